//! The ledger a command keeps pools in, opened in one place: the local ledger in the history
//! database, or the fleet ledger (PostgreSQL) when `--ledger`, `STEPGUARD_LEDGER_URL` or
//! `[ledger] url` names one (`ledger_pg`); an unreachable fleet ledger refuses the run unless
//! `on_ledger_error = "local"`.

use std::path::Path;

use stepguard_config::{OnLedgerError, Origin};
use stepguard_core::{LedgerKind, PoolLedger};
use stepguard_ledger::sqlite::SqliteLedger;
use stepguard_ledger::{DEFAULT_LEASE, Ledger, LedgerError};

use crate::exit::UsageError;

/// Environment variable setting the lease of a run's pool slot (default 30 s): a run that dies
/// frees its slot within it.
pub(crate) const LEASE_ENV: &str = "STEPGUARD_POOL_LEASE";

/// The lease in effect: `STEPGUARD_POOL_LEASE` (1 s to 1 h), else 30 s.
fn lease() -> anyhow::Result<std::time::Duration> {
    let Some(text) = std::env::var_os(LEASE_ENV) else {
        return Ok(DEFAULT_LEASE);
    };
    let text = text.to_string_lossy();
    humantime::parse_duration(&text)
        .ok()
        .filter(|d| (1..=3600).contains(&d.as_secs()))
        .ok_or_else(|| {
            UsageError(format!(
                "{LEASE_ENV}={text}: expected a duration from 1s to 1h, e.g. 30s"
            ))
            .into()
        })
}

/// Where a command keeps its pools: the fleet ledger when one is named (`ledger_pg::chosen`),
/// and what a run does when it cannot be reached at the start.
pub(crate) struct Choice {
    /// The fleet ledger, when one is named.
    pub fleet: Option<crate::ledger_pg::Fleet>,
    /// `[ledger] on_ledger_error`, with where it was set (none: the default, refuse).
    pub on_error: Option<(OnLedgerError, Origin)>,
}

/// An open ledger, and which it is (for the run's record).
pub(crate) struct Opened {
    /// The ledger.
    pub ledger: Box<dyn Ledger>,
    /// Which ledger it is, and whether it stands in for an unreachable fleet ledger.
    pub mark: PoolLedger,
    /// The history database (beside it, the charges a ledger did not take wait for it).
    pub history: std::path::PathBuf,
}

/// Opens the ledger of a run or a command whose history database is `history`: the fleet
/// ledger when `choice` names one, else the local ledger, whose tables live in that file
/// (created with its directory when missing, as the history is). A fleet ledger that cannot be
/// reached is [`LedgerError::Unreachable`] (exit 2 at a run's start), unless
/// `on_ledger_error = "local"` and `fall_back`: then the local ledger is opened with a warning,
/// and the mark says so. The lease is `STEPGUARD_POOL_LEASE`'s.
pub(crate) fn open(history: &Path, choice: &Choice, fall_back: bool) -> anyhow::Result<Opened> {
    let opened = open_chosen(history, choice, fall_back)?;
    // Charges of earlier runs this ledger did not take when they ended: taken now, once.
    let charged = crate::pool_outbox::replay(history, opened.ledger.as_ref());
    if charged > 0 {
        crate::output::note(format!(
            "charged {charged} earlier run(s) to their pools in {}: the ledger was away when \
             they ended",
            opened.ledger.describe()
        ));
    }
    Ok(opened)
}

/// [`open`] without the replay of pending charges.
fn open_chosen(history: &Path, choice: &Choice, fall_back: bool) -> anyhow::Result<Opened> {
    let lease = lease()?;
    if let Some(fleet) = &choice.fleet {
        let local_origin = match &choice.on_error {
            Some((OnLedgerError::Local, origin)) if fall_back => Some(origin),
            _ => None,
        };
        return match (crate::ledger_pg::open(&fleet.url, lease), local_origin) {
            (Ok(ledger), _) => Ok(Opened {
                ledger,
                mark: PoolLedger {
                    kind: LedgerKind::Fleet,
                    fallback: false,
                },
                history: history.to_owned(),
            }),
            (Err(e @ LedgerError::Unreachable { .. }), Some(origin)) => {
                crate::output::diag(
                    "warning",
                    format!(
                        "{e}; on_ledger_error = \"local\" ({origin}): this run keeps its pools in \
                         the local ledger ({}), which other hosts do not see, and its record says so",
                        history.display()
                    ),
                );
                Ok(Opened {
                    ledger: open_local(history, lease)?,
                    mark: PoolLedger {
                        kind: LedgerKind::Local,
                        fallback: true,
                    },
                    history: history.to_owned(),
                })
            }
            (Err(e), _) => Err(e.into()),
        };
    }
    Ok(Opened {
        ledger: open_local(history, lease)?,
        mark: PoolLedger {
            kind: LedgerKind::Local,
            fallback: false,
        },
        history: history.to_owned(),
    })
}

/// Opens the local ledger in the history database at `history`.
fn open_local(history: &Path, lease: std::time::Duration) -> Result<Box<dyn Ledger>, LedgerError> {
    if let Some(dir) = history.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| LedgerError::Unreachable {
            ledger: history.display().to_string(),
            reason: format!("cannot create {}; check its permissions", dir.display()),
            source: Some(Box::new(e)),
        })?;
    }
    Ok(Box::new(SqliteLedger::with_lease(history, lease)?))
}
