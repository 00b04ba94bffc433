//! What a run is given: the spec, the on-limit policy, and the observers' view of a run.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use stepguard_core::StepLimit;
use stepguard_core::loops::LoopSettings;
use stepguard_plugin_api::host::Counter;

/// Where the agent's standard input comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StdinMode {
    /// The supervisor's own standard input.
    #[default]
    Inherit,
    /// `/dev/null` (Codex reads stdin to EOF and would wait on an open pipe).
    Null,
}

/// How a run's processes are contained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Containment {
    /// A cgroup v2 of the run's own when one can be created, else the process walk.
    #[default]
    Auto,
    /// A cgroup of the run's own, or the run does not start.
    Cgroup,
    /// Process group, subreaper and the `/proc` walk only.
    ProcessWalk,
}

/// What to do when none of the agent's output is recognised as the provider's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnUnrecognized {
    /// Stop the tree (slug `unrecognized_stream`, exit 2): an agent stepguard cannot count is an
    /// agent it cannot bound.
    #[default]
    Stop,
    /// Warn (through `tracing`) and let the run go on uncounted.
    Warn,
}

/// How much output a run may produce, none of it recognised as the provider's stream, before
/// it is judged unrecognised: whichever limit comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecognitionWindow {
    /// Lines of output.
    pub lines: u64,
    /// Time since the first line of output.
    pub after: Duration,
    /// Time since the start with no recognised event, output or none: the provider's first
    /// event comes within this (its manifest's `first_event_ms`), so silence past it is no
    /// stream.
    pub first_event: Duration,
}

impl Default for RecognitionWindow {
    /// 50 lines or 30 s, and a first event within 60 s. The real CLIs' first event comes with
    /// their first line, or after a few lines of warnings when stderr is merged (2 in the
    /// recorded streams, one per broken skill for Codex); 50 leaves room for dozens. A CLI in
    /// text mode prints several lines per tool call, so 50 lines or 30 s bounds what it does
    /// unseen to a few steps; one that prints nothing until it ends is bounded by the first
    /// event's time.
    fn default() -> Self {
        RecognitionWindow {
            lines: 50,
            after: Duration::from_secs(30),
            first_event: Duration::from_millis(stepguard_plugin_api::DEFAULT_FIRST_EVENT_MS),
        }
    }
}

/// Labels of a run that the engine does not need but every record of it carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunMeta {
    /// The provider's name.
    pub provider: String,
    /// The provider plugin's version.
    pub plugin_version: Option<String>,
    /// Where the provider came from (`builtin` or the plugin file).
    pub plugin_source: Option<String>,
    /// The step unit counted.
    pub unit: Option<String>,
    /// The task type the budget was resolved for.
    pub task_type: Option<String>,
    /// The profile that bounded the budget.
    pub profile: Option<String>,
    /// The working directory of the run.
    pub cwd: Option<String>,
    /// The pools the run joined (shared budgets), for the record.
    pub pools: Option<Vec<String>>,
    /// The ledger those pools were kept in, for the record.
    pub ledger: Option<stepguard_core::PoolLedger>,
    /// The history id of the run this one resumes (`stepguard resume`).
    pub resumed_from: Option<i64>,
}

/// One agent run to supervise, built with [`RunSpec::builder`] (or [`RunSpec::new`] for the
/// defaults). Its settings come in groups, one per concern: the budget and its limits, the
/// [`Clocks`], the [`Confinement`] of the agent's processes, the [`StreamRecognition`] of its stream
/// and its [`Io`].
pub struct RunSpec {
    /// The program and its arguments (any native limit already added).
    pub command: Vec<String>,
    /// The provider's step counter, opened for the unit to count.
    pub counter: Counter,
    /// The step budget.
    pub budget: StepLimit,
    /// Where the budget came from (e.g. `--max-steps`), for the record.
    pub budget_source: String,
    /// Labels carried into the run record.
    pub meta: RunMeta,
    /// The limits beside the step budget and what happens at the limit.
    pub limits: Limits,
    /// How long each part of the run may take.
    pub clocks: Clocks,
    /// How the agent's processes are contained, and what stops them.
    pub confinement: Confinement,
    /// How the agent's output is recognised as the provider's stream.
    pub recognition: StreamRecognition,
    /// The agent's standard streams and environment.
    pub io: Io,
    /// The model gateway (`--wrap-up`): when set, the agent's model calls go through a gateway
    /// on 127.0.0.1 that makes the budget's last call tool-less and refuses calls past it.
    pub wrap_up: Option<WrapUp>,
}

