//! The engine: one run from spec to report, in three rooms. Launch ([`crate::launch`]) starts
//! the agent and its watchers, supervision ([`crate::supervise`]) owns every decision while it
//! runs, and the end ([`crate::end`]) winds it down and builds the report.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use stepguard_core::StepLedger;
use stepguard_core::loops::LoopSettings;
use stepguard_core::verdict::TerminatedBy;
use stepguard_gateway::{Gateway, Pace};
use stepguard_plugin_api::host::Counter;
use stepguard_supervisor::Reaper;

use crate::end::{Leftovers, RECORD_RESERVE, finish, wind_down};
use crate::event::{Event, Interrupter, OutsideLimits, Resume};
use crate::launch::{self, Agent, Env, Launch};
use crate::limit::{AtLimit, Supervision};
use crate::observe::{RunObserver, RunStarted};
use crate::passthrough::Passthrough;
use crate::reader::StreamReader;
use crate::report::{Ending, RunReport};
use crate::spec::{
    Containment, Labels, LimitPolicy, OnUnrecognized, RecognitionWindow, RunSpec, SpendLimits,
    StdinMode, WrapUp,
};
use crate::stream::LoopWatch;
use crate::supervise::{Engine, Launched, Shared};
use crate::watchdog::{Clocks, Watchdogs};

/// Held for the whole of a run: runs in one process take turns (see the crate docs).
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

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

    /// Returns a handle that tells the run a limit kept outside it (a pool other runs share)
    /// is reached: the run wraps up or stops as at its own budget of that measure.
    pub fn outside_limits(&self) -> OutsideLimits {
        OutsideLimits(self.events_tx.clone())
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
        let (labels, parts) = Parts::split(spec);
        if let Err(e) = stepguard_supervisor::become_subreaper() {
            tracing::warn!(
                "cannot become a child subreaper ({e}); orphaned agent processes may escape"
            );
        }
        let start = Instant::now();
        let started_at = SystemTime::now();
        let shared = Shared::default();
        let launched = start_agent(&labels, &parts.launch, &parts.spend, &shared, &events_tx);
        let (agent, gateway) = match launched {
            Ok(started) => started,
            Err(e) => {
                let ending =
                    Ending::not_started(e, start, started_at, Instant::now() + RECORD_RESERVE);
                return finish(labels, ending, observers);
            }
        };
        let run = Run {
            labels,
            agent,
            gateway,
            shared,
            start,
            started_at,
        };
        run.supervise(parts, events_tx, &events, observers)
    }
}

/// The spec, taken apart by the room that uses each part.
struct Parts {
    launch: LaunchParts,
    reading: ReadingParts,
    clocks: Clocks,
    grace: Duration,
    on_limit: Box<dyn LimitPolicy>,
    ask_timeout: Option<Duration>,
    on_unrecognized: OnUnrecognized,
    spend: SpendLimits,
}

/// What launch needs of the spec.
struct LaunchParts {
    env: Env,
    containment: Containment,
    trampoline: Option<std::path::PathBuf>,
    stdin: StdinMode,
    stderr: Option<Box<dyn std::io::Write + Send>>,
    forward_signals: bool,
    wrap_up: Option<WrapUp>,
    counts_requests: bool,
    /// `--timeout`, for the gateway's notices of the time left.
    timeout: Option<Duration>,
}

/// What the reader needs of the spec.
struct ReadingParts {
    counter: Counter,
    output: Box<dyn std::io::Write + Send>,
    recognition: RecognitionWindow,
    loops: Option<LoopSettings>,
}

