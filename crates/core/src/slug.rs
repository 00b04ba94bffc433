//! Failure slugs: the stable, machine-readable reason a run or an attempt failed.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! failure_slugs {
    ($( $(#[$doc:meta])* $variant:ident => $slug:literal, $reason:literal; )+) => {
        /// Why a run (or one attempt inside a governed loop) failed.
        ///
        /// The lowercase slug (`max_steps`) and the upper-case reason name (`MAX_STEPS`) are stable
        /// public interface: they are stored in the history database, printed in summaries and
        /// matched by users' scripts. New slugs may be added, so the enum is `#[non_exhaustive]`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum FailureSlug {
            $( $(#[$doc])* $variant, )+
        }

        impl FailureSlug {
            /// Every slug, in declaration order.
            pub const ALL: &'static [FailureSlug] = &[$(FailureSlug::$variant),+];

            /// Returns the stable lowercase slug, e.g. `max_steps`.
            pub const fn as_str(self) -> &'static str {
                match self { $(FailureSlug::$variant => $slug,)+ }
            }

            /// Returns the stable upper-case reason name, e.g. `MAX_STEPS`.
            pub const fn reason(self) -> &'static str {
                match self { $(FailureSlug::$variant => $reason,)+ }
            }
        }

        impl FromStr for FailureSlug {
            type Err = UnknownSlug;

            /// Parses a slug or a reason name; the legacy `max_turns`/`MAX_TURNS` map to `MaxSteps`.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($slug | $reason => Ok(FailureSlug::$variant),)+
                    LEGACY_MAX_TURNS_SLUG | LEGACY_MAX_TURNS_REASON => Ok(FailureSlug::MaxSteps),
                    _ => Err(UnknownSlug(s.to_owned())),
                }
            }
        }
    };
}

failure_slugs! {
    /// The step budget was exceeded (by stepguard's count or the provider's own limit).
    MaxSteps => "max_steps", "MAX_STEPS";
    /// The token budget (`--max-tokens`) was spent, by stepguard or the provider's own budget.
    MaxTokens => "max_tokens", "MAX_TOKENS";
    /// The cost budget (`--max-cost-usd`) was spent, by stepguard or the provider's own budget.
    MaxCost => "max_cost", "MAX_COST";
    /// A pool (a budget shared with other runs) was spent: the run was refused at the start.
    PoolExhausted => "pool_exhausted", "POOL_EXHAUSTED";
    /// A pool's cap on concurrent runs was full: the run was refused at the start.
    PoolBusy => "pool_busy", "POOL_BUSY";
    /// The run's wall-clock timeout fired.
    Timeout => "timeout", "TIMEOUT";
    /// The provider reported an error (API error, failed turn, crash).
    ProviderError => "provider_error", "PROVIDER_ERROR";
    /// The provider was rate limited (HTTP 429 or an explicit rate-limit event).
    RateLimited => "rate_limited", "RATE_LIMITED";
    /// The run was interrupted by a signal (Ctrl-C, SIGTERM, SIGHUP) or its supervisor died.
    Interrupted => "interrupted", "INTERRUPTED";
    /// The agent was killed by a signal nobody in stepguard sent.
    Killed => "killed", "KILLED";
    /// The agent process could not be started.
    SpawnFailed => "spawn_failed", "SPAWN_FAILED";
    /// A provider plugin failed to load, panicked or returned an error.
    PluginError => "plugin_error", "PLUGIN_ERROR";
    /// None of the agent's output was recognised as the provider's stream, so nothing could be
    /// counted (a missing `--json`, or the wrong provider).
    UnrecognizedStream => "unrecognized_stream", "UNRECOGNIZED_STREAM";
    /// The agent repeated a tool call (or a short cycle of calls) past the loop limit.
    LoopDetected => "loop_detected", "LOOP_DETECTED";
    /// The run asked for the model gateway (`--wrap-up`) but the agent's model calls did not go
    /// through it (the CLI takes its model URL from somewhere stepguard did not set).
    GatewayBypassed => "gateway_bypassed", "GATEWAY_BYPASSED";
    /// A cost budget was set and a model call's model has no price, so the budget could not
    /// be kept: the call was not made.
    UnpricedModel => "unpriced_model", "UNPRICED_MODEL";
    /// The agent produced no output for the idle timeout.
    Stalled => "stalled", "STALLED";
    /// The agent produced no recognised event within the startup timeout.
    StartupHang => "startup_hang", "STARTUP_HANG";
    /// The conversation outgrew the model's context window.
    ContextGuard => "context_guard", "CONTEXT_GUARD";
    /// The model answered without calling a tool where one was required.
    NoTools => "no_tools", "NO_TOOLS";
    /// The model returned nothing at all.
    EmptyResponse => "empty_response", "EMPTY_RESPONSE";
    /// The model returned only reasoning, no text and no tool call.
    ReasoningOnly => "reasoning_only", "REASONING_ONLY";
    /// The model returned text only, no tool call, where progress was expected.
    TextOnly => "text_only", "TEXT_ONLY";
    /// A tool call could not be parsed.
    MalformedToolCall => "malformed_tool_call", "MALFORMED_TOOL_CALL";
    /// The model called a tool that does not exist.
    UnknownTool => "unknown_tool", "UNKNOWN_TOOL";
    /// A tool was invoked and its execution failed.
    ToolExecFailed => "tool_exec_failed", "TOOL_EXEC_FAILED";
    /// Too many tool calls in one response or one run.
    ToolLimit => "tool_limit", "TOOL_LIMIT";
    /// The session ended without a final report.
    FinalReportMissing => "final_report_missing", "FINAL_REPORT_MISSING";
    /// The final report was not in the required format.
    FinalReportInvalidFormat => "final_report_invalid_format", "FINAL_REPORT_INVALID_FORMAT";
    /// The final report did not validate against its JSON Schema.
    FinalReportSchemaFail => "final_report_schema_fail", "FINAL_REPORT_SCHEMA_FAIL";
    /// A turn used all its attempts without progress.
    RetriesExhausted => "retries_exhausted", "RETRIES_EXHAUSTED";
    /// A tool call's arguments did not match the tool's schema.
    SchemaInvalidToolCall => "schema_invalid_tool_call", "SCHEMA_INVALID_TOOL_CALL";
}

