//! [`PgLedger`]: the [`Ledger`] trait on PostgreSQL, one connection per ledger value, each
//! method one transaction.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use postgres::error::SqlState;
use postgres::{Client, IsolationLevel};
use stepguard_ledger::{
    Admission, ChargeKey, DEFAULT_LEASE, Grant, Ledger, LedgerError, PoolSpec, PoolStatus, RunKey,
    Share, Usage,
};

use crate::connect::{ConnectError, Env, Target, source_chain};
use crate::schema::{self, MigrateError, SCHEMA_VERSION};
use crate::tx::{Fail, Prepared, Tx};

/// Whose clock decides windows and leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// The database's (`now()` at each transaction's start): every host of a fleet agrees,
    /// whatever its own clock says. The `now` callers pass is not used.
    #[default]
    Database,
    /// The caller's `now` (tests that move time; one host).
    Caller,
}

/// How a [`PgLedger`] behaves beyond its URL.
#[derive(Debug, Clone, Copy)]
pub struct PgOptions {
    /// How long a slot or a reservation lives without a renewal.
    pub lease: Duration,
    /// Whose clock counts.
    pub clock: Clock,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            clock: Clock::Database,
        }
    }
}

/// How many times a transaction that lost a deadlock or a serialization conflict is run again.
const CONFLICT_TRIES: u32 = 5;

/// One connection and what it has prepared.
struct Conn {
    client: Client,
    prepared: Prepared,
}

/// Whether a transaction writes (under the pools' row locks) or only reads (one snapshot).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Write,
    Read,
}

/// The fleet ledger: pools kept in a PostgreSQL database shared by every host.
///
/// Reservations are made under row locks: every transaction that may add spend to a pool
/// first locks that pool's row in `stepguard_pools` (`SELECT … FOR UPDATE`, in name order),
/// then reads what is spent and writes; so two hosts never both see room for the last
/// reservation. A lost connection is made again on the next call (once within a call: every
/// method is idempotent, so a call whose answer was lost is safely run again).
pub struct PgLedger {
    target: Target,
    conn: Mutex<Option<Conn>>,
    options: PgOptions,
}

impl std::fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLedger")
            .field("ledger", &self.target.describe())
            .field("options", &self.options)
            .finish()
    }
}

