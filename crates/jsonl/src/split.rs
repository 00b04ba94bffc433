//! Splitting a byte stream into lines, with a cap on line length.

use std::io::{self, Read};

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

/// A run of lines from [`LineSplitter::next_chunk`].
#[derive(Debug, PartialEq, Eq)]
pub enum SplitChunk<'a> {
    /// One or more whole lines, each ending in `\n` except possibly the last one of the stream.
    Lines(&'a [u8]),
    /// A line longer than the cap: its length in bytes (content discarded).
    Oversized(u64),
}

/// Bytes read per `read` call: small enough to stay in cache, large enough to amortise calls.
const CHUNK: usize = 64 << 10;

/// Splits a reader into lines on `\n` only, reading into one reusable buffer and handing out
/// slices of it (no copy per line).
pub struct LineSplitter<R> {
    reader: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes.
    start: usize,
    /// End of the valid bytes.
    end: usize,
    /// Bytes in `start..scanned` are known to hold no newline.
    scanned: usize,
    max: usize,
    eof: bool,
    /// Bytes of an oversized line discarded so far.
    discarded: u64,
    /// True when the last line returned had no terminating newline (a cut stream).
    pub last_line_unterminated: bool,
}

impl<R: Read> LineSplitter<R> {
    /// Creates a splitter with the default cap.
    pub fn new(reader: R) -> Self {
        Self::with_max(reader, MAX_LINE_BYTES)
    }

    /// Creates a splitter with a custom cap (for tests and tight memory budgets).
    pub fn with_max(reader: R, max: usize) -> Self {
        LineSplitter {
            reader,
            buf: vec![0; CHUNK],
            start: 0,
            end: 0,
            scanned: 0,
            max,
            eof: false,
            discarded: 0,
            last_line_unterminated: false,
        }
    }

