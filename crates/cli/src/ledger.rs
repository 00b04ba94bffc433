//! The ledger a command keeps pools in, opened in one place: the local ledger in the history
//! database, or the fleet ledger (PostgreSQL) when `STEPGUARD_LEDGER_URL` names one
//! (`ledger_pg`).

use std::path::Path;

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

/// Opens the ledger for a run or a command whose history database is `history`: the fleet
/// ledger when `STEPGUARD_LEDGER_URL` is set, else the local
/// ledger's tables live in that file (created with its directory when missing, as the history
/// is). A ledger that cannot be opened is [`LedgerError::Unreachable`] (exit 2 at a run's start);
/// the lease is `STEPGUARD_POOL_LEASE`'s.
pub(crate) fn open(history: &Path) -> anyhow::Result<Box<dyn Ledger>> {
    if let Some(url) = crate::ledger_pg::url() {
        return Ok(crate::ledger_pg::open(&url, lease()?)?);
    }
    if let Some(dir) = history.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| LedgerError::Unreachable {
            ledger: history.display().to_string(),
            reason: format!("cannot create {}; check its permissions", dir.display()),
            source: Some(Box::new(e)),
        })?;
    }
    Ok(Box::new(SqliteLedger::with_lease(history, lease()?)?))
}