impl PgLedger {
    /// Connects to the ledger at `url` (with the process's `PG*` variables and passfile),
    /// creating or migrating its tables; an unreachable server is [`LedgerError::Unreachable`]
    /// within the connect timeout.
    pub fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::connect_with(url, &|k| std::env::var(k).ok(), PgOptions::default())
    }

    /// As [`PgLedger::connect`], with the environment and options given.
    pub fn connect_with(url: &str, env: Env<'_>, options: PgOptions) -> Result<Self, LedgerError> {
        let target =
            Target::resolve(url, env).map_err(|e| unreachable(&crate::connect::redact(url), e))?;
        let ledger = PgLedger {
            target,
            conn: Mutex::new(None),
            options,
        };
        let mut conn = ledger.open()?;
        schema::migrate(&mut conn.client, SCHEMA_VERSION).map_err(|e| match e {
            MigrateError::Newer(found) => LedgerError::Newer {
                ledger: ledger.describe(),
                found: i64::from(found),
                supported: i64::from(SCHEMA_VERSION),
            },
            MigrateError::Pg(e) => ledger.classify(e),
        })?;
        *ledger.lock() = Some(conn);
        Ok(ledger)
    }

    /// How long connecting may take before the ledger counts as unreachable.
    pub fn connect_timeout(&self) -> Duration {
        self.target.timeout()
    }

    fn lock(&self) -> MutexGuard<'_, Option<Conn>> {
        // A panic mid-transaction leaves nothing half-done: the driver rolls back on drop.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a connection and sets its bounds: no statement or lock wait runs away.
    fn open(&self) -> Result<Conn, LedgerError> {
        let mut client = self
            .target
            .connect()
            .map_err(|e| unreachable(self.target.describe(), e))?;
        client
            .batch_execute(
                "SET statement_timeout = '30s'; SET lock_timeout = '20s';
                 SET idle_in_transaction_session_timeout = '60s'",
            )
            .map_err(|e| self.classify(e))?;
        Ok(Conn {
            client,
            prepared: Prepared::new(),
        })
    }

    /// Runs `f` in one transaction, connecting when needed; conflicts are run again, and a
    /// lost connection is made again once.
    fn run<T>(
        &self,
        mode: Mode,
        now: SystemTime,
        f: impl Fn(&mut Tx<'_>, SystemTime) -> Result<T, Fail>,
    ) -> Result<T, LedgerError> {
        let mut guard = self.lock();
        let (mut conflicts, mut reconnects) = (0, 0);
        loop {
            let conn = match guard.take() {
                Some(c) if !c.client.is_closed() => guard.insert(c),
                _ => guard.insert(self.open()?),
            };
            let e = match self.attempt(conn, mode, now, &f) {
                Ok(v) => return Ok(v),
                Err(Fail::Ledger(e)) => return Err(e),
                Err(Fail::Pg(e)) => e,
            };
            let retry_conflict = matches!(
                e.code(),
                Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
            );
            if retry_conflict && conflicts < CONFLICT_TRIES {
                conflicts += 1;
                continue;
            }
            let error = self.classify(e);
            if matches!(error, LedgerError::Unreachable { .. }) {
                *guard = None;
                if reconnects == 0 {
                    reconnects += 1;
                    continue;
                }
            }
            return Err(error);
        }
    }

    fn attempt<T>(
        &self,
        conn: &mut Conn,
        mode: Mode,
        now: SystemTime,
        f: &impl Fn(&mut Tx<'_>, SystemTime) -> Result<T, Fail>,
    ) -> Result<T, Fail> {
        let tx = match mode {
            Mode::Write => conn.client.transaction()?,
            Mode::Read => conn
                .client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?,
        };
        let mut tx = Tx {
            tx,
            prepared: &mut conn.prepared,
            lease: self.options.lease,
        };
        let now = match self.options.clock {
            Clock::Database => tx
                .query("SELECT now()", &[])?
                .first()
                .map_or(now, |r| r.get(0)),
            Clock::Caller => now,
        };
        let out = f(&mut tx, now)?;
        tx.tx.commit()?;
        Ok(out)
    }

    /// A lost or refused connection is the ledger being unreachable; anything else the server
    /// said is a query error.
    fn classify(&self, e: postgres::Error) -> LedgerError {
        let lost = match e.code() {
            None => {
                e.is_closed()
                    || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>())
            }
            Some(code) => {
                code.code().starts_with("08")
                    || *code == SqlState::ADMIN_SHUTDOWN
                    || *code == SqlState::CRASH_SHUTDOWN
                    || *code == SqlState::CANNOT_CONNECT_NOW
            }
        };
        if lost {
            LedgerError::Unreachable {
                ledger: self.describe(),
                reason: format!("the connection was lost ({})", source_chain(&e)),
                source: Some(Box::new(e)),
            }
        } else {
            LedgerError::Query {
                ledger: self.describe(),
                source: Box::new(e),
            }
        }
    }
}

fn unreachable(ledger: &str, e: ConnectError) -> LedgerError {
    LedgerError::Unreachable {
        ledger: ledger.to_owned(),
        reason: e.reason,
        source: e.source,
    }
}

impl Ledger for PgLedger {
    fn lease_time(&self) -> Duration {
        self.options.lease
    }

    fn describe(&self) -> String {
        self.target.describe().to_owned()
    }

