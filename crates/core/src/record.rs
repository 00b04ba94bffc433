//! The run record: the one JSON shape that describes a run wherever stepguard emits one.
//!
//! `count --json` (one per file, process fields null), `run --summary-file`, `history --json` and
//! `show --json` all serialize [`RunRecord`], so the same key always has the same type and
//! meaning. The published JSON Schema is `docs/run-record.schema.json`, generated from this type
//! (feature `schema`); field changes are listed in `CHANGELOG.md`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::loops::LoopFound;
use crate::slug::FailureSlug;
use crate::stats::{Outcome, RunStats, TokenUsage};

/// The version of the record's shape; it changes when a field is renamed, removed or retyped.
pub const RECORD_SCHEMA_VERSION: u32 = 1;

/// One run, as every stepguard command emits it. `null` always means "not known here" (a count
/// of a file has no process; an old history row has no noise count), never zero.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(title = "stepguard run record", transform = every_key_required)
)]
pub struct RunRecord {
    /// The version of this shape ([`RECORD_SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// The history id (`stepguard show ID`); null when the run was not recorded.
    pub id: Option<i64>,
    /// The stream file counted (`count` only; `-` for standard input).
    pub file: Option<String>,
    /// The provider whose step mapping applied.
    pub provider: String,
    /// The provider plugin's version.
    pub plugin_version: Option<String>,
    /// Where the provider came from: `builtin`, or the plugin file (a replaced built-in is
    /// named here, allowed by `--allow-override`).
    pub plugin_source: Option<String>,
    /// The step unit counted.
    pub unit: Option<String>,
    /// The task type the budget was resolved for.
    pub task_type: Option<String>,
    /// The profile that bounded the budget.
    pub profile: Option<String>,
    /// The step budget; null when unlimited (or not known for a count).
    pub max_steps: Option<u32>,
    /// Where the budget came from, e.g. `--max-steps` or `task_types.review.max_steps`.
    pub max_steps_source: Option<String>,
    /// The agent command as run (with any native limit added).
    pub command: Option<Vec<String>>,
    /// The working directory of the run.
    pub cwd: Option<String>,
    /// When the run started (RFC 3339, UTC).
    pub started_at: Option<String>,
    /// When it ended (RFC 3339, UTC); null while running.
    pub ended_at: Option<String>,
    /// Wall-clock duration in milliseconds.
    pub duration_ms: Option<u64>,
    /// How the run ended.
    pub outcome: Outcome,
    /// The failure slug (e.g. `max_steps`), null on success; legacy names stay as stored.
    pub error_type: Option<String>,
    /// A human-readable reason: the stream's own error text, or stepguard's (spawn, plugin).
    pub message: Option<String>,
    /// stepguard's exit code.
    pub exit_code: Option<i32>,
    /// The agent's exit code, when it exited normally.
    pub child_exit_code: Option<i32>,
    /// The signal that ended the agent, when one did.
    pub child_signal: Option<i32>,
    /// Who ended the run: `budget`, `timeout`, `signal`, `plugin`, `unrecognized`, `loop`,
    /// `idle`, `startup`, `upstream`, `wrap_up` (the agent ended by itself after the gateway
    /// made its last model call tool-less), or null (it ended by itself).
    pub terminated_by: Option<String>,
    /// How the run's processes were contained: `cgroup` (a cgroup v2 of its own) or
    /// `process-walk` (process group, subreaper and `/proc`).
    pub containment: Option<String>,
    /// The step whose beginning exceeded the budget.
    pub breached_at_step: Option<u64>,
    /// The loops found, in order, each as `{tool, count, kind, period?, first_step}` (`period`
    /// for a `cycle` only): `[]` when none was found; null when loop detection was off, the
    /// provider plugin does not report tool calls, or the run was recorded before loops were.
    pub loops: Option<Vec<LoopFound>>,
    /// The human's decisions at the limit, in order: `stop`, `allow:N`, `continue`.
    pub on_limit_decisions: Vec<String>,
    /// The model's final text when the run wrapped up (`--wrap-up`): its account of what was
    /// done and what is left; null otherwise.
    pub final_report: Option<String>,
    /// Model calls that offered tools and were forwarded upstream by the model gateway; null
    /// when the run had no gateway.
    pub model_calls: Option<u64>,
    /// The token budget (input + output tokens, cached input included); null when none was set.
    pub max_tokens: Option<u64>,
    /// Where the token budget came from (e.g. `--max-tokens`).
    pub max_tokens_source: Option<String>,
    /// The cost budget in US dollars; null when there was none.
    pub max_cost_usd: Option<f64>,
    /// Where the cost budget came from (e.g. `--max-cost-usd`).
    pub max_cost_usd_source: Option<String>,
    /// Token usage per sub-agent (Claude's Task tool), already included in `tokens`; null when
    /// the provider does not report it, or the run was recorded before it was.
    pub sub_agent_tokens: Option<BTreeMap<String, TokenUsage>>,
    /// Steps stepguard counted from the stream.
    pub num_steps_computed: Option<u64>,
    /// Steps the provider itself reported.
    pub num_steps_reported: Option<u64>,
    /// Legacy turns counted from the stream.
    pub num_turns_computed: Option<u64>,
    /// Legacy turns the provider reported.
    pub num_turns_reported: Option<u64>,
    /// Lines that were not events.
    pub noise_lines: Option<u64>,
    /// JSON lines of event types the provider plugin does not know (ignored).
    pub unknown_events: Option<u64>,
    /// Lines over the length cap (counted as noise, not passed through).
    pub oversized_lines: Option<u64>,
    /// True when the stream's last line had no newline (a cut stream).
    pub truncated_last_line: Option<bool>,
    /// Token usage as the provider reported it.
    pub tokens: Option<TokenUsage>,
    /// Cost in US dollars as the provider reported it.
    pub cost_usd: Option<f64>,
    /// Steps per sub-agent (never counted against the budget).
    pub sub_agent_steps: Option<BTreeMap<String, u64>>,
}

