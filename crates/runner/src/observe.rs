//! What observers of a run see: its start, progress ticks and its end.

use std::time::{Duration, SystemTime};

use stepguard_core::StepLimit;

use crate::report::RunReport;
use crate::spec::RunMeta;

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
    /// Tokens the agent's stream reported so far (input plus output), when the engine reads
    /// the stream's usage (a token or cost budget without the gateway); 0 otherwise.
    pub stream_tokens: u64,
    /// Their cost as the engine priced them (a cost budget without the gateway), when every
    /// delta could be priced.
    pub stream_cost_usd: Option<f64>,
}

/// Sees a run's start, progress and end; called on the thread that runs the engine, in
/// registration order. Observers must be quick and must never wait for a terminal, a database
/// or the network: they share the thread that enforces the budget and keeps the deadlines.
/// Write from a thread of your own (the CLI's status line and history recorder do) and bound
/// any wait in [`RunObserver::finished`].
pub trait RunObserver {
    /// The agent started (not called when it could not be started).
    fn started(&mut self, _run: &RunStarted<'_>) {}

    /// The run goes on.
    fn tick(&mut self, _progress: &Progress) {}

    /// The run ended. An observer may fill in what it knows of the record (the history
    /// recorder sets `report.record.id`), so later observers see it.
    fn finished(&mut self, _report: &mut RunReport) {}
}
