//! The engine: start the agent, then own every decision until the run ends.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use stepguard_core::verdict::TerminatedBy;
use stepguard_core::{StepLedger, StepLimit};
use stepguard_supervisor::{ExitStatus, Reaper, StopReport};

use crate::reader::{ReaderEnd, Resume, StreamReader};
use crate::report::{Ending, RunReport};
use crate::spec::{Breach, LimitDecision, Progress, RunObserver, RunSpec, RunStarted, StdinMode};

/// Held for the whole of a run: runs in one process take turns (see the crate docs).
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How often the engine wakes when nothing happens (deadline checks, progress ticks).
const TICK: Duration = Duration::from_millis(200);

/// What the other threads tell the engine.
pub(crate) enum Event {
    /// The reader stopped right after the line whose step exceeded the budget.
    Breach { step: u64 },
    /// The reader reached the end of the agent's output (or gave up).
    ReaderDone(Box<ReaderEnd>),
    /// The agent process exited.
    ChildExited(ExitStatus),
    /// A signal arrived (or an [`Interrupter`] was used): stop the run, starting with it.
    Interrupt(i32),
}

/// Stops a run from another thread as a signal to stepguard would (slug `interrupted`).
#[derive(Clone)]
pub struct Interrupter(Sender<Event>);

impl Interrupter {
    /// Stops the run, sending `signal` (e.g. `libc::SIGINT`'s number) to the tree first; false
    /// when the run is over.
    pub fn interrupt(&self, signal: i32) -> bool {
        self.0.send(Event::Interrupt(signal)).is_ok()
    }
}

/// One run, ready to start.
pub struct Runner {
    spec: RunSpec,
    events_tx: Sender<Event>,
    events: Receiver<Event>,
}

impl Runner {
    /// Prepares a run of `spec`.
    pub fn new(spec: RunSpec) -> Self {
        let (events_tx, events) = mpsc::channel();
        Runner {
            spec,
            events_tx,
            events,
        }
    }

