//! Supervision: the engine's state while the agent runs, one handler per event kind and the
//! watchdogs checked on every wake-up, until the agent has exited and its output is read (or
//! the run did not wind down in time after a stop).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use stepguard_core::loops::{LoopFound, LoopKind};
use stepguard_core::verdict::TerminatedBy;
use stepguard_gateway::{Budget, CallUsage, Gateway, GatewayEvent};
use stepguard_supervisor::{ExitStatus, Tree};

use crate::event::{Event, OutsideLimit, ReaderEnd, StreamWatch};
use crate::limit::Supervision;
use crate::observe::{Progress, RunObserver};
use crate::spec::{LimitDecision, OnUnrecognized, SpendLimits};
use crate::watchdog::{Alarm, Moment, Watchdogs};

/// How long the run may take to wind down once its tree is stopped.
pub(crate) const DRAIN: Duration = Duration::from_secs(2);

/// How often the engine wakes when nothing happens (deadline checks, progress ticks).
const TICK: Duration = Duration::from_millis(200);

/// What the reader and the engine share while the run goes on.
#[derive(Clone, Default)]
pub(crate) struct Shared {
    /// When output came, and whether any was recognised.
    pub watch: Arc<StreamWatch>,
    /// Steps begun so far (also the gateway's view of the run).
    pub steps: Arc<AtomicU64>,
    /// When the plugin call under way began (ms since the start, plus one), 0 when none is.
    pub feeding_since: Arc<AtomicU64>,
}

/// The loop ladder with a gateway: a notice at the first loop, the wrap-up at the second.
#[derive(Default)]
struct LoopLadder {
    noticed: u32,
    wrapping: bool,
}

/// The engine while the agent runs.
pub(crate) struct Engine<'t> {
    /// Decisions: the stop, the limit, the question at the limit.
    pub control: Supervision<'t>,
    /// The clocks.
    pub dogs: Watchdogs,
    shared: Shared,
    tree: &'t Tree,
    grace: Duration,
    start: Instant,
    /// The run's model gateway, when it has one.
    pub gateway: Option<Gateway>,
    /// Whether the gateway's model calls are the steps (unit `request`).
    pub counts_requests: bool,
    /// What an unrecognised stream means.
    pub on_unrecognized: OnUnrecognized,
    /// The token and cost budgets.
    pub spend: SpendLimits,
    /// The agent's exit, once it came.
    pub child_exit: Option<ExitStatus>,
    /// The reader's end, once it came.
    pub reader_end: Option<ReaderEnd>,
    /// Once the tree is stopped (or the agent is gone and its leftovers too), the rest of the
    /// run may take until then: a pipe a survivor holds or a stuck plugin never keeps
    /// stepguard from exiting.
    pub drain_until: Option<Instant>,
    ladder: LoopLadder,
    /// Model calls the gateway forwarded (its latest number).
    model_calls: u64,
    /// Usage the stream reported so far (kept against the budgets without a gateway).
    stream_usage: CallUsage,
    /// Its cost, each delta priced as it came (about one model call's usage, so the call's
    /// context-length tier applies); `None` until priced, or once a delta could not be.
    stream_cost_usd: Option<f64>,
    /// Whether a delta of the stream's usage could not be priced (its cost is then unknown).
    stream_unpriced: bool,
    /// The loops the reader reported, in order (`None` when loops are not looked for): the
    /// record's account of them when the reader itself is abandoned.
    pub loops_seen: Option<Vec<LoopFound>>,
    /// The stream's usage as the reader reported it (`None` until it reported some): the
    /// record's tokens when the reader itself is abandoned.
    pub tokens_seen: Option<stepguard_plugin_api::Tokens>,
    /// Whether an outside limit (a pool others spent) was reached and acted on.
    outside: bool,
    last_tick: Instant,
}

