//! The run record: the one JSON shape that describes a run wherever stepguard emits one.
//!
//! `count --json` (one per file, process fields null), `run --summary-file`, `history --json` and
//! `show --json` all serialize [`RunRecord`], so the same key always has the same type and
//! meaning. The published JSON Schema is `docs/run-record.schema.json`, generated from this type
//! (feature `schema`); field changes are listed in `CHANGELOG.md`.

use std::collections::BTreeMap;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::loops::LoopFound;
use crate::slug::FailureSlug;
use crate::stats::{Outcome, RunStats, TokenUsage};
use crate::verdict::{TerminatedBy, UnknownValue};

/// The version of the record's shape; it changes when a field is renamed, removed or retyped.
pub const RECORD_SCHEMA_VERSION: u32 = 1;

/// One run, as every stepguard command emits it. `null` always means "not known here" (a count
/// of a file has no process; an old history row has no noise count), never zero.
//
// In Rust the fields are grouped (`Source`, `Invocation`, `RecordedVerdict` …); in JSON every
// group is flattened, so the record stays one flat object whose keys come in the order of the
// groups' fields (`the_groups_flatten_into_one_object_in_the_published_key_order`).
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
    /// Which provider counted, with which unit, for which task.
    #[serde(flatten)]
    pub source: Source,
    /// The step budget and where it came from.
    #[serde(flatten)]
    pub step_budget: StepBudget,
    /// What ran, and when.
    #[serde(flatten)]
    pub invocation: Invocation,
    /// The CLI's session, and the run this one resumes.
    #[serde(flatten)]
    pub chain: Chain,
    /// How the run ended, and who ended it.
    #[serde(flatten)]
    pub verdict: RecordedVerdict,
    /// How the run was contained and stopped.
    #[serde(flatten)]
    pub supervision: Supervision,
    /// What the model gateway saw (`--wrap-up`).
    #[serde(flatten)]
    pub gateway: GatewayFigures,
    /// The token and cost budgets and where they came from.
    #[serde(flatten)]
    pub spend: SpendBudgets,
    /// Token usage per sub-agent (Claude's Task tool), already included in `tokens`; null when
    /// the provider does not report it, or the run was recorded before it was.
    pub sub_agent_tokens: Option<BTreeMap<String, TokenUsage>>,
    /// What the stream said: steps, turns and the lines that were not events.
    #[serde(flatten)]
    pub counts: Counts,
    /// Token usage and cost as the provider reported them.
    #[serde(flatten)]
    pub usage: Usage,
    /// Steps per sub-agent (never counted against the budget).
    pub sub_agent_steps: Option<BTreeMap<String, u64>>,
    /// The checkpoint of the work tree at the stop (`--checkpoint git`): the ref, the files
    /// changed since the run began, or why none was written; null when checkpoints were off or
    /// the run succeeded.
    pub checkpoint: Option<crate::checkpoint::Checkpoint>,
}

/// Which provider counted the run, with which unit, for which task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Source {
    /// The provider whose step mapping applied.
    pub provider: String,
    /// The provider plugin's version.
    pub plugin_version: Option<String>,
    /// Where the provider came from: `builtin`, or the plugin file (a replaced built-in is
    /// named here, allowed by `--allow-override`).
    pub plugin_source: Option<String>,
    /// The step unit counted. Units are the provider plugin's own (its manifest names them),
    /// so this is an open set of names, not an enum.
    pub unit: Option<String>,
    /// The task type the budget was resolved for.
    pub task_type: Option<String>,
    /// The profile that bounded the budget.
    pub profile: Option<String>,
}

/// The step budget of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StepBudget {
    /// The step budget; null when unlimited (or not known for a count).
    pub max_steps: Option<u32>,
    /// Where the budget came from, e.g. `--max-steps` or `task_types.review.max_steps`.
    pub max_steps_source: Option<String>,
}

/// What ran, where and when.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Invocation {
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
}

