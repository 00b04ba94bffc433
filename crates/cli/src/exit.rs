//! The one place where errors and run outcomes become process exit codes.

use stepguard_config::ConfigError;
use stepguard_core::{BudgetError, ExitCode};
use stepguard_plugin_api::host::{CallError, LoadError};
use stepguard_plugin_host::LookupError;

/// A usage error found by stepguard itself (not clap), e.g. an unknown provider name.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Returns the exit code for an error that ended a command.
pub fn exit_code_for(err: &anyhow::Error) -> ExitCode {
    for cause in err.chain() {
        match cause.downcast_ref::<LookupError>() {
            Some(LookupError::Unknown { .. }) => return ExitCode::Usage,
            Some(LookupError::FailedToLoad { .. }) => return ExitCode::Plugin,
            None => {}
        }
        if cause.is::<stepguard_store::StoreError>()
            || cause.is::<stepguard_governor::scenario::ScenarioError>()
        {
            return ExitCode::Usage;
        }
        if cause.is::<CallError>() || cause.is::<LoadError>() {
            return ExitCode::Plugin;
        }
        if cause.is::<ConfigError>() || cause.is::<BudgetError>() || cause.is::<UsageError>() {
            return ExitCode::Usage;
        }
    }
    // Anything unforeseen is reported as a usage/environment problem rather than as the agent
    // failing, so scripts never mistake a stepguard bug for an agent's verdict.
    ExitCode::Usage
}

/// Converts our exit code into the process's.
pub fn to_process(code: ExitCode) -> std::process::ExitCode {
    std::process::ExitCode::from(code.code())
}
