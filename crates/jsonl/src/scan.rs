//! The structural field scanner.

use std::borrow::Cow;

/// The raw text of one JSON value inside a line (a string with its quotes, an object with its
/// braces, a number …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawValue<'a>(pub &'a [u8]);

impl<'a> RawValue<'a> {
    /// Returns the value as text when it is a JSON string (unescaping only when needed).
    pub fn as_str(&self) -> Option<Cow<'a, str>> {
        let inner = self.0.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        if memchr::memchr(b'\\', inner).is_none() {
            std::str::from_utf8(inner).ok().map(Cow::Borrowed)
        } else {
            serde_json::from_slice::<String>(self.0)
                .ok()
                .map(Cow::Owned)
        }
    }

    /// Returns the bytes inside a JSON string that has no escapes (no UTF-8 check, no copy);
    /// `None` for other values and for strings with escapes.
    #[inline]
    pub fn plain_str_bytes(&self) -> Option<&'a [u8]> {
        let inner = self.0.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        memchr::memchr(b'\\', inner).is_none().then_some(inner)
    }

    /// Returns true when the value is the JSON string `s` (no allocation on the common path).
    pub fn is_str(&self, s: &str) -> bool {
        match self
            .0
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
        {
            Some(inner) if memchr::memchr(b'\\', inner).is_none() => inner == s.as_bytes(),
            Some(_) => self.as_str().is_some_and(|v| v == s),
            None => false,
        }
    }

    /// Returns true for `null`.
    pub fn is_null(&self) -> bool {
        self.0 == b"null"
    }

    /// Returns the value as an unsigned integer.
    pub fn as_u64(&self) -> Option<u64> {
        std::str::from_utf8(self.0).ok()?.parse().ok()
    }

    /// Returns the value as a float.
    pub fn as_f64(&self) -> Option<f64> {
        std::str::from_utf8(self.0).ok()?.parse().ok()
    }

    /// Returns the value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self.0 {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }

    /// Returns true when the value is an object.
    pub fn is_object(&self) -> bool {
        self.0.first() == Some(&b'{')
    }

    /// Scans this value as an object for the given keys.
    pub fn fields<const N: usize>(&self, keys: [&str; N]) -> Option<[Option<RawValue<'a>>; N]> {
        scan(self.0, keys)
    }

    /// Calls `f` for each element when the value is an array; returns false if it is not one.
    pub fn for_each_element(&self, mut f: impl FnMut(RawValue<'a>)) -> bool {
        let b = self.0;
        if b.first() != Some(&b'[') {
            return false;
        }
        let mut i = skip_ws(b, 1);
        if b.get(i) == Some(&b']') {
            return true;
        }
        loop {
            let Some(end) = skip_value(b, i) else {
                return false;
            };
            f(RawValue(&b[i..end]));
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b']') => return true,
                _ => return false,
            }
        }
    }

    /// Parses the value fully with serde_json (for rare lines that need every detail).
    pub fn to_json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(self.0).ok()
    }
}

/// Compares short keys inline (a `memcmp` call costs more than the comparison itself).
#[inline(always)]
fn key_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[inline]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(c) = b.get(i) {
        if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            break;
        }
        i += 1;
    }
    i
}

/// The index of the first `"` or `\\` among eight bytes, or 8 when there is none (SWAR: each
/// byte compared at once in a `u64`; the lowest flagged byte is exact).
#[inline]
fn quote_or_backslash(eight: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_bytes = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let mut word = [0u8; 8];
    word.copy_from_slice(eight);
    let v = u64::from_le_bytes(word);
    let flagged =
        zero_bytes(v ^ (ONES * u64::from(b'"'))) | zero_bytes(v ^ (ONES * u64::from(b'\\')));
    (flagged.trailing_zeros() / 8) as usize
}

