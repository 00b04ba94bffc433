//! What the run's threads tell the engine, and what the engine tells the reader.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::Sender;

use stepguard_core::StepLedger;
use stepguard_core::StepLimit;
use stepguard_core::loops::LoopFound;
use stepguard_gateway::{Budget, GatewayEvent};
use stepguard_plugin_api::CounterStats;
use stepguard_plugin_api::host::CallError;
use stepguard_supervisor::ExitStatus;

use crate::spec::LimitDecision;
use crate::spec::LimitPolicy;
use crate::stream::Recognition;

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
    /// This many lines came and none was recognised as the provider's stream.
    Unrecognized { lines: u64 },
    /// Output after a recognised start cannot be counted: most of it is not the provider's, or a
    /// line is framed to hide events (the message says which).
    Uncountable(String),
    /// The policy that asks has answered (and is handed back for the next breach).
    Decided(LimitDecision, Box<dyn LimitPolicy>),
    /// The agent's tool calls went round a loop.
    Loop(LoopFound),
    /// The model gateway forwarded, refused or failed a model call.
    Gateway(GatewayEvent),
    /// A chunk of the stream reported this much more token usage.
    StreamUsage(stepguard_plugin_api::Tokens),
    /// A limit kept outside the run (a pool other runs share) is reached.
    Outside(OutsideLimit),
}

/// A limit kept outside the run that it has reached: a budget other runs share (stepguard's
/// pools), spent by them. The engine reacts through the ladder of a budget of the same
/// measure: with the gateway the next model call is the last, tool-less, with a notice naming
/// `name` (it goes out even though the outside budget could no longer pay it); without, the
/// tree is stopped. The run ends with the measure's slug (`max_tokens`, `max_cost`,
/// `max_steps`) and `why` as its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsideLimit {
    /// The shared budget's name (the pool's), for the model's notice: "the shared budget
    /// `NAME` is spent".
    pub name: String,
    /// The measure that is spent.
    pub measure: Budget,
    /// What the record's message says, e.g. "pool `daily` is spent by the runs in it".
    pub why: String,
}

/// Feeds an [`OutsideLimit`] into a running supervision, from another thread (a watcher of
/// the ledger of pools): the caller keeps the outside budget, the runner only reacts to it.
#[derive(Clone)]
pub struct OutsideLimits(pub(crate) Sender<Event>);

impl OutsideLimits {
    /// Tells the run that `limit` is reached; false when the run is over. The first one
    /// counts: later ones (another pool, the same again) change nothing.
    pub fn reached(&self, limit: OutsideLimit) -> bool {
        self.0.send(Event::Outside(limit)).is_ok()
    }
}

/// Stops a run from another thread as a signal to stepguard would (slug `interrupted`).
#[derive(Clone)]
pub struct Interrupter(pub(crate) Sender<Event>);

impl Interrupter {
    /// Stops the run, sending `signal` (e.g. `libc::SIGINT`'s number) to the tree first; false
    /// when the run is over.
    pub fn interrupt(&self, signal: i32) -> bool {
        self.0.send(Event::Interrupt(signal)).is_ok()
    }
}

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