    fn join(
        &self,
        run: &RunKey,
        pools: &[PoolSpec],
        now: SystemTime,
    ) -> Result<Admission, LedgerError> {
        for pool in pools {
            pool.window.check()?;
        }
        self.run(Mode::Write, now, |tx, now| {
            let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            tx.lock_pools(&names, true)?;
            let mut new = Vec::new();
            for pool in pools {
                if !tx.is_member(run, &pool.name)? {
                    new.push(pool);
                }
            }
            for pool in &new {
                let spent = tx.spent(pool, now)?;
                if let Some(refusal) = tx.exhaustion(pool, &spent, &Usage::default(), true, now)? {
                    return Ok(Admission::Exhausted(refusal));
                }
            }
            if let Some(busy) = tx.first_busy(&new, now)? {
                return Ok(Admission::Busy(busy));
            }
            for pool in &new {
                tx.insert_member(run, pool, now)?;
            }
            tx.renew(run, now)?;
            let shares = pools
                .iter()
                .map(|p| tx.share(p, now))
                .collect::<Result<_, _>>()?;
            Ok(Admission::Admitted(shares))
        })
    }

    fn reserve(
        &self,
        key: &ChargeKey,
        estimate: Usage,
        now: SystemTime,
    ) -> Result<Grant, LedgerError> {
        self.run(Mode::Write, now, |tx, now| {
            let pools = locked_pools_of(tx, &key.run)?;
            if tx.key_known(key)?.is_none() {
                for pool in &pools {
                    let spent = tx.spent(pool, now)?;
                    if let Some(refusal) = tx.exhaustion(pool, &spent, &estimate, false, now)? {
                        return Ok(Grant::Refused(refusal));
                    }
                }
                tx.insert_reserved(key, estimate, now)?;
            }
            let shares = pools
                .iter()
                .map(|p| tx.share(p, now))
                .collect::<Result<_, _>>()?;
            Ok(Grant::Granted(shares))
        })
    }

    fn settle(
        &self,
        key: &ChargeKey,
        actual: Usage,
        now: SystemTime,
    ) -> Result<Vec<Share>, LedgerError> {
        self.run(Mode::Write, now, |tx, now| {
            locked_pools_of(tx, &key.run)?;
            match tx.key_known(key)?.as_deref() {
                Some("reserved") => tx.settle_reserved(key, actual, now)?,
                Some(_) => {}
                None => tx.insert_charged(key, actual, now)?,
            }
            tx.shares(&key.run, now)
        })
    }

    fn charge(
        &self,
        key: &ChargeKey,
        actual: Usage,
        now: SystemTime,
    ) -> Result<Vec<Share>, LedgerError> {
        self.run(Mode::Write, now, |tx, now| {
            locked_pools_of(tx, &key.run)?;
            if tx.key_known(key)?.is_none() {
                tx.insert_charged(key, actual, now)?;
            }
            tx.shares(&key.run, now)
        })
    }

    fn renew(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
        self.run(Mode::Write, now, |tx, now| tx.renew(run, now))
    }

    fn leave(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
        self.run(Mode::Write, now, |tx, now| tx.leave(run, now))
    }

    fn allowance(&self, run: &RunKey, now: SystemTime) -> Result<Vec<Share>, LedgerError> {
        self.run(Mode::Read, now, |tx, now| tx.shares(run, now))
    }

    fn status(&self, pools: &[PoolSpec], now: SystemTime) -> Result<Vec<PoolStatus>, LedgerError> {
        self.run(Mode::Read, now, |tx, now| {
            pools.iter().map(|pool| tx.status(pool, now)).collect()
        })
    }
}

/// The run's pools, locked; a run that joined none is a caller's error.
fn locked_pools_of(tx: &mut Tx<'_>, run: &RunKey) -> Result<Vec<PoolSpec>, Fail> {
    let pools = tx.pools_of(run)?;
    if pools.is_empty() {
        return Err(LedgerError::NotJoined { run: run.clone() }.into());
    }
    let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    tx.lock_pools(&names, false)?;
    Ok(pools)
}
