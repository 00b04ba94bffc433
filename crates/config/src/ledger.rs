//! `[ledger]`: where a fleet keeps its pools (`url`, a PostgreSQL database) and what a run does
//! when that database cannot be reached at its start (`on_ledger_error`).
//!
//! Only the files a repository cannot edit may set it: the user's file, the system file and the
//! `STEPGUARD_POLICY` file. A `[ledger]` in a project file (found by walking up, or named by
//! `--config`) is ignored with a warning: a repository naming a server of its own would receive
//! its runs' pool charges (and escape the fleet's pools by keeping them there).

use crate::value::Origin;
use crate::{Diagnostic, Severity};

/// The keys of `[ledger]`.
pub(crate) const LEDGER_KEYS: &[&str] = &["url", "on_ledger_error"];

/// The warning for a `[ledger]` table in a project file, after the file and key.
pub const PROJECT_LEDGER_IGNORED: &str = "[ledger] in a project file is ignored: a repository \
     may not choose the server its runs' pools are kept in; set it in the user or system file, \
     STEPGUARD_LEDGER_URL or --ledger";

/// What a run does when the fleet ledger cannot be reached at its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnLedgerError {
    /// Refuse the run before the agent starts (exit 2): the default, fail closed.
    #[default]
    Refuse,
    /// Run on the local ledger (the history database) with a warning and a mark in the record.
    Local,
}

impl OnLedgerError {
    /// The value as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            OnLedgerError::Refuse => "refuse",
            OnLedgerError::Local => "local",
        }
    }
}

/// The `[ledger]` table of the files in effect, each value with where it was set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LedgerConfig {
    /// `ledger.url`: the fleet ledger's URL (it may hold a password).
    pub url: Option<(String, Origin)>,
    /// `ledger.on_ledger_error`.
    pub on_error: Option<(OnLedgerError, Origin)>,
}

impl LedgerConfig {
    /// Takes each key `other` sets that this one does not (`self` is of higher precedence).
    pub(crate) fn fill_from(&mut self, other: &LedgerConfig) {
        if self.url.is_none() {
            self.url.clone_from(&other.url);
        }
        if self.on_error.is_none() {
            self.on_error = other.on_error.clone();
        }
    }
}

/// Parses a `[ledger]` table of the file at `path`; problems become diagnostics naming the key.
pub(crate) fn parse(path: &str, value: &toml::Value, out: &mut Vec<Diagnostic>) -> LedgerConfig {
    let mut config = LedgerConfig::default();
    let diag = |out: &mut Vec<Diagnostic>, severity, key: &str, message: String| {
        out.push(Diagnostic {
            severity,
            file: path.to_owned(),
            key: Some(key.to_owned()),
            message,
        });
    };
    let Some(table) = value.as_table() else {
        diag(
            out,
            Severity::Error,
            "ledger",
            format!("expected a table, found {}", value.type_str()),
        );
        return config;
    };
    for (key, v) in table {
        let at = format!("ledger.{key}");
        let origin = Origin::File {
            path: path.to_owned(),
            key: at.clone(),
        };
        match key.as_str() {
            "url" => match v.as_str().map(str::trim) {
                Some(url) if !url.is_empty() => config.url = Some((url.to_owned(), origin)),
                _ => diag(
                    out,
                    Severity::Error,
                    &at,
                    "expected the fleet ledger's URL, e.g. \
                     \"postgres://stepguard@ledger.example/stepguard\""
                        .to_owned(),
                ),
            },
            "on_ledger_error" => match v.as_str() {
                Some("refuse") => config.on_error = Some((OnLedgerError::Refuse, origin)),
                Some("local") => config.on_error = Some((OnLedgerError::Local, origin)),
                _ => diag(
                    out,
                    Severity::Error,
                    &at,
                    format!("expected \"refuse\" or \"local\", found {v}"),
                ),
            },
            other => {
                let message = match crate::did_you_mean(other, LEDGER_KEYS) {
                    Some(s) => format!("unknown key `{other}`; did you mean `{s}`?"),
                    None => format!(
                        "unknown key `{other}`; known keys here: {}",
                        LEDGER_KEYS.join(", ")
                    ),
                };
                diag(out, Severity::Warning, &at, message);
            }
        }
    }
    config
}
