//! `stepguard run`: supervise an agent CLI, pass its output through, enforce its step budget.
//!
//! Threads: a reader (the agent's stdout: count a run of whole lines, pass through what was
//! counted, stop right after the breaching line), a reaper (collects exits, including orphans
//! reparented to stepguard as a subreaper), a signal listener, and the main thread, which owns
//! every decision: stop the tree, ask a human, or let the run finish.

use std::io::{self, IsTerminal as _, Write as _};
use std::process::{ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use stepguard_core::verdict::{self, ChildExit, StreamVerdict, TerminatedBy};
use stepguard_core::{ExitCode, FailureSlug, RunStats, StepLedger, StepLimit, budget};
use stepguard_jsonl::{LineSplitter, SplitChunk};
use stepguard_plugin_api::CounterStats;
use stepguard_plugin_api::host::{CallError, Counter};
use stepguard_store::{FinishedRun, NewRun, RunId, Store};
use stepguard_supervisor::{ExitStatus, Reaper};

use crate::args::{Cli, OnLimit, RunArgs, StdinMode};
use crate::commands::count::StreamReport;
use crate::exit::UsageError;
use crate::{output, providers, settings};

/// What the other threads tell the main thread.
enum Event {
    /// The reader stopped right after the line whose step exceeded the budget.
    Breach { step: u64 },
    /// The reader reached the end of the agent's output (or gave up).
    ReaderDone(Box<ReaderEnd>),
    /// The agent process exited.
    ChildExited(ExitStatus),
    /// stepguard received a signal.
    Signal(i32),
}

/// The main thread's answer to a breach.
enum Decision {
    /// Keep counting under a new limit.
    Continue(StepLimit),
    /// Stop reading: the tree is being stopped.
    Stop,
}

/// How the reader ended.
struct ReaderEnd {
    stats: Option<CounterStats>,
    ledger: StepLedger,
    oversized_lines: u64,
    truncated_last_line: bool,
    plugin_error: Option<CallError>,
}

/// State shared with the status line.
struct Shared {
    steps: AtomicU64,
    /// True while a status line is drawn on stderr (it must be cleared before stdout writes when
    /// both are the same terminal).
    status_drawn: Mutex<bool>,
}

/// The `--summary-file` object: `count --json`'s fields plus the run's.
#[derive(Serialize)]
struct RunSummary<'a> {
    file: Option<&'a str>,
    #[serde(flatten)]
    stream: StreamReport<'a>,
    max_steps: StepLimit,
    max_steps_source: &'a str,
    exit_code: u8,
    child_exit_code: Option<i32>,
    child_signal: Option<i32>,
    duration_ms: u64,
    terminated_by: Option<&'static str>,
    breached_at_step: Option<u64>,
    on_limit_decisions: &'a [String],
    command: &'a [String],
}

