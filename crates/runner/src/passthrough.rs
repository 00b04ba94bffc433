//! The passthrough: what the reader counted goes to the run's output from a writer thread of
//! its own, through a bounded queue that spills to a temporary file, so that a consumer who
//! stops reading stepguard's output (a pipe nobody reads, a terminal paused with Ctrl-S) never
//! stalls counting.
//!
//! The queue keeps up to [`MEMORY_CAP`] bytes in memory; past that, chunks are appended to an
//! unlinked temporary file (up to [`SPILL_CAP`] bytes) and written out in order once the
//! consumer reads again. The consumer always receives a prefix of what was counted, in order:
//! bytes after the breach point are never queued, and once passthrough stops (the consumer
//! closed its end, the spill is full or cannot be written) it stays stopped.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt as _;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Bytes kept in memory before the queue spills to its file.
pub const MEMORY_CAP: usize = 4 << 20;

/// Bytes the spill file may hold; past that, passthrough stops (counting goes on).
pub const SPILL_CAP: u64 = 1 << 30;

/// How much of the spill file the writer reads at once.
const READ_PIECE: usize = 64 << 10;

/// The engine's end of the passthrough: closes the queue at the end of a run and waits, bounded,
/// for the writer.
pub(crate) struct Passthrough {
    queue: Arc<Queue>,
    done: Receiver<()>,
}

/// The reader's end of the passthrough: queues what was counted, never waits for the consumer.
pub(crate) struct Feed {
    queue: Arc<Queue>,
}

/// The writer's account at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Bytes the reader counted and queued.
    pub queued: u64,
    /// Bytes written to the output.
    pub written: u64,
    /// Bytes that went through the spill file.
    pub spilled: u64,
}

#[derive(Default)]
struct Queue {
    state: Mutex<Spool>,
    ready: Condvar,
}

/// Queued bytes: older ones in memory, newer ones in the file while it holds any.
#[derive(Default)]
struct Spool {
    memory: VecDeque<Vec<u8>>,
    memory_bytes: usize,
    file: Option<File>,
    /// Bytes written to the file since it was last emptied.
    file_end: u64,
    /// Bytes of the file already passed on to the writer.
    file_read: u64,
    /// The reader has finished: the writer drains what is left and ends.
    closed: bool,
    /// Passthrough stopped for good (why, for the log, is said where it happened).
    stopped: bool,
    delivery: Delivery,
}

