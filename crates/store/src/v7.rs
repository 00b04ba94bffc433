//! Reading rows of schema version 7 and before: one column per record field. Frozen: only the
//! migration to version 8 reads these columns, so a new record field never comes here.

use rusqlite::Row;
use stepguard_core::{Outcome, RecordedSlug, TokenUsage};

use crate::RunRecord;

/// How many columns [`COLUMNS`] names.
pub(crate) const COLUMN_COUNT: usize = 46;

/// The record's columns, in the order [`record`] reads them.
pub(crate) const COLUMNS: &str = "id, started_at, ended_at, provider, plugin_version, unit, task_type, profile, max_steps,
    max_steps_source, command, cwd, outcome, failure_slug, exit_code, child_exit_code, terminated_by,
    duration_ms, num_steps_reported, num_steps_computed, num_turns_reported, num_turns_computed,
    input_tokens, output_tokens, cost_usd, on_limit_decision, message, child_signal, breached_at_step,
    noise_lines, unknown_events, oversized_lines, truncated_last_line, cached_input_tokens,
    reasoning_output_tokens, sub_agent_steps, plugin_source, containment, loops, final_report,
    model_calls, max_tokens, max_tokens_source, max_cost_usd, max_cost_usd_source, sub_agent_tokens";

/// Reads one row as a run record; counts stored as SQLite integers come back unsigned.
pub(crate) fn record(r: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let n = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?
            .and_then(|v| u64::try_from(v).ok()))
    };
    let command: String = r.get(10)?;
    let outcome: String = r.get(12)?;
    let decisions: Option<String> = r.get(25)?;
    let sub_agents: Option<String> = r.get(35)?;
    let tokens = match (n(22)?, n(23)?) {
        (Some(input_tokens), Some(output_tokens)) => Some(TokenUsage {
            input_tokens,
            output_tokens,
            cached_input_tokens: n(33)?,
            reasoning_output_tokens: n(34)?,
        }),
        _ => None,
    };
    // Outcomes are written by this crate only; an unreadable one is shown as a failed run.
    let mut rec = RunRecord::new(
        r.get::<_, String>(3)?,
        outcome.parse().unwrap_or(Outcome::Failed),
    );
    rec.id = r.get(0)?;
    rec.invocation.started_at = r.get(1)?;
    rec.invocation.ended_at = r.get(2)?;
    rec.source.plugin_version = r.get(4)?;
    rec.source.unit = r.get(5)?;
    rec.source.task_type = r.get(6)?;
    rec.source.profile = r.get(7)?;
    rec.step_budget.max_steps = r
        .get::<_, Option<i64>>(8)?
        .and_then(|v| u32::try_from(v).ok());
    rec.step_budget.max_steps_source = r.get(9)?;
    rec.invocation.command = Some(serde_json::from_str(&command).unwrap_or_else(|_| vec![command]));
    rec.invocation.cwd = r.get(11)?;
    rec.verdict.error_type = r
        .get::<_, Option<String>>(13)?
        .map(|s| RecordedSlug::from(s.as_str()));
    rec.verdict.exit_code = r.get(14)?;
    rec.verdict.child_exit_code = r.get(15)?;
    // Written from the same closed set the record names now.
    rec.verdict.terminated_by = r.get::<_, Option<String>>(16)?.and_then(|s| s.parse().ok());
    rec.invocation.duration_ms = n(17)?;
    rec.counts.num_steps_reported = n(18)?;
    rec.counts.num_steps_computed = n(19)?;
    rec.counts.num_turns_reported = n(20)?;
    rec.counts.num_turns_computed = n(21)?;
    rec.usage.tokens = tokens;
    rec.usage.cost_usd = r.get(24)?;
    // Stored comma-joined; decisions (`stop`, `allow:N`, `continue`) never contain a comma.
    rec.supervision.on_limit_decisions = decisions
        .map(|d| {
            d.split(',')
                .filter(|s| !s.is_empty())
                // Written by the same labels the record's decisions read.
                .filter_map(|s| s.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    rec.verdict.message = r.get(26)?;
    rec.verdict.child_signal = r.get(27)?;
    rec.supervision.breached_at_step = n(28)?;
    rec.counts.noise_lines = n(29)?;
    rec.counts.unknown_events = n(30)?;
    rec.counts.oversized_lines = n(31)?;
    rec.counts.truncated_last_line = r.get(32)?;
    rec.sub_agent_steps = sub_agents.and_then(|s| serde_json::from_str(&s).ok());
    rec.source.plugin_source = r.get(36)?;
    rec.supervision.containment = r.get::<_, Option<String>>(37)?.and_then(|s| s.parse().ok());
    rec.supervision.loops = r
        .get::<_, Option<String>>(38)?
        .and_then(|s| serde_json::from_str(&s).ok());
    rec.gateway.final_report = r.get(39)?;
    rec.gateway.model_calls = n(40)?;
    rec.spend.max_tokens = n(41)?;
    rec.spend.max_tokens_source = r.get(42)?;
    rec.spend.max_cost_usd = r.get(43)?;
    rec.spend.max_cost_usd_source = r.get(44)?;
    rec.sub_agent_tokens = r
        .get::<_, Option<String>>(45)?
        .and_then(|s| serde_json::from_str(&s).ok());
    Ok(rec)
}