/// What happens at the step budget, and the limits beside it.
pub struct Limits {
    /// What happens when the budget is exceeded.
    pub on_limit: Box<dyn LimitPolicy>,
    /// Loop detection over the tool calls the plugin reports (slug `loop_detected`); `None`:
    /// off (also the right choice for a plugin that does not report tool calls).
    pub loops: Option<LoopSettings>,
    /// Token and cost budgets, kept through the gateway's usage when the run has one, else
    /// through the usage the stream reports.
    pub spend: SpendLimits,
}

impl Default for Limits {
    /// Stop at the limit, no loop detection, no token or cost budget.
    fn default() -> Self {
        Limits {
            on_limit: Box::new(StopAtLimit),
            loops: None,
            spend: SpendLimits::default(),
        }
    }
}

/// How long each part of a run may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clocks {
    /// Time between SIGTERM and SIGKILL when the tree is stopped.
    pub grace: Duration,
    /// Stop the agent after this long (slug `timeout`).
    pub timeout: Option<Duration>,
    /// Stop the agent when it has written nothing to stdout for this long (slug `stalled`).
    pub idle: Option<Duration>,
    /// Stop the agent when no line was recognised as the provider's within this long of the
    /// start (slug `startup_hang`).
    pub startup: Option<Duration>,
    /// How long a policy that asks may take to answer; then the tree is stopped (slug
    /// `max_steps`). `None`: no limit.
    pub ask: Option<Duration>,
    /// A plugin call that does not return within this is abandoned and the run stopped.
    pub plugin: Duration,
}

impl Default for Clocks {
    /// 5 s grace, no timeout, no idle or startup timeout, 5 min to answer, 10 s per plugin call.
    fn default() -> Self {
        Clocks {
            grace: Duration::from_secs(5),
            timeout: None,
            idle: None,
            startup: None,
            ask: Some(Duration::from_secs(300)),
            plugin: Duration::from_secs(10),
        }
    }
}

/// How a run's processes are contained, and what stops them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Confinement {
    /// How the run's processes are contained.
    pub containment: Containment,
    /// A program that acts as the agent's trampoline and as the guardian when given
    /// [`stepguard_supervisor::guard::EXEC_ARG`] or [`stepguard_supervisor::guard::GUARDIAN_ARG`]
    /// (`stepguard` itself). Without one the agent is moved into its cgroup just after it
    /// starts (a fork in that instant stays outside), it does not die with this process, and
    /// no guardian stops the run if this process is killed.
    pub trampoline: Option<std::path::PathBuf>,
    /// Whether SIGINT, SIGTERM and SIGHUP to this process stop the run (slug `interrupted`).
    /// Off by default: once on, the process keeps handlers for them after the run (doing
    /// nothing, so they no longer end it). A short-lived supervisor like `stepguard run` turns
    /// it on; a long-lived host should keep it off and use an [`crate::Interrupter`].
    pub forward_signals: bool,
}

/// How the agent's output is recognised as the provider's stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamRecognition {
    /// What the provider's stream looks like, for the message when none of it is recognised
    /// (the manifest's `expects`).
    pub expects: String,
    /// What to do when the agent's output is not recognised as the provider's stream.
    pub on_unrecognized: OnUnrecognized,
    /// How much unrecognised output is tolerated before [`StreamRecognition::on_unrecognized`]
    /// applies.
    pub window: RecognitionWindow,
}