impl Parts {
    /// The report's labels and the rest of the spec, grouped.
    fn split(spec: RunSpec) -> (Labels, Parts) {
        let RunSpec {
            command,
            counter,
            budget,
            budget_source,
            meta,
            limits,
            clocks,
            confinement,
            recognition,
            io,
            wrap_up,
        } = spec;
        let shown = match &wrap_up {
            Some(_) => command.iter().map(|a| launch::hide_urls(a)).collect(),
            None => command.clone(),
        };
        let labels = Labels {
            command,
            shown,
            budget,
            budget_source,
            meta,
        };
        let watch = Clocks {
            timeout: clocks.timeout,
            idle: clocks.idle,
            startup: clocks.startup,
            first_event: recognition.window.first_event,
            recognition_after: recognition.window.after,
            plugin_timeout: clocks.plugin,
            provider: labels.meta.provider.clone(),
            expects: recognition.expects,
        };
        let parts = Parts {
            launch: LaunchParts {
                env: io.env,
                containment: confinement.containment,
                trampoline: confinement.trampoline,
                stdin: io.stdin,
                stderr: io.stderr,
                forward_signals: confinement.forward_signals,
                wrap_up,
                counts_requests: counter.counts_model_calls(),
                timeout: clocks.timeout,
            },
            reading: ReadingParts {
                counter,
                output: io.output,
                recognition: recognition.window,
                loops: limits.loops,
            },
            clocks: watch,
            grace: clocks.grace,
            on_limit: limits.on_limit,
            ask_timeout: clocks.ask,
            on_unrecognized: recognition.on_unrecognized,
            spend: limits.spend,
        };
        (labels, parts)
    }
}

/// Contains, points and starts the agent: the cgroup, the gateway (before the agent, which
/// is pointed at it), then the agent itself.
fn start_agent(
    labels: &Labels,
    launch: &LaunchParts,
    spend: &SpendLimits,
    shared: &Shared,
    events: &Sender<Event>,
) -> std::io::Result<(Agent, Option<Gateway>)> {
    if labels.command.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ));
    }
    let cgroup = launch::cgroup_for(launch.containment)?;
    let mut command = labels.command.clone();
    let mut env = launch.env.clone();
    let gateway = match &launch.wrap_up {
        Some(w) => {
            let pace = Pace {
                limit: labels.budget.get().map(u64::from),
                steps: Arc::clone(&shared.steps),
                reply_cost: w.reply_cost,
                count_requests: launch.counts_requests,
                max_tokens: spend.max_tokens,
                max_cost_usd: spend.max_cost_usd,
                price: spend.price.clone(),
            };
            Some(launch::start_gateway(
                w,
                pace,
                launch.timeout,
                &mut command,
                &mut env,
                events,
            )?)
        }
        None => None,
    };
    let agent = Launch {
        command: &command,
        env,
        trampoline: launch.trampoline.as_deref(),
        cgroup,
        stdin: launch.stdin,
        pipe_stderr: launch.stderr.is_some(),
    }
    .spawn()?;
    Ok((agent, gateway))
}

/// A run whose agent has started.
struct Run {
    labels: Labels,
    agent: Agent,
    gateway: Option<Gateway>,
    shared: Shared,
    start: Instant,
    started_at: SystemTime,
}

/// The threads that watch a started agent.
struct Watchers {
    reaper: Reaper,
    signals: Option<signal_hook::iterator::Handle>,
    /// `None`: the reader could not start (the engine was told the stream ended, uncounted).
    reader: Option<std::thread::JoinHandle<()>>,
    stderr_done: Option<Receiver<()>>,
    /// Where the engine tells the reader how to go on after a breach.
    resume: Sender<Resume>,
    /// The passthrough's writer, closed and waited for (bounded) at the end.
    passthrough: Option<Passthrough>,
}

