//! How a supervised run is judged: who stopped it, what the stream said, how the agent exited.

use serde::Serialize;

use crate::exit::ExitCode;
use crate::slug::FailureSlug;
use crate::stats::Outcome;

/// Why stepguard itself stopped the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TerminatedBy {
    /// The step budget was exceeded.
    Budget,
    /// The run's timeout fired.
    Timeout,
    /// stepguard received SIGINT, SIGTERM or SIGHUP and forwarded it.
    Signal,
    /// The provider plugin failed mid-run (fail closed).
    Plugin,
    /// None of the agent's output was recognised as the provider's stream (fail closed).
    Unrecognized,
    /// The agent repeated a tool call past the loop limit.
    Loop,
    /// The agent produced no output for the idle timeout.
    Idle,
    /// The agent produced no recognised event within the startup timeout.
    Startup,
    /// The agent ended by itself after the model gateway made its last model call tool-less
    /// (`--wrap-up`): the budget ended the run, gracefully.
    WrapUp,
    /// The model gateway could not reach the model upstream.
    Upstream,
    /// The agent made model calls that did not go through the model gateway.
    Bypassed,
    /// The token budget was exceeded.
    Tokens,
    /// The cost budget was exceeded.
    Cost,
    /// A cost budget was set and a model call's model has no price.
    Unpriced,
}

impl TerminatedBy {
    /// Returns the stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TerminatedBy::Budget => "budget",
            TerminatedBy::Timeout => "timeout",
            TerminatedBy::Signal => "signal",
            TerminatedBy::Plugin => "plugin",
            TerminatedBy::Unrecognized => "unrecognized",
            TerminatedBy::Loop => "loop",
            TerminatedBy::Idle => "idle",
            TerminatedBy::Startup => "startup",
            TerminatedBy::WrapUp => "wrap_up",
            TerminatedBy::Upstream => "upstream",
            TerminatedBy::Bypassed => "bypassed",
            TerminatedBy::Tokens => "tokens",
            TerminatedBy::Cost => "cost",
            TerminatedBy::Unpriced => "unpriced",
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

/// Judges a run. stepguard's own reason to stop comes first; otherwise the stream's terminal
/// event decides, checked against the exit status; a stream without one is judged by the exit
/// status alone.
pub fn classify(
    terminated_by: Option<TerminatedBy>,
    stream: Option<StreamVerdict>,
    child: Option<ChildExit>,
) -> Verdict {
    match terminated_by {
        Some(TerminatedBy::Budget) => {
            return Verdict::failed(FailureSlug::MaxSteps, ExitCode::BudgetExceeded);
        }
        Some(TerminatedBy::Timeout) => {
            return Verdict::failed(FailureSlug::Timeout, ExitCode::Timeout);
        }
        Some(TerminatedBy::Signal) => {
            return Verdict::failed(FailureSlug::Interrupted, ExitCode::Interrupted);
        }
        Some(TerminatedBy::Plugin) => {
            return Verdict::failed(FailureSlug::PluginError, ExitCode::Plugin);
        }
        Some(TerminatedBy::Unrecognized) => {
            return Verdict::failed(FailureSlug::UnrecognizedStream, ExitCode::Usage);
        }
        // A loop is a budget outcome (the agent spent steps going round); stalls are timeouts.
        Some(TerminatedBy::Loop) => {
            return Verdict::failed(FailureSlug::LoopDetected, ExitCode::BudgetExceeded);
        }
        Some(TerminatedBy::Idle) => {
            return Verdict::failed(FailureSlug::Stalled, ExitCode::Timeout);
        }
        Some(TerminatedBy::Startup) => {
            return Verdict::failed(FailureSlug::StartupHang, ExitCode::Timeout);
        }
        // The budget ended it as surely as a stop would; the agent only got to say goodbye.
        Some(TerminatedBy::WrapUp) => {
            return Verdict::failed(FailureSlug::MaxSteps, ExitCode::BudgetExceeded);
        }
        Some(TerminatedBy::Upstream) => {
            return Verdict::failed(FailureSlug::ProviderError, ExitCode::AgentFailed);
        }
        // A setup problem, like a stream that cannot be counted: the fix is in the command.
        Some(TerminatedBy::Bypassed) => {
            return Verdict::failed(FailureSlug::GatewayBypassed, ExitCode::Usage);
        }
        Some(TerminatedBy::Tokens) => {
            return Verdict::failed(FailureSlug::MaxTokens, ExitCode::BudgetExceeded);
        }
        Some(TerminatedBy::Cost) => {
            return Verdict::failed(FailureSlug::MaxCost, ExitCode::BudgetExceeded);
        }
        // Like a stream that cannot be counted: the fix is in the setup (a price file).
        Some(TerminatedBy::Unpriced) => {
            return Verdict::failed(FailureSlug::UnpricedModel, ExitCode::Usage);
        }
        None => {}
    }
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
            let v = classify(Some(by), ok(), Some(ChildExit::Signal(15)));
            assert_eq!(
                (v.outcome, v.slug, v.exit_code.code()),
                (Outcome::Failed, Some(slug), code)
            );
        }
    }

    #[test]
    fn the_stream_decides_when_the_agent_ended_by_itself() {
        let v = classify(None, ok(), Some(ChildExit::Code(0)));
        assert_eq!((v.outcome, v.exit_code.code()), (Outcome::Success, 0));
        let v = classify(
            None,
            failed(FailureSlug::MaxSteps),
            Some(ChildExit::Code(1)),
        );
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::MaxSteps), 3)
        );
        let v = classify(
            None,
            failed(FailureSlug::RateLimited),
            Some(ChildExit::Code(1)),
        );
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::RateLimited), 1)
        );
        let v = classify(None, ok(), Some(ChildExit::Code(2)));
        assert_eq!(v.slug, Some(FailureSlug::ProviderError));
        let v = classify(
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
            classify(None, None, Some(ChildExit::Code(0))).outcome,
            Outcome::Success
        );
        let v = classify(None, None, Some(ChildExit::Code(101)));
        assert_eq!(
            (v.slug, v.exit_code.code()),
            (Some(FailureSlug::ProviderError), 1)
        );
        let v = classify(None, None, Some(ChildExit::Signal(9)));
        assert_eq!((v.slug, v.exit_code.code()), (Some(FailureSlug::Killed), 1));
    }
}
