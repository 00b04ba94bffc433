//! How a supervised run is judged: who stopped it, what the stream said, how the agent exited.
//!
//! [`classify`] is the only judge of a run's verdict (outcome, failure slug, exit code): every
//! fact that decides it is one of its inputs ([`RunFacts`]), so no caller patches the verdict
//! afterwards. `count` judges a recorded stream with the same function ([`RunFacts::stream`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::exit::ExitCode;
use crate::slug::FailureSlug;
use crate::stats::Outcome;

macro_rules! terminated_by {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, )+) => {
        /// Why stepguard itself stopped the agent (the record's `terminated_by`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum TerminatedBy {
            $( $(#[$doc])* $variant, )+
        }

        impl TerminatedBy {
            /// Every value, in declaration order (the documented list).
            pub const ALL: &'static [TerminatedBy] = &[$(TerminatedBy::$variant),+];

            /// Returns the stable lowercase name.
            pub const fn as_str(self) -> &'static str {
                match self { $(TerminatedBy::$variant => $name,)+ }
            }
        }

        impl FromStr for TerminatedBy {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(TerminatedBy::$variant),)+
                    _ => Err(UnknownValue { what: "terminated_by", value: s.to_owned() }),
                }
            }
        }

        #[cfg(feature = "schema")]
        impl schemars::JsonSchema for TerminatedBy {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                "TerminatedBy".into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "description": "Who ended the run.",
                    "type": "string",
                    "enum": [$($name),+]
                })
            }
        }
    };
}

terminated_by! {
    /// The step budget was exceeded.
    Budget => "budget",
    /// The run's timeout fired.
    Timeout => "timeout",
    /// stepguard received SIGINT, SIGTERM or SIGHUP and forwarded it.
    Signal => "signal",
    /// The provider plugin failed mid-run (fail closed).
    Plugin => "plugin",
    /// None of the agent's output was recognised as the provider's stream (fail closed).
    Unrecognized => "unrecognized",
    /// The agent repeated a tool call past the loop limit.
    Loop => "loop",
    /// The agent produced no output for the idle timeout.
    Idle => "idle",
    /// The agent produced no recognised event within the startup timeout.
    Startup => "startup",
    /// The agent ended by itself after the model gateway made its last model call tool-less
    /// (`--wrap-up`): the budget ended the run, gracefully.
    WrapUp => "wrap_up",
    /// The model gateway could not reach the model upstream.
    Upstream => "upstream",
    /// The agent made model calls that did not go through the model gateway.
    Bypassed => "bypassed",
    /// The token budget was exceeded.
    Tokens => "tokens",
    /// The cost budget was exceeded.
    Cost => "cost",
    /// A cost budget was set and a model call's model has no price.
    Unpriced => "unpriced",
}

impl fmt::Display for TerminatedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TerminatedBy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TerminatedBy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A string that is not one of a closed set's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}`")]
pub struct UnknownValue {
    /// Which field's set.
    pub what: &'static str,
    /// The string.
    pub value: String,
}

/// A budget of a run: what a graceful wrap-up (`--wrap-up`) ended the run for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// The step budget (`max_steps`).
    Steps,
    /// The token budget (`max_tokens`).
    Tokens,
    /// The cost budget (`max_cost_usd`).
    Cost,
}

impl Limit {
    /// Returns the failure slug of a run this budget ended.
    pub const fn slug(self) -> FailureSlug {
        match self {
            Limit::Steps => FailureSlug::MaxSteps,
            Limit::Tokens => FailureSlug::MaxTokens,
            Limit::Cost => FailureSlug::MaxCost,
        }
    }
}

/// How the agent process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

/// The stream's own terminal event, when it had one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamVerdict {
    /// Whether the provider reported success.
    pub success: bool,
    /// The failure slug it implies.
    pub slug: Option<FailureSlug>,
}

/// The judgement of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Success or failure.
    pub outcome: Outcome,
    /// Why it failed.
    pub slug: Option<FailureSlug>,
    /// What stepguard exits with.
    pub exit_code: ExitCode,
}

impl Verdict {
    const fn failed(slug: FailureSlug, exit_code: ExitCode) -> Self {
        Verdict {
            outcome: Outcome::Failed,
            slug: Some(slug),
            exit_code,
        }
    }
}