/// The agent's standard streams and environment.
pub struct Io {
    /// The agent's standard input.
    pub stdin: StdinMode,
    /// Where the agent's counted output is passed through (stepguard's stdout in the CLI).
    pub output: Box<dyn Write + Send>,
    /// Where the agent's standard error goes: `None` inherits stepguard's; a writer gets it
    /// through a pipe (e.g. to clear a status line before each write).
    pub stderr: Option<Box<dyn Write + Send>>,
    /// Variables added to the agent's environment (e.g. `TRACEPARENT`, so that the agent's
    /// own traces nest under the run's span).
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl Default for Io {
    /// Inherited stdin and stderr, output to stdout, nothing added to the environment.
    fn default() -> Self {
        Io {
            stdin: StdinMode::Inherit,
            output: Box::new(std::io::stdout()),
            stderr: None,
            env: Vec::new(),
        }
    }
}

/// Builds a [`RunSpec`] group by group; every group left out keeps its default.
pub struct RunSpecBuilder {
    spec: RunSpec,
}

impl RunSpecBuilder {
    /// The step budget and where it came from (e.g. `--max-steps`), for the record.
    pub fn budget(mut self, budget: StepLimit, source: impl Into<String>) -> Self {
        self.spec.budget = budget;
        self.spec.budget_source = source.into();
        self
    }

    /// The labels carried into the run record.
    pub fn meta(mut self, meta: RunMeta) -> Self {
        self.spec.meta = meta;
        self
    }

    /// The limits beside the step budget and what happens at the limit.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.spec.limits = limits;
        self
    }

    /// How long each part of the run may take.
    pub fn clocks(mut self, clocks: Clocks) -> Self {
        self.spec.clocks = clocks;
        self
    }

    /// How the agent's processes are contained, and what stops them.
    pub fn confinement(mut self, confinement: Confinement) -> Self {
        self.spec.confinement = confinement;
        self
    }

    /// How the agent's output is recognised as the provider's stream.
    pub fn recognition(mut self, recognition: StreamRecognition) -> Self {
        self.spec.recognition = recognition;
        self
    }

    /// The agent's standard streams and environment.
    pub fn io(mut self, io: Io) -> Self {
        self.spec.io = io;
        self
    }

    /// The model gateway, or none.
    pub fn wrap_up(mut self, wrap_up: Option<WrapUp>) -> Self {
        self.spec.wrap_up = wrap_up;
        self
    }

    /// Returns the spec.
    pub fn build(self) -> RunSpec {
        self.spec
    }
}

/// A run's token and cost budgets (`--max-tokens`, `--max-cost-usd`).
#[derive(Clone, Debug, Default)]
pub struct SpendLimits {
    /// Input + output tokens of every model call, cached input included.
    pub max_tokens: Option<u64>,
    /// Where the token budget came from, for the record.
    pub max_tokens_source: Option<String>,
    /// US dollars.
    pub max_cost_usd: Option<f64>,
    /// Where the cost budget came from, for the record.
    pub max_cost_usd_source: Option<String>,
    /// Prices a model call by model and usage; a cost budget needs it.
    pub price: Option<stepguard_gateway::Pricing>,
    /// The model the stream's usage is priced as when there is no gateway (known before the
    /// start from the agent's command).
    pub model: Option<String>,
    /// Whether the provider's counters report usage line by line (protocol 1.5): without the
    /// gateway, the budgets are kept from it.
    pub stream_usage: bool,
}

/// How a run's model gateway is set up.
#[derive(Clone)]
pub struct WrapUp {
    /// How the provider's CLI reaches its model (the plugin manifest's `model_endpoint`).
    pub endpoint: stepguard_plugin_api::ModelEndpoint,
    /// What a tool-less reply costs in the counted unit (the unit's `reply_cost`; 1 if unset).
    pub reply_cost: u64,
    /// Whether every forwarded model call carries `system notice: this is step X of Y`.
    pub notices: bool,
    /// The shares of each limit (steps, tokens, cost, a pool's share, the time before the
    /// timeout) at which the next model call tells the model what is left, ascending, each in
    /// (0, 1); empty: no staged notices.
    pub notice_thresholds: Vec<f64>,
    /// Where to write every model request, without credentials; `None` stores nothing.
    pub record_requests: Option<std::path::PathBuf>,
    /// The pools every main model call reserves its estimate in, before it is forwarded, and
    /// settles to its real usage after; `None`: no pool.
    pub shared_budget: Option<std::sync::Arc<dyn stepguard_gateway::SharedBudget>>,
}

impl std::fmt::Debug for WrapUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrapUp")
            .field("endpoint", &self.endpoint)
            .field("reply_cost", &self.reply_cost)
            .field("notices", &self.notices)
            .field("notice_thresholds", &self.notice_thresholds)
            .field("record_requests", &self.record_requests)
            .field("shared_budget", &self.shared_budget.is_some())
            .finish()
    }
}