impl Passthrough {
    /// Starts the writer thread on `output`; `None` when it could not start (the caller passes
    /// nothing through then).
    pub fn start(output: Box<dyn Write + Send>) -> Option<(Feed, Self)> {
        let queue = Arc::new(Queue::default());
        let (done_tx, done) = mpsc::channel();
        let writer_queue = Arc::clone(&queue);
        let spawned = std::thread::Builder::new()
            .name("stepguard-passthrough".into())
            .spawn(move || {
                write_out(&writer_queue, output);
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => Some((
                Feed {
                    queue: Arc::clone(&queue),
                },
                Passthrough { queue, done },
            )),
            Err(e) => {
                tracing::warn!(
                    "cannot start the passthrough writer ({e}): output is not passed through"
                );
                None
            }
        }
    }

    /// Says that nothing more comes and waits until `until` for the writer to pass on what is
    /// queued; returns the account (bytes not yet written are then left behind).
    pub fn finish(self, until: Instant) -> Delivery {
        self.queue.lock().closed = true;
        self.queue.ready.notify_one();
        let finished = self
            .done
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .is_ok();
        let delivery = self.queue.lock().delivery;
        if !finished {
            tracing::warn!(
                "{} bytes of the agent's output were not passed through: the reader of stepguard's output is not reading",
                delivery.queued - delivery.written
            );
        }
        delivery
    }
}

impl Feed {
    /// Queues counted bytes for the output; never waits for the consumer.
    pub fn send(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut spool = self.queue.lock();
        if spool.stopped {
            return;
        }
        spool.delivery.queued += bytes.len() as u64;
        let spilling = spool.file_end > spool.file_read;
        if !spilling && spool.memory_bytes + bytes.len() <= MEMORY_CAP {
            spool.memory_bytes += bytes.len();
            spool.memory.push_back(bytes.to_vec());
        } else if let Err(why) = spool.spill(bytes) {
            tracing::warn!(
                "the reader of stepguard's output stopped reading and {why}: passthrough stops here, counting goes on"
            );
            spool.stopped = true;
        }
        drop(spool);
        self.queue.ready.notify_one();
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Spool> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Spool {
    /// Appends to the spill file (created on first use).
    fn spill(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.file_end + bytes.len() as u64 > SPILL_CAP {
            return Err(format!("{} MiB are queued", SPILL_CAP >> 20));
        }
        if self.file.is_none() {
            let file = tempfile::tempfile()
                .map_err(|e| format!("no temporary file for the queue could be made ({e})"))?;
            self.file = Some(file);
        }
        let file = self.file.as_ref().ok_or("no spill file")?;
        file.write_all_at(bytes, self.file_end)
            .map_err(|e| format!("the queue's temporary file cannot be written ({e})"))?;
        self.file_end += bytes.len() as u64;
        self.delivery.spilled += bytes.len() as u64;
        Ok(())
    }

    /// The next piece to write, oldest first; `None` when nothing is queued.
    fn next_piece(&mut self) -> Option<Vec<u8>> {
        if let Some(piece) = self.memory.pop_front() {
            self.memory_bytes -= piece.len();
            return Some(piece);
        }
        let file = self.file.as_ref()?;
        if self.file_read >= self.file_end {
            return None;
        }
        let len = usize::try_from(self.file_end - self.file_read)
            .unwrap_or(READ_PIECE)
            .min(READ_PIECE);
        let mut piece = vec![0; len];
        if let Err(e) = file.read_exact_at(&mut piece, self.file_read) {
            tracing::warn!(
                "the passthrough queue's temporary file cannot be read ({e}): passthrough stops"
            );
            self.stopped = true;
            return None;
        }
        self.file_read += len as u64;
        if self.file_read == self.file_end {
            // Emptied: the next bytes go to memory again, and the file starts over.
            let _ = file.set_len(0);
            self.file_read = 0;
            self.file_end = 0;
        }
        Some(piece)
    }
}

/// The writer thread: writes queued pieces in order until the reader has finished and the
/// queue is empty, or the output fails.
fn write_out(queue: &Queue, mut output: Box<dyn Write + Send>) {
    loop {
        let piece = {
            let mut spool = queue.lock();
            loop {
                if let Some(piece) = spool.next_piece() {
                    break piece;
                }
                if spool.closed || spool.stopped {
                    return;
                }
                spool = queue.ready.wait(spool).unwrap_or_else(|p| p.into_inner());
            }
        };
        if let Err(e) = output.write_all(&piece).and_then(|()| output.flush()) {
            // A closed downstream (e.g. `| head`) does not stop the agent; counting goes on.
            tracing::debug!("passthrough stopped: {e}");
            let mut spool = queue.lock();
            spool.stopped = true;
            spool.memory.clear();
            spool.memory_bytes = 0;
            return;
        }
        queue.lock().delivery.written += piece.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::SyncSender;
    use std::time::Duration;

    /// An output that takes writes only when the test lets it, collecting them.
    struct Gate {
        open: Receiver<()>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.open.recv();
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn gated() -> (Feed, Passthrough, SyncSender<()>, Arc<Mutex<Vec<u8>>>) {
        let (open_tx, open) = mpsc::sync_channel(0);
        let got = Arc::default();
        let gate = Gate {
            open,
            got: Arc::clone(&got),
        };
        let (feed, pass) = Passthrough::start(Box::new(gate)).unwrap();
        (feed, pass, open_tx, got)
    }

    #[test]
    fn a_stalled_consumer_never_blocks_the_sender_and_gets_every_byte_in_order() {
        let (feed, pass, open, got) = gated();
        // 12 MiB while the consumer reads nothing: memory fills, the rest spills, no wait.
        let mut sent = Vec::new();
        for i in 0..3000u32 {
            let line = format!("{i:05} {}\n", "x".repeat(4090));
            feed.send(line.as_bytes());
            sent.extend_from_slice(line.as_bytes());
        }
        assert!(pass.queue.lock().delivery.spilled > 0);
        // The consumer reads again: everything arrives, in order, exactly once.
        let opener = std::thread::spawn(move || while open.send(()).is_ok() {});
        let delivery = pass.finish(Instant::now() + Duration::from_secs(30));
        assert_eq!(delivery.written, sent.len() as u64);
        assert_eq!(*got.lock().unwrap(), sent);
        drop(opener);
    }

    #[test]
    fn finish_is_bounded_when_the_consumer_never_reads() {
        let (feed, pass, _open, got) = gated();
        feed.send(b"one\n");
        feed.send(b"two\n");
        let t = Instant::now();
        let delivery = pass.finish(Instant::now() + Duration::from_millis(200));
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!((delivery.queued, delivery.written), (8, 0));
        assert!(got.lock().unwrap().is_empty());
    }

    #[test]
    fn a_closed_consumer_stops_passthrough_for_good() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (feed, pass) = Passthrough::start(Box::new(Closed)).unwrap();
        feed.send(b"one\n");
        let delivery = pass.finish(Instant::now() + Duration::from_secs(5));
        assert_eq!(delivery.written, 0);
    }
}