/// Everything that decides a run's verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunFacts {
    /// The agent could not be started: nothing ran.
    pub spawn_failed: bool,
    /// Why stepguard stopped the agent, when it did.
    pub terminated_by: Option<TerminatedBy>,
    /// Which budget a graceful wrap-up ended the run for (with `TerminatedBy::WrapUp`); the
    /// step budget when not known.
    pub wrapped_up_for: Option<Limit>,
    /// The agent's output was seen and none of it was the provider's stream, and that fails
    /// the run (`--unrecognized stop`): output that was not counted is never a success.
    pub unrecognized: bool,
    /// The agent printed nothing at all on stdout, and an unrecognised stream fails the run
    /// (`--unrecognized stop`): an agent that exits 0 without a word is not a success with 0
    /// steps (a missing stream, a CLI that crashed quietly), it is a stream that never came.
    pub silent: bool,
    /// The stream's own terminal event, when it had one.
    pub stream: Option<StreamVerdict>,
    /// How the agent process ended, when it was seen to end.
    pub child: Option<ChildExit>,
}

impl RunFacts {
    /// The facts of a recorded stream (`count`): no process, only what the stream said.
    pub fn stream(stream: Option<StreamVerdict>) -> Self {
        RunFacts {
            stream,
            ..RunFacts::default()
        }
    }
}

/// Judges a run. A command that could not start failed; then stepguard's own reason to stop
/// comes first; otherwise the stream's terminal event decides, checked against the exit
/// status; a stream without one is judged by the exit status alone.
pub fn classify(facts: RunFacts) -> Verdict {
    if facts.spawn_failed {
        return Verdict::failed(FailureSlug::SpawnFailed, ExitCode::Usage);
    }
    let stopped_by = facts
        .terminated_by
        .or(facts.unrecognized.then_some(TerminatedBy::Unrecognized));
    if let Some(by) = stopped_by {
        return stopped(by, facts.wrapped_up_for);
    }
    // Silence and a clean exit: nothing was counted, so nothing says it went well. A silent
    // failure stays the agent's (its exit code says more).
    if facts.silent && facts.stream.is_none() && facts.child == Some(ChildExit::Code(0)) {
        return Verdict::failed(FailureSlug::UnrecognizedStream, ExitCode::Usage);
    }
    judge_stream(facts.stream, facts.child)
}

/// The verdict on a run stepguard stopped (or, for a wrap-up, let end on the budget's terms).
fn stopped(by: TerminatedBy, wrapped_up_for: Option<Limit>) -> Verdict {
    let (slug, code) = match by {
        TerminatedBy::Budget => (FailureSlug::MaxSteps, ExitCode::BudgetExceeded),
        TerminatedBy::Timeout => (FailureSlug::Timeout, ExitCode::Timeout),
        TerminatedBy::Signal => (FailureSlug::Interrupted, ExitCode::Interrupted),
        TerminatedBy::Plugin => (FailureSlug::PluginError, ExitCode::Plugin),
        TerminatedBy::Unrecognized => (FailureSlug::UnrecognizedStream, ExitCode::Usage),
        // A loop is a budget outcome (the agent spent steps going round); stalls are timeouts.
        TerminatedBy::Loop => (FailureSlug::LoopDetected, ExitCode::BudgetExceeded),
        TerminatedBy::Idle => (FailureSlug::Stalled, ExitCode::Timeout),
        TerminatedBy::Startup => (FailureSlug::StartupHang, ExitCode::Timeout),
        // The budget ended it as surely as a stop would; the agent only got to say goodbye.
        TerminatedBy::WrapUp => (
            wrapped_up_for.unwrap_or(Limit::Steps).slug(),
            ExitCode::BudgetExceeded,
        ),
        TerminatedBy::Upstream => (FailureSlug::ProviderError, ExitCode::AgentFailed),
        // A setup problem, like a stream that cannot be counted: the fix is in the command.
        TerminatedBy::Bypassed => (FailureSlug::GatewayBypassed, ExitCode::Usage),
        TerminatedBy::Tokens => (FailureSlug::MaxTokens, ExitCode::BudgetExceeded),
        TerminatedBy::Cost => (FailureSlug::MaxCost, ExitCode::BudgetExceeded),
        // Like a stream that cannot be counted: the fix is in the setup (a price file).
        TerminatedBy::Unpriced => (FailureSlug::UnpricedModel, ExitCode::Usage),
    };
    Verdict::failed(slug, code)
}

