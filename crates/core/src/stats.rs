//! Run stats and the one-line console summary every stepguard command prints the same way.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::slug::FailureSlug;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// The agent finished and its stream says it succeeded.
    Success,
    /// The agent failed or was stopped; the slug says why.
    Failed,
    /// The stream ended with no terminal event and nothing else decided (e.g. `count` on a cut log).
    Incomplete,
    /// The run is still going (history rows only).
    Running,
    /// The supervising stepguard died (crash, `kill -9`) before it could record the end.
    Interrupted,
}

impl Outcome {
    /// Every outcome, in declaration order (the documented list).
    pub const ALL: &'static [Outcome] = &[
        Outcome::Success,
        Outcome::Failed,
        Outcome::Incomplete,
        Outcome::Running,
        Outcome::Interrupted,
    ];

    /// Returns the stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failed => "failed",
            Outcome::Incomplete => "incomplete",
            Outcome::Running => "running",
            Outcome::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Outcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "success" => Ok(Outcome::Success),
            "failed" => Ok(Outcome::Failed),
            "incomplete" => Ok(Outcome::Incomplete),
            "running" => Ok(Outcome::Running),
            "interrupted" => Ok(Outcome::Interrupted),
            other => Err(format!("unknown outcome `{other}`")),
        }
    }
}

/// Token counts, as the provider reported them (totals for the run, not per-line sums).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TokenUsage {
    /// Input tokens, including cached ones.
    pub input_tokens: u64,
    /// Output tokens, including reasoning ones.
    pub output_tokens: u64,
    /// Input tokens served from cache, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// Output tokens spent on reasoning, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_output_tokens: Option<u64>,
}

/// The numbers of one run, as stored and summarised. Every count is nullable: `None` means the
/// source did not say, which is different from zero.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// Steps as the provider itself reported them.
    pub num_steps_reported: Option<u64>,
    /// Steps as stepguard counted them from the stream.
    pub num_steps_computed: Option<u64>,
    /// Legacy turns as the provider reported them.
    pub num_turns_reported: Option<u64>,
    /// Legacy turns as stepguard counted them.
    pub num_turns_computed: Option<u64>,
    /// How the run ended.
    pub outcome: Outcome,
    /// Why it failed, when it did.
    pub slug: Option<FailureSlug>,
    /// Wall-clock duration in milliseconds, when known.
    pub duration_ms: Option<u64>,
    /// Token usage, when the stream carries it.
    pub tokens: Option<TokenUsage>,
    /// Cost in US dollars, when the stream carries it.
    pub cost_usd: Option<f64>,
}

impl RunStats {
    /// Creates stats with only an outcome set.
    pub fn new(outcome: Outcome) -> Self {
        RunStats {
            num_steps_reported: None,
            num_steps_computed: None,
            num_turns_reported: None,
            num_turns_computed: None,
            outcome,
            slug: None,
            duration_ms: None,
            tokens: None,
            cost_usd: None,
        }
    }

    /// Returns the step count to show: ours when we counted, else the provider's.
    pub fn steps(&self) -> Option<u64> {
        self.num_steps_computed.or(self.num_steps_reported)
    }

    /// Returns the turn count to show: the provider's when reported, else ours.
    pub fn turns(&self) -> Option<u64> {
        self.num_turns_reported.or(self.num_turns_computed)
    }

    /// Returns the counts part of the summary: `Steps: X`, `Steps: X (legacy turns: Y)` when
    /// both are known and differ, or `Turns: Y` for turn-only records.
    pub fn counts_label(&self) -> String {
        match (self.steps(), self.turns()) {
            (Some(s), Some(t)) if s != t => format!("Steps: {s} (legacy turns: {t})"),
            (Some(s), _) => format!("Steps: {s}"),
            (None, Some(t)) => format!("Turns: {t}"),
            (None, None) => "Steps: unknown".to_owned(),
        }
    }

    /// Returns the one-line console summary, e.g.
    /// `Steps: 6 (legacy turns: 1) | failed: max_steps | 12.3s | tokens: 100 in / 20 out`.
    pub fn summary_line(&self) -> String {
        let mut line = self.counts_label();
        match self.slug {
            Some(slug) => {
                let _ = write!(line, " | {}: {slug}", self.outcome);
            }
            None => {
                let _ = write!(line, " | {}", self.outcome);
            }
        }
        if let Some(ms) = self.duration_ms {
            let _ = write!(line, " | {}", format_duration_ms(ms));
        }
        if let Some(t) = self.tokens {
            let _ = write!(
                line,
                " | tokens: {} in / {} out",
                t.input_tokens, t.output_tokens
            );
        }
        if let Some(cost) = self.cost_usd {
            let _ = write!(line, " | cost: ${cost:.4}");
        }
        line
    }
}

/// Formats milliseconds for people: `850ms`, `12.3s`, `4m05s`, `1h02m`.
pub fn format_duration_ms(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(steps: Option<u64>, turns: Option<u64>) -> RunStats {
        RunStats {
            num_steps_computed: steps,
            num_turns_reported: turns,
            ..RunStats::new(Outcome::Success)
        }
    }

    #[test]
    fn summary_line_variants() {
        insta::assert_snapshot!(stats(Some(6), Some(1)).summary_line(), @"Steps: 6 (legacy turns: 1) | success");
        insta::assert_snapshot!(stats(Some(4), Some(4)).summary_line(), @"Steps: 4 | success");
        insta::assert_snapshot!(stats(Some(4), None).summary_line(), @"Steps: 4 | success");
        insta::assert_snapshot!(stats(None, Some(9)).summary_line(), @"Turns: 9 | success");
        insta::assert_snapshot!(stats(None, None).summary_line(), @"Steps: unknown | success");
        let full = RunStats {
            num_steps_computed: Some(31),
            num_steps_reported: Some(30),
            num_turns_reported: Some(1),
            outcome: Outcome::Failed,
            slug: Some(FailureSlug::MaxSteps),
            duration_ms: Some(12_345),
            tokens: Some(TokenUsage {
                input_tokens: 48213,
                output_tokens: 1875,
                ..Default::default()
            }),
            cost_usd: Some(0.12345),
            ..RunStats::new(Outcome::Failed)
        };
        insta::assert_snapshot!(full.summary_line(), @"Steps: 31 (legacy turns: 1) | failed: max_steps | 12.3s | tokens: 48213 in / 1875 out | cost: $0.1235");
    }

    #[test]
    fn reported_steps_are_used_when_not_computed() {
        let s = RunStats {
            num_steps_reported: Some(3),
            ..RunStats::new(Outcome::Success)
        };
        assert_eq!(s.counts_label(), "Steps: 3");
        let s = RunStats {
            num_turns_computed: Some(2),
            ..RunStats::new(Outcome::Success)
        };
        assert_eq!(s.counts_label(), "Turns: 2");
    }

    #[test]
    fn durations_are_humane() {
        assert_eq!(format_duration_ms(850), "850ms");
        assert_eq!(format_duration_ms(12_345), "12.3s");
        assert_eq!(format_duration_ms(245_000), "4m05s");
        assert_eq!(format_duration_ms(3_720_000), "1h02m");
    }

    #[test]
    fn outcome_round_trips() {
        for o in [
            Outcome::Success,
            Outcome::Failed,
            Outcome::Incomplete,
            Outcome::Running,
        ] {
            assert_eq!(o.as_str().parse::<Outcome>(), Ok(o));
            assert_eq!(serde_json::to_string(&o).unwrap(), format!("\"{o}\""));
        }
    }
}