/// Marks every key required: a record always carries every key, `null` when unknown.
#[cfg(feature = "schema")]
fn every_key_required(schema: &mut schemars::Schema) {
    let keys: Vec<serde_json::Value> = schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|p| p.keys().cloned().map(serde_json::Value::String).collect())
        .unwrap_or_default();
    schema.insert("required".to_owned(), serde_json::Value::Array(keys));
}

impl RunRecord {
    /// Creates a record with only a provider and an outcome; everything else unknown.
    pub fn new(provider: impl Into<String>, outcome: Outcome) -> Self {
        RunRecord {
            schema_version: RECORD_SCHEMA_VERSION,
            id: None,
            file: None,
            provider: provider.into(),
            plugin_version: None,
            plugin_source: None,
            unit: None,
            task_type: None,
            profile: None,
            max_steps: None,
            max_steps_source: None,
            command: None,
            cwd: None,
            started_at: None,
            ended_at: None,
            duration_ms: None,
            outcome,
            error_type: None,
            message: None,
            exit_code: None,
            child_exit_code: None,
            child_signal: None,
            terminated_by: None,
            containment: None,
            breached_at_step: None,
            loops: None,
            on_limit_decisions: Vec::new(),
            final_report: None,
            model_calls: None,
            max_tokens: None,
            max_tokens_source: None,
            max_cost_usd: None,
            max_cost_usd_source: None,
            sub_agent_tokens: None,
            num_steps_computed: None,
            num_steps_reported: None,
            num_turns_computed: None,
            num_turns_reported: None,
            noise_lines: None,
            unknown_events: None,
            oversized_lines: None,
            truncated_last_line: None,
            tokens: None,
            cost_usd: None,
            sub_agent_steps: None,
        }
    }

    /// Copies the counts, outcome, slug, duration and usage of `stats` into the record.
    pub fn set_stats(&mut self, stats: &RunStats) {
        self.num_steps_computed = stats.num_steps_computed;
        self.num_steps_reported = stats.num_steps_reported;
        self.num_turns_computed = stats.num_turns_computed;
        self.num_turns_reported = stats.num_turns_reported;
        self.outcome = stats.outcome;
        self.error_type = stats.slug.map(|s| s.as_str().to_owned());
        self.duration_ms = stats.duration_ms;
        self.tokens = stats.tokens;
        self.cost_usd = stats.cost_usd;
    }

    /// Returns the core's stats view of the record (for the summary line and figures).
    pub fn run_stats(&self) -> RunStats {
        RunStats {
            num_steps_reported: self.num_steps_reported,
            num_steps_computed: self.num_steps_computed,
            num_turns_reported: self.num_turns_reported,
            num_turns_computed: self.num_turns_computed,
            outcome: self.outcome,
            // Unknown slugs are shown as stored by `summary_line`, not here.
            slug: self
                .error_type
                .as_deref()
                .and_then(|s| s.parse::<FailureSlug>().ok()),
            duration_ms: self.duration_ms,
            tokens: self.tokens,
            cost_usd: self.cost_usd,
        }
    }

    /// Returns the summary line; legacy slugs are shown as stored, marked as legacy.
    pub fn summary_line(&self) -> String {
        let line = self.run_stats().summary_line();
        match self.error_type.as_deref() {
            Some(s) if FailureSlug::is_legacy_name(s) => {
                line.replace("max_steps", &format!("{s} (legacy name of max_steps)"))
            }
            _ => line,
        }
    }

    /// Returns the step count to judge budgets by: computed, else reported.
    pub fn steps(&self) -> Option<u64> {
        self.num_steps_computed.or(self.num_steps_reported)
    }

    /// Returns the turn count: reported, else computed.
    pub fn turns(&self) -> Option<u64> {
        self.num_turns_reported.or(self.num_turns_computed)
    }