/// What the engine is given of the launched run.
pub(crate) struct Launched<'t> {
    pub control: Supervision<'t>,
    pub dogs: Watchdogs,
    pub shared: Shared,
    pub tree: &'t Tree,
    pub grace: Duration,
    pub start: Instant,
    pub gateway: Option<Gateway>,
    pub counts_requests: bool,
    pub on_unrecognized: OnUnrecognized,
    pub spend: SpendLimits,
    /// Whether the reader looks for loops.
    pub looks_for_loops: bool,
}

impl<'t> Engine<'t> {
    /// The engine of a run that has just started.
    pub fn new(l: Launched<'t>) -> Self {
        Engine {
            control: l.control,
            dogs: l.dogs,
            shared: l.shared,
            tree: l.tree,
            grace: l.grace,
            start: l.start,
            gateway: l.gateway,
            counts_requests: l.counts_requests,
            on_unrecognized: l.on_unrecognized,
            spend: l.spend,
            child_exit: None,
            reader_end: None,
            drain_until: None,
            ladder: LoopLadder::default(),
            model_calls: 0,
            stream_usage: CallUsage::default(),
            stream_cost_usd: None,
            stream_unpriced: false,
            loops_seen: l.looks_for_loops.then(Vec::new),
            tokens_seen: None,
            outside: false,
            last_tick: l.start,
        }
    }

    /// Steps as the record counts them so far.
    pub fn steps(&self) -> u64 {
        self.shared.steps.load(Ordering::Relaxed)
    }