/// The agent CLI's own session of a run, and the run it resumes (`stepguard resume`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Chain {
    /// The CLI's id of the session the stream belongs to (Claude's `session_id`, Codex's thread
    /// id …), which `stepguard resume` resumes; null when the stream named none, the provider
    /// does not report it, or the run was recorded before it was.
    pub session_id: Option<String>,
    /// The history id of the run this one resumes (`stepguard resume ID`); null for a run
    /// started afresh.
    pub resumed_from: Option<i64>,
}

/// How a run ended, as [`crate::verdict::classify`] judged it, and who ended it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RecordedVerdict {
    /// How the run ended.
    pub outcome: Outcome,
    /// The failure slug (e.g. `max_steps`), null on success; legacy names stay as stored.
    pub error_type: Option<RecordedSlug>,
    /// A human-readable reason: the stream's own error text, or stepguard's (spawn, plugin).
    pub message: Option<String>,
    /// stepguard's exit code.
    pub exit_code: Option<i32>,
    /// The agent's exit code, when it exited normally.
    pub child_exit_code: Option<i32>,
    /// The signal that ended the agent, when one did.
    pub child_signal: Option<i32>,
    /// Who ended the run, or null (it ended by itself). `wrap_up`: the agent ended by itself
    /// after the gateway made its last model call tool-less.
    pub terminated_by: Option<TerminatedBy>,
}

/// How a run was contained and stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Supervision {
    /// How the run's processes were contained.
    pub containment: Option<Containment>,
    /// The step whose beginning exceeded the budget.
    pub breached_at_step: Option<u64>,
    /// The loops found, in order, each as `{tool, count, kind, period?, first_step}` (`period`
    /// for a `cycle` only): `[]` when none was found; null when loop detection was off, the
    /// provider plugin does not report tool calls, or the run was recorded before loops were.
    pub loops: Option<Vec<LoopFound>>,
    /// The human's decisions at the limit, in order: `stop`, `allow:N`, `continue`.
    pub on_limit_decisions: Vec<LimitChoice>,
}

/// What the model gateway of `--wrap-up` saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GatewayFigures {
    /// The model's final text when the run wrapped up (`--wrap-up`): its account of what was
    /// done and what is left; null otherwise.
    pub final_report: Option<String>,
    /// Model calls that offered tools and were forwarded upstream by the model gateway; null
    /// when the run had no gateway.
    pub model_calls: Option<u64>,
    /// The staged notices the gateway gave the model as the run crossed its thresholds of a
    /// limit, in order: `[]` when none was given; null when the run had no gateway, or was
    /// recorded before notices were.
    pub notices: Option<Vec<BudgetNotice>>,
}

/// A staged notice: the model was told what was left of one of its limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BudgetNotice {
    /// The limit it told of.
    pub limit: NoticeLimit,
    /// The share of the limit spent that it marked (e.g. 0.8): the highest crossed, when one
    /// model call crossed several.
    pub threshold: f64,
    /// The steps the run had taken when it was given.
    pub at_step: u64,
    /// The model call that carried it (the gateway's count of forwarded calls, from 1).
    pub model_call: u64,
    /// The notice as the model got it (one notice may tell of several limits).
    pub text: String,
}

/// The limit a [`BudgetNotice`] told of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NoticeLimit {
    /// The step budget.
    Steps,
    /// The token budget.
    Tokens,
    /// The cost budget.
    Cost,
    /// The run's share of a pool.
    Pool,
    /// The time before `--timeout`.
    Time,
}

impl NoticeLimit {
    /// Returns the stable name.
    pub const fn as_str(self) -> &'static str {
        match self {
            NoticeLimit::Steps => "steps",
            NoticeLimit::Tokens => "tokens",
            NoticeLimit::Cost => "cost",
            NoticeLimit::Pool => "pool",
            NoticeLimit::Time => "time",
        }
    }
}