impl Run {
    /// Starts the watchers (stderr, the reaper, the signal listener, the reader: counting
    /// starts before anyone is told), tells the observers, supervises the run to its end and
    /// reports it.
    fn supervise(
        mut self,
        parts: Parts,
        events_tx: Sender<Event>,
        events: &Receiver<Event>,
        observers: &mut [&mut dyn RunObserver],
    ) -> RunReport {
        let asks = parts.on_limit.asks();
        let looks_for_loops = parts.reading.loops.is_some();
        let watchers = self.watch(
            parts.launch.stderr,
            parts.launch.forward_signals,
            parts.reading,
            &parts.spend,
            asks,
            &events_tx,
        );
        for o in observers.iter_mut() {
            o.started(&RunStarted {
                pid: self.agent.pgid,
                command: &self.labels.shown,
                started_at: self.started_at,
                budget: self.labels.budget,
                budget_source: &self.labels.budget_source,
                meta: &self.labels.meta,
            });
        }
        let at_limit = AtLimit {
            policy: parts.on_limit,
            ask_timeout: parts.ask_timeout,
            answers: events_tx,
        };
        let tree = &self.agent.tree;
        let mut control = Supervision::new(
            tree,
            parts.grace,
            self.labels.budget,
            at_limit,
            watchers.resume,
        );
        if watchers.reader.is_none() {
            // Without a reader nothing is counted: fail closed.
            control.stop(TerminatedBy::Plugin, Signal::TERM);
        }
        let mut engine = Engine::new(Launched {
            control,
            dogs: Watchdogs::new(self.start, parts.clocks),
            shared: self.shared,
            tree,
            grace: parts.grace,
            start: self.start,
            gateway: self.gateway,
            counts_requests: parts.launch.counts_requests,
            on_unrecognized: parts.on_unrecognized,
            spend: parts.spend,
            looks_for_loops,
        });
        engine.supervise(events, observers);
        let leftovers = Leftovers {
            events,
            reaper: watchers.reaper,
            guardian: self.agent.guardian.take(),
            signals: watchers.signals,
            reader: watchers.reader,
            stderr_done: watchers.stderr_done,
            passthrough: watchers.passthrough,
        };
        let ending = wind_down(
            engine,
            leftovers,
            self.agent.pgid,
            self.start,
            self.started_at,
        );
        // Removes the run's cgroup (empty by now).
        drop(self.agent);
        finish(self.labels, ending, observers)
    }

    /// Starts the threads that watch the agent: its stderr, the reaper, the signal listener
    /// and the reader.
    fn watch(
        &mut self,
        stderr: Option<Box<dyn std::io::Write + Send>>,
        forward_signals: bool,
        reading: ReadingParts,
        spend: &SpendLimits,
        asks: bool,
        events_tx: &Sender<Event>,
    ) -> Watchers {
        let stderr_done = match (stderr, self.agent.stderr.take()) {
            (Some(writer), Some(pipe)) => launch::forward_stderr(pipe, writer),
            _ => None,
        };
        let (resume, resume_rx) = mpsc::channel();
        let (feed, passthrough) = Passthrough::start(reading.output).unzip();
        let reaper = Reaper::start(self.agent.pgid, events_tx.clone(), Event::ChildExited);
        let signals = forward_signals
            .then(|| launch::listen_for_signals(events_tx.clone()))
            .flatten();
        let reader = StreamReader {
            counter: reading.counter,
            ledger: StepLedger::new(self.labels.budget),
            output: feed,
            events: events_tx.clone(),
            resume: resume_rx,
            steps: Arc::clone(&self.shared.steps),
            feeding_since: Arc::clone(&self.shared.feeding_since),
            started: self.start,
            // Nobody will be asked: the reader may signal the group at once.
            term_on_breach: (!asks).then_some(self.agent.pgid),
            watch: Arc::clone(&self.shared.watch),
            recognition_lines: reading.recognition.lines,
            loops: reading.loops.map(LoopWatch::new),
            // With a gateway its usage keeps the budgets; the stream's is only the fallback.
            usage: spend.stream_usage
                && self.gateway.is_none()
                && (spend.max_tokens.is_some() || spend.max_cost_usd.is_some()),
        };
        let reader = reader.spawn(self.agent.stdout.take(), self.labels.budget);
        Watchers {
            reaper,
            signals,
            reader,
            stderr_done,
            resume,
            passthrough,
        }
    }
}
