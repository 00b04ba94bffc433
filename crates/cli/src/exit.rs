//! The one place where errors and run outcomes become process exit codes.

use std::error::Error;

use stepguard_checkpoint::CheckpointError;
use stepguard_config::{ConfigError, InvalidValue, LimitError};
use stepguard_core::ExitCode;
use stepguard_core::slug::UnknownSlug;
use stepguard_governor::DefinitionError;
use stepguard_governor::scenario::ScenarioError;
use stepguard_ledger::LedgerError;
use stepguard_plugin_api::host::{CallError, LoadError};
use stepguard_plugin_host::trust::UnsafePlugin;
use stepguard_plugin_host::{FailureReason, LookupError};
use stepguard_prices::PriceError;
use stepguard_runner::CountError;
use stepguard_store::StoreError;
use stepguard_telemetry::TelemetryError;

/// A usage error found by stepguard itself (not clap), e.g. an unknown provider name.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub String);

/// Every error a command can end with, as the CLI knows it. [`Known::code`] is the one place
/// each gets its exit code and `--json` kind: its matches name every type and every variant, so
/// a new variant does not compile without a code, and `tests/e2e/architecture.rs` checks that every
/// error type the libraries declare is here (or named as never reaching the CLI).
#[derive(Debug)]
// The reference names what was matched; the code depends on its type and variant only.
#[allow(dead_code)]
pub(crate) enum Known<'a> {
    /// A provider that is not there or did not load.
    Lookup(&'a LookupError),
    /// Why a plugin file was not used.
    Failure(&'a FailureReason),
    /// A plugin file no one but root and the user may change.
    Unsafe(&'a UnsafePlugin),
    /// A plugin that did not load.
    Load(&'a LoadError),
    /// A plugin call that failed.
    Call(&'a CallError),
    /// The history database.
    Store(&'a StoreError),
    /// The ledger of pools (unreachable at a run's start, newer, a query that failed).
    Ledger(&'a LedgerError),
    /// A governor scenario.
    Scenario(&'a ScenarioError),
    /// A governor agent definition.
    Definition(&'a DefinitionError),
    /// A config file.
    Config(&'a ConfigError),
    /// A bad value of a limit, or an unknown profile.
    Limit(&'a LimitError),
    /// A bad value, on its own.
    Value(&'a InvalidValue),
    /// A price file.
    Price(&'a PriceError),
    /// Counting a recorded stream.
    Count(&'a CountError),
    /// Exporting history as telemetry.
    Telemetry(&'a TelemetryError),
    /// A failure slug that does not exist.
    Slug(&'a UnknownSlug),
    /// A checkpoint that could not be listed or restored.
    Checkpoint(&'a CheckpointError),
    /// A usage error found by stepguard itself.
    Usage(&'a UsageError),
    /// A file or a process.
    Io(&'a std::io::Error),
}

/// Error types of the libraries that never reach the CLI as an error, and why (read by
/// `tests/e2e/architecture.rs`, which checks that every error type has a code or a reason here).
#[allow(dead_code)]
pub(crate) const NEVER_AN_ERROR_OF_THE_CLI: &[(&str, &str)] = &[
    (
        "ResumeError",
        "`resume` turns a resume template's refusal into a UsageError naming the run (exit 2)",
    ),
    (
        "GatewayError",
        "the runner makes a gateway that cannot start a run that did not start (`spawn_failed`)",
    ),
    (
        "UnknownDialect",
        "a plugin's endpoint dialect the runner cannot speak makes a run that did not start",
    ),
    (
        "UnknownValue",
        "a record's enum values are read through serde, whose error (in a StoreError) says it",
    ),
    (
        "PointError",
        "the runner makes a command it cannot point at the gateway a run that did not start",
    ),
];

impl<'a> Known<'a> {
    /// The first thing stepguard knows `cause` to be.
    pub(crate) fn of(cause: &'a (dyn Error + 'static)) -> Option<Self> {
        macro_rules! first {
            ($($variant:ident($ty:ty)),* $(,)?) => {
                $(if let Some(e) = cause.downcast_ref::<$ty>() {
                    return Some(Known::$variant(e));
                })*
            };
        }
        first!(
            Lookup(LookupError),
            Failure(FailureReason),
            Unsafe(UnsafePlugin),
            Load(LoadError),
            Call(CallError),
            Store(StoreError),
            Ledger(LedgerError),
            Scenario(ScenarioError),
            Definition(DefinitionError),
            Config(ConfigError),
            Limit(LimitError),
            Value(InvalidValue),
            Price(PriceError),
            Count(CountError),
            Telemetry(TelemetryError),
            Slug(UnknownSlug),
            Checkpoint(CheckpointError),
            Usage(UsageError),
            Io(std::io::Error),
        );
        None
    }

    /// The exit code and the `--json` kind of this error.
    pub(crate) fn code(&self) -> (ExitCode, &'static str) {
        match self {
            Known::Lookup(LookupError::Unknown { .. }) => (ExitCode::Usage, "unknown_provider"),
            Known::Lookup(LookupError::FailedToLoad { .. })
            | Known::Failure(_)
            | Known::Unsafe(_)
            | Known::Load(_)
            | Known::Call(_)
            | Known::Count(CountError::Plugin(_)) => (ExitCode::Plugin, "plugin"),
            Known::Store(_) => (ExitCode::Usage, "history"),
            Known::Ledger(_) => (ExitCode::Usage, "ledger"),
            Known::Scenario(_) | Known::Definition(_) => (ExitCode::Usage, "scenario"),
            Known::Config(_) => (ExitCode::Usage, "config"),
            Known::Checkpoint(_) => (ExitCode::Usage, "checkpoint"),
            Known::Limit(_) | Known::Value(_) => (ExitCode::Usage, "budget"),
            Known::Count(CountError::Read { .. }) | Known::Io(_) => (ExitCode::Usage, "io"),
            Known::Price(PriceError::Read { .. }) => (ExitCode::Usage, "io"),
            Known::Price(_) | Known::Telemetry(_) | Known::Slug(_) | Known::Usage(_) => {
                (ExitCode::Usage, "usage")
            }
        }
    }
}

/// Returns the exit code for an error that ended a command.
pub(crate) fn exit_code_for(err: &anyhow::Error) -> ExitCode {
    classify(err).0
}

/// Returns the exit code and the error's kind (the `kind` of a `--json` error object), deciding
/// both from the first cause stepguard knows.
pub(crate) fn classify(err: &anyhow::Error) -> (ExitCode, &'static str) {
    err.chain()
        .find_map(Known::of)
        .map(|known| known.code())
        // Anything unforeseen is reported as a usage/environment problem rather than as the
        // agent failing, so scripts never mistake a stepguard bug for an agent's verdict.
        .unwrap_or((ExitCode::Usage, "usage"))
}

/// Returns the `--json` form of an error: `{"error": {"kind": …, "message": …}}`.
pub(crate) fn error_object(err: &anyhow::Error) -> serde_json::Value {
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
pub(crate) fn render(err: &anyhow::Error) -> String {
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
pub(crate) fn to_process(code: ExitCode) -> std::process::ExitCode {
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