/// Returns the index just past the string starting at `b[i] == '"'`.
#[inline]
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let start = i + 1;
    let mut j = start;
    // Most strings in agent streams are short: a scalar look at the first bytes beats setting up
    // a vectorised search.
    // Eight bytes at a time, with no quote or backslash among them, are passed at once.
    let short_end = (start + 32).min(b.len());
    while j < short_end {
        if let Some(eight) = b.get(j..j + 8) {
            let found = quote_or_backslash(eight);
            if found == 8 {
                j += 8;
                continue;
            }
            j += found;
        }
        match b[j] {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
    // Long strings (command output) are full of escaped newlines: search for quotes only, and
    // treat a quote as closing when an even number of backslashes precedes it.
    loop {
        let k = j + memchr::memchr(b'"', b.get(j..)?)?;
        let backslashes = b[start..k]
            .iter()
            .rev()
            .take_while(|c| **c == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Some(k + 1);
        }
        j = k + 1;
    }
}

/// Returns the index just past the object or array starting at `b[i]`.
fn skip_container(b: &[u8], i: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut j = i;
    while let Some(&c) = b.get(j) {
        match c {
            b'"' => {
                j = skip_string(b, j)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

/// Returns the index just past the value starting at `b[i]`.
#[inline]
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => skip_container(b, i),
        c if c == b'-' || c.is_ascii_alphanumeric() => {
            let end = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .map_or(b.len(), |p| i + p);
            let token = &b[i..end];
            let ok = matches!(token, b"true" | b"false" | b"null")
                || token
                    .iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'));
            ok.then_some(end)
        }
        _ => None,
    }
}

/// Scans `line` as one JSON object and returns the raw values of `keys` at its top level.
///
/// Returns `None` when the line is not a well-formed JSON object at the top level (values of
/// keys that are not asked for are skipped structurally, not validated in depth).
pub fn scan<'a, const N: usize>(
    line: &'a [u8],
    keys: [&str; N],
) -> Option<[Option<RawValue<'a>>; N]> {
    let b = line;
    let mut out = [None; N];
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = &b[i + 1..key_end - 1];
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let value_end = skip_value(b, i)?;
        if let Some(slot) = keys.iter().position(|k| key_eq(k.as_bytes(), key)) {
            out[slot] = Some(RawValue(&b[i..value_end]));
        }
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return (skip_ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

/// Walks the members of `line`, one JSON object, in order: `f` gets each key (the bytes between
/// its quotes, escapes as written) and its raw value, and stops the walk by returning `false`.
/// Returns whether the line is a well-formed object at the top level (values skipped
/// structurally, as [`scan`] does) whose every member `f` accepted.
pub fn for_each_member<'a>(
    line: &'a [u8],
    mut f: impl FnMut(&'a [u8], RawValue<'a>) -> bool,
) -> bool {
    let b = line;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return false;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return skip_ws(b, i + 1) == b.len();
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return false;
        }
        let Some(key_end) = skip_string(b, i) else {
            return false;
        };
        let key = &b[i + 1..key_end - 1];
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return false;
        }
        i = skip_ws(b, i + 1);
        let Some(value_end) = skip_value(b, i) else {
            return false;
        };
        if !f(key, RawValue(&b[i..value_end])) {
            return false;
        }
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return skip_ws(b, i + 1) == b.len(),
            _ => return false,
        }
    }
}

/// Scans the leading members of a JSON object line for `keys`, stopping as soon as each has
/// been found once: the fast path for event streams whose writers put the discriminating keys
/// first (`{"type":…,"item":{"id":…,"type":…` ).
///
/// Differences from [`scan`], which it trades for speed on the per-line hot path:
/// * the first occurrence of a key wins (writers of these streams never repeat top-level keys);
/// * the line must start with `{` and end with `}`, but members after the last key found are
///   not validated;
/// * when the key that completes the set holds an object or array, its value is returned from
///   its start to the end of the line, unskipped; read it with [`RawValue::prefix_fields`],
///   which stops early too.
///
/// Returns `None` when the line is not an object, or when the walked part is malformed.
pub fn scan_prefix<'a, const N: usize>(
    line: &'a [u8],
    keys: [&str; N],
) -> Option<[Option<RawValue<'a>>; N]> {
    let end = line
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t' | b'\r' | b'\n'))?;
    if line[end] != b'}' {
        return None;
    }
    prefix_members(&line[..=end], keys, true)
}

