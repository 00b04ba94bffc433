//! The reader thread: counts the agent's stdout, passes through what was counted, and stops
//! right after the line whose step exceeds the budget.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};

use stepguard_core::loops::LoopFound;
use stepguard_core::{StepLedger, StepLimit};
use stepguard_jsonl::{LineSplitter, SplitChunk};
use stepguard_plugin_api::host::{CallError, Counter};
use stepguard_plugin_api::{CounterStats, LineReport};

use crate::engine::Event;
use crate::stream::{LoopWatch, Recognition, reconcile};

/// The engine's answer to a breach.
pub(crate) enum Resume {
    /// Keep counting under a new limit.
    Continue(StepLimit),
    /// Stop reading: the tree is being stopped.
    Stop,
}

/// How the reader ended.
pub(crate) struct ReaderEnd {
    pub stats: Option<CounterStats>,
    pub ledger: StepLedger,
    pub oversized_lines: u64,
    pub truncated_last_line: bool,
    pub plugin_error: Option<CallError>,
    pub recognition: Recognition,
    /// The loops found, when loops were looked for.
    pub loops: Option<Vec<LoopFound>>,
}

/// What the engine sees of the stream while the reader blocks on it.
#[derive(Default)]
pub(crate) struct StreamWatch {
    /// When the first line arrived (ms since the run's start, plus one), 0 before.
    pub first_output: AtomicU64,
    /// True once a line was recognised as the provider's stream.
    pub recognised: AtomicBool,
    /// When the latest output arrived (ms since the run's start, plus one), 0 before any.
    pub last_output: AtomicU64,
}

/// The reader thread's inputs.
pub(crate) struct StreamReader {
    pub counter: Counter,
    pub ledger: StepLedger,
    pub output: Box<dyn Write + Send>,
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
    /// Reads `pipe` to its end (or to a breach the engine stops at) and reports how it ended.
    pub fn read(self, pipe: impl Read) -> ReaderEnd {
        let StreamReader {
            mut counter,
            mut ledger,
            mut output,
            events,
            resume,
            steps,
            feeding_since,
            started,
            term_on_breach,
            watch,
            recognition_lines,
            mut loops,
            usage,
        } = self;
        let mut lines = LineSplitter::new(pipe);
        let mut passthrough = true;
        let mut oversized_lines = 0;
        let mut plugin_error = None;
        let mut recognition = Recognition::default();
        let mut told_unrecognised = false;
        // The per-line reports, summed: the counts that win over `finish()`'s.
        let mut totals = LineReport::empty();
        loop {
            let chunk = match lines.next_chunk() {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("reading the agent's output failed: {e}");
                    break;
                }
            };
            let now = started.elapsed().as_millis() as u64 + 1;
            if watch.first_output.load(Ordering::Relaxed) == 0 {
                watch.first_output.store(now, Ordering::Relaxed);
            }
            watch.last_output.store(now, Ordering::Relaxed);
            let bytes = match chunk {
                SplitChunk::Lines(bytes) => bytes,
                SplitChunk::Oversized(len) => {
                    oversized_lines += 1;
                    recognition.lines += 1;
                    tracing::warn!(
                        bytes = len,
                        "a line over the length cap was counted as noise and not passed through"
                    );
                    continue;
                }
            };
            let allowance = match ledger.limit() {
                StepLimit::Limited(n) => u64::from(n).saturating_sub(ledger.steps()),
                StepLimit::Unlimited => u64::MAX,
            };
            feeding_since.store(started.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
            let fed = recognition.feed(&mut counter, bytes, allowance);
            feeding_since.store(0, Ordering::Relaxed);
            let report = match fed {
                Ok(r) => r,
                Err(e) => {
                    // Fail closed: an agent we cannot count is an agent we cannot bound.
                    plugin_error = Some(e);
                    break;
                }
            };
            if recognition.recognised {
                watch.recognised.store(true, Ordering::Relaxed);
            } else if recognition.lines >= recognition_lines && !told_unrecognised {
                told_unrecognised = true;
                let _ = events.send(Event::Unrecognized {
                    lines: recognition.lines,
                });
            }
            stepguard_plugin_api::guest::add_report(&mut totals, &report.sum);
            ledger.begin(u64::from(report.sum.steps_begun));
            ledger.complete(u64::from(report.sum.steps_completed));
            steps.store(ledger.steps(), Ordering::Relaxed);
            if let Some(watch) = loops.as_mut() {
                feeding_since.store(started.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                let seen = watch.after_chunk(&mut counter, &report, ledger.steps());
                feeding_since.store(0, Ordering::Relaxed);
                match seen {
                    Ok(Some(found)) => {
                        let _ = events.send(Event::Loop(found));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        plugin_error = Some(e);
                        break;
                    }
                }
            }
            if usage && report.sum.has(LineReport::USAGE) {
                feeding_since.store(started.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                let taken = counter.take_usage();
                feeding_since.store(0, Ordering::Relaxed);
                match taken {
                    Ok(Some(delta)) => {
                        let _ = events.send(Event::StreamUsage(delta));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        plugin_error = Some(e);
                        break;
                    }
                }
            }
            // When nobody will be asked, signal the group at once, before even passing the line
            // through: this is the latency users feel. The engine then stops the rest.
            if report.stopped
                && let Some(pgid) = term_on_breach
            {
                stepguard_supervisor::term_group(pgid);
            }
            let consumed = usize::try_from(report.consumed)
                .unwrap_or(bytes.len())
                .min(bytes.len());
            if passthrough
                && let Err(e) = output
                    .write_all(&bytes[..consumed])
                    .and_then(|()| output.flush())
            {
                // A closed downstream (e.g. `| head`) does not stop the agent; counting goes on.
                tracing::debug!("passthrough stopped: {e}");
                passthrough = false;
            }
            if report.stopped {
                let rest = bytes.len() - consumed;
                lines.give_back(rest);
                let _ = events.send(Event::Breach {
                    step: ledger.steps(),
                });
                match resume.recv() {
                    Ok(Resume::Continue(limit)) => {
                        ledger.set_limit(limit);
                    }
                    Ok(Resume::Stop) | Err(_) => {
                        return ReaderEnd {
                            stats: counter.finish().ok().map(|mut s| {
                                reconcile(&mut s, &totals);
                                s
                            }),
                            ledger,
                            oversized_lines,
                            truncated_last_line: false,
                            plugin_error,
                            recognition,
                            loops: loops.map(|w| w.found),
                        };
                    }
                }
            }
        }
        let stats = match counter.finish() {
            Ok(mut s) => {
                reconcile(&mut s, &totals);
                Some(s)
            }
            Err(e) => {
                plugin_error.get_or_insert(e);
                None
            }
        };
        ReaderEnd {
            stats,
            ledger,
            oversized_lines,
            truncated_last_line: lines.last_line_unterminated,
            plugin_error,
            recognition,
            loops: loops.map(|w| w.found),
        }
    }
}