    /// Returns the next line, or `None` at the end of the stream.
    pub fn next_line(&mut self) -> io::Result<Option<SplitLine<'_>>> {
        loop {
            if let Some(pos) = memchr::memchr(b'\n', &self.buf[self.scanned..self.end]) {
                let nl = self.scanned + pos;
                let (start, discarded) = (self.start, std::mem::take(&mut self.discarded));
                self.start = nl + 1;
                self.scanned = self.start;
                self.last_line_unterminated = false;
                if discarded > 0 {
                    return Ok(Some(SplitLine::Oversized(discarded + (nl - start) as u64)));
                }
                let line = &self.buf[start..nl];
                return Ok(Some(SplitLine::Line(
                    line.strip_suffix(b"\r").unwrap_or(line),
                )));
            }
            self.scanned = self.end;
            if self.eof {
                let (start, discarded) = (self.start, std::mem::take(&mut self.discarded));
                if start == self.end && discarded == 0 {
                    return Ok(None);
                }
                self.start = self.end;
                self.last_line_unterminated = true;
                if discarded > 0 {
                    return Ok(Some(SplitLine::Oversized(
                        discarded + (self.end - start) as u64,
                    )));
                }
                let line = &self.buf[start..self.end];
                return Ok(Some(SplitLine::Line(
                    line.strip_suffix(b"\r").unwrap_or(line),
                )));
            }
            self.refill()?;
        }
    }

    /// Returns every whole line currently buffered as one slice (reading when none is), or
    /// `None` at the end of the stream. Cheaper than [`LineSplitter::next_line`] when lines are
    /// handed on in bulk.
    pub fn next_chunk(&mut self) -> io::Result<Option<SplitChunk<'_>>> {
        loop {
            if self.discarded > 0 {
                // Finish the oversized line first: it ends at the first newline.
                if let Some(pos) = memchr::memchr(b'\n', &self.buf[self.scanned..self.end]) {
                    let nl = self.scanned + pos;
                    let len = std::mem::take(&mut self.discarded) + (nl - self.start) as u64;
                    self.start = nl + 1;
                    self.scanned = self.start;
                    return Ok(Some(SplitChunk::Oversized(len)));
                }
            } else if let Some(pos) = memchr::memrchr(b'\n', &self.buf[self.scanned..self.end]) {
                let nl = self.scanned + pos;
                let start = self.start;
                self.start = nl + 1;
                self.scanned = self.start;
                self.last_line_unterminated = false;
                return Ok(Some(SplitChunk::Lines(&self.buf[start..=nl])));
            }
            self.scanned = self.end;
            if self.eof {
                let (start, discarded) = (self.start, std::mem::take(&mut self.discarded));
                self.start = self.end;
                if discarded > 0 {
                    self.last_line_unterminated = true;
                    return Ok(Some(SplitChunk::Oversized(
                        discarded + (self.end - start) as u64,
                    )));
                }
                if start == self.end {
                    return Ok(None);
                }
                self.last_line_unterminated = true;
                return Ok(Some(SplitChunk::Lines(&self.buf[start..self.end])));
            }
            self.refill()?;
        }
    }

    /// Returns the last `n` bytes of the chunk just handed out to the buffer, so the next call
    /// starts with them (used to hold back the lines after a budget breach).
    pub fn give_back(&mut self, n: usize) {
        let n = n.min(self.start);
        self.start -= n;
        self.scanned = self.start;
    }

    fn refill(&mut self) -> io::Result<()> {
        // Move the unfinished line to the front.
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.scanned -= self.start;
            self.start = 0;
        }
        // Over the cap: forget the bytes, remember how many.
        if self.end > self.max {
            self.discarded += self.end as u64;
            self.end = 0;
            self.scanned = 0;
        }
        if self.buf.len() - self.end < CHUNK {
            let grown = (self.buf.len() * 2).max(self.end + CHUNK);
            self.buf.resize(grown, 0);
        }
        let upto = (self.end + CHUNK).min(self.buf.len());
        loop {
            match self.reader.read(&mut self.buf[self.end..upto]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize, cap: usize) -> Vec<String> {
        let reader = Trickle { data: input, cap };
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

    /// A reader that returns at most `cap` bytes per call, like a slow pipe.
    struct Trickle<'a> {
        data: &'a [u8],
        cap: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.data.len().min(self.cap).min(out.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn lines_spanning_many_reads_and_growth() {
        let long = "y".repeat(3 * CHUNK + 7);
        let input = format!("a\n{long}\nb");
        assert_eq!(
            lines(input.as_bytes(), usize::MAX, 1000),
            ["a".to_owned(), long, "b".to_owned()]
        );
        assert_eq!(
            lines(input.as_bytes(), CHUNK, 4096),
            [
                "a".to_owned(),
                format!("<oversized {}>", 3 * CHUNK + 7),
                "b".to_owned()
            ]
        );
    }

    #[test]
    fn splits_on_newline_only_and_trims_cr() {
        let input = "a\r\nb\u{2028}c\n\nlast".as_bytes();
        assert_eq!(lines(input, 100, 3), ["a", "b\u{2028}c", "", "last"]);
    }

    fn chunks(input: &[u8], max: usize, cap: usize) -> Vec<String> {
        let mut s = LineSplitter::with_max(Trickle { data: input, cap }, max);
        let mut out = Vec::new();
        while let Some(c) = s.next_chunk().unwrap() {
            out.push(match c {
                SplitChunk::Lines(b) => String::from_utf8_lossy(b).into_owned(),
                SplitChunk::Oversized(n) => format!("<oversized {n}>"),
            });
        }
        out
    }

    #[test]
    fn chunks_hold_whole_lines_only() {
        let input = b"a\nbb\nccc\ndddd\ne";
        let joined: String = chunks(input, 100, 3).concat();
        assert_eq!(joined, "a\nbb\nccc\ndddd\ne");
        for c in chunks(input, 100, 3) {
            assert!(c.ends_with('\n') || c == "e", "{c:?}");
        }
        assert_eq!(chunks(input, 100, 1000), ["a\nbb\nccc\ndddd\n", "e"]);
        assert_eq!(
            chunks(b"ok\n0123456789abcdef\nfine\n", 8, 4),
            ["ok\n", "<oversized 16>", "fine\n"]
        );
        assert!(chunks(b"", 10, 4).is_empty());
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