    /// How the run's tree is contained (`cgroup` or `process-walk`).
    pub fn containment(&self) -> &'static str {
        self.tree.mechanism().as_str()
    }

    /// What the stream's usage cost, as stepguard priced it (no gateway, a cost budget, every
    /// delta priced).
    pub fn stream_cost_usd(&self) -> Option<f64> {
        self.stream_cost_usd.filter(|_| !self.stream_unpriced)
    }

    /// Whether the loop ladder made the last call (a loop, not the budget, wrapped up).
    pub fn loop_wrapping(&self) -> bool {
        self.ladder.wrapping
    }

    /// Handles events and checks the clocks until the agent has exited and its output is
    /// read, or the run did not wind down in time after a stop.
    pub fn supervise(&mut self, events: &Receiver<Event>, observers: &mut [&mut dyn RunObserver]) {
        while self.child_exit.is_none() || self.reader_end.is_none() {
            if self.control.stop.is_some() {
                // Stopped: the agent's exit and the reader's end have this long to arrive.
                self.drain_until.get_or_insert(Instant::now() + DRAIN);
            }
            if self.drain_until.is_some_and(|d| Instant::now() >= d) {
                tracing::warn!(
                    agent_exited = self.child_exit.is_some(),
                    reader_done = self.reader_end.is_some(),
                    "the run did not wind down after the stop; not waiting any longer"
                );
                break;
            }
            match events.recv_timeout(self.next_wake(Instant::now())) {
                Ok(event) => self.handle(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Every clock on every wake-up while the agent runs: event traffic never keeps a
            // watchdog from firing. Once it has exited, its silence is not a stall.
            if self.child_exit.is_none() {
                self.check_clocks(Instant::now());
            }
            self.tick(observers);
        }
        if self.control.stop.is_some() {
            self.drain_until.get_or_insert(Instant::now());
        }
    }

    /// How long to wait for the next event: until the next deadline, at most a tick.
    fn next_wake(&self, now: Instant) -> Duration {
        [
            self.dogs.deadline,
            self.drain_until,
            self.control.question_deadline(),
        ]
        .into_iter()
        .flatten()
        .map(|d| d.saturating_duration_since(now))
        .fold(TICK, Duration::min)
    }

    /// One event.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Breach { step } => self.control.breach(step, Instant::now()),
            Event::Decided(decision, policy) => self.on_decided(decision, policy),
            Event::ChildExited(exit) => self.on_child_exit(exit),
            Event::ReaderDone(end) => {
                if end.plugin_error.is_some() {
                    self.control.stop(TerminatedBy::Plugin, Signal::TERM);
                }
                self.reader_end = Some(*end);
            }
            Event::Interrupt(sig) => {
                let first = Signal::from_named_raw(sig).unwrap_or(Signal::TERM);
                self.control.stop(TerminatedBy::Signal, first);
            }
            Event::Loop(found) => self.on_loop(&found),
            Event::StreamUsage(delta) => self.on_stream_usage(&delta),
            Event::Gateway(event) => self.on_gateway(event),
            Event::Outside(limit) => self.on_outside(limit),
            Event::Uncountable(why) => self.control.unrecognised(self.on_unrecognized, why),
            Event::Unrecognized { lines } => {
                if let Some(why) = self.dogs.unrecognised_lines(lines) {
                    self.control.unrecognised(self.on_unrecognized, why);
                }
            }
        }
    }

    /// The policy that asks has answered.
    fn on_decided(&mut self, decision: LimitDecision, policy: Box<dyn crate::LimitPolicy>) {
        if self.control.answered(decision, policy) {
            // The pause was ours: the idle clock starts again.
            let now = self.start.elapsed().as_millis() as u64 + 1;
            self.shared.watch.last_output.store(now, Ordering::Relaxed);
        }
    }

    /// The agent exited: nothing it started may outlive it.
    fn on_child_exit(&mut self, exit: ExitStatus) {
        self.child_exit = Some(exit);
        self.control.withdraw_question();
        // This also closes stdout pipes that leftover descendants still hold.
        let report = self.tree.stop(Signal::TERM, self.grace);
        if report.initial > 0 {
            tracing::info!(
                processes = report.initial,
                "stopped processes the agent left behind"
            );
        }
        self.drain_until.get_or_insert(Instant::now() + DRAIN);
    }

    /// The agent's tool calls went round a loop: with a gateway, the ladder (a notice, then
    /// the wrap-up); without, a stop.
    fn on_loop(&mut self, found: &LoopFound) {
        if let Some(seen) = &mut self.loops_seen {
            seen.push(found.clone());
        }
        if self.control.terminated_by.is_some() {
            return;
        }
        let why = loop_message(found);
        match &self.gateway {
            // First rung: the model is told, once, on its next call.
            Some(gw) if self.ladder.noticed == 0 => {
                self.ladder.noticed += 1;
                tracing::info!("{why}; telling the model");
                gw.push_notice(&loop_notice(found));
            }
            // Second rung: its next call is its last, without tools.
            Some(gw) if !self.ladder.wrapping => {
                self.ladder.wrapping = true;
                tracing::info!("{why}; the next model call is the last");
                self.control
                    .why
                    .get_or_insert(why.replace("stopped as a loop", "wrapped up as a loop"));
                gw.force_last();
            }
            _ => {
                tracing::info!("{why}");
                self.control.why.get_or_insert(why);
                self.control.stop(TerminatedBy::Loop, Signal::TERM);
            }
        }
    }

    /// The stream reported usage: kept against the token and cost budgets.
    fn on_stream_usage(&mut self, delta: &stepguard_plugin_api::Tokens) {
        let seen = self.tokens_seen.get_or_insert_with(Default::default);
        seen.input_tokens += delta.input_tokens;
        seen.output_tokens += delta.output_tokens;
        if let Some(cached) = delta.cached_input_tokens {
            *seen.cached_input_tokens.get_or_insert(0) += cached;
        }
        if let Some(reasoning) = delta.reasoning_output_tokens {
            *seen.reasoning_output_tokens.get_or_insert(0) += reasoning;
        }
        let delta = CallUsage {
            input: delta.input_tokens,
            cached_input: delta.cached_input_tokens.unwrap_or(0),
            output: delta.output_tokens,
        };
        self.stream_usage.add(&delta);
        match price_of(&self.spend, &delta) {
            Some(cost) => *self.stream_cost_usd.get_or_insert(0.0) += cost,
            None => self.stream_unpriced |= self.spend.max_cost_usd.is_some(),
        }
        if self.control.terminated_by.is_none()
            && let Some((reason, why)) =
                spend_crossed(&self.spend, &self.stream_usage, self.stream_cost_usd())
        {
            tracing::info!("{why}");
            self.control.why.get_or_insert(why);
            self.control.stop(reason, Signal::TERM);
        }
    }

    /// A limit kept outside the run is reached (a pool other runs spent): the ladder of a
    /// budget of its measure. With the gateway, the next model call is the last, tool-less,
    /// with a notice naming the pool; without, the tree is stopped. Once: a run already
    /// ending, or told before, is left as it goes.
    fn on_outside(&mut self, limit: OutsideLimit) {
        if self.outside || self.control.terminated_by.is_some() || self.child_exit.is_some() {
            return;
        }
        self.outside = true;
        match &self.gateway {
            Some(gw) => {
                tracing::info!("{}; the next model call is the last", limit.why);
                self.control
                    .why
                    .get_or_insert_with(|| format!("{}; wrapped up", limit.why));
                gw.wrap_up_for(&limit.name, limit.measure);
            }
            None => {
                let reason = match limit.measure {
                    Budget::Tokens => TerminatedBy::Tokens,
                    Budget::Cost => TerminatedBy::Cost,
                    Budget::Steps => TerminatedBy::Budget,
                };
                tracing::debug!("{}; stopped", limit.why);
                self.control.why = Some(format!("{}; stopped", limit.why));
                self.control.stop(reason, Signal::TERM);
            }
        }
    }

    /// The gateway forwarded, refused or failed a model call.
    fn on_gateway(&mut self, event: GatewayEvent) {
        match event {
            GatewayEvent::Forwarded { number, .. } => self.model_calls = number,
            GatewayEvent::Refused { count } => self.on_refused(count),
            GatewayEvent::Usage { .. } => {}
            GatewayEvent::Unreadable { why } => self.stop_saying(TerminatedBy::Bypassed, why),
            GatewayEvent::Unpriced { model } => {
                let why = format!(
                    "a cost budget is set and the model `{model}` has no price: the call was \
                     not made; add the model to a price file (--prices FILE) or run without \
                     --max-cost-usd"
                );
                self.stop_saying(TerminatedBy::Unpriced, why);
            }
            GatewayEvent::UpstreamFailed { error } => {
                if self.control.terminated_by.is_none() {
                    self.control.why.get_or_insert(error);
                    self.control.stop(TerminatedBy::Upstream, Signal::TERM);
                }
            }
        }
    }

    /// A call past the last one, answered by the gateway with a final text that ends the CLI
    /// cleanly. A second one means it did not end: the backstop.
    fn on_refused(&mut self, count: u64) {
        if self.ladder.wrapping {
            self.control.stop(TerminatedBy::Loop, Signal::TERM);
            return;
        }
        if count < 2 {
            return;
        }
        match self.gateway.as_ref().and_then(Gateway::reason) {
            Some(Budget::Tokens) => self.control.stop(TerminatedBy::Tokens, Signal::TERM),
            Some(Budget::Cost) => self.control.stop(TerminatedBy::Cost, Signal::TERM),
            _ => {
                let step = self.model_calls + count;
                self.control.breached_at.get_or_insert(step);
                self.control.decide(LimitDecision::Stop, step);
            }
        }
    }

    /// Stops the run unless someone did, making `why` the record's message (which the CLI shows
    /// once, at the end: it is logged here only at debug level, so it is not printed twice).
    fn stop_saying(&mut self, reason: TerminatedBy, why: String) {
        if self.control.terminated_by.is_none() {
            tracing::debug!("{why}");
            self.control.why = Some(why);
            self.control.stop(reason, Signal::TERM);
        }
    }

    /// The deadline, the question at the limit, then every other watchdog.
    fn check_clocks(&mut self, now: Instant) {
        if let Some(alarm) = self.dogs.check_deadline(now) {
            self.sound(alarm);
        }
        self.control.check_question(now);
        let moment = Moment {
            now,
            asking: self.control.is_asking(),
            steps: self.steps(),
            gateway_calls: self
                .gateway
                .as_ref()
                .filter(|_| !self.counts_requests)
                .map(|gw| gw.forwarded().saturating_add(gw.refused())),
        };
        let alarms = self
            .dogs
            .check(&moment, &self.shared.watch, &self.shared.feeding_since);
        for alarm in alarms {
            self.sound(alarm);
        }
    }

    /// What a watchdog that fired does to the run.
    fn sound(&mut self, alarm: Alarm) {
        match alarm {
            Alarm::Timeout => self.control.stop(TerminatedBy::Timeout, Signal::TERM),
            Alarm::Stall(reason, why) => self.control.stop_because(reason, why),
            Alarm::Unrecognised(why) => self.control.unrecognised(self.on_unrecognized, why),
            Alarm::PluginHung(why) => {
                self.control.why = Some(why);
                self.control.stop(TerminatedBy::Plugin, Signal::TERM);
            }
            Alarm::Bypassed(why) => self.stop_saying(TerminatedBy::Bypassed, why),
        }
    }

    /// Tells the observers how far the run has got, about five times a second.
    fn tick(&mut self, observers: &mut [&mut dyn RunObserver]) {
        let now = Instant::now();
        if now.saturating_duration_since(self.last_tick) < TICK {
            return;
        }
        self.last_tick = now;
        let progress = Progress {
            steps: if self.counts_requests {
                self.model_calls
            } else {
                self.steps()
            },
            limit: self.control.limit,
            elapsed: self.start.elapsed(),
            stream_tokens: self.stream_usage.total(),
            stream_cost_usd: self.stream_cost_usd(),
        };
        for o in observers.iter_mut() {
            o.tick(&progress);
        }
    }
}

