//! What a run yields: the report, and the run record built from it.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use stepguard_core::record::SpendBudgets;
use stepguard_core::verdict::{self, ChildExit, Limit, RunFacts, TerminatedBy, Verdict};
use stepguard_core::{ExitCode, LimitChoice, RunRecord, RunStats};
use stepguard_plugin_api::CounterStats;
use stepguard_plugin_api::host::CallError;
use stepguard_supervisor::{ExitStatus, StopReport};

use crate::event::ReaderEnd;
use crate::spec::{Labels, LimitDecision, OnUnrecognized};
use crate::stream::{StreamCount, run_stats, stream_record, stream_verdict};

/// How a run went, gathered by the engine.
pub(crate) struct Ending {
    pub started_at: SystemTime,
    pub duration: Duration,
    pub pid: Option<u32>,
    pub reader: Option<ReaderEnd>,
    pub child_exit: Option<ExitStatus>,
    pub terminated_by: Option<TerminatedBy>,
    pub stop: Option<StopReport>,
    pub breached_at: Option<u64>,
    pub decisions: Vec<LimitDecision>,
    pub spawn_error: Option<std::io::Error>,
    /// Steps the reader had counted (the only count left when it was abandoned).
    pub steps_seen: u64,
    /// The loops the reader had reported (the only account left when it was abandoned).
    pub loops_seen: Option<Vec<stepguard_core::loops::LoopFound>>,
    /// The stream's usage the reader had reported (the only account left when it was
    /// abandoned; reported only while a token or cost budget reads the stream).
    pub tokens_seen: Option<stepguard_plugin_api::Tokens>,
    /// The containment mechanism used.
    pub containment: Option<&'static str>,
    /// What the record's message should say about the ending, when the engine knows best (a
    /// plugin call abandoned, no answer at the limit, an unrecognised stream).
    pub why: Option<String>,
    /// What an unrecognised stream means for the verdict.
    pub unrecognized: OnUnrecognized,
    /// What the model gateway saw, when the run had one.
    pub gateway: Option<GatewayEnd>,
    /// The run's token and cost budgets.
    pub spend: crate::spec::SpendLimits,
    /// What the stream's usage cost as stepguard priced it (no gateway, a cost budget).
    pub stream_cost_usd: Option<f64>,
    /// When stepguard should be gone (see [`RunReport::exit_by`]).
    pub exit_by: std::time::Instant,
}

/// The model gateway's account of a run.
#[derive(Clone, Debug, Default)]
pub(crate) struct GatewayEnd {
    /// Model calls that offered tools, forwarded upstream.
    pub model_calls: u64,
    /// The last call's reply text, when the last call was made tool-less.
    pub final_report: Option<String>,
    /// Whether the unit is `request`: the model calls are the steps.
    pub counts_steps: bool,
    /// Usage of every model call that went through it.
    pub usage: stepguard_gateway::CallUsage,
    /// Their cost, when every one could be priced.
    pub cost_usd: Option<f64>,
    /// Which budget made the last call the last one.
    pub reason: Option<stepguard_gateway::Budget>,
    /// The staged notices sent, in order.
    pub notices: Vec<stepguard_gateway::SentNotice>,
}

impl Ending {
    /// A run whose agent could not be started.
    pub fn not_started(
        error: std::io::Error,
        start: std::time::Instant,
        started_at: SystemTime,
        exit_by: std::time::Instant,
    ) -> Self {
        Ending {
            started_at,
            duration: start.elapsed(),
            pid: None,
            reader: None,
            child_exit: None,
            terminated_by: None,
            stop: None,
            breached_at: None,
            decisions: Vec::new(),
            spawn_error: Some(error),
            steps_seen: 0,
            loops_seen: None,
            tokens_seen: None,
            containment: None,
            why: None,
            gateway: None,
            spend: crate::spec::SpendLimits::default(),
            unrecognized: OnUnrecognized::Stop,
            stream_cost_usd: None,
            exit_by,
        }
    }
}

