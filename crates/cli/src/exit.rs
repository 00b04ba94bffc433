//! The one place where errors and run outcomes become process exit codes.

use stepguard_config::{ConfigError, LimitError};
use stepguard_core::ExitCode;
use stepguard_plugin_api::host::{CallError, LoadError};
use stepguard_plugin_host::LookupError;

/// A usage error found by stepguard itself (not clap), e.g. an unknown provider name.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Returns the exit code for an error that ended a command.
pub fn exit_code_for(err: &anyhow::Error) -> ExitCode {
    classify(err).0
}

/// Returns the exit code and the error's kind (the `kind` of a `--json` error object), deciding
/// both from the first cause stepguard knows.
pub fn classify(err: &anyhow::Error) -> (ExitCode, &'static str) {
    for cause in err.chain() {
        match cause.downcast_ref::<LookupError>() {
            Some(LookupError::Unknown { .. }) => return (ExitCode::Usage, "unknown_provider"),
            Some(LookupError::FailedToLoad { .. }) => return (ExitCode::Plugin, "plugin"),
            None => {}
        }
        if cause.is::<stepguard_store::StoreError>() {
            return (ExitCode::Usage, "history");
        }
        if cause.is::<stepguard_governor::scenario::ScenarioError>() {
            return (ExitCode::Usage, "scenario");
        }
        if cause.is::<CallError>() || cause.is::<LoadError>() {
            return (ExitCode::Plugin, "plugin");
        }
        if cause.is::<ConfigError>() {
            return (ExitCode::Usage, "config");
        }
        // A bad value of any limit (steps, tokens, cost, loop limit) or an unknown profile: one
        // kind for all of them, exit 2 like every other mistake on the command line or in a file.
        if cause.is::<LimitError>() {
            return (ExitCode::Usage, "budget");
        }
        if cause.is::<UsageError>() {
            return (ExitCode::Usage, "usage");
        }
        if cause.is::<std::io::Error>() {
            return (ExitCode::Usage, "io");
        }
    }
    // Anything unforeseen is reported as a usage/environment problem rather than as the agent
    // failing, so scripts never mistake a stepguard bug for an agent's verdict.
    (ExitCode::Usage, "usage")
}

/// Returns the `--json` form of an error: `{"error": {"kind": …, "message": …}}`.
pub fn error_object(err: &anyhow::Error) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "kind": classify(err).1,
            "message": render(err),
        }
    })
}

/// Returns an error's message with its causes, each said once: `failed to …: because …`.
///
/// Library errors follow the `thiserror` habit of both printing their source in their own message
/// and returning it from `source()`, so walking the chain (as `{err:#}` does) says things twice.
/// A cause is left out when the message so far already says it, or when it only restates the
/// cause before it with a prefix (SQLite's `Error code 26: file is not a database` under
/// `file is not a database`).
pub fn render(err: &anyhow::Error) -> String {
    let mut message = String::new();
    let mut previous = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let repeats = text.is_empty()
            || message.contains(&text)
            || (!previous.is_empty() && text.ends_with(&previous));
        if !repeats {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        previous = text;
    }
    message
}

/// Converts our exit code into the process's.
pub fn to_process(code: ExitCode) -> std::process::ExitCode {
    std::process::ExitCode::from(code.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {source}")]
    struct Outer {
        #[source]
        source: Inner,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner {
        #[source]
        source: Detail,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("code 26: inner")]
    struct Detail;

    #[test]
    fn each_cause_is_said_once() {
        let err = anyhow::Error::new(Outer {
            source: Inner { source: Detail },
        })
        .context("file.toml");
        assert_eq!(render(&err), "file.toml: outer: inner");
    }

    #[test]
    fn causes_not_in_the_message_are_kept() {
        let err = anyhow::Error::new(std::io::Error::other("disk full")).context("cannot write x");
        assert_eq!(render(&err), "cannot write x: disk full");
    }
}
