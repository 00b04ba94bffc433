//! The reader thread: counts the agent's stdout, queues what was counted for the passthrough
//! (which never makes it wait), and stops right after the line whose step exceeds the budget.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};

use stepguard_core::{StepLedger, StepLimit};
use stepguard_jsonl::{LineSplitter, SplitChunk};
use stepguard_plugin_api::host::{CallError, Counter};
use stepguard_plugin_api::{ChunkReport, LineReport};

use crate::event::{Event, ReaderEnd, Resume, StreamWatch};
use crate::passthrough::Feed;
use crate::stream::{LoopWatch, Recognition, reconcile};

/// The reader thread's inputs.
pub(crate) struct StreamReader {
    pub counter: Counter,
    pub ledger: StepLedger,
    /// Where counted bytes go (the passthrough's queue); `None` passes nothing through.
    pub output: Option<Feed>,
    pub events: Sender<Event>,
    pub resume: Receiver<Resume>,
    /// Steps begun so far, for progress ticks.
    pub steps: Arc<AtomicU64>,
    /// When the plugin call under way began (ms since the run's start, plus one), 0 when none
    /// is: the engine abandons a call that does not return.
    pub feeding_since: Arc<AtomicU64>,
    /// The run's start, the clock `feeding_since` is read against.
    pub started: std::time::Instant,
    /// The process group to SIGTERM the moment a breach is seen (when nobody will be asked).
    pub term_on_breach: Option<u32>,
    /// Shared with the engine, which judges how long output has gone unrecognised.
    pub watch: Arc<StreamWatch>,
    /// After this many lines with none recognised, the engine is told.
    pub recognition_lines: u64,
    /// Loop detection, when on.
    pub loops: Option<LoopWatch>,
    /// Whether to ask the counter for the usage a chunk reported (protocol 1.5 plugins, when a
    /// token or cost budget is kept from the stream).
    pub usage: bool,
}

impl StreamReader {
    /// Starts the reader on a thread of its own; `None` when it could not start, in which
    /// case the engine has already been told that the stream ended, uncounted.
    pub fn spawn(
        self,
        stdout: Option<std::process::ChildStdout>,
        budget: StepLimit,
    ) -> Option<std::thread::JoinHandle<()>> {
        let events = self.events.clone();
        let spawned = std::thread::Builder::new()
            .name("stepguard-reader".into())
            .spawn(move || {
                let events = self.events.clone();
                let end = match stdout {
                    Some(pipe) => self.read(pipe),
                    None => self.read(std::io::empty()),
                };
                let _ = events.send(Event::ReaderDone(Box::new(end)));
            });
        match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                // Without a reader nothing is counted: the engine fails closed.
                tracing::error!("cannot start the stream reader: {e}");
                let _ = events.send(Event::ReaderDone(Box::new(ReaderEnd {
                    stats: None,
                    ledger: StepLedger::new(budget),
                    oversized_lines: 0,
                    truncated_last_line: false,
                    plugin_error: None,
                    recognition: Recognition::default(),
                    loops: None,
                })));
                None
            }
        }
    }

    /// Reads `pipe` to its end (or to a breach the engine stops at) and reports how it ended.
    pub fn read(self, pipe: impl Read) -> ReaderEnd {
        let mut lines = LineSplitter::new(pipe);
        let mut reading = Reading {
            reader: self,
            oversized_lines: 0,
            plugin_error: None,
            recognition: Recognition::default(),
            told_unrecognised: false,
            told_mostly: false,
            totals: LineReport::empty(),
        };
        loop {
            let chunk = match lines.next_chunk() {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("reading the agent's output failed: {e}");
                    break;
                }
            };
            reading.saw_output();
            let bytes = match chunk {
                SplitChunk::Lines(bytes) => bytes,
                SplitChunk::Oversized(len) => {
                    reading.oversized(len);
                    continue;
                }
            };
            match reading.chunk(bytes) {
                Ok(Chunk::Counted) => {}
                Ok(Chunk::Breach { rest }) => {
                    lines.give_back(rest);
                    if !reading.breach() {
                        // Stopped: what the counter says at the end is kept, a failure of it
                        // is not the run's (the stop is).
                        return reading.end(false, Finish::Quietly);
                    }
                }
                Err(e) => {
                    // Fail closed: an agent we cannot count is an agent we cannot bound.
                    reading.plugin_error = Some(e);
                    break;
                }
            }
        }
        let truncated = lines.last_line_unterminated;
        reading.end(truncated, Finish::Counted)
    }
}