/// The token and cost budgets of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SpendBudgets {
    /// The token budget (input + output tokens, cached input included); null when none was set.
    pub max_tokens: Option<u64>,
    /// Where the token budget came from (e.g. `--max-tokens`).
    pub max_tokens_source: Option<String>,
    /// The cost budget in US dollars; null when there was none.
    pub max_cost_usd: Option<f64>,
    /// Where the cost budget came from (e.g. `--max-cost-usd`).
    pub max_cost_usd_source: Option<String>,
    /// The pools (budgets shared with other runs) the run joined; null when none. A budget that
    /// a pool's share lowered names it as its source (`pool NAME`).
    pub pools: Option<Vec<String>>,
    /// The ledger the run's pools were kept in; null when it joined none. `fallback` is true
    /// when the fleet ledger could not be reached at the start and `on_ledger_error = "local"`
    /// kept them in the local ledger instead (other hosts did not see this run's spend).
    pub ledger: Option<PoolLedger>,
}

/// Which ledger kept a run's pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LedgerKind {
    /// The history database of the host (SQLite).
    Local,
    /// The fleet ledger (PostgreSQL) every host shares.
    Fleet,
}

/// The ledger a run's pools were kept in, and whether it was a fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PoolLedger {
    /// `local` or `fleet`.
    pub kind: LedgerKind,
    /// True when the fleet ledger was named but unreachable at the start, and the run kept its
    /// pools in the local ledger (`on_ledger_error = "local"`).
    pub fallback: bool,
}

/// What the stream said: steps, turns, and the lines that were not events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Counts {
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
}

/// Token usage and cost as the provider reported them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// Token usage as the provider reported it.
    pub tokens: Option<TokenUsage>,
    /// Cost in US dollars as the provider reported it.
    pub cost_usd: Option<f64>,
}

/// How a run's processes were contained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub enum Containment {
    /// A cgroup v2 of its own.
    #[serde(rename = "cgroup")]
    Cgroup,
    /// Process group, subreaper and `/proc`.
    #[serde(rename = "process-walk")]
    ProcessWalk,
}

impl Containment {
    /// Every value, in declaration order.
    pub const ALL: &'static [Containment] = &[Containment::Cgroup, Containment::ProcessWalk];

    /// Returns the stable name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Containment::Cgroup => "cgroup",
            Containment::ProcessWalk => "process-walk",
        }
    }
}

impl FromStr for Containment {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Containment::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownValue {
                what: "containment",
                value: s.to_owned(),
            })
    }
}