/// Walks members of the object starting at `b` (after optional whitespace), stopping early.
fn prefix_members<'a, const N: usize>(
    b: &'a [u8],
    keys: [&str; N],
    require_end: bool,
) -> Option<[Option<RawValue<'a>>; N]> {
    let mut out = [None; N];
    let mut missing = N;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (!require_end || skip_ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = &b[i + 1..key_end - 1];
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let slot = keys
            .iter()
            .position(|k| k.as_bytes() == key)
            .filter(|&s| out[s].is_none());
        if let Some(slot) = slot {
            missing -= 1;
            if missing == 0 && matches!(b.get(i), Some(b'{' | b'[')) {
                out[slot] = Some(RawValue(&b[i..]));
                return Some(out);
            }
        }
        let value_end = skip_value(b, i)?;
        if let Some(slot) = slot {
            out[slot] = Some(RawValue(&b[i..value_end]));
            if missing == 0 {
                return Some(out);
            }
        }
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return (!require_end || skip_ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

impl<'a> RawValue<'a> {
    /// Reads the leading members of this object value like [`scan_prefix`], stopping as soon as
    /// every key is found (for values returned unskipped by [`scan_prefix`]).
    pub fn prefix_fields<const N: usize>(
        &self,
        keys: [&str; N],
    ) -> Option<[Option<RawValue<'a>>; N]> {
        prefix_members(self.0, keys, false)
    }
}

/// How a line is framed, judged before a provider reads it: one JSON object per line is the
/// only framing a stream's events may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// One JSON object (or not an object at all: text, or a cut line, which is noise).
    Plain,
    /// A framing that could hide an event from a provider's reading of the line, which a
    /// stream written by its CLI never has; says which.
    Hostile(HostileFraming),
}

/// A line framed to hide events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostileFraming {
    /// More than one JSON value on one line (events packed together, or split by `\r`).
    Packed,
    /// A byte-order mark, NUL or another control byte before the event.
    Prefixed,
    /// A top-level key written with an escape (`"typ\u0065"`): readers disagree on it.
    EscapedKey,
    /// A top-level key given twice: readers disagree on which one counts.
    DuplicateKey,
}

impl HostileFraming {
    /// Says what the line does, e.g. in a refusal.
    pub fn describe(self) -> &'static str {
        match self {
            HostileFraming::Packed => {
                "more than one JSON value on one line (packed, or split by \\r)"
            }
            HostileFraming::Prefixed => "a byte-order mark or control bytes before the event",
            HostileFraming::EscapedKey => "a top-level key written with an escape",
            HostileFraming::DuplicateKey => "a top-level key given twice",
        }
    }
}

/// Judges how `line` (without its `\n`) is framed; see [`Framing`]. Structural, like [`scan`]:
/// nested values are skipped, not validated (nested duplicate keys occur in real streams).
pub fn framing(line: &[u8]) -> Framing {
    let b = line;
    let start = skip_ws(b, 0);
    if b.get(start) != Some(&b'{') {
        return prefixed(&b[start..]);
    }
    let Some((end, hostile)) = top_level_keys(b, start) else {
        // Not well-formed JSON: noise, which the whole run's recognition counts.
        return Framing::Plain;
    };
    if let Some(h) = hostile {
        return Framing::Hostile(h);
    }
    if skip_ws(b, end) != b.len() {
        return Framing::Hostile(HostileFraming::Packed);
    }
    Framing::Plain
}

/// A line that does not start with `{`: hostile when control bytes or a BOM hide one.
fn prefixed(rest: &[u8]) -> Framing {
    let rest_after_bom = rest.strip_prefix(b"\xEF\xBB\xBF");
    let hidden = rest_after_bom.is_some() || rest.first().is_some_and(|c| c.is_ascii_control());
    let after = rest_after_bom
        .unwrap_or(rest)
        .iter()
        .position(|c| !(c.is_ascii_control() || *c == b' '));
    match after {
        Some(i) if hidden && rest_after_bom.unwrap_or(rest)[i] == b'{' => {
            Framing::Hostile(HostileFraming::Prefixed)
        }
        _ => Framing::Plain,
    }
}

/// Keys a line's events have at most, in practice: up to this many are kept on the stack.
const FEW_KEYS: usize = 16;

/// The top-level keys of one line: on the stack for the usual few (no allocation per line),
/// on the heap past [`FEW_KEYS`].
#[derive(Default)]
struct Keys<'a> {
    few: [&'a [u8]; FEW_KEYS],
    len: usize,
    more: Vec<&'a [u8]>,
}

impl<'a> Keys<'a> {
    fn push(&mut self, key: &'a [u8]) {
        if self.len < FEW_KEYS {
            self.few[self.len] = key;
            self.len += 1;
        } else {
            if self.more.is_empty() {
                self.more.extend_from_slice(&self.few);
            }
            self.more.push(key);
        }
    }