/// Runs `stepguard run`.
pub fn run(cli: &Cli, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let config = settings::load_config(cli.config.as_deref())?;
    for d in config.diagnostics() {
        output::diag("warning", d.to_string().trim_start_matches("warning: "));
    }
    let resolved = budget::resolve(&settings::budget_request(&args.budget, &config.model))?;
    for w in &resolved.warnings {
        output::diag("warning", w);
    }
    let registry = providers::load_registry(&cli.plugin_dir);
    let selection = providers::select(
        &registry,
        &args.provider,
        args.unit.as_deref(),
        Some(&config),
    )?;
    let manifest = selection.provider.manifest();
    let counter = selection.provider.open_counter(&selection.request)?;

    let mut command = args.command.clone();
    if let (Some(native), Some(limit), false) = (
        &manifest.native_limit,
        resolved.max_steps.get(),
        args.no_native_limit,
    ) && let Some(extra) = native.args_for(&command, limit)
    {
        tracing::info!(args = ?extra, "adding the provider's native limit");
        command.extend(extra);
    }
    tracing::info!(
        max_steps = %resolved.max_steps,
        source = %resolved.source,
        provider = %manifest.name,
        unit = %selection.request.unit,
        "step budget"
    );

    if let Err(e) = stepguard_supervisor::become_subreaper() {
        tracing::warn!(
            "cannot become a child subreaper ({e}); orphaned agent processes may escape"
        );
    }
    let start = Instant::now();
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.stdin(match args.stdin {
        StdinMode::Inherit => Stdio::inherit(),
        StdinMode::Null => Stdio::null(),
    });
    let spawned = stepguard_supervisor::spawn_in_group(&mut cmd);
    let record = || {
        Recorder::begin(
            cli,
            args,
            &config,
            &resolved,
            manifest,
            &selection.request.unit,
            &command,
        )
    };
    let mut child = match spawned {
        Ok(child) => child,
        // A run that could not start is history too.
        Err(e) => {
            return spawn_failed(
                args,
                &resolved,
                &selection.request.unit,
                &command,
                &e,
                start,
                &record(),
            );
        }
    };
    let pgid = child.id();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| UsageError("the agent has no stdout pipe".into()))?;

    let ask =
        args.on_limit == OnLimit::Ask && io::stdin().is_terminal() && io::stderr().is_terminal();
    let (events_tx, events) = mpsc::channel::<Event>();
    let (decisions_tx, decisions) = mpsc::channel::<Decision>();
    let shared = Arc::new(Shared {
        steps: AtomicU64::new(0),
        status_drawn: Mutex::new(false),
    });
    let status = StatusLine::new(!args.quiet, Arc::clone(&shared));
    let reaper = Reaper::start(pgid, events_tx.clone(), Event::ChildExited);
    let _signals = listen_for_signals(events_tx.clone());
    let reader = {
        let reader = StreamReader {
            counter,
            ledger: StepLedger::new(resolved.max_steps),
            events: events_tx.clone(),
            decisions,
            shared: Arc::clone(&shared),
            stdout_is_tty: io::stdout().is_terminal() && status.enabled,
            // Nobody will be asked: the reader may signal the group at once.
            term_on_breach: (!ask).then_some(pgid),
        };
        std::thread::Builder::new()
            .name("stepguard-reader".into())
            .spawn(move || {
                let events = reader.events.clone();
                let end = reader.read(stdout);
                let _ = events.send(Event::ReaderDone(Box::new(end)));
            })?
    };
    drop(events_tx);
    // Opened only now that the reader runs: a slow disk must not delay enforcement.
    let record = record();

    let grace: Duration = args.grace.into();
    let deadline = args.timeout.map(|t| start + Duration::from(t));
    let mut limit = resolved.max_steps;
    let mut terminated_by: Option<TerminatedBy> = None;
    let mut breached_at = None;
    let mut decisions_log: Vec<String> = Vec::new();
    let mut child_exit: Option<ExitStatus> = None;
    let mut reader_end: Option<ReaderEnd> = None;
    let stop = |why: TerminatedBy,
                first: rustix::process::Signal,
                terminated_by: &mut Option<TerminatedBy>| {
        if terminated_by.is_none() {
            *terminated_by = Some(why);
            tracing::info!(reason = why.as_str(), "stopping the agent's process tree");
            let report = stepguard_supervisor::stop_tree_with(pgid, first, grace);
            tracing::debug!(?report, "process tree stopped");
        }
    };

    while child_exit.is_none() || reader_end.is_none() {
        let tick = Duration::from_millis(200);
        let wait = deadline.map_or(tick, |d| {
            d.saturating_duration_since(Instant::now()).min(tick)
        });
        match events.recv_timeout(wait) {
            Ok(Event::Breach { step }) => {
                breached_at.get_or_insert(step);
                let decision = if ask {
                    ask_human(pgid, step, limit, &manifest.name, &status)
                } else {
                    Asked::Stop
                };
                match decision {
                    Asked::Stop => {
                        if ask {
                            decisions_log.push("stop".into());
                        }
                        let _ = decisions_tx.send(Decision::Stop);
                        stop(
                            TerminatedBy::Budget,
                            rustix::process::Signal::TERM,
                            &mut terminated_by,
                        );
                    }
                    Asked::Allow(n) => {
                        decisions_log.push(format!("allow:{n}"));
                        limit = StepLimit::Limited(
                            limit.get().unwrap_or(0).saturating_add(n).max(step as u32),
                        );
                        let _ = decisions_tx.send(Decision::Continue(limit));
                        stepguard_supervisor::pause_tree(pgid, false);
                    }
                    Asked::Unlimited => {
                        decisions_log.push("continue".into());
                        limit = StepLimit::Unlimited;
                        let _ = decisions_tx.send(Decision::Continue(limit));
                        stepguard_supervisor::pause_tree(pgid, false);
                    }
                }
            }
            Ok(Event::ChildExited(exit)) => {
                child_exit = Some(exit);
                // Nothing the agent started may outlive it; this also closes stdout pipes that
                // leftover descendants still hold.
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
                    stop(
                        TerminatedBy::Plugin,
                        rustix::process::Signal::TERM,
                        &mut terminated_by,
                    );
                }
                reader_end = Some(*end);
            }
            Ok(Event::Signal(sig)) => {
                let first = rustix::process::Signal::from_named_raw(sig)
                    .unwrap_or(rustix::process::Signal::TERM);
                stop(TerminatedBy::Signal, first, &mut terminated_by);
            }
            Err(RecvTimeoutError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    stop(
                        TerminatedBy::Timeout,
                        rustix::process::Signal::TERM,
                        &mut terminated_by,
                    );
                }
                status.draw(
                    limit,
                    &manifest.name,
                    &selection.request.unit,
                    start.elapsed(),
                );
                record.progress(shared.steps.load(Ordering::Relaxed));
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    drop(reaper);
    let _ = reader.join();
    status.clear();
    let duration = start.elapsed();

    let end =
        reader_end.ok_or_else(|| UsageError("the stream reader ended without a report".into()))?;
    if let Some(e) = &end.plugin_error {
        output::diag("error", e.to_string());
    }
    let counter_stats = end.stats.clone().unwrap_or_default();
    let stream_verdict = counter_stats.terminal.as_ref().map(|t| StreamVerdict {
        success: t.success,
        slug: t
            .slug
            .as_deref()
            .map(|s| s.parse().unwrap_or(FailureSlug::ProviderError)),
    });
    let child = child_exit.map(|e| match e {
        ExitStatus::Code(c) => ChildExit::Code(c),
        ExitStatus::Signal(s) => ChildExit::Signal(s),
    });
    let judged = verdict::classify(terminated_by, stream_verdict, child);
    let mut stats: RunStats = providers::run_stats(&counter_stats);
    stats.num_steps_computed = Some(end.ledger.steps());
    stats.outcome = judged.outcome;
    stats.slug = judged.slug;
    stats.duration_ms = Some(duration.as_millis() as u64);

    let mut line = stats.summary_line();
    if let (Some(step), Some(TerminatedBy::Budget)) = (breached_at, terminated_by) {
        line.push_str(&format!(
            " | stopped at step {step} of {}",
            resolved.max_steps
        ));
    }
    output::note(line);
    record.finish(&FinishedRun {
        stats: stats.clone(),
        exit_code: i32::from(judged.exit_code.code()),
        child_exit_code: child_exit.and_then(|e| match e {
            ExitStatus::Code(c) => Some(c),
            ExitStatus::Signal(_) => None,
        }),
        terminated_by: terminated_by.map(|t| t.as_str().to_owned()),
        on_limit_decision: (!decisions_log.is_empty()).then(|| decisions_log.join(",")),
    });

    if let Some(path) = &args.summary_file {
        let stream = StreamReport::new(
            &manifest.name,
            &selection.request.unit,
            &stats,
            &counter_stats,
            end.oversized_lines,
            end.truncated_last_line,
        );
        let summary = RunSummary {
            file: None,
            stream,
            max_steps: resolved.max_steps,
            max_steps_source: &resolved.source,
            exit_code: judged.exit_code.code(),
            child_exit_code: child_exit.and_then(|e| match e {
                ExitStatus::Code(c) => Some(c),
                ExitStatus::Signal(_) => None,
            }),
            child_signal: child_exit.and_then(|e| match e {
                ExitStatus::Signal(s) => Some(s),
                ExitStatus::Code(_) => None,
            }),
            duration_ms: duration.as_millis() as u64,
            terminated_by: terminated_by.map(TerminatedBy::as_str),
            breached_at_step: breached_at,
            on_limit_decisions: &decisions_log,
            command: &command,
        };
        write_summary(path, &summary);
    }
    Ok(judged.exit_code)
}

