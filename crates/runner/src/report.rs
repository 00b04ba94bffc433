//! What a run yields: the report, and the run record built from it.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use stepguard_core::verdict::{self, ChildExit, StreamVerdict, TerminatedBy};
use stepguard_core::{ExitCode, FailureSlug, Outcome, RunRecord, RunStats};
use stepguard_plugin_api::CounterStats;
use stepguard_plugin_api::host::CallError;
use stepguard_supervisor::{ExitStatus, StopReport};

use crate::event::ReaderEnd;
use crate::spec::{Labels, LimitDecision, OnUnrecognized};
use crate::stream::{StreamCount, run_stats, stream_record};

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
}

impl Ending {
    /// A run whose agent could not be started.
    pub fn not_started(
        error: std::io::Error,
        start: std::time::Instant,
        started_at: SystemTime,
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
            containment: None,
            why: None,
            gateway: None,
            spend: crate::spec::SpendLimits::default(),
            unrecognized: OnUnrecognized::Stop,
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
}

impl RunReport {
    pub(crate) fn new(spec: &Labels, ending: Ending) -> Self {
        let duration_ms = u64::try_from(ending.duration.as_millis()).unwrap_or(u64::MAX);
        let unrecognised = ending.unrecognized == OnUnrecognized::Stop
            && ending
                .reader
                .as_ref()
                .is_some_and(|end| end.recognition.failed());
        let recognition = ending
            .reader
            .as_ref()
            .map(|end| end.recognition)
            .unwrap_or_default();
        let loops = ending.reader.as_ref().and_then(|end| end.loops.clone());
        let (counter_stats, oversized_lines, truncated_last_line, plugin_error, steps) =
            match ending.reader {
                Some(end) => (
                    end.stats.unwrap_or_default(),
                    end.oversized_lines,
                    end.truncated_last_line,
                    end.plugin_error,
                    Some(end.ledger.steps()),
                ),
                // The reader was abandoned (a stuck plugin, a pipe held open): what it counted.
                None => (
                    CounterStats::default(),
                    0,
                    false,
                    None,
                    ending.pid.map(|_| ending.steps_seen),
                ),
            };
        // Counting model calls: the gateway's count is the step count.
        let steps = match &ending.gateway {
            Some(g) if g.counts_steps => Some(g.model_calls),
            _ => steps,
        };
        let mut counter_stats = counter_stats;
        counter_stats.noise_lines += oversized_lines;
        let (stats, exit_code) = match &ending.spawn_error {
            Some(_) => {
                let mut stats = RunStats::new(Outcome::Failed);
                stats.slug = Some(FailureSlug::SpawnFailed);
                (stats, ExitCode::Usage)
            }
            None => {
                let stream = counter_stats.terminal.as_ref().map(|t| StreamVerdict {
                    success: t.success,
                    slug: t
                        .slug
                        .as_deref()
                        .map(|s| s.parse().unwrap_or(FailureSlug::ProviderError)),
                });
                let child = ending.child_exit.map(|e| match e {
                    ExitStatus::Code(c) => ChildExit::Code(c),
                    ExitStatus::Signal(s) => ChildExit::Signal(s),
                });
                // Output none of which was the provider's is never a success: it was not counted.
                let judged_by = ending
                    .terminated_by
                    .or(unrecognised.then_some(TerminatedBy::Unrecognized));
                let judged = verdict::classify(judged_by, stream, child);
                let mut stats = run_stats(&counter_stats);
                stats.num_steps_computed = steps;
                stats.outcome = judged.outcome;
                stats.slug = judged.slug;
                // A wrap-up ends the run for the budget that asked for it.
                if ending.terminated_by == Some(TerminatedBy::WrapUp) {
                    match ending.gateway.as_ref().and_then(|g| g.reason) {
                        Some(stepguard_gateway::Budget::Tokens) => {
                            stats.slug = Some(FailureSlug::MaxTokens);
                        }
                        Some(stepguard_gateway::Budget::Cost) => {
                            stats.slug = Some(FailureSlug::MaxCost);
                        }
                        _ => {}
                    }
                }
                (stats, judged.exit_code)
            }
        };
        let mut stats = stats;
        stats.duration_ms = Some(duration_ms);

        let count = StreamCount {
            stats: counter_stats,
            oversized_lines,
            truncated_last_line,
            recognition,
            loops,
        };
        let mut record = stream_record(&spec.meta, &stats, &count);
        let counter_stats = count.stats;
        record.max_steps = spec.budget.get();
        record.max_steps_source = Some(spec.budget_source.clone());
        record.command = Some(spec.command.clone());
        record.started_at = Some(rfc3339(ending.started_at));
        record.ended_at = Some(rfc3339(ending.started_at + ending.duration));
        record.exit_code = Some(i32::from(exit_code.code()));
        record.child_exit_code = ending.child_exit.and_then(|e| match e {
            ExitStatus::Code(c) => Some(c),
            ExitStatus::Signal(_) => None,
        });
        record.child_signal = ending.child_exit.and_then(|e| match e {
            ExitStatus::Signal(s) => Some(s),
            ExitStatus::Code(_) => None,
        });
        record.terminated_by = ending.terminated_by.map(|t| t.as_str().to_owned());
        record.containment = ending.containment.map(str::to_owned);
        record.breached_at_step = ending.breached_at;
        record.on_limit_decisions = ending.decisions.iter().map(|d| d.label()).collect();
        if let Some(g) = &ending.gateway {
            record.model_calls = Some(g.model_calls);
            record.final_report.clone_from(&g.final_report);
            // The gateway saw every model call (sub-agents' and side calls too): its usage is
            // the run's; a cost the provider reported itself still wins.
            if g.usage.total() > 0 {
                record.tokens = Some(stepguard_core::TokenUsage {
                    input_tokens: g.usage.input,
                    output_tokens: g.usage.output,
                    cached_input_tokens: Some(g.usage.cached_input),
                    reasoning_output_tokens: record.tokens.and_then(|t| t.reasoning_output_tokens),
                });
            }
            if record.cost_usd.is_none() {
                record.cost_usd = g.cost_usd.filter(|_| g.usage.total() > 0);
            }
        }
        record.max_tokens = ending.spend.max_tokens;
        record.max_tokens_source = ending
            .spend
            .max_tokens
            .and(ending.spend.max_tokens_source.clone());
        record.max_cost_usd = ending.spend.max_cost_usd;
        record.max_cost_usd_source = ending
            .spend
            .max_cost_usd
            .and(ending.spend.max_cost_usd_source.clone());
        if let Some(e) = &ending.spawn_error {
            record.message = Some(spawn_message(&spec.command, e));
            // Nothing ran, so nothing was counted.
            record.noise_lines = None;
            record.unknown_events = None;
            record.oversized_lines = None;
            record.truncated_last_line = None;
            record.sub_agent_steps = None;
            record.sub_agent_tokens = None;
        } else if let Some(e) = &plugin_error {
            record.message = Some(e.to_string());
        } else if let Some(why) = &ending.why {
            record.message = Some(why.clone());
        }
        RunReport {
            record,
            stats,
            counter_stats,
            exit_code,
            terminated_by: ending.terminated_by,
            breached_at_step: ending.breached_at,
            decisions: ending.decisions,
            budget: spec.budget,
            child_exit: ending.child_exit,
            pid: ending.pid,
            duration: ending.duration,
            stop: ending.stop,
            plugin_error,
            spawn_error: ending.spawn_error,
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
                self.record.model_calls.unwrap_or_default()
            );
        }
        if let (Some(tokens), Some(max)) = (self.record.tokens, self.record.max_tokens) {
            let _ = write!(
                line,
                " | tokens {} of {max}",
                tokens.input_tokens + tokens.output_tokens
            );
        }
        if let Some(max) = self.record.max_cost_usd {
            match self.record.cost_usd {
                Some(cost) => {
                    let _ = write!(line, " | ${cost:.4} of ${max:.2}");
                }
                None => {
                    let _ = write!(line, " | cost unknown of ${max:.2}");
                }
            }
        }
        line
    }
}

/// Says why a command could not be started, naming it: `cannot run `x`: command not found`.
fn spawn_message(command: &[String], err: &std::io::Error) -> String {
    let why = match err.kind() {
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