    /// Whether a key repeats: sorted, so a line of many keys costs k log k, never k² (a
    /// hostile agent could otherwise stall counting with one long line).
    fn any_duplicate(&mut self) -> bool {
        let keys = if self.more.is_empty() {
            &mut self.few[..self.len]
        } else {
            &mut self.more[..]
        };
        keys.sort_unstable();
        keys.windows(2).any(|w| w[0] == w[1])
    }
}

/// Walks the top-level members of the object at `b[i] == '{'`: the index past its `}` and the
/// first hostile key found; `None` when it is not well-formed.
fn top_level_keys(b: &[u8], i: usize) -> Option<(usize, Option<HostileFraming>)> {
    let mut keys = Keys::default();
    let mut hostile = None;
    let mut i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some((i + 1, None));
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = &b[i + 1..key_end - 1];
        if memchr::memchr(b'\\', key).is_some() {
            hostile.get_or_insert(HostileFraming::EscapedKey);
        }
        keys.push(key);
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_value(b, skip_ws(b, i + 1))?;
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => {
                if keys.any_duplicate() {
                    hostile.get_or_insert(HostileFraming::DuplicateKey);
                }
                return Some((i + 1, hostile));
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn members_are_walked_in_order_at_the_top_level_only() {
        let line = br#"{"a":{"b":1,"c":"}"},"d\"":[1,{"e":2}],"f":null}"#;
        let mut seen = Vec::new();
        assert!(super::for_each_member(line, |k, v| {
            seen.push((k, v.0));
            true
        }));
        assert_eq!(
            seen,
            [
                (&b"a"[..], &br#"{"b":1,"c":"}"}"#[..]),
                (&br#"d\""#[..], &b"[1,{\"e\":2}]"[..]),
                (&b"f"[..], &b"null"[..]),
            ]
        );
        assert!(super::for_each_member(b" {} ", |_, _| false));
        let mut n = 0;
        assert!(!super::for_each_member(br#"{"a":1,"b":2}"#, |_, _| {
            n += 1;
            n < 2
        }));
        for bad in [
            &br#"{"a":1"#[..],
            br#"{"a":1} x"#,
            br#"{"a" 1}"#,
            b"[1]",
            br#"{"a":tru"#,
        ] {
            assert!(!super::for_each_member(bad, |_, _| true), "{bad:?}");
        }
    }

    #[test]
    fn hostile_framings_are_told_from_plain_lines() {
        use super::{Framing::*, HostileFraming::*, framing};
        let ok = br#"{"type":"item.started","item":{"id":"c1","id":"c1"}}"#;
        assert_eq!(
            framing(ok),
            Plain,
            "nested duplicates occur in real streams"
        );
        assert_eq!(framing(b"plain text"), Plain);
        assert_eq!(
            framing(br#"{"type":"item.st"#),
            Plain,
            "a cut line is noise"
        );
        assert_eq!(framing(b"{\"a\":1}  \r"), Plain);
        let packed = br#"{"type":"item.started"}{"type":"item.started"}"#;
        assert_eq!(framing(packed), Hostile(Packed));
        assert_eq!(framing(b"{\"a\":1}\r{\"a\":2}"), Hostile(Packed));
        assert_eq!(
            framing(br#"{"typ\u0065":"item.started"}"#),
            Hostile(EscapedKey)
        );
        assert_eq!(
            framing(br#"{"type":"x","type":"item.started"}"#),
            Hostile(DuplicateKey)
        );
        // Duplicates are found however many keys a line has (on the stack up to 16, past
        // that on the heap), wherever the two copies are.
        for n in [2, 15, 16, 17, 40] {
            let keys: Vec<String> = (0..n).map(|k| format!("\"k{k}\":{k}")).collect();
            let plain = format!("{{{}}}", keys.join(","));
            assert_eq!(framing(plain.as_bytes()), Plain, "{n} keys");
            for (a, b) in [(0, n - 1), (n - 1, 0), (n / 2, n - 1)] {
                let mut dup = keys.clone();
                dup[b] = dup[a].clone();
                if a == b {
                    continue;
                }
                let line = format!("{{{}}}", dup.join(","));
                assert_eq!(
                    framing(line.as_bytes()),
                    Hostile(DuplicateKey),
                    "{n}: {a}={b}"
                );
            }
        }
        assert_eq!(framing(b"\xEF\xBB\xBF{\"a\":1}"), Hostile(Prefixed));
        assert_eq!(framing(b"\0{\"a\":1}"), Hostile(Prefixed));
        assert_eq!(
            framing(b"\x1b[2J"),
            Plain,
            "control bytes before text are noise"
        );
    }

    use proptest::prelude::*;

    use super::*;

    fn get<'a>(line: &'a [u8], key: &str) -> Option<RawValue<'a>> {
        scan(line, [key]).and_then(|[v]| v)
    }

    #[test]
    fn finds_top_level_keys_only() {
        let line = br#"{"item":{"type":"inner"},"type":"outer","n":12,"b":true,"z":null}"#;
        let [t, n, b, z, missing] = scan(line, ["type", "n", "b", "z", "missing"]).unwrap();
        assert!(t.unwrap().is_str("outer"));
        assert_eq!(n.unwrap().as_u64(), Some(12));
        assert_eq!(b.unwrap().as_bool(), Some(true));
        assert!(z.unwrap().is_null());
        assert!(missing.is_none());
    }

    #[test]
    fn the_eight_byte_search_finds_the_first_quote_or_backslash() {
        for (bytes, at) in [
            (&b"abcdefgh"[..], 8),
            (b"\"bcdefgh", 0),
            (b"abcdefg\\", 7),
            (b"ab\\de\"gh", 2),
            (b"\xff\x80\x22\x5c\x00\x01\x7f\x22", 2),
            (b"\x21\x23\x5b\x5d\x02\x00\x00\x5c", 7),
        ] {
            assert_eq!(quote_or_backslash(bytes), at, "{bytes:?}");
        }
    }

    /// The end of the string at `b[0] == '"'`, read byte by byte.
    fn skip_string_bytewise(b: &[u8]) -> Option<usize> {
        let mut j = 1;
        while j < b.len() {
            match b[j] {
                b'"' => return Some(j + 1),
                b'\\' => j += 2,
                _ => j += 1,
            }
        }
        None
    }

    proptest! {
        /// Strings of quotes, backslashes and other bytes end where a byte-by-byte reading
        /// says, whichever path (eight bytes at a time, scalar, memchr) finds the end.
        #[test]
        fn strings_end_where_a_bytewise_reading_says(
            body in prop::collection::vec(
                prop_oneof![12 => Just(b'x'), 1 => Just(b'"'), 2 => Just(b'\\'), 1 => Just(0xC3u8)],
                0..120,
            ),
        ) {
            let b = [&b"\""[..], &body].concat();
            prop_assert_eq!(skip_string(&b, 0), skip_string_bytewise(&b));
        }
    }

    #[test]
    fn fake_events_inside_strings_are_not_keys() {
        let line = br#"{"type":"item.started","item":{"aggregated_output":"{\"type\":\"item.completed\"}\n"}}"#;
        assert!(get(line, "type").unwrap().is_str("item.started"));
    }

    #[test]
    fn duplicate_keys_last_wins() {
        let line = br#"{"id":"item_3","type":"web_search","id":"ws_abc"}"#;
        assert_eq!(get(line, "id").unwrap().as_str().as_deref(), Some("ws_abc"));
    }

    #[test]
    fn escapes_and_unicode() {
        let line = br#"{"id":"a\"b\\c\u00e9","k":"caf\u00e9 \ud83d\ude00"}"#;
        assert_eq!(
            get(line, "id").unwrap().as_str().as_deref(),
            Some("a\"b\\c\u{e9}")
        );
        assert!(get(line, "k").unwrap().is_str("caf\u{e9} \u{1f600}"));
    }

    #[test]
    fn malformed_lines_are_rejected() {
        for bad in [
            &b""[..],
            b"not json",
            b"[1,2]",
            br#"{"type":"turn.started""#,
            br#"{"type":"x",}"#,
            br#"{"type" "x"}"#,
            br#"{"type":"x"} trailing"#,
            br#"{"a":{"b":1}"#,
            br#"{"a":"unterminated}"#,
            br#"{"a":nope}"#,
            b"2026-11-22T09:40:04Z ERROR codex_core: boom",
        ] {
            assert!(
                scan(bad, ["type"]).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(scan(b"  {}  ", ["type"]).is_some());
        assert!(
            scan(
                b"{ \"a\" : [ 1 , { \"b\" : \"]\" } ] , \"type\" : \"x\" }",
                ["type"]
            )
            .unwrap()[0]
                .is_some()
        );
    }

    #[test]
    fn prefix_scan_stops_early_and_hands_back_the_open_container() {
        let line = br#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","aggregated_output":"{\"type\":\"x\"}"},"extra":[1,2]}"#;
        let [ty, item] = scan_prefix(line, ["type", "item"]).unwrap();
        assert!(ty.unwrap().is_str("item.completed"));
        let [id, kind] = item.unwrap().prefix_fields(["id", "type"]).unwrap();
        assert!(id.unwrap().is_str("item_1"));
        assert!(kind.unwrap().is_str("command_execution"));
        // First occurrence wins.
        let [id] = RawValue(br#"{"id":"item_3","type":"web_search","id":"ws_1"}"#)
            .prefix_fields(["id"])
            .unwrap();
        assert!(id.unwrap().is_str("item_3"));
    }

    #[test]
    fn prefix_scan_rejects_lines_that_are_not_closed_objects() {
        for bad in [
            &br#"{"type":"item.completed","item":{"id":"item_0","aggregated_output":"partial"#[..],
            b"noise",
            br#"["type"]"#,
            br#"{"type" "x"}"#,
        ] {
            assert!(
                scan_prefix(bad, ["type", "item"]).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let [ty, missing] = scan_prefix(br#"{"type":"turn.started"}"#, ["type", "item"]).unwrap();
        assert!(ty.is_some() && missing.is_none());
    }

    #[test]
    fn arrays_iterate() {
        let v = RawValue(br#"[{"type":"text"},{"type":"tool_use","id":"t1"}, 3]"#);
        let mut seen = Vec::new();
        assert!(v.for_each_element(|e| seen.push(e.0.len())));
        assert_eq!(seen.len(), 3);
        assert!(RawValue(b"[]").for_each_element(|_| panic!()));
        assert!(!RawValue(b"{}").for_each_element(|_| {}));
    }

    proptest! {
        /// The scanner agrees with serde_json on which top-level "type" a valid object has.
        #[test]
        fn agrees_with_serde_json(v in json_object()) {
            let text = serde_json::to_string(&v).unwrap();
            let [t] = scan(text.as_bytes(), ["type"]).expect("valid JSON must scan");
            let expected = v.get("type").map(|t| serde_json::to_string(t).unwrap());
            prop_assert_eq!(t.map(|t| String::from_utf8(t.0.to_vec()).unwrap()), expected);
        }

        /// Arbitrary bytes never panic the scanners.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = scan(&bytes, ["type", "id"]);
            if let Some([_, Some(item)]) = scan_prefix(&bytes, ["type", "item"]) {
                let _ = item.prefix_fields(["id", "type"]);
            }
        }

        /// On valid JSON whose keys are unique, the prefix scan finds what serde_json finds.
        #[test]
        fn prefix_scan_agrees_with_serde_json(v in json_object()) {
            let text = serde_json::to_string(&v).unwrap();
            let [t] = scan_prefix(text.as_bytes(), ["type"]).expect("valid JSON must scan");
            let expected = v.get("type").map(|t| serde_json::to_string(t).unwrap());
            let got = t.map(|t| {
                // An unskipped container runs to the end of the line: compare by parsing a prefix.
                let mut de = serde_json::Deserializer::from_slice(t.0).into_iter::<serde_json::Value>();
                serde_json::to_string(&de.next().unwrap().unwrap()).unwrap()
            });
            prop_assert_eq!(got, expected);
        }
    }

    fn json_leaf() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            ".{0,12}".prop_map(serde_json::Value::from),
            Just(serde_json::Value::from("\"type\":\"item.completed\"")),
        ]
    }

    fn json_object() -> impl Strategy<Value = serde_json::Value> {
        let value = json_leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(
                    prop_oneof![Just("type".to_owned()), "[a-z]{1,4}"],
                    inner,
                    0..4
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        proptest::collection::btree_map(
            prop_oneof![Just("type".to_owned()), "[a-z]{1,4}"],
            value,
            0..5,
        )
        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }
}
