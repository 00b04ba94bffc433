//! Writing to the terminal: results on stdout, diagnostics on stderr, broken pipes tolerated.
//!
//! Colour is decided once per process ([`set_color`], from `--color`) and only ever touches
//! stderr: the `error:`/`warning:` of a diagnostic and the outcome of the run's summary line.
//! Every line reads the same without it.
//!
//! While a run goes on, stderr is written by a thread of its own ([`queue_stderr`]): the
//! diagnostics, the log and the summary line are queued, so a terminal paused with Ctrl-S (or
//! a stderr nobody reads) never blocks the thread that enforces the budget; at the end the
//! queue gets a bounded time to drain ([`StderrQueue::settle`]).

use std::io::{self, IsTerminal as _, Write as _};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

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
    // Control characters are C0 and DEL (bytes below 0x20, and 0x7f) and C1 (U+0080–U+009F,
    // 0xc2 then 0x80–0x9f in UTF-8): text without those bytes is looked at byte by byte only
    // (a million exported records).
    // (A fold over blocks, not `any`, so that the compiler vectorises it.)
    let suspect = |b: &u8| *b < 0x20 || *b == 0x7f || *b == 0xc2;
    let clean = text
        .as_bytes()
        .chunks(64)
        .all(|block| !block.iter().fold(false, |seen, b| seen | suspect(b)));
    if clean || !text.chars().any(escaped) {
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

/// Where stderr writes go while a run's queue is open (see [`queue_stderr`]).
static STDERR_QUEUE: Mutex<Option<Sender<Vec<u8>>>> = Mutex::new(None);

/// The open stderr queue; [`StderrQueue::settle`] closes it.
pub(crate) struct StderrQueue {
    done: Receiver<()>,
}

/// From now on, stderr is written by a thread of its own: every write of this module and of
/// the log is queued and never waits for the terminal. `None` when the thread cannot start
/// (writes stay direct).
pub(crate) fn queue_stderr() -> Option<StderrQueue> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name("stepguard-stderr".into())
        .spawn(move || {
            let mut err = io::stderr();
            for bytes in rx {
                // A closed stderr leaves nowhere to report to; ignoring is the only option.
                let _ = err.write_all(&bytes);
            }
            let _ = done_tx.send(());
        })
        .ok()?;
    *STDERR_QUEUE.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    Some(StderrQueue { done })
}

impl StderrQueue {
    /// Closes the queue (later writes are direct) and waits until `until` for what is queued to
    /// be written; false when the terminal did not take it in time (it is left behind).
    pub(crate) fn settle(self, until: Instant) -> bool {
        drop(
            STDERR_QUEUE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        self.done
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

/// Writes `bytes` on stderr: queued while a run's queue is open, else directly.
fn write_err(bytes: Vec<u8>) {
    let bytes = {
        let queue = STDERR_QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        match queue.as_ref() {
            Some(tx) => match tx.send(bytes) {
                Ok(()) => return,
                Err(mpsc::SendError(bytes)) => bytes,
            },
            None => bytes,
        }
    };
    // A closed stderr leaves nowhere to report to; ignoring is the only option.
    let _ = io::stderr().write_all(&bytes);
}

/// One event of the log, written on stderr as a whole when dropped (queued while a run's queue
/// is open): the log's writer (`tracing_subscriber`'s `MakeWriter`).
#[derive(Default)]
pub(crate) struct LogEvent(Vec<u8>);

impl io::Write for LogEvent {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            write_err(std::mem::take(&mut self.0));
        }
    }
}

/// Writes a diagnostic line on stderr, e.g. `stepguard: warning: …`.
pub(crate) fn diag(level: &str, text: impl AsRef<str>) {
    let level = match (stderr_color(), level) {
        (true, "error") => format!("{BOLD_RED}error:{RESET}"),
        (true, "warning") => format!("{BOLD_YELLOW}warning:{RESET}"),
        _ => format!("{level}:"),
    };
    let text = printable(text.as_ref());
    write_err(format!("stepguard: {level} {text}\n").into_bytes());
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
    write_err(format!("stepguard: {text}\n").into_bytes());
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
