//! Writing to the terminal: results on stdout, diagnostics on stderr, broken pipes tolerated.

use std::io::{self, Write as _};

/// Writes one line of command output on stdout.
pub fn line(text: impl AsRef<str>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_ref().as_bytes())?;
    out.write_all(b"\n")
}

/// Writes a value as one line of compact JSON on stdout.
pub fn json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    line(serde_json::to_string(value)?)?;
    Ok(())
}

/// Writes a diagnostic line on stderr, e.g. `stepguard: warning: …`.
pub fn diag(level: &str, text: impl AsRef<str>) {
    // A closed stderr leaves nowhere to report to; ignoring is the only option.
    let _ = writeln!(io::stderr().lock(), "stepguard: {level}: {}", text.as_ref());
}

/// Writes an informational line on stderr, e.g. the run's summary: `stepguard: …`.
pub fn note(text: impl AsRef<str>) {
    // A closed stderr leaves nowhere to report to; ignoring is the only option.
    let _ = writeln!(io::stderr().lock(), "stepguard: {}", text.as_ref());
}

/// Returns true when `err` is a closed stdout (e.g. piped into `head`), which is not a failure.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}