    /// Returns true when the slug is a budget failure (`max_steps` or its legacy name).
    pub fn is_budget_failure(&self) -> bool {
        self.error_type
            .as_deref()
            .and_then(|s| s.parse::<FailureSlug>().ok())
            .is_some_and(FailureSlug::is_budget_failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip_through_a_record() {
        let stats = RunStats {
            num_steps_computed: Some(6),
            num_turns_computed: Some(1),
            slug: Some(FailureSlug::MaxSteps),
            duration_ms: Some(194),
            ..RunStats::new(Outcome::Failed)
        };
        let mut record = RunRecord::new("codex", Outcome::Running);
        record.set_stats(&stats);
        assert_eq!(record.error_type.as_deref(), Some("max_steps"));
        assert_eq!(record.run_stats(), stats);
        assert!(record.is_budget_failure());
        assert_eq!(
            record.summary_line(),
            "Steps: 6 (legacy turns: 1) | failed: max_steps | 194ms"
        );
    }

    #[test]
    fn legacy_slugs_are_shown_as_stored() {
        let mut record = RunRecord::new("claude", Outcome::Failed);
        record.error_type = Some("max_turns".into());
        record.num_turns_reported = Some(5);
        assert!(record.is_budget_failure());
        assert_eq!(
            record.summary_line(),
            "Turns: 5 | failed: max_turns (legacy name of max_steps)"
        );
    }

    #[test]
    fn every_field_is_present_in_json_even_when_unknown() {
        let json = serde_json::to_value(RunRecord::new("codex", Outcome::Success)).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object.len(), 45);
        assert_eq!(object["schema_version"], RECORD_SCHEMA_VERSION);
        assert!(object["id"].is_null());
        assert_eq!(object["on_limit_decisions"], serde_json::json!([]));
        assert!(object["loops"].is_null());
        assert!(object["final_report"].is_null());
        assert!(object["model_calls"].is_null());
        for key in [
            "max_tokens",
            "max_tokens_source",
            "max_cost_usd",
            "max_cost_usd_source",
            "sub_agent_tokens",
        ] {
            assert!(object[key].is_null(), "{key}");
        }
    }

    #[test]
    fn token_and_cost_budgets_serialize_and_read_back() {
        let mut record = RunRecord::new("claude", Outcome::Failed);
        record.error_type = Some("max_cost".into());
        record.terminated_by = Some("cost".into());
        record.max_tokens = Some(200_000);
        record.max_tokens_source = Some("--max-tokens".into());
        record.max_cost_usd = Some(0.5);
        record.max_cost_usd_source = Some("profiles.ci.max_cost_usd".into());
        record.tokens = Some(TokenUsage {
            input_tokens: 1000,
            output_tokens: 200,
            cached_input_tokens: Some(600),
            reasoning_output_tokens: None,
        });
        record.cost_usd = Some(0.51);
        record.sub_agent_tokens = Some(BTreeMap::from([(
            "task-1".to_owned(),
            TokenUsage {
                input_tokens: 300,
                output_tokens: 40,
                ..TokenUsage::default()
            },
        )]));
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["max_tokens"], 200_000);
        assert_eq!(json["max_cost_usd"], 0.5);
        assert_eq!(json["max_cost_usd_source"], "profiles.ci.max_cost_usd");
        // Sub-agent usage has the shape of `tokens`: unknown details are left out.
        assert_eq!(
            json["sub_agent_tokens"],
            serde_json::json!({"task-1": {"input_tokens": 300, "output_tokens": 40}})
        );
        assert!(record.is_budget_failure());
        let back: RunRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn gateway_fields_serialize_and_read_back() {
        let mut record = RunRecord::new("codex", Outcome::Success);
        record.terminated_by = Some("wrap_up".into());
        record.final_report = Some("Done: the parser.\nLeft: the docs.".into());
        record.model_calls = Some(0);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["final_report"], "Done: the parser.\nLeft: the docs.");
        // Zero calls is a figure, not unknown.
        assert_eq!(json["model_calls"], 0);
        let back: RunRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn loops_serialize_with_their_kind_and_read_back() {
        use crate::loops::LoopKind;
        let mut record = RunRecord::new("codex", Outcome::Failed);
        record.loops = Some(vec![
            LoopFound {
                tool: "shell".into(),
                count: 3,
                kind: LoopKind::Repeat,
                first_step: 2,
            },
            LoopFound {
                tool: "read → edit".into(),
                count: 3,
                kind: LoopKind::Cycle { period: 2 },
                first_step: 7,
            },
        ]);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json["loops"],
            serde_json::json!([
                {"tool": "shell", "count": 3, "kind": "repeat", "first_step": 2},
                {"tool": "read → edit", "count": 3, "kind": "cycle", "period": 2, "first_step": 7},
            ])
        );
        let back: RunRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }
}
