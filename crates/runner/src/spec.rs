//! What a run is given: the spec, the on-limit policy, and the observers' view of a run.

use std::io::Write;
use std::time::{Duration, SystemTime};

use stepguard_core::StepLimit;
use stepguard_plugin_api::host::Counter;

use crate::report::RunReport;

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
}

/// One agent run to supervise.
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
    /// Time between SIGTERM and SIGKILL when the tree is stopped.
    pub grace: Duration,
    /// Stop the agent after this long (slug `timeout`).
    pub timeout: Option<Duration>,
    /// The agent's standard input.
    pub stdin: StdinMode,
    /// What happens when the budget is exceeded.
    pub on_limit: Box<dyn LimitPolicy>,
    /// Where the agent's counted output is passed through (stepguard's stdout in the CLI).
    pub output: Box<dyn Write + Send>,
    /// Whether SIGINT, SIGTERM and SIGHUP to this process stop the run (slug `interrupted`).
    /// Off by default: once on, the process keeps handlers for them after the run (doing
    /// nothing, so they no longer end it). A short-lived supervisor like `stepguard run` turns
    /// it on; a long-lived host should keep it off and use an [`crate::Interrupter`].
    pub forward_signals: bool,
    /// How the run's processes are contained.
    pub containment: Containment,
    /// A program that acts as the agent's trampoline and as the guardian when given
    /// [`stepguard_supervisor::guard::EXEC_ARG`] or [`stepguard_supervisor::guard::GUARDIAN_ARG`]
    /// (`stepguard` itself). Without one the agent is moved into its cgroup just after it
    /// starts (a fork in that instant stays outside), it does not die with this process, and
    /// no guardian stops the run if this process is killed.
    pub trampoline: Option<std::path::PathBuf>,
    /// A plugin call that does not return within this is abandoned and the run stopped.
    pub plugin_timeout: Duration,
}

impl RunSpec {
    /// Creates a spec with the defaults of `stepguard run`: 5 s grace, no timeout, inherited
    /// stdin, stop at the limit, output to stdout; signals are not forwarded.
    pub fn new(command: Vec<String>, counter: Counter, budget: StepLimit) -> Self {
        RunSpec {
            command,
            counter,
            budget,
            budget_source: "default".to_owned(),
            meta: RunMeta::default(),
            grace: Duration::from_secs(5),
            timeout: None,
            stdin: StdinMode::Inherit,
            on_limit: Box::new(StopAtLimit),
            output: Box::new(std::io::stdout()),
            forward_signals: false,
            containment: Containment::Auto,
            trampoline: None,
            plugin_timeout: Duration::from_secs(10),
        }
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

    /// Returns the decision for this breach (called on the thread that runs the engine).
    fn decide(&mut self, breach: &Breach) -> LimitDecision;
}

/// The default policy: stop at the limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct StopAtLimit;

impl LimitPolicy for StopAtLimit {
    fn decide(&mut self, _breach: &Breach) -> LimitDecision {
        LimitDecision::Stop
    }
}

/// The agent has started.
#[derive(Clone, Debug)]
pub struct RunStarted<'a> {
    /// The agent's pid (also its process group id).
    pub pid: u32,
    /// The command as run.
    pub command: &'a [String],
    /// When it started.
    pub started_at: SystemTime,
    /// The budget.
    pub budget: StepLimit,
    /// Where the budget came from.
    pub budget_source: &'a str,
    /// The run's labels.
    pub meta: &'a RunMeta,
}

/// A progress tick (about five a second while the run goes on).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Steps begun so far.
    pub steps: u64,
    /// The limit in force (it changes when a policy allows more).
    pub limit: StepLimit,
    /// Time since the start.
    pub elapsed: Duration,
}

/// Sees a run's start, progress and end; called on the thread that runs the engine, in
/// registration order. Observers must be quick: they share the thread that enforces the budget.
pub trait RunObserver {
    /// The agent started (not called when it could not be started).
    fn started(&mut self, _run: &RunStarted<'_>) {}

    /// The run goes on.
    fn tick(&mut self, _progress: &Progress) {}

    /// The run ended. An observer may fill in what it knows of the record (the history
    /// recorder sets `report.record.id`), so later observers see it.
    fn finished(&mut self, _report: &mut RunReport) {}
}
