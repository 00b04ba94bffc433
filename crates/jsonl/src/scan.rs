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

/// Returns the index just past the string starting at `b[i] == '"'`.
#[inline]
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = j + memchr::memchr2(b'"', b'\\', &b[j..])?;
        if b[k] == b'"' {
            return Some(k + 1);
        }
        j = k + 2;
        if j > b.len() {
            return None;
        }
    }
}

/// Returns the index just past the object or array starting at `b[i]`.
fn skip_container(b: &[u8], i: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut j = i;
    loop {
        // Jump to the next byte that matters: a quote or a bracket.
        let k = j + b[j..]
            .iter()
            .position(|c| matches!(c, b'"' | b'{' | b'[' | b'}' | b']'))?;
        match b[k] {
            b'"' => j = skip_string(b, k)?,
            b'{' | b'[' => {
                depth += 1;
                j = k + 1;
            }
            _ => {
                depth -= 1;
                j = k + 1;
                if depth == 0 {
                    return Some(j);
                }
            }
        }
    }
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
        if let Some(slot) = keys.iter().position(|k| k.as_bytes() == key) {
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

#[cfg(test)]
mod tests {
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

        /// Arbitrary bytes never panic the scanner.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = scan(&bytes, ["type", "id"]);
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