/// How the reader ends: at the end of the stream, a counter that cannot finish is a plugin
/// failure; after a stop, it is not.
enum Finish {
    Counted,
    Quietly,
}

/// What became of one chunk.
enum Chunk {
    /// Counted and passed through.
    Counted,
    /// Counted up to the line whose step exceeds the budget; `rest` bytes were not consumed.
    Breach { rest: usize },
}

/// The reader's state while it reads.
struct Reading {
    reader: StreamReader,
    oversized_lines: u64,
    plugin_error: Option<CallError>,
    recognition: Recognition,
    told_unrecognised: bool,
    /// True once the engine was told that a recognised stream cannot be counted (mostly not
    /// the provider's, or framed to hide events).
    told_mostly: bool,
    /// The per-line reports, summed: the counts that win over `finish()`'s.
    totals: LineReport,
}

impl Reading {
    /// Output came: the engine's clocks see it.
    fn saw_output(&self) {
        let r = &self.reader;
        let now = r.started.elapsed().as_millis() as u64 + 1;
        if r.watch.first_output.load(Ordering::Relaxed) == 0 {
            r.watch.first_output.store(now, Ordering::Relaxed);
        }
        r.watch.last_output.store(now, Ordering::Relaxed);
    }

    /// A line over the length cap: noise, not passed through.
    fn oversized(&mut self, len: u64) {
        self.oversized_lines += 1;
        self.recognition.lines += 1;
        self.recognition.unrecognised += 1;
        tracing::warn!(
            bytes = len,
            "a line over the length cap was counted as noise and not passed through"
        );
    }

    /// Runs `call` on the counter with the engine's plugin clock running.
    fn timed<T>(&mut self, call: impl FnOnce(&mut Counter, &mut Recognition) -> T) -> T {
        let r = &mut self.reader;
        r.feeding_since.store(
            r.started.elapsed().as_millis() as u64 + 1,
            Ordering::Relaxed,
        );
        let out = call(&mut r.counter, &mut self.recognition);
        r.feeding_since.store(0, Ordering::Relaxed);
        out
    }

    /// Counts one chunk of whole lines, tells the engine what it found, and passes through
    /// what was counted.
    fn chunk(&mut self, bytes: &[u8]) -> Result<Chunk, CallError> {
        let allowance = match self.reader.ledger.limit() {
            StepLimit::Limited(n) => u64::from(n).saturating_sub(self.reader.ledger.steps()),
            StepLimit::Unlimited => u64::MAX,
        };
        let report =
            self.timed(|counter, recognition| recognition.feed(counter, bytes, allowance))?;
        self.judge_recognition();
        self.apply(&report);
        self.find_loops(&report)?;
        self.take_usage(&report)?;
        // When nobody will be asked, signal the group at once, before even passing the line
        // through: this is the latency users feel. The engine then stops the rest.
        if report.stopped
            && let Some(pgid) = self.reader.term_on_breach
        {
            stepguard_supervisor::term_group(pgid);
        }
        let consumed = usize::try_from(report.consumed)
            .unwrap_or(bytes.len())
            .min(bytes.len());
        self.pass_through(&bytes[..consumed]);
        Ok(if report.stopped {
            Chunk::Breach {
                rest: bytes.len() - consumed,
            }
        } else {
            Chunk::Counted
        })
    }