impl RunSpec {
    /// Starts a spec for `command`, counted by `counter`, with the defaults of every group:
    /// an unlimited budget from `default`, 5 s grace, no timeout, inherited stdin and stderr,
    /// stop at the limit (a policy that asks has 5 min), output to stdout, an unrecognised
    /// stream stops the run; signals are not forwarded, and loop detection and the idle and
    /// startup timeouts are off.
    pub fn builder(command: Vec<String>, counter: Counter) -> RunSpecBuilder {
        RunSpecBuilder {
            spec: RunSpec {
                command,
                counter,
                budget: StepLimit::Unlimited,
                budget_source: "default".to_owned(),
                meta: RunMeta::default(),
                limits: Limits::default(),
                clocks: Clocks::default(),
                confinement: Confinement::default(),
                recognition: StreamRecognition::default(),
                io: Io::default(),
                wrap_up: None,
            },
        }
    }

    /// Creates a spec with the defaults of every group (see [`RunSpec::builder`]) and the step
    /// budget `budget` from `default`.
    pub fn new(command: Vec<String>, counter: Counter, budget: StepLimit) -> Self {
        RunSpec::builder(command, counter)
            .budget(budget, "default")
            .build()
    }
}

/// The budget was exceeded: step `step` began under `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breach {
    /// The step that began over the limit.
    pub step: u64,
    /// The limit in force.
    pub limit: StepLimit,
}

/// What to do at the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitDecision {
    /// Stop the whole tree (slug `max_steps`).
    Stop,
    /// Allow this many more steps beyond the current limit.
    Allow(u32),
    /// Go on without a limit.
    Unlimited,
}

impl LimitDecision {
    /// Returns the decision as the run record lists it: `stop`, `allow:N` or `continue`.
    pub fn label(self) -> String {
        match self {
            LimitDecision::Stop => "stop".to_owned(),
            LimitDecision::Allow(n) => format!("allow:{n}"),
            LimitDecision::Unlimited => "continue".to_owned(),
        }
    }
}

/// Decides what happens when the budget is exceeded.
pub trait LimitPolicy: Send {
    /// Whether this policy asks someone: then the tree is paused (SIGSTOP) while it decides and
    /// its decisions are recorded. A policy that never asks lets the engine SIGTERM the agent's
    /// group from the reader thread the moment the breaching line is seen.
    fn asks(&self) -> bool {
        false
    }

    /// Returns the decision for this breach.
    ///
    /// A policy that asks is called on a thread of its own while the engine goes on watching
    /// signals, the timeout and [`Clocks::ask`]; when one of them ends the run,
    /// [`Question::withdrawn`] turns true and the answer is ignored, so return soon after.
    fn decide(&mut self, breach: &Breach, question: &Question) -> LimitDecision;
}

/// The question a policy that asks is answering, which the engine may withdraw.
#[derive(Clone, Debug)]
pub struct Question {
    withdrawn: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Question {
    /// Creates a question that must be answered by `deadline`.
    pub fn new(deadline: Option<Instant>) -> Self {
        Question {
            withdrawn: Arc::new(AtomicBool::new(false)),
            deadline,
        }
    }

    /// Returns true once the answer no longer matters (the run is being stopped).
    pub fn withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::Acquire)
    }

    /// Withdraws the question.
    pub fn withdraw(&self) {
        self.withdrawn.store(true, Ordering::Release);
    }

    /// When the engine stops waiting for the answer, if it ever does.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

/// The default policy: stop at the limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct StopAtLimit;

impl LimitPolicy for StopAtLimit {
    fn decide(&mut self, _breach: &Breach, _question: &Question) -> LimitDecision {
        LimitDecision::Stop
    }
}

/// What the report needs of the spec once the run is under way.
pub(crate) struct Labels {
    pub command: Vec<String>,
    /// The command as records and observers see it: with the model gateway, its URLs hidden
    /// (the history database is readable by the agent's user).
    pub shown: Vec<String>,
    pub budget: StepLimit,
    pub budget_source: String,
    pub meta: RunMeta,
}