/// Everything a supervised run produced.
#[derive(Debug)]
pub struct RunReport {
    /// The run record, as every stepguard command emits it (`id` is set by a history
    /// recorder, when one observed the run).
    pub record: RunRecord,
    /// The run's numbers and verdict.
    pub stats: RunStats,
    /// The counter's own final numbers (default when the plugin failed).
    pub counter_stats: CounterStats,
    /// What stepguard exits with.
    pub exit_code: ExitCode,
    /// Who stopped the agent, when stepguard did.
    pub terminated_by: Option<TerminatedBy>,
    /// The step whose beginning exceeded the budget.
    pub breached_at_step: Option<u64>,
    /// The on-limit policy's decisions, in order (only a policy that asks records them).
    pub decisions: Vec<LimitDecision>,
    /// The budget in force at the start.
    pub budget: stepguard_core::StepLimit,
    /// How the agent process ended, when it was seen to end.
    pub child_exit: Option<ExitStatus>,
    /// The agent's pid (also its process group id), when it started.
    pub pid: Option<u32>,
    /// Wall-clock time from start to the end of supervision.
    pub duration: Duration,
    /// What stopping the tree took, when stepguard stopped it.
    pub stop: Option<StopReport>,
    /// The plugin failure that ended the run (fail closed), if any.
    pub plugin_error: Option<CallError>,
    /// Why the agent could not be started, if it could not.
    pub spawn_error: Option<std::io::Error>,
    /// When stepguard should be gone: the one bound that every wait after the run's end shares
    /// (at most 2.5 s after the stop; see the crate docs). Observers that write the record
    /// elsewhere (a database, a collector) wait until then at most, and so does the caller's
    /// last output.
    pub exit_by: std::time::Instant,
}

impl RunReport {
    pub(crate) fn new(spec: &Labels, mut ending: Ending) -> Self {
        let counted = Counted::take(&mut ending);
        let verdict = verdict::classify(facts(&ending, &counted));
        let mut stats = judged_stats(&ending, &counted, verdict);
        let mut record = stream_record(&spec.meta, &stats, &counted.count);
        set_process_fields(&mut record, spec, &ending, verdict.exit_code);
        if let Some(g) = &ending.gateway {
            set_gateway_fields(&mut record, g);
            // One source: the summary line shows the usage the record holds (the gateway's,
            // which saw every call), not the stream's.
            stats.tokens = record.usage.tokens;
            stats.cost_usd = record.usage.cost_usd;
        }
        // The cost the budget was kept with, when the stream did not report its own.
        if record.usage.cost_usd.is_none() {
            record.usage.cost_usd = ending.stream_cost_usd;
        }
        set_spend_fields(&mut record, &ending.spend);
        set_message(&mut record, spec, &ending, counted.plugin_error.as_ref());
        RunReport {
            record,
            stats,
            counter_stats: counted.count.stats,
            exit_code: verdict.exit_code,
            terminated_by: ending.terminated_by,
            breached_at_step: ending.breached_at,
            decisions: ending.decisions,
            budget: spec.budget,
            child_exit: ending.child_exit,
            pid: ending.pid,
            duration: ending.duration,
            stop: ending.stop,
            plugin_error: counted.plugin_error,
            spawn_error: ending.spawn_error,
            exit_by: ending.exit_by,
        }
    }

    /// Returns the one-line summary, e.g.
    /// `Steps: 6 (legacy turns: 1) | failed: max_steps | 194ms | stopped at step 6 of 5`.
    pub fn summary_line(&self) -> String {
        let mut line = self.stats.summary_line();
        if let (Some(step), Some(TerminatedBy::Budget)) =
            (self.breached_at_step, self.terminated_by)
        {
            let _ = write!(line, " | stopped at step {step} of {}", self.budget);
        }
        if self.terminated_by == Some(TerminatedBy::WrapUp) {
            let _ = write!(
                line,
                " | wrapped up: the last of {} model calls had no tools",
                self.record.gateway.model_calls.unwrap_or_default()
            );
        }
        if let (Some(tokens), Some(max)) = (self.record.usage.tokens, self.record.spend.max_tokens)
        {
            let _ = write!(
                line,
                " | tokens {} of {max}",
                tokens.input_tokens + tokens.output_tokens
            );
        }
        if let Some(max) = self.record.spend.max_cost_usd {
            match self.record.usage.cost_usd {
                Some(cost) => {
                    let _ = write!(line, " | ${cost:.4} of {}", stepguard_core::money::usd(max));
                }
                None => {
                    let _ = write!(
                        line,
                        " | cost unknown of {}",
                        stepguard_core::money::usd(max)
                    );
                }
            }
        }
        line
    }
}

/// What the reader counted, taken out of the ending.
struct Counted {
    /// The stream's numbers (noise includes oversized lines).
    count: StreamCount,
    /// The plugin failure that ended the run, if any.
    plugin_error: Option<CallError>,
    /// Steps counted: the ledger's, the gateway's model calls when they are the steps, what an
    /// abandoned reader had seen, or none when nothing ran.
    steps: Option<u64>,
    /// Lines were seen and none was the provider's.
    unrecognised: bool,
    /// The reader saw the stream end and not one line came.
    silent: bool,
}

