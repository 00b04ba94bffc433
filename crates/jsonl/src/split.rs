//! Splitting a byte stream into lines, with a cap on line length.

use std::io::{self, BufRead};

/// The longest line kept whole (256 MiB); longer lines are reported as [`SplitLine::Oversized`]
/// and their bytes discarded, so memory stays bounded whatever the stream holds.
pub const MAX_LINE_BYTES: usize = 256 << 20;

/// One line from a [`LineSplitter`].
#[derive(Debug, PartialEq, Eq)]
pub enum SplitLine<'a> {
    /// A complete line without its `\n` (and without a trailing `\r`).
    Line(&'a [u8]),
    /// A line longer than the cap: its length in bytes (content discarded).
    Oversized(u64),
}

/// Splits a reader into lines on `\n` only, reusing one buffer.
pub struct LineSplitter<R> {
    reader: R,
    buf: Vec<u8>,
    max: usize,
    /// True when the last line returned had no terminating newline (a cut stream).
    pub last_line_unterminated: bool,
}

impl<R: BufRead> LineSplitter<R> {
    /// Creates a splitter with the default cap.
    pub fn new(reader: R) -> Self {
        Self::with_max(reader, MAX_LINE_BYTES)
    }

    /// Creates a splitter with a custom cap (for tests and tight memory budgets).
    pub fn with_max(reader: R, max: usize) -> Self {
        LineSplitter {
            reader,
            buf: Vec::with_capacity(64 * 1024),
            max,
            last_line_unterminated: false,
        }
    }

    /// Returns the next line, or `None` at the end of the stream.
    pub fn next_line(&mut self) -> io::Result<Option<SplitLine<'_>>> {
        self.buf.clear();
        let mut total: u64 = 0;
        let mut oversized = false;
        let mut saw_newline = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                break;
            }
            let (chunk, consumed, done) = match memchr::memchr(b'\n', available) {
                Some(pos) => (&available[..pos], pos + 1, true),
                None => (available, available.len(), false),
            };
            total += chunk.len() as u64;
            if !oversized {
                if self.buf.len() + chunk.len() > self.max {
                    oversized = true;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            self.reader.consume(consumed);
            if done {
                saw_newline = true;
                break;
            }
        }
        if total == 0 && !saw_newline {
            return Ok(None);
        }
        self.last_line_unterminated = !saw_newline;
        if oversized {
            return Ok(Some(SplitLine::Oversized(total)));
        }
        let line = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
        Ok(Some(SplitLine::Line(line)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize, cap: usize) -> Vec<String> {
        let reader = io::BufReader::with_capacity(cap, input);
        let mut s = LineSplitter::with_max(reader, max);
        let mut out = Vec::new();
        while let Some(l) = s.next_line().unwrap() {
            out.push(match l {
                SplitLine::Line(b) => String::from_utf8_lossy(b).into_owned(),
                SplitLine::Oversized(n) => format!("<oversized {n}>"),
            });
        }
        out
    }

    #[test]
    fn splits_on_newline_only_and_trims_cr() {
        let input = "a\r\nb\u{2028}c\n\nlast".as_bytes();
        assert_eq!(lines(input, 100, 3), ["a", "b\u{2028}c", "", "last"]);
    }

    #[test]
    fn oversized_lines_are_reported_not_kept() {
        let input = b"short\n0123456789abcdef\nok\n";
        assert_eq!(lines(input, 8, 4), ["short", "<oversized 16>", "ok"]);
    }

    #[test]
    fn unterminated_last_line_is_flagged() {
        let mut s = LineSplitter::new(&b"x\ny"[..]);
        assert_eq!(s.next_line().unwrap(), Some(SplitLine::Line(b"x")));
        assert!(!s.last_line_unterminated);
        assert_eq!(s.next_line().unwrap(), Some(SplitLine::Line(b"y")));
        assert!(s.last_line_unterminated);
        assert_eq!(s.next_line().unwrap(), None);
    }

    #[test]
    fn empty_input_has_no_lines() {
        assert!(lines(b"", 10, 4).is_empty());
        assert_eq!(lines(b"\n", 10, 4), [""]);
    }
}
