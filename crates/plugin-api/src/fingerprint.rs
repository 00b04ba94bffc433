//! Normalising what loop detection compares: shell commands (protocol 1.3, refined in 1.6) and
//! tool results (protocol 1.6).
//!
//! A command that differs from another only in spacing, a comment or an environment prefix is
//! the same command; a result that differs only in timings, timestamps, colours or spacing is
//! the same result. Both become a 64-bit FNV-1a hash, written as 16 hex digits.

use std::sync::LazyLock;

use regex::Regex;

/// 64-bit FNV-1a, fed piece by piece.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.byte(*byte);
        }
    }

    #[inline]
    fn byte(&mut self, byte: u8) {
        self.0 ^= u64::from(byte);
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }

    fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// The 64-bit FNV-1a hash of `parts` joined by zero bytes, as 16 hex digits.
pub(crate) fn fnv(parts: &[&[u8]]) -> String {
    let mut hash = Fnv::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hash.write(&[0]);
        }
        hash.write(part);
    }
    hash.hex()
}

/// `fnv(&[status, normalise_output(output).as_bytes()])`, without building the normalised
/// text: its words are hashed as they are found (a tool result's output can be long).
pub(crate) fn output_fingerprint(status: &[u8], output: &str) -> String {
    let mut hash = Fnv::new();
    hash.write(status);
    hash.write(&[0]);
    let text = without_volatile(output);
    if text.is_ascii() {
        // Byte by byte: ASCII's whitespace is `char::is_whitespace`'s there.
        let (mut words, mut gap) = (false, false);
        for &c in text.as_bytes() {
            if matches!(c, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r') {
                gap = words;
            } else {
                if gap {
                    hash.byte(b' ');
                    gap = false;
                }
                hash.byte(c);
                words = true;
            }
        }
        return hash.hex();
    }
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 {
            hash.write(b" ");
        }
        hash.write(word.as_bytes());
    }
    hash.hex()
}