    /// Returns a handle that stops the run as a forwarded signal would.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(self.events_tx.clone())
    }

    /// Runs the agent to its end and reports the run; `observers` see its start, progress and
    /// end. Never panics on the agent's behaviour: every way a run can go is in the report.
    /// A second run started meanwhile in the same process waits for this one to end, so never
    /// start a run from an observer or a policy (it would wait for itself).
    pub fn run(self, observers: &mut [&mut dyn RunObserver]) -> RunReport {
        let Runner {
            spec,
            events_tx,
            events,
        } = self;
        // A poisoned lock only means an earlier run panicked; this one starts clean.
        let _turn = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let RunSpec {
            command,
            counter,
            budget,
            budget_source,
            meta,
            grace,
            timeout,
            stdin,
            mut on_limit,
            output,
            forward_signals,
        } = spec;
        let spec = Labels {
            command,
            budget,
            budget_source,
            meta,
        };
        if let Err(e) = stepguard_supervisor::become_subreaper() {
            tracing::warn!(
                "cannot become a child subreaper ({e}); orphaned agent processes may escape"
            );
        }
        let start = Instant::now();
        let started_at = SystemTime::now();
        let Some((program, args)) = spec.command.split_first() else {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command");
            return finish(spec, Ending::not_started(e, start, started_at), observers);
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(match stdin {
                StdinMode::Inherit => Stdio::inherit(),
                StdinMode::Null => Stdio::null(),
            });
        let mut child = match stepguard_supervisor::spawn_in_group(&mut cmd) {
            Ok(child) => child,
            Err(e) => return finish(spec, Ending::not_started(e, start, started_at), observers),
        };
        let pgid = child.id();
        let asks = on_limit.asks();
        let (resume_tx, resume) = mpsc::channel();
        let steps = Arc::new(AtomicU64::new(0));
        let reaper = Reaper::start(pgid, events_tx.clone(), Event::ChildExited);
        let signals = forward_signals
            .then(|| listen_for_signals(events_tx.clone()))
            .flatten();
        let stdout = child.stdout.take();
        let reader = StreamReader {
            counter,
            ledger: StepLedger::new(spec.budget),
            output,
            events: events_tx.clone(),
            resume,
            steps: Arc::clone(&steps),
            // Nobody will be asked: the reader may signal the group at once.
            term_on_breach: (!asks).then_some(pgid),
        };
        let reader = std::thread::Builder::new()
            .name("stepguard-reader".into())
            .spawn(move || {
                let events = reader.events.clone();
                let end = match stdout {
                    Some(pipe) => reader.read(pipe),
                    None => reader.read(std::io::empty()),
                };
                let _ = events.send(Event::ReaderDone(Box::new(end)));
            });
        let (reader, reader_failed) = match reader {
            Ok(handle) => (Some(handle), false),
            Err(e) => {
                // Without a reader nothing is counted: fail closed (the tree is stopped below).
                tracing::error!("cannot start the stream reader: {e}");
                let _ = events_tx.send(Event::ReaderDone(Box::new(ReaderEnd {
                    stats: None,
                    ledger: StepLedger::new(spec.budget),
                    oversized_lines: 0,
                    truncated_last_line: false,
                    plugin_error: None,
                })));
                (None, true)
            }
        };
        drop(events_tx);
        for o in observers.iter_mut() {
            o.started(&RunStarted {
                pid: pgid,
                command: &spec.command,
                started_at,
                budget: spec.budget,
                budget_source: &spec.budget_source,
                meta: &spec.meta,
            });
        }

        let mut run = Supervision {
            pgid,
            grace,
            limit: spec.budget,
            terminated_by: None,
            stop: None,
            breached_at: None,
            decisions: Vec::new(),
        };
        if reader_failed {
            run.stop(TerminatedBy::Plugin, Signal::TERM);
        }
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let mut child_exit: Option<ExitStatus> = None;
        let mut reader_end: Option<ReaderEnd> = None;
        while child_exit.is_none() || reader_end.is_none() {
            let wait = deadline.map_or(TICK, |d| {
                d.saturating_duration_since(Instant::now()).min(TICK)
            });
            match events.recv_timeout(wait) {
                Ok(Event::Breach { step }) => {
                    run.breached_at.get_or_insert(step);
                    let decision = if asks {
                        stepguard_supervisor::pause_tree(pgid, true);
                        let d = on_limit.decide(&Breach {
                            step,
                            limit: run.limit,
                        });
                        run.decisions.push(d);
                        d
                    } else {
                        LimitDecision::Stop
                    };
                    let resume = match decision {
                        LimitDecision::Stop => Resume::Stop,
                        LimitDecision::Allow(n) => {
                            let raised = run.limit.get().unwrap_or(0).saturating_add(n);
                            let at_least = u32::try_from(step).unwrap_or(u32::MAX);
                            run.limit = StepLimit::Limited(raised.max(at_least));
                            Resume::Continue(run.limit)
                        }
                        LimitDecision::Unlimited => {
                            run.limit = StepLimit::Unlimited;
                            Resume::Continue(run.limit)
                        }
                    };
                    let stopping = matches!(resume, Resume::Stop);
                    let _ = resume_tx.send(resume);
                    if stopping {
                        run.stop(TerminatedBy::Budget, Signal::TERM);
                    } else {
                        stepguard_supervisor::pause_tree(pgid, false);
                    }
                }
                Ok(Event::ChildExited(exit)) => {
                    child_exit = Some(exit);
                    // Nothing the agent started may outlive it; this also closes stdout pipes
                    // that leftover descendants still hold.
                    let report = stepguard_supervisor::stop_tree(pgid, grace);
                    if report.initial > 0 {
                        tracing::info!(
                            processes = report.initial,
                            "stopped processes the agent left behind"
                        );
                    }
                }
                Ok(Event::ReaderDone(end)) => {
                    if end.plugin_error.is_some() {
                        run.stop(TerminatedBy::Plugin, Signal::TERM);
                    }
                    reader_end = Some(*end);
                }
                Ok(Event::Interrupt(sig)) => {
                    let first = Signal::from_named_raw(sig).unwrap_or(Signal::TERM);
                    run.stop(TerminatedBy::Signal, first);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        run.stop(TerminatedBy::Timeout, Signal::TERM);
                    }
                    let progress = Progress {
                        steps: steps.load(Ordering::Relaxed),
                        limit: run.limit,
                        elapsed: start.elapsed(),
                    };
                    for o in observers.iter_mut() {
                        o.tick(&progress);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        drop(reaper);
        if let Some(signals) = signals {
            // Ends the listener thread. The handlers stay installed (doing nothing) for the
            // life of the process: signal-hook never restores the default actions.
            signals.close();
        }
        if let Some(reader) = reader {
            let _ = reader.join();
        }
        let ending = Ending {
            started_at,
            duration: start.elapsed(),
            pid: Some(pgid),
            reader: reader_end,
            child_exit,
            terminated_by: run.terminated_by,
            stop: run.stop,
            breached_at: run.breached_at,
            decisions: run.decisions,
            spawn_error: None,
        };
        finish(spec, ending, observers)
    }
}

/// The engine's decisions so far.
struct Supervision {
    pgid: u32,
    grace: Duration,
    limit: StepLimit,
    terminated_by: Option<TerminatedBy>,
    stop: Option<StopReport>,
    breached_at: Option<u64>,
    decisions: Vec<LimitDecision>,
}

impl Supervision {
    /// Stops the tree once, for the first reason that asked.
    fn stop(&mut self, why: TerminatedBy, first: Signal) {
        if self.terminated_by.is_some() {
            return;
        }
        self.terminated_by = Some(why);
        tracing::info!(reason = why.as_str(), "stopping the agent's process tree");
        let report = stepguard_supervisor::stop_tree_with(self.pgid, first, self.grace);
        tracing::debug!(?report, "process tree stopped");
        self.stop = Some(report);
    }
}

/// What the report needs of the spec once the run is under way.
pub(crate) struct Labels {
    pub command: Vec<String>,
    pub budget: StepLimit,
    pub budget_source: String,
    pub meta: crate::spec::RunMeta,
}

/// Builds the report and lets the observers see it.
fn finish(spec: Labels, ending: Ending, observers: &mut [&mut dyn RunObserver]) -> RunReport {
    let mut report = RunReport::new(&spec, ending);
    for o in observers.iter_mut() {
        o.finished(&mut report);
    }
    report
}

/// Turns SIGINT, SIGTERM and SIGHUP into interrupts of the run.
fn listen_for_signals(events: Sender<Event>) -> Option<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).ok()?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("stepguard-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if events.send(Event::Interrupt(sig)).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    Some(handle)
}
