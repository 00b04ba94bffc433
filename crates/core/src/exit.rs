//! The exit codes of the `stepguard` binary, defined once.

/// What `stepguard` exits with. The numbers are stable public interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExitCode {
    /// The command (or the supervised agent) succeeded.
    Success,
    /// The supervised agent failed (provider error, rate limit, crash …).
    AgentFailed,
    /// Usage or configuration error; also a missing agent executable.
    Usage,
    /// The step budget was exceeded (`max_steps`).
    BudgetExceeded,
    /// A provider plugin failed to load, panicked or returned an error.
    Plugin,
    /// The run's timeout fired.
    Timeout,
    /// stepguard was interrupted (SIGINT, SIGTERM, SIGHUP).
    Interrupted,
}

impl ExitCode {
    /// Every exit code, for documentation and tests.
    pub const ALL: &'static [ExitCode] = &[
        ExitCode::Success,
        ExitCode::AgentFailed,
        ExitCode::Usage,
        ExitCode::BudgetExceeded,
        ExitCode::Plugin,
        ExitCode::Timeout,
        ExitCode::Interrupted,
    ];

    /// Returns the numeric process exit code.
    pub const fn code(self) -> u8 {
        match self {
            ExitCode::Success => 0,
            ExitCode::AgentFailed => 1,
            ExitCode::Usage => 2,
            ExitCode::BudgetExceeded => 3,
            ExitCode::Plugin => 4,
            ExitCode::Timeout => 124,
            ExitCode::Interrupted => 130,
        }
    }

    /// Returns the one-line meaning, as documented in `--help` and the README.
    pub const fn meaning(self) -> &'static str {
        match self {
            ExitCode::Success => "success",
            ExitCode::AgentFailed => "the agent failed",
            ExitCode::Usage => "usage or configuration error",
            ExitCode::BudgetExceeded => {
                "a budget exceeded (max_steps, max_tokens, max_cost), a loop, or a spent or \
                 full pool"
            }
            ExitCode::Plugin => "plugin error",
            ExitCode::Timeout => "timeout (also: stalled, startup_hang)",
            ExitCode::Interrupted => "interrupted",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones_and_distinct() {
        let codes: Vec<u8> = ExitCode::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 124, 130]);
    }
}