impl Counted {
    fn take(ending: &mut Ending) -> Self {
        let silent = ending
            .reader
            .as_ref()
            .is_some_and(|end| end.recognition.silent());
        let (mut count, plugin_error, steps) = match ending.reader.take() {
            Some(end) => (
                StreamCount {
                    stats: end.stats.unwrap_or_default(),
                    oversized_lines: end.oversized_lines,
                    truncated_last_line: end.truncated_last_line,
                    recognition: end.recognition,
                    loops: end.loops,
                },
                end.plugin_error,
                Some(end.ledger.steps()),
            ),
            // The reader was abandoned (a stuck plugin, a pipe held open): what it counted.
            None => (
                StreamCount {
                    stats: {
                        let mut stats = CounterStats::default();
                        stats.tokens = ending.tokens_seen.take();
                        stats
                    },
                    oversized_lines: 0,
                    truncated_last_line: false,
                    recognition: Default::default(),
                    loops: ending.loops_seen.take(),
                },
                None,
                ending.pid.map(|_| ending.steps_seen),
            ),
        };
        count.stats.noise_lines += count.oversized_lines;
        // Unknown events after the first recognised line are only known from the totals.
        count.recognition.settle(&count.stats);
        // Counting model calls: the gateway's count is the step count.
        let steps = match &ending.gateway {
            Some(g) if g.counts_steps => Some(g.model_calls),
            _ => steps,
        };
        Counted {
            unrecognised: count.recognition.failed(),
            silent,
            count,
            plugin_error,
            steps,
        }
    }
}

/// Everything the verdict depends on.
fn facts(ending: &Ending, counted: &Counted) -> RunFacts {
    RunFacts {
        spawn_failed: ending.spawn_error.is_some(),
        terminated_by: ending.terminated_by,
        wrapped_up_for: ending
            .gateway
            .as_ref()
            .and_then(|g| g.reason)
            .map(|reason| match reason {
                stepguard_gateway::Budget::Steps => Limit::Steps,
                stepguard_gateway::Budget::Tokens => Limit::Tokens,
                stepguard_gateway::Budget::Cost => Limit::Cost,
            }),
        // Output none of which was the provider's is never a success: it was not counted.
        unrecognized: counted.unrecognised && ending.unrecognized == OnUnrecognized::Stop,
        // No output at all is no stream either.
        silent: counted.silent && ending.unrecognized == OnUnrecognized::Stop,
        stream: stream_verdict(&counted.count.stats),
        child: ending.child_exit.map(|e| match e {
            ExitStatus::Code(c) => ChildExit::Code(c),
            ExitStatus::Signal(s) => ChildExit::Signal(s),
        }),
    }
}

/// The run's numbers with the verdict: none when nothing ran.
fn judged_stats(ending: &Ending, counted: &Counted, verdict: Verdict) -> RunStats {
    let mut stats = if ending.spawn_error.is_some() {
        RunStats::new(verdict.outcome)
    } else {
        let mut stats = run_stats(&counted.count.stats);
        stats.num_steps_computed = counted.steps;
        stats
    };
    stats.outcome = verdict.outcome;
    stats.slug = verdict.slug;
    stats.duration_ms = Some(u64::try_from(ending.duration.as_millis()).unwrap_or(u64::MAX));
    stats
}

/// The fields only a supervised run has: the budget, the command, times, exits, who stopped
/// it, containment, breach and decisions.
fn set_process_fields(record: &mut RunRecord, spec: &Labels, ending: &Ending, exit: ExitCode) {
    record.step_budget.max_steps = spec.budget.get();
    record.step_budget.max_steps_source = Some(spec.budget_source.clone());
    record.invocation.command = Some(spec.shown.clone());
    record.invocation.started_at = Some(rfc3339(ending.started_at));
    record.invocation.ended_at = Some(rfc3339(ending.started_at + ending.duration));
    let verdict = &mut record.verdict;
    verdict.exit_code = Some(i32::from(exit.code()));
    verdict.child_exit_code = ending.child_exit.and_then(|e| match e {
        ExitStatus::Code(c) => Some(c),
        ExitStatus::Signal(_) => None,
    });
    verdict.child_signal = ending.child_exit.and_then(|e| match e {
        ExitStatus::Signal(s) => Some(s),
        ExitStatus::Code(_) => None,
    });
    verdict.terminated_by = ending.terminated_by;
    let supervision = &mut record.supervision;
    supervision.containment = ending.containment.and_then(|c| c.parse().ok());
    supervision.breached_at_step = ending.breached_at;
    supervision.on_limit_decisions = ending
        .decisions
        .iter()
        .map(|d| match *d {
            LimitDecision::Stop => LimitChoice::Stop,
            LimitDecision::Allow(n) => LimitChoice::Allow(n),
            LimitDecision::Unlimited => LimitChoice::Continue,
        })
        .collect();
}