    /// Recognised at last, or too many lines without, or mostly not the provider's after a
    /// recognised start: the engine is told once of each.
    fn judge_recognition(&mut self) {
        let r = &self.reader;
        if self.recognition.recognised {
            r.watch.recognised.store(true, Ordering::Relaxed);
            let why = match self.recognition.refused {
                Some(refusal) => Some(refusal.message()),
                None if self.recognition.mostly_unrecognised() => {
                    Some(self.recognition.mostly_unrecognised_message())
                }
                None => None,
            };
            if let Some(why) = why.filter(|_| !self.told_mostly) {
                self.told_mostly = true;
                let _ = r.events.send(Event::Uncountable(why));
            }
        } else if self.recognition.lines >= r.recognition_lines && !self.told_unrecognised {
            self.told_unrecognised = true;
            let _ = r.events.send(Event::Unrecognized {
                lines: self.recognition.lines,
            });
        }
    }

    /// Applies a chunk's counts to the ledger.
    fn apply(&mut self, report: &ChunkReport) {
        stepguard_plugin_api::guest::add_report(&mut self.totals, &report.sum);
        let r = &mut self.reader;
        r.ledger.begin(u64::from(report.sum.steps_begun));
        r.ledger.complete(u64::from(report.sum.steps_completed));
        r.steps.store(r.ledger.steps(), Ordering::Relaxed);
    }

    /// Feeds the chunk's tool calls to the loop detector, when loops are looked for.
    fn find_loops(&mut self, report: &ChunkReport) -> Result<(), CallError> {
        let Some(mut watch) = self.reader.loops.take() else {
            return Ok(());
        };
        let step = self.reader.ledger.steps();
        let seen = self.timed(|counter, _| watch.after_chunk(counter, report, step));
        self.reader.loops = Some(watch);
        if let Some(found) = seen? {
            let _ = self.reader.events.send(Event::Loop(found));
        }
        Ok(())
    }

    /// Takes the usage the chunk reported, when the budgets are kept from the stream.
    fn take_usage(&mut self, report: &ChunkReport) -> Result<(), CallError> {
        if !self.reader.usage || !report.sum.has(LineReport::USAGE) {
            return Ok(());
        }
        if let Some(delta) = self.timed(|counter, _| counter.take_usage())? {
            let _ = self.reader.events.send(Event::StreamUsage(delta));
        }
        Ok(())
    }

    /// Queues what was counted for the output: a consumer that stops reading never stalls
    /// counting (see [`crate::passthrough`]).
    fn pass_through(&mut self, counted: &[u8]) {
        if let Some(feed) = &self.reader.output {
            feed.send(counted);
        }
    }

    /// Tells the engine of the breach and waits for its answer: true to go on counting
    /// (under the new limit), false to stop reading.
    fn breach(&mut self) -> bool {
        let r = &mut self.reader;
        let _ = r.events.send(Event::Breach {
            step: r.ledger.steps(),
        });
        match r.resume.recv() {
            Ok(Resume::Continue(limit)) => {
                r.ledger.set_limit(limit);
                true
            }
            Ok(Resume::Stop) | Err(_) => false,
        }
    }

    /// How the reader ended: the counter's final stats, reconciled with the line reports.
    fn end(self, truncated_last_line: bool, finish: Finish) -> ReaderEnd {
        let Reading {
            reader,
            mut plugin_error,
            totals,
            ..
        } = self;
        let StreamReader {
            mut counter,
            ledger,
            loops,
            ..
        } = reader;
        let stats = match counter.finish() {
            Ok(mut s) => {
                reconcile(&mut s, &totals);
                Some(s)
            }
            Err(e) => {
                if matches!(finish, Finish::Counted) {
                    plugin_error.get_or_insert(e);
                }
                None
            }
        };
        ReaderEnd {
            stats,
            ledger,
            oversized_lines: self.oversized_lines,
            truncated_last_line,
            plugin_error,
            recognition: self.recognition,
            loops: loops.map(|w| w.found),
        }
    }
}