/// The legacy slug older turn-based tools stored for what is now `max_steps`.
pub const LEGACY_MAX_TURNS_SLUG: &str = "max_turns";
/// The legacy reason name older turn-based tools stored for what is now `MAX_STEPS`.
pub const LEGACY_MAX_TURNS_REASON: &str = "MAX_TURNS";

impl FailureSlug {
    /// Returns true when `s` is one of the legacy spellings of `max_steps`.
    pub fn is_legacy_name(s: &str) -> bool {
        s == LEGACY_MAX_TURNS_SLUG || s == LEGACY_MAX_TURNS_REASON
    }

    /// Returns true for slugs that mean "a budget ran out" rather than "something broke".
    pub const fn is_budget_failure(self) -> bool {
        matches!(
            self,
            FailureSlug::MaxSteps
                | FailureSlug::MaxTokens
                | FailureSlug::MaxCost
                | FailureSlug::PoolExhausted
                | FailureSlug::PoolBusy
                | FailureSlug::Timeout
                | FailureSlug::ToolLimit
        )
    }
}

impl fmt::Display for FailureSlug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for FailureSlug {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FailureSlug {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A string that is neither a known slug nor a known reason name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown failure slug `{0}`")]
pub struct UnknownSlug(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slug_round_trips_through_both_spellings() {
        for &slug in FailureSlug::ALL {
            assert_eq!(slug.as_str().parse::<FailureSlug>(), Ok(slug));
            assert_eq!(slug.reason().parse::<FailureSlug>(), Ok(slug));
            assert_eq!(slug.reason(), slug.as_str().to_uppercase());
            let json = serde_json::to_string(&slug).unwrap();
            assert_eq!(json, format!("\"{}\"", slug.as_str()));
            assert_eq!(serde_json::from_str::<FailureSlug>(&json).unwrap(), slug);
        }
    }

    #[test]
    fn slugs_and_reasons_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &slug in FailureSlug::ALL {
            assert!(seen.insert(slug.as_str()), "duplicate slug {slug}");
            assert!(
                seen.insert(slug.reason()),
                "duplicate reason {}",
                slug.reason()
            );
        }
    }

    #[test]
    fn required_slugs_exist() {
        for name in [
            "max_steps",
            "timeout",
            "provider_error",
            "rate_limited",
            "interrupted",
            "killed",
            "spawn_failed",
            "plugin_error",
            "unrecognized_stream",
            "loop_detected",
            "gateway_bypassed",
            "unpriced_model",
            "max_tokens",
            "max_cost",
            "stalled",
            "startup_hang",
            "context_guard",
            "no_tools",
            "empty_response",
            "reasoning_only",
            "text_only",
            "malformed_tool_call",
            "unknown_tool",
            "tool_exec_failed",
            "tool_limit",
            "final_report_missing",
            "final_report_invalid_format",
            "final_report_schema_fail",
            "retries_exhausted",
        ] {
            assert!(name.parse::<FailureSlug>().is_ok(), "{name} missing");
        }
    }

    #[test]
    fn legacy_max_turns_means_max_steps() {
        assert_eq!(
            "max_turns".parse::<FailureSlug>(),
            Ok(FailureSlug::MaxSteps)
        );
        assert_eq!(
            "MAX_TURNS".parse::<FailureSlug>(),
            Ok(FailureSlug::MaxSteps)
        );
        assert_eq!(
            serde_json::from_str::<FailureSlug>("\"max_turns\"").unwrap(),
            FailureSlug::MaxSteps
        );
        assert!(FailureSlug::is_legacy_name("max_turns"));
        assert!(!FailureSlug::is_legacy_name("max_steps"));
    }

    #[test]
    fn unknown_and_mixed_case_spellings_are_rejected() {
        assert_eq!(
            "Max_Steps".parse::<FailureSlug>(),
            Err(UnknownSlug("Max_Steps".into()))
        );
        assert!("".parse::<FailureSlug>().is_err());
        assert!(serde_json::from_str::<FailureSlug>("\"nope\"").is_err());
    }
}
