//! The fleet ledger's selection: `STEPGUARD_LEDGER_URL` names a PostgreSQL database that every
//! host shares pools through (`stepguard-ledger-postgres`); without it, pools stay in the local
//! ledger. Its URL, passwords, TLS and faults are described in `docs/fleet.md`.

use std::time::Duration;

use stepguard_ledger::{Ledger, LedgerError};
use stepguard_ledger_postgres::{Clock, PgLedger, PgOptions};

/// Environment variable naming the fleet ledger (a `postgres://` URL).
pub(crate) const URL_ENV: &str = "STEPGUARD_LEDGER_URL";

/// The fleet ledger's URL, when one is set (an empty value is none).
pub(crate) fn url() -> Option<String> {
    crate::reexec::var(URL_ENV).filter(|u| !u.trim().is_empty())
}

/// Connects to the fleet ledger (the `PG*` variables and the passfile fill what the URL leaves
/// out), creating its tables when missing; leases and windows follow the database's clock.
pub(crate) fn open(url: &str, lease: Duration) -> Result<Box<dyn Ledger>, LedgerError> {
    let options = PgOptions {
        lease,
        clock: Clock::Database,
    };
    let ledger = PgLedger::connect_with(url, &|k| std::env::var(k).ok(), options)?;
    Ok(Box::new(ledger))
}