/// Returns a shell command's words with comments, quoting and spacing gone and leading
/// environment assignments (`FOO=1 cargo test`) dropped, joined by single spaces; a command
/// that does not parse (an unclosed quote) is only trimmed and its whitespace collapsed.
///
/// ```
/// use stepguard_plugin_api::fingerprint::normalise_command;
///
/// assert_eq!(normalise_command("RUST_LOG=1  cargo test   # again"), "cargo test");
/// assert_eq!(normalise_command("cargo 'test'"), "cargo test");
/// ```
pub fn normalise_command(command: &str) -> String {
    match shlex::split(command) {
        Some(words) => {
            let start = words.iter().take_while(|w| is_assignment(w)).count();
            words[start..].join(" ")
        }
        None => command.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

/// Returns the program a shell command runs: its first word after environment assignments,
/// `env`, and leading `cd DIR &&` (or `;`) steps, without its directory; `None` for an empty
/// command.
///
/// ```
/// use stepguard_plugin_api::fingerprint::program_of;
///
/// assert_eq!(program_of("FOO=1 cargo test -p x").as_deref(), Some("cargo"));
/// assert_eq!(program_of("cd crates/core && /usr/bin/make -j2").as_deref(), Some("make"));
/// assert_eq!(program_of("bash -lc 'pytest -x'").as_deref(), Some("pytest"));
/// assert_eq!(program_of("  "), None);
/// ```
pub fn program_of(command: &str) -> Option<String> {
    let words = shlex::split(command)
        .unwrap_or_else(|| command.split_whitespace().map(str::to_owned).collect());
    let mut rest: &[String] = &words;
    loop {
        let skip = rest
            .iter()
            .take_while(|w| is_assignment(w) || *w == "env")
            .count();
        rest = &rest[skip..];
        match rest {
            [cd, _, sep, tail @ ..] if cd == "cd" && (sep == "&&" || sep == ";") => rest = tail,
            [cd, dir, tail @ ..] if cd == "cd" && dir.ends_with(';') => rest = tail,
            [shell, flag, script] if is_shell(shell) && flag.starts_with('-') => {
                return program_of(script);
            }
            [first, ..] => {
                let first = first.trim_end_matches(';');
                return Some(first.rsplit('/').next().unwrap_or(first).to_owned());
            }
            [] => return None,
        }
    }
}

/// A shell started to run one script (`bash -lc '…'`), as Codex wraps its commands.
fn is_shell(word: &str) -> bool {
    matches!(
        word.rsplit('/').next().unwrap_or(word),
        "bash" | "sh" | "zsh" | "dash"
    )
}

/// `NAME=value`, the environment assignment of a shell command.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// What makes two runs of the same command print different text though nothing changed:
/// ANSI escapes, timestamps, durations, process ids and temporary paths.
/// Each with a byte every match of it holds, when there is one: a text without that byte is not
/// searched (most outputs have no escape; many have no date or clock time).
static VOLATILE: LazyLock<[(Regex, &'static str, Option<u8>); 5]> = LazyLock::new(|| {
    let re = |pattern: &str| Regex::new(pattern).expect("a valid built-in pattern");
    [
        (
            re(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)"),
            "",
            Some(0x1b),
        ),
        (
            re(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?"),
            "<time>",
            Some(b'-'),
        ),
        (re(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b"), "<time>", Some(b':')),
        (
            re(r"(?i)\b\d+(\.\d+)?\s?(ns|µs|us|ms|s|sec|secs|seconds?|m|min|mins|minutes?|h)\b"),
            "<duration>",
            None,
        ),
        (
            re(r"(?i)\b(pid|process)\s*[:=]?\s*\d+|/tmp/[A-Za-z0-9._-]+|0x[0-9a-f]{6,}"),
            "<id>",
            None,
        ),
    ]
});

/// Returns a tool's output with what varies between identical runs taken out (ANSI escapes,
/// timestamps, durations such as `finished in 0.42s`, process ids, temporary paths, hex
/// addresses) and whitespace trimmed and collapsed.
///
/// ```
/// use stepguard_plugin_api::fingerprint::normalise_output;
///
/// let a = "\x1b[31mFAILED\x1b[0m  1 passed; 1 failed; finished in 0.42s\n";
/// let b = "FAILED 1 passed; 1 failed; finished in 12.9s";
/// assert_eq!(normalise_output(a), normalise_output(b));
/// assert_ne!(normalise_output(a), normalise_output("FAILED 2 passed; 0 failed; finished in 1s"));
/// ```
pub fn normalise_output(text: &str) -> String {
    without_volatile(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with the [`VOLATILE`] parts replaced, borrowed when it has none.
fn without_volatile(text: &str) -> std::borrow::Cow<'_, str> {
    let mut text = std::borrow::Cow::Borrowed(text);
    // Most outputs have no escape, digit or temporary path: no pattern can match them.
    let volatile = text
        .bytes()
        .any(|b| b == 0x1b || b.is_ascii_digit() || b == b'/');
    if !volatile {
        return text;
    }
    for (pattern, replacement, needs) in VOLATILE.iter() {
        if needs.is_some_and(|byte| memchr::memchr(byte, text.as_bytes()).is_none()) {
            continue;
        }
        if let std::borrow::Cow::Owned(changed) = pattern.replace_all(&text, *replacement) {
            text = std::borrow::Cow::Owned(changed);
        }
    }
    text
}

/// Returns the text of a tool's output as providers send it: a string as it is; a list of
/// content blocks (`[{"type": "text", "text": …}]`) as their texts, one per line; anything else
/// as its JSON.
///
/// ```
/// use stepguard_plugin_api::fingerprint::output_text;
/// use stepguard_plugin_api::serde_json::json;
///
/// assert_eq!(output_text(&json!("ok")), "ok");
/// assert_eq!(output_text(&json!([{"type": "text", "text": "a"}, "b"])), "a\nb");
/// assert_eq!(output_text(&json!({"exit": 1})), r#"{"exit":1}"#);
/// ```
pub fn output_text(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        Value::Array(items) => items
            .iter()
            .map(|item| match item.get("text") {
                Some(Value::String(text)) => text.clone(),
                _ => output_text(item),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trivial_variations_of_a_command_are_the_same_command() {
        let same = [
            "cargo test -p core",
            "  cargo   test -p core ",
            "cargo test -p core # try again",
            "RUST_BACKTRACE=1 cargo test -p core",
            "cargo test -p \"core\"",
        ];
        for command in same {
            assert_eq!(
                normalise_command(command),
                "cargo test -p core",
                "{command}"
            );
        }
        assert_ne!(
            normalise_command("cargo test -p cli"),
            normalise_command("cargo test -p core")
        );
        // An unclosed quote is kept, only its spacing normalised.
        assert_eq!(normalise_command("echo  'oops"), "echo 'oops");
        // `#` inside a word or quotes is not a comment.
        assert_eq!(normalise_command("echo a#b '# c'"), "echo a#b # c");
    }

    #[test]
    fn the_program_is_the_first_word_past_prefixes() {
        for (command, program) in [
            ("cargo build", Some("cargo")),
            ("FOO=1 BAR=x cargo build", Some("cargo")),
            ("env FOO=1 ./target/debug/app --x", Some("app")),
            ("cd a && cd b; npm test", Some("npm")),
            ("/bin/bash -lc \"cd x && pytest -q\"", Some("pytest")),
            ("bash script.sh", Some("bash")),
            ("", None),
            ("FOO=1", None),
        ] {
            assert_eq!(program_of(command).as_deref(), program, "{command}");
        }
    }

    #[test]
    fn the_output_fingerprint_is_the_hash_of_the_normalised_output() {
        for output in [
            "",
            "   ",
            "ok",
            "  a\t b\n\nc  ",
            "\x1b[1;31merror\x1b[0m: x finished in 0.42s at 2026-11-25T12:00:01Z",
            "wrote /tmp/tmp.AbC123 pid 4242\n  done",
            "a\x0bb\x0cc\r\nd \t",
            "caf\u{e9}\u{2003}au\u{85}lait  ",
            "no digits: a-b c:d",
        ] {
            for status in [&b"ok"[..], b"failed"] {
                assert_eq!(
                    output_fingerprint(status, output),
                    fnv(&[status, normalise_output(output).as_bytes()]),
                    "{output:?}"
                );
            }
        }
    }

    #[test]
    fn outputs_differing_in_volatile_parts_normalise_alike() {
        let pairs = [
            (
                "test result: ok. finished in 0.42s",
                "test result: ok. finished in 3s",
            ),
            (
                "2026-11-25T12:00:01Z build started",
                "2026-11-26 09:13:44.123 build started",
            ),
            ("[12:01:02] error", "[23:59:59.5] error"),
            ("\x1b[1;31merror\x1b[0m: x", "error: x"),
            (
                "wrote /tmp/tmp.AbC123 pid 4242",
                "wrote /tmp/tmp.zzz999 pid 7",
            ),
        ];
        for (a, b) in pairs {
            assert_eq!(normalise_output(a), normalise_output(b), "{a:?} vs {b:?}");
        }
        for (a, b) in [
            ("3 passed; 2 failed", "4 passed; 1 failed"),
            (
                "error[E0308]: mismatched types at src/a.rs:3",
                "error[E0425]: cannot find value at src/a.rs:9",
            ),
            ("Building 40%", "Building 80%"),
        ] {
            assert_ne!(normalise_output(a), normalise_output(b), "{a:?} vs {b:?}");
        }
    }
}