/// The reader thread's inputs.
struct StreamReader {
    counter: Counter,
    ledger: StepLedger,
    events: Sender<Event>,
    decisions: Receiver<Decision>,
    shared: Arc<Shared>,
    stdout_is_tty: bool,
    /// The process group to SIGTERM the moment a breach is seen (when nobody will be asked).
    term_on_breach: Option<u32>,
}

impl StreamReader {
    /// Reads the agent's stdout: counts whole lines, passes through what was counted, and stops
    /// right after the line whose step exceeds the budget, waiting for the main thread's decision.
    fn read(self, pipe: ChildStdout) -> ReaderEnd {
        let StreamReader {
            mut counter,
            mut ledger,
            events,
            decisions,
            shared,
            stdout_is_tty,
            term_on_breach,
        } = self;
        let mut lines = LineSplitter::new(pipe);
        let mut out = io::stdout().lock();
        let mut passthrough = true;
        let mut oversized_lines = 0;
        let mut plugin_error = None;
        loop {
            let chunk = match lines.next_chunk() {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("reading the agent's output failed: {e}");
                    break;
                }
            };
            let bytes = match chunk {
                SplitChunk::Lines(bytes) => bytes,
                SplitChunk::Oversized(len) => {
                    oversized_lines += 1;
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
            let report = match counter.feed_chunk(bytes, allowance) {
                Ok(r) => r,
                Err(e) => {
                    // Fail closed: an agent we cannot count is an agent we cannot bound.
                    plugin_error = Some(e);
                    break;
                }
            };
            ledger.begin(u64::from(report.sum.steps_begun));
            ledger.complete(u64::from(report.sum.steps_completed));
            shared.steps.store(ledger.steps(), Ordering::Relaxed);
            // When nobody will be asked, signal the group at once, before even passing the line
            // through: this is the latency users feel. The main thread then stops the rest.
            if report.stopped
                && let Some(pgid) = term_on_breach
            {
                stepguard_supervisor::term_group(pgid);
            }
            let consumed = usize::try_from(report.consumed)
                .unwrap_or(bytes.len())
                .min(bytes.len());
            if passthrough {
                let mut write = || -> io::Result<()> {
                    if stdout_is_tty {
                        let mut drawn = shared
                            .status_drawn
                            .lock()
                            .unwrap_or_else(|p| p.into_inner());
                        if *drawn {
                            let _ = io::stderr().write_all(b"\r\x1b[2K");
                            *drawn = false;
                        }
                    }
                    out.write_all(&bytes[..consumed])?;
                    out.flush()
                };
                if let Err(e) = write() {
                    // A closed downstream (e.g. `| head`) does not stop the agent; counting goes on.
                    tracing::debug!("passthrough stopped: {e}");
                    passthrough = false;
                }
            }
            if report.stopped {
                // When nobody will be asked, signal the group at once from here: it saves a thread
                // hop; the main thread then stops the rest of the tree.

                let rest = bytes.len() - consumed;
                lines.give_back(rest);
                let _ = events.send(Event::Breach {
                    step: ledger.steps(),
                });
                match decisions.recv() {
                    Ok(Decision::Continue(limit)) => {
                        ledger.set_limit(limit);
                    }
                    Ok(Decision::Stop) | Err(_) => {
                        return ReaderEnd {
                            stats: counter.finish().ok(),
                            ledger,
                            oversized_lines,
                            truncated_last_line: false,
                            plugin_error,
                        };
                    }
                }
            }
        }
        let stats = match counter.finish() {
            Ok(s) => Some(s),
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
        }
    }
}

/// A human's answer at the limit.
enum Asked {
    Stop,
    Allow(u32),
    Unlimited,
}

/// Pauses the tree and asks on the terminal what to do.
fn ask_human(pgid: u32, step: u64, limit: StepLimit, provider: &str, status: &StatusLine) -> Asked {
    stepguard_supervisor::pause_tree(pgid, true);
    status.clear();
    let mut err = io::stderr().lock();
    let _ = writeln!(
        err,
        "stepguard: step budget reached: step {step} began, the budget is {limit} ({provider}). The agent is paused."
    );
    for _ in 0..3 {
        let _ = write!(
            err,
            "stepguard: [s]top now, [a N] allow N more steps, [c]ontinue without a limit? "
        );
        let _ = err.flush();
        let mut answer = String::new();
        match io::stdin().read_line(&mut answer) {
            Ok(0) | Err(_) => return Asked::Stop,
            Ok(_) => {}
        }
        let words: Vec<&str> = answer.split_whitespace().collect();
        match words.as_slice() {
            [] | ["s" | "stop"] => return Asked::Stop,
            ["c" | "continue"] => return Asked::Unlimited,
            ["a" | "allow", n] | [n] if n.parse::<u32>().is_ok_and(|n| n > 0) => {
                return Asked::Allow(n.parse().unwrap_or(1));
            }
            _ => {
                let _ = writeln!(err, "stepguard: answer `s`, `a 5` (any number) or `c`.");
            }
        }
    }
    Asked::Stop
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the main thread.
fn listen_for_signals(events: Sender<Event>) -> Option<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).ok()?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("stepguard-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if events.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    Some(handle)
}

/// The live status line on stderr (only when stderr is a terminal).
struct StatusLine {
    enabled: bool,
    shared: Arc<Shared>,
}

impl StatusLine {
    fn new(wanted: bool, shared: Arc<Shared>) -> Self {
        StatusLine {
            enabled: wanted && io::stderr().is_terminal(),
            shared,
        }
    }

