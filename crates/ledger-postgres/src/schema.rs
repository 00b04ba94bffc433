//! The fleet ledger's tables and their migrations.
//!
//! Like the history store's: numbered steps, each bringing the tables one version up, applied in
//! order inside one transaction that holds an advisory lock (so hosts opening a fresh database at
//! once do not race), the version kept in `stepguard_schema`. A database whose version is newer
//! than this build knows is refused before anything is written.

use postgres::Client;

/// The SQL steps, in order; index + 1 is the version each brings the tables to.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: pools (their lock rows, with running totals of what was ever charged), their members
    // (slot leases) and their spend (reservations, and charges numbered in time order with the
    // running totals after each, so a window's spend is two index lookups, not a sum).
    "CREATE TABLE stepguard_pools (
        name TEXT PRIMARY KEY,
        charges BIGINT NOT NULL DEFAULT 0,
        cum_cost BIGINT NOT NULL DEFAULT 0,
        cum_tokens BIGINT NOT NULL DEFAULT 0,
        cum_steps BIGINT NOT NULL DEFAULT 0,
        last_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
    );
    CREATE TABLE stepguard_pool_members (
        run TEXT NOT NULL,
        pool TEXT NOT NULL REFERENCES stepguard_pools (name),
        max_cost_micros BIGINT,
        max_tokens BIGINT,
        max_steps BIGINT,
        max_runs BIGINT,
        max_concurrent_runs BIGINT,
        window_kind TEXT NOT NULL CHECK (window_kind IN ('rolling', 'day', 'week', 'none')),
        window_ms BIGINT,
        window_tz TEXT,
        joined_at TIMESTAMPTZ NOT NULL,
        lease_until TIMESTAMPTZ NOT NULL,
        left_at TIMESTAMPTZ,
        PRIMARY KEY (run, pool)
    );
    CREATE INDEX stepguard_pool_members_by_lease ON stepguard_pool_members (pool, lease_until);
    CREATE INDEX stepguard_pool_members_by_join ON stepguard_pool_members (pool, joined_at);
    CREATE TABLE stepguard_pool_spend (
        pool TEXT NOT NULL REFERENCES stepguard_pools (name),
        run TEXT NOT NULL,
        seq BIGINT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('reserved', 'charged')),
        at TIMESTAMPTZ NOT NULL,
        lease_until TIMESTAMPTZ NOT NULL,
        cost_micros BIGINT NOT NULL CHECK (cost_micros >= 0),
        tokens BIGINT NOT NULL CHECK (tokens >= 0),
        steps BIGINT NOT NULL CHECK (steps >= 0),
        charge_no BIGINT,
        cum_cost BIGINT,
        cum_tokens BIGINT,
        cum_steps BIGINT,
        PRIMARY KEY (pool, run, seq),
        CHECK ((state = 'charged') = (charge_no IS NOT NULL AND cum_cost IS NOT NULL
            AND cum_tokens IS NOT NULL AND cum_steps IS NOT NULL))
    );
    CREATE INDEX stepguard_pool_spend_charges ON stepguard_pool_spend (pool, at, charge_no)
        WHERE state = 'charged';
    CREATE INDEX stepguard_pool_spend_reserved ON stepguard_pool_spend (pool, lease_until)
        WHERE state = 'reserved';
    CREATE INDEX stepguard_pool_spend_by_run ON stepguard_pool_spend (run, seq);",
];

/// The version this build writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory lock every migration holds (an arbitrary constant: "stepgrd" in ASCII).
const MIGRATION_LOCK: i64 = 0x0073_7465_7067_7264;

/// How migrating ended badly.
#[derive(Debug)]
pub(crate) enum MigrateError {
    /// The tables are newer than this build.
    Newer(i32),
    /// The server said no.
    Pg(postgres::Error),
}

impl From<postgres::Error> for MigrateError {
    fn from(e: postgres::Error) -> Self {
        MigrateError::Pg(e)
    }
}

/// Brings the tables to `target` (at most [`SCHEMA_VERSION`]), all steps in one transaction.
pub(crate) fn migrate(client: &mut Client, target: i32) -> Result<i32, MigrateError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS stepguard_schema (version INTEGER NOT NULL)")?;
    let found: Option<i32> = tx
        .query_opt("SELECT version FROM stepguard_schema", &[])?
        .map(|r| r.get(0));
    let mut version = found.unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(MigrateError::Newer(version));
    }
    if found.is_none() {
        tx.execute("INSERT INTO stepguard_schema (version) VALUES (0)", &[])?;
    }
    while version < target.min(SCHEMA_VERSION) {
        let step = MIGRATIONS[usize::try_from(version).unwrap_or(0)];
        tx.batch_execute(step)?;
        version += 1;
    }
    tx.execute("UPDATE stepguard_schema SET version = $1", &[&version])?;
    tx.commit()?;
    Ok(version)
}