/// The verdict on a run that ended by itself: its stream, checked against its exit.
fn judge_stream(stream: Option<StreamVerdict>, child: Option<ChildExit>) -> Verdict {
    match (stream, child) {
        (Some(StreamVerdict { success: true, .. }), None | Some(ChildExit::Code(0))) => Verdict {
            outcome: Outcome::Success,
            slug: None,
            exit_code: ExitCode::Success,
        },
        // The stream said success but the process disagrees: trust the failure.
        (Some(StreamVerdict { success: true, .. }), Some(ChildExit::Code(_))) => {
            Verdict::failed(FailureSlug::ProviderError, ExitCode::AgentFailed)
        }
        (Some(StreamVerdict { success: true, .. }), Some(ChildExit::Signal(_))) => {
            Verdict::failed(FailureSlug::Killed, ExitCode::AgentFailed)
        }
        (
            Some(StreamVerdict {
                success: false,
                slug,
            }),
            _,
        ) => {
            let slug = slug.unwrap_or(FailureSlug::ProviderError);
            // The provider's own limit fired: still a budget outcome.
            let code = if matches!(
                slug,
                FailureSlug::MaxSteps | FailureSlug::MaxTokens | FailureSlug::MaxCost
            ) {
                ExitCode::BudgetExceeded
            } else {
                ExitCode::AgentFailed
            };
            Verdict::failed(slug, code)
        }
        (None, Some(ChildExit::Code(0))) => Verdict {
            outcome: Outcome::Success,
            slug: None,
            exit_code: ExitCode::Success,
        },
        (None, Some(ChildExit::Code(_))) => {
            Verdict::failed(FailureSlug::ProviderError, ExitCode::AgentFailed)
        }
        (None, Some(ChildExit::Signal(_))) => {
            Verdict::failed(FailureSlug::Killed, ExitCode::AgentFailed)
        }
        (None, None) => Verdict {
            outcome: Outcome::Incomplete,
            slug: None,
            exit_code: ExitCode::AgentFailed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(
        terminated_by: Option<TerminatedBy>,
        stream: Option<StreamVerdict>,
        child: Option<ChildExit>,
    ) -> Verdict {
        classify(RunFacts {
            terminated_by,
            stream,
            child,
            ..RunFacts::default()
        })
    }

    #[test]
    fn terminated_by_names_round_trip_and_are_the_documented_ones() {
        let names: Vec<&str> = TerminatedBy::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(
            names,
            [
                "budget",
                "timeout",
                "signal",
                "plugin",
                "unrecognized",
                "loop",
                "idle",
                "startup",
                "wrap_up",
                "upstream",
                "bypassed",
                "tokens",
                "cost",
                "unpriced"
            ]
        );
        for &by in TerminatedBy::ALL {
            let json = serde_json::to_string(&by).unwrap();
            assert_eq!(json, format!("\"{by}\""));
            assert_eq!(serde_json::from_str::<TerminatedBy>(&json).unwrap(), by);
        }
        assert!("wrap-up".parse::<TerminatedBy>().is_err());
    }

    #[test]
    fn a_command_that_could_not_start_failed_whatever_else_is_known() {
        let v = classify(RunFacts {
            spawn_failed: true,
            terminated_by: Some(TerminatedBy::Signal),
            ..RunFacts::default()
        });
        assert_eq!(
            (v.outcome, v.slug, v.exit_code.code()),
            (Outcome::Failed, Some(FailureSlug::SpawnFailed), 2)
        );
    }

    #[test]
    fn a_wrap_up_fails_the_run_for_the_budget_that_asked_for_it() {
        for (limit, slug) in [
            (None, FailureSlug::MaxSteps),
            (Some(Limit::Steps), FailureSlug::MaxSteps),
            (Some(Limit::Tokens), FailureSlug::MaxTokens),
            (Some(Limit::Cost), FailureSlug::MaxCost),
        ] {
            let v = classify(RunFacts {
                terminated_by: Some(TerminatedBy::WrapUp),
                wrapped_up_for: limit,
                stream: ok(),
                child: Some(ChildExit::Code(0)),
                ..RunFacts::default()
            });
            assert_eq!((v.slug, v.exit_code.code()), (Some(slug), 3), "{limit:?}");
        }
        // The budget a wrap-up names means nothing when something else stopped the run.
        let v = classify(RunFacts {
            terminated_by: Some(TerminatedBy::Timeout),
            wrapped_up_for: Some(Limit::Cost),
            ..RunFacts::default()
        });
        assert_eq!(v.slug, Some(FailureSlug::Timeout));
    }

    #[test]
    fn an_unrecognised_stream_is_never_a_success_but_a_stop_says_why_first() {
        let unrecognised = |terminated_by| {
            classify(RunFacts {
                unrecognized: true,
                terminated_by,
                stream: ok(),
                child: Some(ChildExit::Code(0)),
                ..RunFacts::default()
            })
        };
        let v = unrecognised(None);
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::UnrecognizedStream), 2)
        );
        assert_eq!(
            unrecognised(Some(TerminatedBy::Timeout)).slug,
            Some(FailureSlug::Timeout)
        );
    }

    #[test]
    fn an_agent_that_printed_nothing_and_exited_0_is_not_a_success() {
        let silent = |child| {
            classify(RunFacts {
                silent: true,
                child: Some(child),
                ..RunFacts::default()
            })
        };
        let v = silent(ChildExit::Code(0));
        assert_eq!(
            (v.outcome, v.slug, v.exit_code.code()),
            (Outcome::Failed, Some(FailureSlug::UnrecognizedStream), 2)
        );
        // A silent failure stays the agent's; a stop still says why first.
        assert_eq!(
            silent(ChildExit::Code(1)).slug,
            Some(FailureSlug::ProviderError)
        );
        assert_eq!(silent(ChildExit::Signal(9)).slug, Some(FailureSlug::Killed));
        let stopped = classify(RunFacts {
            silent: true,
            terminated_by: Some(TerminatedBy::Timeout),
            child: Some(ChildExit::Code(0)),
            ..RunFacts::default()
        });
        assert_eq!(stopped.slug, Some(FailureSlug::Timeout));
    }

    #[test]
    fn a_recorded_stream_is_judged_by_its_terminal_event_alone() {
        assert_eq!(classify(RunFacts::stream(ok())).outcome, Outcome::Success);
        assert_eq!(
            classify(RunFacts::stream(None)).outcome,
            Outcome::Incomplete
        );
        let v = classify(RunFacts::stream(failed(FailureSlug::RateLimited)));
        assert_eq!(
            (v.outcome, v.slug),
            (Outcome::Failed, Some(FailureSlug::RateLimited))
        );
    }

    fn ok() -> Option<StreamVerdict> {
        Some(StreamVerdict {
            success: true,
            slug: None,
        })
    }

    fn failed(slug: FailureSlug) -> Option<StreamVerdict> {
        Some(StreamVerdict {
            success: false,
            slug: Some(slug),
        })
    }

    #[test]
    fn stepguards_own_stop_wins() {
        for (by, slug, code) in [
            (TerminatedBy::Budget, FailureSlug::MaxSteps, 3),
            (TerminatedBy::Timeout, FailureSlug::Timeout, 124),
            (TerminatedBy::Signal, FailureSlug::Interrupted, 130),
            (TerminatedBy::Plugin, FailureSlug::PluginError, 4),
            (
                TerminatedBy::Unrecognized,
                FailureSlug::UnrecognizedStream,
                2,
            ),
            (TerminatedBy::Loop, FailureSlug::LoopDetected, 3),
            (TerminatedBy::Idle, FailureSlug::Stalled, 124),
            (TerminatedBy::Startup, FailureSlug::StartupHang, 124),
            (TerminatedBy::WrapUp, FailureSlug::MaxSteps, 3),
            (TerminatedBy::Upstream, FailureSlug::ProviderError, 1),
            (TerminatedBy::Bypassed, FailureSlug::GatewayBypassed, 2),
            (TerminatedBy::Tokens, FailureSlug::MaxTokens, 3),
            (TerminatedBy::Cost, FailureSlug::MaxCost, 3),
            (TerminatedBy::Unpriced, FailureSlug::UnpricedModel, 2),
        ] {
            let v = judge(Some(by), ok(), Some(ChildExit::Signal(15)));
            assert_eq!(
                (v.outcome, v.slug, v.exit_code.code()),
                (Outcome::Failed, Some(slug), code)
            );
        }
    }

    #[test]
    fn the_stream_decides_when_the_agent_ended_by_itself() {
        let v = judge(None, ok(), Some(ChildExit::Code(0)));
        assert_eq!((v.outcome, v.exit_code.code()), (Outcome::Success, 0));
        let v = judge(
            None,
            failed(FailureSlug::MaxSteps),
            Some(ChildExit::Code(1)),
        );
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::MaxSteps), 3)
        );
        let v = judge(
            None,
            failed(FailureSlug::RateLimited),
            Some(ChildExit::Code(1)),
        );
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::RateLimited), 1)
        );
        let v = judge(None, ok(), Some(ChildExit::Code(2)));
        assert_eq!(v.slug, Some(FailureSlug::ProviderError));
        let v = judge(
            None,
            Some(StreamVerdict {
                success: false,
                slug: None,
            }),
            Some(ChildExit::Code(1)),
        );
        assert_eq!(v.slug, Some(FailureSlug::ProviderError));
    }

    #[test]
    fn without_a_terminal_event_the_exit_status_decides() {
        assert_eq!(
            judge(None, None, Some(ChildExit::Code(0))).outcome,
            Outcome::Success
        );
        let v = judge(None, None, Some(ChildExit::Code(101)));
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::ProviderError), 1)
        );
        let v = judge(None, None, Some(ChildExit::Signal(9)));
        assert_eq!((v.slug, v.exit_code.code()), (Some(FailureSlug::Killed), 1));
    }
}