/// What the model gateway saw: its calls, the final report, and the usage of every call.
fn set_gateway_fields(record: &mut RunRecord, g: &GatewayEnd) {
    record.gateway.model_calls = Some(g.model_calls);
    record.gateway.final_report.clone_from(&g.final_report);
    record.gateway.notices = Some(g.notices.iter().map(budget_notice).collect());
    // The gateway saw every model call (sub-agents' and side calls too): its usage is the
    // run's; a cost the provider reported itself still wins.
    let usage = &mut record.usage;
    if g.usage.total() > 0 {
        usage.tokens = Some(stepguard_core::TokenUsage {
            input_tokens: g.usage.input,
            output_tokens: g.usage.output,
            cached_input_tokens: Some(g.usage.cached_input),
            reasoning_output_tokens: usage.tokens.and_then(|t| t.reasoning_output_tokens),
        });
    }
    if usage.cost_usd.is_none() {
        usage.cost_usd = g.cost_usd.filter(|_| g.usage.total() > 0);
    }
}

/// A staged notice the gateway sent, as the record holds it.
fn budget_notice(n: &stepguard_gateway::SentNotice) -> stepguard_core::BudgetNotice {
    use stepguard_core::NoticeLimit as R;
    use stepguard_gateway::NoticeLimit as G;
    stepguard_core::BudgetNotice {
        limit: match n.limit {
            G::Steps => R::Steps,
            G::Tokens => R::Tokens,
            G::Cost => R::Cost,
            G::Pool => R::Pool,
            G::Time => R::Time,
        },
        threshold: n.threshold,
        at_step: n.at_step,
        model_call: n.model_call,
        text: n.text.clone(),
    }
}

/// The token and cost budgets, each with its source only when it was set.
fn set_spend_fields(record: &mut RunRecord, spend: &crate::spec::SpendLimits) {
    record.spend = SpendBudgets {
        max_tokens: spend.max_tokens,
        max_tokens_source: spend.max_tokens.and(spend.max_tokens_source.clone()),
        max_cost_usd: spend.max_cost_usd,
        max_cost_usd_source: spend.max_cost_usd.and(spend.max_cost_usd_source.clone()),
        pools: record.spend.pools.take(),
        ledger: record.spend.ledger.take(),
    };
}

/// Why the run ended, in words, when stepguard knows better than the stream: a command that
/// could not start (then nothing was counted), a plugin failure, the engine's own reason.
fn set_message(
    record: &mut RunRecord,
    spec: &Labels,
    ending: &Ending,
    plugin_error: Option<&CallError>,
) {
    if let Some(e) = &ending.spawn_error {
        record.verdict.message = Some(spawn_message(&spec.command, e));
        // Nothing ran, so nothing was counted.
        record.counts.noise_lines = None;
        record.counts.unknown_events = None;
        record.counts.oversized_lines = None;
        record.counts.truncated_last_line = None;
        record.sub_agent_steps = None;
        record.sub_agent_tokens = None;
    } else if let Some(e) = plugin_error {
        record.verdict.message = Some(e.to_string());
    } else if let Some(why) = &ending.why {
        record.verdict.message = Some(why.clone());
    }
}

/// Says why a command could not be started, naming it: `cannot run `x`: command not found`.
fn spawn_message(command: &[String], err: &std::io::Error) -> String {
    let why = match err.kind() {
        // The launch's own words, naming the fix.
        _ if err.get_ref().is_some() => err.to_string(),
        std::io::ErrorKind::NotFound => "command not found".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => err.to_string(),
    };
    let program = command.first().map_or("", String::as_str);
    format!("cannot run `{program}`: {why}")
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Instant, SystemTime};

    use stepguard_core::loops::{LoopFound, LoopKind};

    use super::{Counted, Ending};

    /// A reader abandoned after it reported a loop (a plugin stuck in the drain, a loaded
    /// machine): the record still holds the loop the engine was told of, the steps and the usage.
    #[test]
    fn an_abandoned_reader_leaves_its_loops_and_steps_in_the_record() {
        let mut ending = Ending::not_started(
            std::io::Error::other("unused"),
            Instant::now(),
            SystemTime::now(),
            Instant::now(),
        );
        ending.spawn_error = None;
        ending.pid = Some(42);
        ending.steps_seen = 3;
        let found = LoopFound {
            tool: "shell".into(),
            count: 3,
            kind: LoopKind::Repeat,
            first_step: 1,
        };
        ending.loops_seen = Some(vec![found.clone()]);
        ending.tokens_seen = Some(stepguard_plugin_api::Tokens::new(900, 100));
        let counted = Counted::take(&mut ending);
        assert_eq!(counted.count.loops, Some(vec![found]));
        assert_eq!(
            counted.count.stats.tokens,
            Some(stepguard_plugin_api::Tokens::new(900, 100))
        );
        assert_eq!(counted.steps, Some(3));
    }
}
