//! Writing to the terminal: results on stdout, diagnostics on stderr, broken pipes tolerated.
//!
//! Colour is decided once per process ([`set_color`], from `--color`) and only ever touches
//! stderr: the `error:`/`warning:` of a diagnostic and the outcome of the run's summary line.
//! Every line reads the same without it.

use std::io::{self, IsTerminal as _, Write as _};
use std::sync::OnceLock;

use clap::ColorChoice;

/// Whether stderr gets colour; decided once, by [`set_color`] or on first use.
static STDERR_COLOR: OnceLock<bool> = OnceLock::new();

const BOLD_RED: &str = "\x1b[1;31m";
const BOLD_YELLOW: &str = "\x1b[1;33m";
const GREEN: &str = "\x1b[32m";
const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const RESET: &str = "\x1b[0m";

/// Decides, once for the process, whether stderr gets colour: `always`, `never`, or with `auto`
/// when stderr is a terminal, `NO_COLOR` is unset or empty and `TERM` is not `dumb`
/// (`CLICOLOR_FORCE` forces it, as `NO_COLOR` does not). Later calls change nothing.
pub(crate) fn set_color(choice: ColorChoice) {
    let _ = STDERR_COLOR.set(resolve_color(
        choice,
        &|name| std::env::var_os(name),
        &|| io::stderr().is_terminal(),
    ));
}

/// Returns whether stderr gets colour (e.g. for the log's ANSI styling).
pub(crate) fn stderr_color() -> bool {
    *STDERR_COLOR.get_or_init(|| {
        resolve_color(ColorChoice::Auto, &|name| std::env::var_os(name), &|| {
            io::stderr().is_terminal()
        })
    })
}

fn resolve_color(
    choice: ColorChoice,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    is_terminal: &dyn Fn() -> bool,
) -> bool {
    let set = |name: &str| env(name).is_some_and(|v| !v.is_empty() && v != "0");
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            // https://no-color.org: any non-empty value; it beats CLICOLOR_FORCE, as in clap.
            if env("NO_COLOR").is_some_and(|v| !v.is_empty()) {
                false
            } else if set("CLICOLOR_FORCE") {
                true
            } else {
                is_terminal() && env("TERM").is_none_or(|t| t != "dumb")
            }
        }
    }
}

/// Returns `text` safe to print on a terminal: every control character but newline and tab
/// (C0, DEL, C1: what starts an escape sequence) is written escaped (`\u{1b}`, `\r`). Text that
/// came from an agent's stream or command (a tool's name, a message, an argument) can hold
/// anything; printed raw, it could clear the screen, move the cursor or retitle the window.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(text, |c| c == '\n' || c == '\t')
}

/// Returns `text` for one place in a line (a name): every control character escaped, newline
/// and tab included.
pub(crate) fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(text, |_| false)
}

/// Escapes every control character of `text` but those `keep` says stay.
fn escape_controls(text: &str, keep: fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() && !keep(c);
    if !text.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes one line of command output on stdout (control characters escaped: [`printable`]).
pub(crate) fn line(text: impl AsRef<str>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(printable(text.as_ref()).as_bytes())?;
    out.write_all(b"\n")
}

/// Writes a value as one line of compact JSON on stdout.
pub(crate) fn json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    line(serde_json::to_string(value)?)?;
    Ok(())
}

/// Writes a diagnostic line on stderr, e.g. `stepguard: warning: …`.
pub(crate) fn diag(level: &str, text: impl AsRef<str>) {
    // A closed stderr leaves nowhere to report to; ignoring is the only option.
    let level = match (stderr_color(), level) {
        (true, "error") => format!("{BOLD_RED}error:{RESET}"),
        (true, "warning") => format!("{BOLD_YELLOW}warning:{RESET}"),
        _ => format!("{level}:"),
    };
    let text = printable(text.as_ref());
    let _ = writeln!(io::stderr().lock(), "stepguard: {level} {text}");
}