impl fmt::Display for Containment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision taken at the limit by a policy that asks (`--on-limit ask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitChoice {
    /// Stop the run (`stop`).
    Stop,
    /// Allow this many more steps (`allow:N`).
    Allow(u32),
    /// Go on without a limit (`continue`).
    Continue,
}

impl fmt::Display for LimitChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitChoice::Stop => f.write_str("stop"),
            LimitChoice::Allow(n) => write!(f, "allow:{n}"),
            LimitChoice::Continue => f.write_str("continue"),
        }
    }
}

impl FromStr for LimitChoice {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stop" => Ok(LimitChoice::Stop),
            "continue" => Ok(LimitChoice::Continue),
            _ => s
                .strip_prefix("allow:")
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse().ok())
                .map(LimitChoice::Allow)
                .ok_or_else(|| UnknownValue {
                    what: "on-limit decision",
                    value: s.to_owned(),
                }),
        }
    }
}

impl Serialize for LimitChoice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LimitChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for LimitChoice {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LimitChoice".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A decision at the limit: `stop`, `allow:N` (N more steps) or `continue`.",
            "type": "string",
            "pattern": "^(stop|continue|allow:[0-9]+)$"
        })
    }
}

/// A record's failure slug as stored: one this stepguard knows, or a legacy spelling kept as
/// it was written (`max_turns`, shown as stored and read as `max_steps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RecordedSlug {
    /// A slug of [`FailureSlug`], in its own spelling.
    Known(FailureSlug),
    /// Any other spelling, kept as stored (legacy names; what an older stepguard wrote).
    AsStored(String),
}

impl RecordedSlug {
    /// Returns the slug as stored.
    pub fn as_str(&self) -> &str {
        match self {
            RecordedSlug::Known(slug) => slug.as_str(),
            RecordedSlug::AsStored(s) => s,
        }
    }

    /// Returns the slug it means: legacy names read as the slug they became.
    pub fn slug(&self) -> Option<FailureSlug> {
        match self {
            RecordedSlug::Known(slug) => Some(*slug),
            RecordedSlug::AsStored(s) => s.parse().ok(),
        }
    }

    /// Returns true for a legacy spelling of `max_steps`.
    pub fn is_legacy(&self) -> bool {
        FailureSlug::is_legacy_name(self.as_str())
    }
}

impl From<FailureSlug> for RecordedSlug {
    fn from(slug: FailureSlug) -> Self {
        RecordedSlug::Known(slug)
    }
}

impl From<&str> for RecordedSlug {
    /// Keeps a slug's own spelling as [`RecordedSlug::Known`], anything else as stored.
    fn from(s: &str) -> Self {
        FailureSlug::ALL
            .iter()
            .copied()
            .find(|slug| slug.as_str() == s)
            .map_or_else(|| RecordedSlug::AsStored(s.to_owned()), RecordedSlug::Known)
    }
}

impl fmt::Display for RecordedSlug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RecordedSlug {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RecordedSlug {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(RecordedSlug::from(
            String::deserialize(deserializer)?.as_str(),
        ))
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for RecordedSlug {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FailureSlug".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut names: Vec<&str> = FailureSlug::ALL.iter().map(|s| s.as_str()).collect();
        names.push(crate::slug::LEGACY_MAX_TURNS_SLUG);
        schemars::json_schema!({
            "description": "A failure slug; `max_turns` is the legacy name of `max_steps`, kept as stored.",
            "type": "string",
            "enum": names
        })
    }
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
            source: Source {
                provider: provider.into(),
                ..Source::default()
            },
            step_budget: StepBudget::default(),
            invocation: Invocation::default(),
            chain: Chain::default(),
            verdict: RecordedVerdict {
                outcome,
                error_type: None,
                message: None,
                exit_code: None,
                child_exit_code: None,
                child_signal: None,
                terminated_by: None,
            },
            supervision: Supervision::default(),
            gateway: GatewayFigures::default(),
            spend: SpendBudgets::default(),
            sub_agent_tokens: None,
            counts: Counts::default(),
            usage: Usage::default(),
            sub_agent_steps: None,
            checkpoint: None,
        }
    }

    /// Copies the counts, outcome, slug, duration and usage of `stats` into the record.
    pub fn set_stats(&mut self, stats: &RunStats) {
        self.counts.num_steps_computed = stats.num_steps_computed;
        self.counts.num_steps_reported = stats.num_steps_reported;
        self.counts.num_turns_computed = stats.num_turns_computed;
        self.counts.num_turns_reported = stats.num_turns_reported;
        self.verdict.outcome = stats.outcome;
        self.verdict.error_type = stats.slug.map(RecordedSlug::Known);
        self.invocation.duration_ms = stats.duration_ms;
        self.usage.tokens = stats.tokens;
        self.usage.cost_usd = stats.cost_usd;
    }

    /// Returns the core's stats view of the record (for the summary line and figures).
    pub fn run_stats(&self) -> RunStats {
        RunStats {
            num_steps_reported: self.counts.num_steps_reported,
            num_steps_computed: self.counts.num_steps_computed,
            num_turns_reported: self.counts.num_turns_reported,
            num_turns_computed: self.counts.num_turns_computed,
            outcome: self.verdict.outcome,
            // Unknown slugs are shown as stored by `summary_line`, not here.
            slug: self
                .verdict
                .error_type
                .as_ref()
                .and_then(RecordedSlug::slug),
            duration_ms: self.invocation.duration_ms,
            tokens: self.usage.tokens,
            cost_usd: self.usage.cost_usd,
        }
    }

    /// Returns the summary line; legacy slugs are shown as stored, marked as legacy.
    pub fn summary_line(&self) -> String {
        let line = self.run_stats().summary_line();
        match &self.verdict.error_type {
            Some(s) if s.is_legacy() => {
                line.replace("max_steps", &format!("{s} (legacy name of max_steps)"))
            }
            _ => line,
        }
    }

    /// Returns the provider's name.
    pub fn provider(&self) -> &str {
        &self.source.provider
    }

    /// Returns the step count to judge budgets by: computed, else reported.
    pub fn steps(&self) -> Option<u64> {
        self.counts
            .num_steps_computed
            .or(self.counts.num_steps_reported)
    }

    /// Returns the turn count: reported, else computed.
    pub fn turns(&self) -> Option<u64> {
        self.counts
            .num_turns_reported
            .or(self.counts.num_turns_computed)
    }

    /// Returns true when the slug is a budget failure (`max_steps` or its legacy name).
    pub fn is_budget_failure(&self) -> bool {
        self.verdict
            .error_type
            .as_ref()
            .and_then(RecordedSlug::slug)
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
        assert_eq!(
            record.verdict.error_type.as_ref().map(RecordedSlug::as_str),
            Some("max_steps")
        );
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
        record.verdict.error_type = Some("max_turns".into());
        record.counts.num_turns_reported = Some(5);
        assert!(record.is_budget_failure());
        assert_eq!(
            record.summary_line(),
            "Turns: 5 | failed: max_turns (legacy name of max_steps)"
        );
    }

    #[test]
    fn recorded_slugs_keep_their_spelling_and_read_as_the_slug_they_mean() {
        for (stored, known, slug) in [
            ("max_steps", true, Some(FailureSlug::MaxSteps)),
            ("max_turns", false, Some(FailureSlug::MaxSteps)),
            ("MAX_STEPS", false, Some(FailureSlug::MaxSteps)),
            ("from_the_future", false, None),
        ] {
            let recorded: RecordedSlug = serde_json::from_str(&format!("\"{stored}\"")).unwrap();
            assert_eq!(
                matches!(recorded, RecordedSlug::Known(_)),
                known,
                "{stored}"
            );
            assert_eq!(recorded.slug(), slug, "{stored}");
            assert_eq!(
                serde_json::to_string(&recorded).unwrap(),
                format!("\"{stored}\"")
            );
        }
        for (text, choice) in [
            ("stop", LimitChoice::Stop),
            ("allow:12", LimitChoice::Allow(12)),
            ("continue", LimitChoice::Continue),
        ] {
            assert_eq!(text.parse::<LimitChoice>(), Ok(choice));
            assert_eq!(
                serde_json::to_string(&choice).unwrap(),
                format!("\"{text}\"")
            );
        }
        for bad in ["allow:", "allow:-1", "allow:+2", "Stop", "allow:2,stop"] {
            assert!(bad.parse::<LimitChoice>().is_err(), "{bad}");
        }
        for &c in Containment::ALL {
            assert_eq!(c.as_str().parse::<Containment>(), Ok(c));
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
        }
        assert!("walk".parse::<Containment>().is_err());
    }

    #[test]
    fn the_groups_flatten_into_one_object_in_the_published_key_order() {
        let mut record = RunRecord::new("codex", Outcome::Failed);
        record.verdict.error_type = Some(FailureSlug::MaxSteps.into());
        record.verdict.terminated_by = Some(TerminatedBy::Budget);
        record.supervision.containment = Some(Containment::ProcessWalk);
        let text = serde_json::to_string(&record).unwrap();
        let mut keys: Vec<&str> = text
            .split("\":")
            .filter_map(|part| part.rsplit('"').next())
            .collect();
        keys.pop(); // after the last key: its value

        assert_eq!(
            keys.join(","),
            "schema_version,id,file,provider,plugin_version,plugin_source,unit,task_type,\
             profile,max_steps,max_steps_source,command,cwd,started_at,ended_at,duration_ms,\
             session_id,resumed_from,outcome,error_type,message,exit_code,child_exit_code,child_signal,terminated_by,\
             containment,breached_at_step,loops,on_limit_decisions,final_report,model_calls,\
             notices,max_tokens,max_tokens_source,max_cost_usd,max_cost_usd_source,pools,ledger,sub_agent_tokens,\
             num_steps_computed,num_steps_reported,num_turns_computed,num_turns_reported,\
             noise_lines,unknown_events,oversized_lines,truncated_last_line,tokens,cost_usd,\
             sub_agent_steps,checkpoint"
        );
        assert!(text.contains(r#""error_type":"max_steps""#), "{text}");
        assert!(text.contains(r#""terminated_by":"budget","containment":"process-walk""#));
        let back: RunRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn every_field_is_present_in_json_even_when_unknown() {
        let json = serde_json::to_value(RunRecord::new("codex", Outcome::Success)).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object.len(), 51);
        assert!(object["checkpoint"].is_null());
        assert!(object["ledger"].is_null());
        assert_eq!(object["schema_version"], RECORD_SCHEMA_VERSION);
        assert!(object["id"].is_null());
        assert_eq!(object["on_limit_decisions"], serde_json::json!([]));
        assert!(object["loops"].is_null());
        assert!(object["final_report"].is_null());
        assert!(object["model_calls"].is_null());
        assert!(object["notices"].is_null());
        for key in [
            "max_tokens",
            "max_tokens_source",
            "max_cost_usd",
            "max_cost_usd_source",
            "pools",
            "ledger",
            "sub_agent_tokens",
        ] {
            assert!(object[key].is_null(), "{key}");
        }
    }

    #[test]
    fn token_and_cost_budgets_serialize_and_read_back() {
        let mut record = RunRecord::new("claude", Outcome::Failed);
        record.verdict.error_type = Some("max_cost".into());
        record.verdict.terminated_by = Some(TerminatedBy::Cost);
        record.spend.max_tokens = Some(200_000);
        record.spend.max_tokens_source = Some("--max-tokens".into());
        record.spend.max_cost_usd = Some(0.5);
        record.spend.max_cost_usd_source = Some("profiles.ci.max_cost_usd".into());
        record.usage.tokens = Some(TokenUsage {
            input_tokens: 1000,
            output_tokens: 200,
            cached_input_tokens: Some(600),
            reasoning_output_tokens: None,
        });
        record.usage.cost_usd = Some(0.51);
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
        record.verdict.terminated_by = Some(TerminatedBy::WrapUp);
        record.gateway.final_report = Some("Done: the parser.\nLeft: the docs.".into());
        record.gateway.model_calls = Some(0);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["final_report"], "Done: the parser.\nLeft: the docs.");
        // Zero calls is a figure, not unknown.
        assert_eq!(json["model_calls"], 0);
        let back: RunRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn notices_serialize_with_their_limit_and_read_back() {
        let mut record = RunRecord::new("claude", Outcome::Success);
        record.gateway.notices = Some(vec![BudgetNotice {
            limit: NoticeLimit::Cost,
            threshold: 0.8,
            at_step: 12,
            model_call: 13,
            text: "system notice: $0.40 of $2.00 left.".into(),
        }]);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json["notices"],
            serde_json::json!([{"limit": "cost", "threshold": 0.8, "at_step": 12,
                "model_call": 13, "text": "system notice: $0.40 of $2.00 left."}])
        );
        let back: RunRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
        let bad = serde_json::json!({"limit": "budget", "threshold": 0.5, "at_step": 1,
            "model_call": 1, "text": ""});
        assert!(serde_json::from_value::<BudgetNotice>(bad).is_err());
    }

    #[test]
    fn loops_serialize_with_their_kind_and_read_back() {
        use crate::loops::LoopKind;
        let mut record = RunRecord::new("codex", Outcome::Failed);
        record.supervision.loops = Some(vec![
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