    fn draw(&self, limit: StepLimit, provider: &str, unit: &str, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let steps = self.shared.steps.load(Ordering::Relaxed);
        let mut drawn = self
            .shared
            .status_drawn
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _ = write!(
            io::stderr(),
            "\r\x1b[2Kstepguard: {steps}/{limit} steps | {provider} ({unit}) | {}",
            stepguard_core::stats::format_duration_ms(elapsed.as_millis() as u64)
        );
        *drawn = true;
    }

    fn clear(&self) {
        let mut drawn = self
            .shared
            .status_drawn
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *drawn {
            let _ = io::stderr().write_all(b"\r\x1b[2K");
            *drawn = false;
        }
    }
}

fn write_summary(path: &std::path::Path, summary: &RunSummary<'_>) {
    let written = serde_json::to_vec(summary)
        .map_err(io::Error::other)
        .and_then(|mut json| {
            json.push(b'\n');
            std::fs::write(path, json)
        });
    if let Err(e) = written {
        output::diag(
            "warning",
            format!("cannot write the summary file {}: {e}", path.display()),
        );
    }
}

/// Reports an agent that could not be started (`spawn_failed`, exit 2).
fn spawn_failed(
    args: &RunArgs,
    resolved: &budget::ResolvedBudget,
    unit: &str,
    command: &[String],
    err: &io::Error,
    start: Instant,
    record: &Recorder,
) -> anyhow::Result<ExitCode> {
    let why = match err.kind() {
        io::ErrorKind::NotFound => "command not found".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => err.to_string(),
    };
    output::diag("error", format!("cannot run `{}`: {why}", command[0]));
    let mut stats = RunStats::new(stepguard_core::Outcome::Failed);
    stats.slug = Some(FailureSlug::SpawnFailed);
    stats.duration_ms = Some(start.elapsed().as_millis() as u64);
    output::note(stats.summary_line());
    record.finish(&FinishedRun {
        stats: stats.clone(),
        exit_code: i32::from(ExitCode::Usage.code()),
        child_exit_code: None,
        terminated_by: None,
        on_limit_decision: None,
    });
    if let Some(path) = &args.summary_file {
        let counter_stats = CounterStats::default();
        let stream = StreamReport::new(&args.provider, unit, &stats, &counter_stats, 0, false);
        let summary = RunSummary {
            file: None,
            stream,
            max_steps: resolved.max_steps,
            max_steps_source: &resolved.source,
            exit_code: ExitCode::Usage.code(),
            child_exit_code: None,
            child_signal: None,
            duration_ms: start.elapsed().as_millis() as u64,
            terminated_by: None,
            breached_at_step: None,
            on_limit_decisions: &[],
            command,
        };
        write_summary(path, &summary);
    }
    Ok(ExitCode::Usage)
}

/// The run's row in the history database, when recording is on and the database opened.
struct Recorder {
    row: Option<(Store, RunId)>,
    last_write: std::cell::Cell<Option<Instant>>,
    last_steps: std::cell::Cell<u64>,
}

impl Recorder {
    /// Opens the history and writes the `running` row. A history problem never stops the run:
    /// enforcing the budget comes first, so it is reported and the run goes on unrecorded.
    fn begin(
        cli: &Cli,
        args: &RunArgs,
        config: &stepguard_config::LoadedConfig,
        resolved: &budget::ResolvedBudget,
        manifest: &stepguard_plugin_api::Manifest,
        unit: &str,
        command: &[String],
    ) -> Recorder {
        let none = Recorder {
            row: None,
            last_write: std::cell::Cell::new(None),
            last_steps: std::cell::Cell::new(0),
        };
        if args.no_record {
            return none;
        }
        let cwd = std::env::current_dir().unwrap_or_default();
        let path = stepguard_store::default_location(
            cli.db.as_deref(),
            config.project_dir().as_deref(),
            &cwd,
        );
        let opened = Store::open(&path).and_then(|store| {
            let id = store.begin_run(&NewRun {
                provider: manifest.name.clone(),
                plugin_version: Some(manifest.version.clone()),
                unit: Some(unit.to_owned()),
                task_type: args.budget.task_type.clone(),
                profile: resolved.profile.clone(),
                max_steps: resolved.max_steps.get(),
                max_steps_source: Some(resolved.source.clone()),
                command: command.to_vec(),
                cwd: Some(cwd.display().to_string()),
            })?;
            Ok((store, id))
        });
        match opened {
            Ok(row) => {
                tracing::debug!(db = %path.display(), id = row.1, "recording the run");
                Recorder {
                    row: Some(row),
                    ..none
                }
            }
            Err(e) => {
                output::diag("warning", format!("not recording this run: {e}"));
                none
            }
        }
    }

    /// Writes the live step count, at most once a second (a long run must not hammer the disk).
    fn progress(&self, steps: u64) {
        let Some((store, id)) = &self.row else { return };
        let due = self
            .last_write
            .get()
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if due && steps != self.last_steps.get() {
            if let Err(e) = store.update_progress(*id, steps) {
                tracing::warn!("cannot record progress: {e}");
            }
            self.last_write.set(Some(Instant::now()));
            self.last_steps.set(steps);
        }
    }

    /// Completes the row.
    fn finish(&self, run: &FinishedRun) {
        if let Some((store, id)) = &self.row
            && let Err(e) = store.finish_run(*id, run)
        {
            output::diag("warning", format!("cannot record the end of this run: {e}"));
        }
    }
}