/// Writes an informational line on stderr, e.g. the run's summary: `stepguard: …`. With colour,
/// a run summary's outcome (`success`, `failed: max_steps`, …) is coloured.
pub(crate) fn note(text: impl AsRef<str>) {
    let text = printable(text.as_ref());
    let text = text.as_ref();
    let text = if stderr_color() {
        paint_outcome(text)
    } else {
        text.to_owned()
    };
    // A closed stderr leaves nowhere to report to; ignoring is the only option.
    let _ = writeln!(io::stderr().lock(), "stepguard: {text}");
}

/// Colours the outcome field of a run summary (`Steps: 6 | failed: max_steps | 194ms`): green for
/// success, red for a failure, yellow for the rest; any other text is returned as it is.
fn paint_outcome(text: &str) -> String {
    let mut fields: Vec<&str> = text.split(" | ").collect();
    let is_summary = fields
        .first()
        .is_some_and(|f| f.starts_with("Steps: ") || f.starts_with("Turns: "));
    let Some(outcome) = fields.get(1).filter(|_| is_summary) else {
        return text.to_owned();
    };
    let colour = match outcome.split(':').next().unwrap_or_default() {
        "success" => GREEN,
        "failed" => RED,
        "incomplete" | "interrupted" | "running" => YELLOW,
        _ => return text.to_owned(),
    };
    let painted = format!("{colour}{outcome}{RESET}");
    fields[1] = &painted;
    fields.join(" | ")
}

/// Returns true when `err` is a closed stdout (e.g. piped into `head`), which is not a failure.
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn control_characters_from_streams_are_escaped_and_the_rest_kept() {
        assert_eq!(printable("Ba\u{1b}[2Jsh"), "Ba\\u{1b}[2Jsh");
        assert_eq!(
            printable("a\u{7}b\u{7f}c\u{9b}d\re"),
            "a\\u{7}b\\u{7f}c\\u{9b}d\\re"
        );
        assert_eq!(printable("two\nlines\tand é ✓"), "two\nlines\tand é ✓");
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(one_line("two\nlines\tx"), "two\\nlines\\tx");
    }

    fn decide(choice: ColorChoice, vars: &[(&str, &str)], tty: bool) -> bool {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        resolve_color(choice, &env, &|| tty)
    }

    #[test]
    fn colour_follows_the_flag_then_no_color_then_the_terminal() {
        assert!(decide(ColorChoice::Always, &[("NO_COLOR", "1")], false));
        assert!(!decide(
            ColorChoice::Never,
            &[("CLICOLOR_FORCE", "1")],
            true
        ));
        assert!(decide(ColorChoice::Auto, &[], true));
        assert!(!decide(ColorChoice::Auto, &[], false));
        assert!(!decide(ColorChoice::Auto, &[("NO_COLOR", "1")], true));
        assert!(decide(ColorChoice::Auto, &[("NO_COLOR", "")], true));
        assert!(!decide(ColorChoice::Auto, &[("TERM", "dumb")], true));
        assert!(decide(ColorChoice::Auto, &[("CLICOLOR_FORCE", "1")], false));
        assert!(!decide(
            ColorChoice::Auto,
            &[("CLICOLOR_FORCE", "0")],
            false
        ));
        assert!(!decide(
            ColorChoice::Auto,
            &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")],
            true
        ));
    }

    #[test]
    fn only_a_summary_outcome_is_painted() {
        assert_eq!(
            paint_outcome("Steps: 6 (legacy turns: 1) | failed: max_steps | 194ms"),
            format!("Steps: 6 (legacy turns: 1) | {RED}failed: max_steps{RESET} | 194ms")
        );
        assert_eq!(
            paint_outcome("Steps: 4 | success"),
            format!("Steps: 4 | {GREEN}success{RESET}")
        );
        let other = "guardian: the supervising stepguard is gone | success";
        assert_eq!(paint_outcome(other), other);
    }
}