/// The cost of `usage` as the run's model, when a cost budget prices it.
fn price_of(spend: &SpendLimits, usage: &CallUsage) -> Option<f64> {
    spend.max_cost_usd?;
    let model = spend.model.as_deref()?;
    (spend.price.as_ref()?.0)(model, usage)
}

/// Whether the stream's usage so far (`used`, costing `cost`) has crossed a budget: which,
/// and why, for the record.
fn spend_crossed(
    spend: &SpendLimits,
    used: &CallUsage,
    cost: Option<f64>,
) -> Option<(TerminatedBy, String)> {
    if let Some(max) = spend.max_tokens
        && used.total() > max
    {
        return Some((
            TerminatedBy::Tokens,
            format!(
                "the stream reported {} tokens, over the token budget of {max}; stopped",
                used.total()
            ),
        ));
    }
    let max = spend.max_cost_usd?;
    let model = spend.model.as_deref()?;
    let cost = cost?;
    (cost > max + 1e-9).then(|| {
        (
            TerminatedBy::Cost,
            format!(
                "the stream's usage costs ${cost:.4} as {model}, over the cost budget of {}; stopped",
                stepguard_core::money::usd(max)
            ),
        )
    })
}

/// The first rung of the loop ladder: what the model is told on its next call.
fn loop_notice(found: &LoopFound) -> String {
    format!(
        "system notice: you have called {} with the same arguments {} times; change approach or \
         summarise and stop",
        found.tool, found.count
    )
}

/// Says what loop stopped the run, e.g. "the agent called `shell` with the same arguments 3
/// times (since step 2)".
fn loop_message(found: &LoopFound) -> String {
    match found.kind {
        LoopKind::Repeat => format!(
            "the agent called `{}` with the same arguments {} times (since step {}); stopped as a loop",
            found.tool, found.count, found.first_step
        ),
        LoopKind::Cycle { .. } => format!(
            "the agent went round the same calls `{}` {} times (since step {}); stopped as a loop",
            found.tool, found.count, found.first_step
        ),
        LoopKind::NoProgress => format!(
            "`{}` failed with the same error {} times (since step {}), whatever the agent did in between; stopped as a loop",
            found.tool, found.count, found.first_step
        ),
    }
}
