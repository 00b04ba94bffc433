//! The local ledger: pools kept in the history database (SQLite, WAL), shared by every run on a
//! host.
//!
//! The ledger's tables are its own, beside the store's runs, with their own version in
//! `stepguard_ledger_meta` (the store's `user_version` is not touched, so the history and the
//! ledger migrate independently); a file whose ledger tables are newer is refused. Each write is
//! one `BEGIN IMMEDIATE` transaction (the write lock taken before anything is read, so two
//! processes never both see room for one more reservation), with a 30 s busy timeout.
//!
//! * `pool_members`: one row per run and pool, with the pool's caps and window as the run
//!   declared them, when it joined (runs started), its lease (`lease_until`) and when it left;
//! * `pool_spend`: one row per pool and idempotency key (`run`, `seq`): a reservation (counted
//!   while its lease lives) or a charge (counted while its time is in the window). Charges are
//!   numbered per pool in time order (`charge_no`) and carry the pool's running totals after them
//!   (`cum_cost`, `cum_tokens`, `cum_steps`);
//! * `pool_totals`: per pool, the running totals of everything it was ever charged and the time
//!   of its last charge. What a window holds is the totals less the running totals of the last
//!   charge before the window starts: two index lookups however many charges the window holds,
//!   and still exact as spend ages out (the PostgreSQL ledger keeps the same). A charge's time is
//!   never before its pool's last charge (a writer whose clock is behind takes the last time), so
//!   charge order is time order.
//!
//! Version 1 had no running totals; opening it adds them (numbering the charges it holds in time
//! order) in the same transaction that moves `stepguard_ledger_meta` to version 2.
//!
//! Times are milliseconds since the Unix epoch.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::{
    Admission, Busy, CalendarUnit, ChargeKey, DEFAULT_LEASE, Exhaustion, Grant, Ledger,
    LedgerError, Measure, MeasureStatus, PoolLimits, PoolSpec, PoolStatus, RunKey, Share, Usage,
    Window,
};

/// The version of the ledger's tables this build writes.
pub const LEDGER_VERSION: i64 = MIGRATIONS.len() as i64;

const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS pool_members (
    run TEXT NOT NULL,
    pool TEXT NOT NULL,
    max_cost_micros INTEGER,
    max_tokens INTEGER,
    max_steps INTEGER,
    max_runs INTEGER,
    max_concurrent_runs INTEGER,
    window_kind TEXT NOT NULL CHECK (window_kind IN ('rolling', 'day', 'week', 'none')),
    window_ms INTEGER,
    window_tz TEXT,
    joined_at INTEGER NOT NULL,
    lease_until INTEGER NOT NULL,
    left_at INTEGER,
    PRIMARY KEY (run, pool)
);
CREATE INDEX IF NOT EXISTS pool_members_by_pool ON pool_members (pool, lease_until);
CREATE INDEX IF NOT EXISTS pool_members_joined ON pool_members (pool, joined_at);
CREATE TABLE IF NOT EXISTS pool_spend (
    pool TEXT NOT NULL,
    run TEXT NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'charged')),
    at INTEGER NOT NULL,
    lease_until INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    steps INTEGER NOT NULL,
    PRIMARY KEY (pool, run, seq)
);
CREATE INDEX IF NOT EXISTS pool_spend_by_time ON pool_spend (pool, at);
CREATE INDEX IF NOT EXISTS pool_spend_by_run ON pool_spend (run, seq);
";

/// Version 2: running totals per pool, and on each charge (numbered in time order) the totals
/// after it; the charges a version 1 file holds are numbered and totalled in place.
const SCHEMA_V2: &str = "
CREATE TABLE pool_totals (
    pool TEXT PRIMARY KEY,
    charges INTEGER NOT NULL DEFAULT 0,
    cum_cost INTEGER NOT NULL DEFAULT 0,
    cum_tokens INTEGER NOT NULL DEFAULT 0,
    cum_steps INTEGER NOT NULL DEFAULT 0,
    last_at INTEGER NOT NULL
);
ALTER TABLE pool_spend ADD COLUMN charge_no INTEGER;
ALTER TABLE pool_spend ADD COLUMN cum_cost INTEGER;
ALTER TABLE pool_spend ADD COLUMN cum_tokens INTEGER;
ALTER TABLE pool_spend ADD COLUMN cum_steps INTEGER;
WITH c AS (
    SELECT rowid AS id, ROW_NUMBER() OVER w AS n, SUM(cost_micros) OVER w AS cc,
           SUM(tokens) OVER w AS ct, SUM(steps) OVER w AS cs
    FROM pool_spend WHERE state = 'charged'
    WINDOW w AS (PARTITION BY pool ORDER BY at, run, seq ROWS UNBOUNDED PRECEDING)
)
UPDATE pool_spend SET charge_no = c.n, cum_cost = c.cc, cum_tokens = c.ct, cum_steps = c.cs
FROM c WHERE pool_spend.rowid = c.id;
INSERT INTO pool_totals (pool, charges, cum_cost, cum_tokens, cum_steps, last_at)
    SELECT pool, COUNT(*), SUM(cost_micros), SUM(tokens), SUM(steps), MAX(at)
    FROM pool_spend WHERE state = 'charged' GROUP BY pool;
DROP INDEX IF EXISTS pool_spend_by_time;
CREATE INDEX pool_spend_charges ON pool_spend (pool, at, charge_no) WHERE state = 'charged';
CREATE INDEX pool_spend_reserved ON pool_spend (pool, lease_until) WHERE state = 'reserved';
";

/// The steps, in order; index + 1 is the version each brings the tables to.
const MIGRATIONS: &[&str] = &[SCHEMA_V1, SCHEMA_V2];

/// The local ledger on one SQLite file.
#[derive(Debug)]
pub struct SqliteLedger {
    conn: Mutex<Connection>,
    path: PathBuf,
    lease: Duration,
}

impl SqliteLedger {
    /// Opens (creating when missing) the ledger's tables in the database at `path`, with the
    /// default lease.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        Self::with_lease(path, DEFAULT_LEASE)
    }

    /// Opens the ledger with a lease of its own (tests shorten it).
    pub fn with_lease(path: &Path, lease: Duration) -> Result<Self, LedgerError> {
        let unreachable = |e: rusqlite::Error| LedgerError::Unreachable {
            ledger: path.display().to_string(),
            reason: "cannot open the database; check the path and its permissions".into(),
            source: Some(Box::new(e)),
        };
        let mut conn = Connection::open(path).map_err(unreachable)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(unreachable)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(unreachable)?;
        let query = |e: rusqlite::Error| LedgerError::Query {
            ledger: path.display().to_string(),
            source: Box::new(e),
        };
        migrate(&mut conn, path).map_err(|e| e.either(query))?;
        Ok(SqliteLedger {
            conn: Mutex::new(conn),
            path: path.to_owned(),
            lease,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves no half-done transaction (rusqlite rolls back on
        // drop), so the connection is still good.
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn query(&self, e: rusqlite::Error) -> LedgerError {
        LedgerError::Query {
            ledger: self.path.display().to_string(),
            source: Box::new(e),
        }
    }

    /// Runs `f` in one immediate transaction, committed when it returns `Ok`.
    fn write<T>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query(e))?;
        let out = f(&Tx {
            tx: &tx,
            ledger: self,
        })?;
        tx.commit().map_err(|e| self.query(e))?;
        Ok(out)
    }
}

/// Why the ledger's tables could not be made ready.
enum Migrate {
    Sql(rusqlite::Error),
    Newer(LedgerError),
}

impl Migrate {
    fn either(self, sql: impl FnOnce(rusqlite::Error) -> LedgerError) -> LedgerError {
        match self {
            Migrate::Sql(e) => sql(e),
            Migrate::Newer(e) => e,
        }
    }
}

impl From<rusqlite::Error> for Migrate {
    fn from(e: rusqlite::Error) -> Self {
        Migrate::Sql(e)
    }
}

/// Creates the ledger's tables when missing, or brings older ones to this version, in one
/// immediate transaction that re-reads the version (concurrent first opens do not race); refuses
/// tables of a newer version.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), Migrate> {
    // Tables already at this version: nothing to write, so no write lock to wait for (every
    // `stepguard run` with pools opens the ledger).
    let current: Option<i64> = conn
        .query_row("SELECT version FROM stepguard_ledger_meta", [], |r| {
            r.get(0)
        })
        .optional()
        .unwrap_or(None);
    if current == Some(LEDGER_VERSION) {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS stepguard_ledger_meta (version INTEGER NOT NULL)",
    )?;
    let found: Option<i64> = tx
        .query_row("SELECT version FROM stepguard_ledger_meta", [], |r| {
            r.get(0)
        })
        .optional()?;
    let mut version = found.unwrap_or(0);
    if version > LEDGER_VERSION {
        return Err(Migrate::Newer(LedgerError::Newer {
            ledger: path.display().to_string(),
            found: version,
            supported: LEDGER_VERSION,
        }));
    }
    if found.is_none() {
        tx.execute("INSERT INTO stepguard_ledger_meta (version) VALUES (0)", [])?;
    }
    while version < LEDGER_VERSION {
        tx.execute_batch(MIGRATIONS[usize::try_from(version).unwrap_or(0)])?;
        version += 1;
    }
    tx.execute("UPDATE stepguard_ledger_meta SET version = ?1", [version])?;
    Ok(tx.commit()?)
}

/// One transaction with the ledger's helpers.
struct Tx<'a> {
    tx: &'a Transaction<'a>,
    ledger: &'a SqliteLedger,
}

/// Milliseconds since the epoch (0 before it).
fn ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn time(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// What a pool has spent in its window: charged, and held by live reservations.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    charged: Usage,
    reserved: Usage,
    runs: u64,
}

impl Spent {
    fn of(&self, m: Measure) -> u64 {
        match m {
            Measure::Runs => self.runs,
            _ => m.of(&self.charged).saturating_add(m.of(&self.reserved)),
        }
    }
}

impl Tx<'_> {
    fn err(&self, e: rusqlite::Error) -> LedgerError {
        self.ledger.query(e)
    }

    /// The pools a run joined, with the caps it declared.
    fn pools_of(&self, run: &RunKey) -> Result<Vec<PoolSpec>, LedgerError> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT pool, max_cost_micros, max_tokens, max_steps, max_runs, max_concurrent_runs,
                        window_kind, window_ms, window_tz
                 FROM pool_members WHERE run = ?1 ORDER BY pool",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([run.as_str()], spec_row)
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// What a pool spent in its window: its running totals less those of the last charge before
    /// the window, the live reservations in it, and (when capped) the runs that joined in it.
    fn spent(&self, pool: &PoolSpec, now: SystemTime) -> Result<Spent, LedgerError> {
        let start = pool.window.start(now)?.map_or(i64::MIN, ms);
        let total = self
            .tx
            .prepare_cached(
                "SELECT cum_cost, cum_tokens, cum_steps FROM pool_totals WHERE pool = ?1",
            )
            .and_then(|mut s| s.query_row([&pool.name], usage_row).optional())
            .map(Option::unwrap_or_default)
            .map_err(|e| self.err(e))?;
        let before = self.charged_before(&pool.name, start)?;
        let reserved = self
            .tx
            .prepare_cached(
                "SELECT COALESCE(SUM(cost_micros), 0), COALESCE(SUM(tokens), 0),
                        COALESCE(SUM(steps), 0)
                 FROM pool_spend
                 WHERE pool = ?1 AND state = 'reserved' AND lease_until > ?3 AND at >= ?2",
            )
            .and_then(|mut s| s.query_row(params![pool.name, start, ms(now)], usage_row))
            .map_err(|e| self.err(e))?;
        let runs = match pool.limits.max_runs {
            None => 0,
            Some(_) => self
                .tx
                .prepare_cached(
                    "SELECT COUNT(*) FROM pool_members WHERE pool = ?1 AND joined_at >= ?2",
                )
                .and_then(|mut s| s.query_row(params![pool.name, start], |r| r.get::<_, i64>(0)))
                .map(from_sql)
                .map_err(|e| self.err(e))?,
        };
        Ok(Spent {
            charged: Usage {
                cost_micros: total.cost_micros.saturating_sub(before.cost_micros),
                tokens: total.tokens.saturating_sub(before.tokens),
                steps: total.steps.saturating_sub(before.steps),
            },
            reserved,
            runs,
        })
    }

    /// The running totals of a pool's last charge before `start` (zero when there is none).
    fn charged_before(&self, pool: &str, start: i64) -> Result<Usage, LedgerError> {
        self.tx
            .prepare_cached(
                "SELECT cum_cost, cum_tokens, cum_steps FROM pool_spend
                 WHERE pool = ?1 AND state = 'charged' AND at < ?2
                 ORDER BY at DESC, charge_no DESC LIMIT 1",
            )
            .and_then(|mut s| s.query_row(params![pool, start], usage_row).optional())
            .map(Option::unwrap_or_default)
            .map_err(|e| self.err(e))
    }

    fn running(&self, pool: &str, now: SystemTime) -> Result<Vec<RunKey>, LedgerError> {
        let mut stmt = self
            .tx
            .prepare_cached("SELECT run FROM pool_members WHERE pool = ?1 AND lease_until > ?2 ORDER BY joined_at")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![pool, ms(now)], |r| {
                r.get::<_, String>(0).map(RunKey)
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// The first capped measure that cannot pay `ask` (for runs: one more run).
    fn exhaustion(
        &self,
        pool: &PoolSpec,
        spent: &Spent,
        ask: &Usage,
        join: bool,
        now: SystemTime,
    ) -> Result<Option<Exhaustion>, LedgerError> {
        for m in Measure::ALL {
            let Some(cap) = pool.limits.cap(m) else {
                continue;
            };
            let asked = if m == Measure::Runs {
                u64::from(join)
            } else {
                m.of(ask)
            };
            if m == Measure::Runs && !join {
                continue;
            }
            let used = spent.of(m);
            if used >= cap || used.saturating_add(asked) > cap {
                let frees_at =
                    self.frees_at(pool, m, used.saturating_add(asked.max(1)) - cap, now)?;
                return Ok(Some(Exhaustion {
                    pool: pool.name.clone(),
                    measure: m,
                    spent: used,
                    cap,
                    asked,
                    frees_at,
                }));
            }
        }
        Ok(None)
    }

    /// When the window will have freed `need` of a measure: the oldest charges age out first;
    /// what reservations hold frees within a lease.
    fn frees_at(
        &self,
        pool: &PoolSpec,
        m: Measure,
        need: u64,
        now: SystemTime,
    ) -> Result<Option<SystemTime>, LedgerError> {
        let Window::Rolling(_) = pool.window else {
            return pool.window.frees(now);
        };
        let start = pool.window.start(now)?.map_or(i64::MIN, ms);
        let found = match m {
            Measure::Runs => self.nth_join(&pool.name, start, need)?,
            _ => self.charge_reaching(&pool.name, start, m, need)?,
        };
        if let Some(at) = found {
            return pool.window.frees(time(at));
        }
        // What is left is held by reservations: they settle or expire within a lease.
        let last: Option<i64> = self
            .tx
            .prepare_cached("SELECT last_at FROM pool_totals WHERE pool = ?1 AND last_at >= ?2")
            .and_then(|mut s| {
                s.query_row(params![pool.name, start], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        let last = last
            .map(|at| pool.window.frees(time(at)))
            .transpose()?
            .flatten();
        let lease = now + self.ledger.lease;
        Ok(Some(last.map_or(lease, |l| l.max(lease))))
    }

    /// When the `need`-th run that joined in the window joined.
    fn nth_join(&self, pool: &str, start: i64, need: u64) -> Result<Option<i64>, LedgerError> {
        self.tx
            .prepare_cached(
                "SELECT joined_at FROM pool_members WHERE pool = ?1 AND joined_at >= ?2
                 ORDER BY joined_at LIMIT 1 OFFSET ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![pool, start, to_sql(need.saturating_sub(1))], |r| {
                    r.get(0)
                })
                .optional()
            })
            .map_err(|e| self.err(e))
    }

    /// When the charge was made after which the window's charges of `m` reach `need`.
    fn charge_reaching(
        &self,
        pool: &str,
        start: i64,
        m: Measure,
        need: u64,
    ) -> Result<Option<i64>, LedgerError> {
        let base = m.of(&self.charged_before(pool, start)?);
        let target = to_sql(base.saturating_add(need));
        let sql = match m {
            Measure::Cost => {
                "SELECT at FROM pool_spend WHERE pool = ?1 AND state = 'charged' AND at >= ?2
                 AND cum_cost >= ?3 ORDER BY at, charge_no LIMIT 1"
            }
            Measure::Tokens => {
                "SELECT at FROM pool_spend WHERE pool = ?1 AND state = 'charged' AND at >= ?2
                 AND cum_tokens >= ?3 ORDER BY at, charge_no LIMIT 1"
            }
            _ => {
                "SELECT at FROM pool_spend WHERE pool = ?1 AND state = 'charged' AND at >= ?2
                 AND cum_steps >= ?3 ORDER BY at, charge_no LIMIT 1"
            }
        };
        self.tx
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_row(params![pool, start, target], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err(e))
    }

    fn share(&self, pool: &PoolSpec, now: SystemTime) -> Result<Share, LedgerError> {
        let spent = self.spent(pool, now)?;
        let left = |m: Measure| {
            pool.limits
                .cap(m)
                .map(|cap| cap.saturating_sub(spent.of(m)))
        };
        Ok(Share {
            pool: pool.name.clone(),
            cost_micros: left(Measure::Cost),
            tokens: left(Measure::Tokens),
            steps: left(Measure::Steps),
        })
    }

    fn shares(&self, run: &RunKey, now: SystemTime) -> Result<Vec<Share>, LedgerError> {
        let pools = self.pools_of(run)?;
        if pools.is_empty() {
            return Err(LedgerError::NotJoined { run: run.clone() });
        }
        pools.iter().map(|p| self.share(p, now)).collect()
    }

    fn is_member(&self, run: &RunKey, pool: &str) -> Result<bool, LedgerError> {
        self.tx
            .query_row(
                "SELECT 1 FROM pool_members WHERE run = ?1 AND pool = ?2",
                params![run.as_str(), pool],
                |_| Ok(()),
            )
            .optional()
            .map(|o| o.is_some())
            .map_err(|e| self.err(e))
    }

    fn key_known(&self, key: &ChargeKey) -> Result<Option<String>, LedgerError> {
        self.tx
            .query_row(
                "SELECT MAX(state) FROM pool_spend WHERE run = ?1 AND seq = ?2",
                params![key.run.as_str(), to_sql(key.seq)],
                |r| r.get::<_, Option<String>>(0),
            )
            .map_err(|e| self.err(e))
    }

    /// Holds `usage` for the key in every pool of the run, for a lease.
    fn insert_reserved(
        &self,
        key: &ChargeKey,
        usage: Usage,
        now: SystemTime,
    ) -> Result<(), LedgerError> {
        let lease_until = ms(now + self.ledger.lease);
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT INTO pool_spend (pool, run, seq, state, at, lease_until, cost_micros, tokens, steps)
                 SELECT pool, run, ?2, 'reserved', ?3, ?4, ?5, ?6, ?7 FROM pool_members WHERE run = ?1",
            )
            .map_err(|e| self.err(e))?;
        stmt.execute(params![
            key.run.as_str(),
            to_sql(key.seq),
            ms(now),
            lease_until,
            to_sql(usage.cost_micros),
            to_sql(usage.tokens),
            to_sql(usage.steps)
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Charges `usage` for the key in every pool of the run, or (`settle`) turns the key's open
    /// reservations into that charge: each pool's running totals grow, and the charge takes the
    /// next number, the totals after it and a time not before the pool's last charge.
    fn insert_charged(
        &self,
        key: &ChargeKey,
        usage: Usage,
        now: SystemTime,
        settle: bool,
    ) -> Result<(), LedgerError> {
        let pools = if settle {
            self.names(
                "SELECT pool FROM pool_spend WHERE run = ?1 AND seq = ?2 AND state = 'reserved' ORDER BY pool",
                params![key.run.as_str(), to_sql(key.seq)],
            )?
        } else {
            self.names(
                "SELECT pool FROM pool_members WHERE run = ?1 ORDER BY pool",
                params![key.run.as_str()],
            )?
        };
        for pool in pools {
            let (charge_no, cum, at) = self.add_to_totals(&pool, usage, now)?;
            let write = if settle {
                "UPDATE pool_spend SET state = 'charged', at = ?4, lease_until = ?5,
                     cost_micros = ?6, tokens = ?7, steps = ?8, charge_no = ?9, cum_cost = ?10,
                     cum_tokens = ?11, cum_steps = ?12
                 WHERE pool = ?1 AND run = ?2 AND seq = ?3"
            } else {
                "INSERT INTO pool_spend (pool, run, seq, state, at, lease_until, cost_micros,
                     tokens, steps, charge_no, cum_cost, cum_tokens, cum_steps)
                 VALUES (?1, ?2, ?3, 'charged', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            };
            self.tx
                .prepare_cached(write)
                .and_then(|mut s| {
                    s.execute(params![
                        pool,
                        key.run.as_str(),
                        to_sql(key.seq),
                        at,
                        ms(now + self.ledger.lease),
                        to_sql(usage.cost_micros),
                        to_sql(usage.tokens),
                        to_sql(usage.steps),
                        charge_no,
                        to_sql(cum.cost_micros),
                        to_sql(cum.tokens),
                        to_sql(cum.steps)
                    ])
                })
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// The first column of every row `sql` returns.
    fn names(&self, sql: &str, params: impl rusqlite::Params) -> Result<Vec<String>, LedgerError> {
        self.tx
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_map(params, |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| self.err(e))
    }

    /// Adds a charge to a pool's running totals: its number, the totals after it and its time.
    fn add_to_totals(
        &self,
        pool: &str,
        usage: Usage,
        now: SystemTime,
    ) -> Result<(i64, Usage, i64), LedgerError> {
        self.tx
            .prepare_cached(
                "INSERT INTO pool_totals (pool, charges, cum_cost, cum_tokens, cum_steps, last_at)
                 VALUES (?1, 1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (pool) DO UPDATE SET charges = charges + 1,
                     cum_cost = cum_cost + excluded.cum_cost,
                     cum_tokens = cum_tokens + excluded.cum_tokens,
                     cum_steps = cum_steps + excluded.cum_steps,
                     last_at = MAX(last_at, excluded.last_at)
                 RETURNING charges, cum_cost, cum_tokens, cum_steps, last_at",
            )
            .and_then(|mut s| {
                s.query_row(
                    params![
                        pool,
                        to_sql(usage.cost_micros),
                        to_sql(usage.tokens),
                        to_sql(usage.steps),
                        ms(now)
                    ],
                    |r| {
                        Ok((
                            r.get(0)?,
                            Usage {
                                cost_micros: from_sql(r.get(1)?),
                                tokens: from_sql(r.get(2)?),
                                steps: from_sql(r.get(3)?),
                            },
                            r.get(4)?,
                        ))
                    },
                )
            })
            .map_err(|e| self.err(e))
    }

    fn insert_member(
        &self,
        run: &RunKey,
        pool: &PoolSpec,
        now: SystemTime,
    ) -> Result<(), LedgerError> {
        let (kind, window_ms, tz) = match &pool.window {
            Window::Rolling(d) => (
                "rolling",
                Some(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
                None,
            ),
            Window::Calendar {
                unit: CalendarUnit::Day,
                tz,
            } => ("day", None, Some(tz.as_str())),
            Window::Calendar {
                unit: CalendarUnit::Week,
                tz,
            } => ("week", None, Some(tz.as_str())),
            Window::Lifetime => ("none", None, None),
        };
        let l = &pool.limits;
        self.tx
            .prepare_cached(
                "INSERT INTO pool_members (run, pool, max_cost_micros, max_tokens, max_steps, max_runs,
                     max_concurrent_runs, window_kind, window_ms, window_tz, joined_at, lease_until)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    run.as_str(),
                    pool.name,
                    l.max_cost_micros.map(to_sql),
                    l.max_tokens.map(to_sql),
                    l.max_steps.map(to_sql),
                    l.max_runs.map(to_sql),
                    l.max_concurrent_runs.map(to_sql),
                    kind,
                    window_ms,
                    tz,
                    ms(now),
                    ms(now + self.ledger.lease)
                ])
            })
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn renew(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
        let until = ms(now + self.ledger.lease);
        self.tx
            .execute(
                "UPDATE pool_members SET lease_until = ?2 WHERE run = ?1 AND left_at IS NULL",
                params![run.as_str(), until],
            )
            .and_then(|_| {
                self.tx.execute(
                    "UPDATE pool_spend SET lease_until = ?2 WHERE run = ?1 AND state = 'reserved'",
                    params![run.as_str(), until],
                )
            })
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// Cost, tokens and steps in a row's first three columns.
fn usage_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Usage> {
    Ok(Usage {
        cost_micros: from_sql(r.get(0)?),
        tokens: from_sql(r.get(1)?),
        steps: from_sql(r.get(2)?),
    })
}

fn spec_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PoolSpec> {
    let cap = |i: usize| r.get::<_, Option<i64>>(i).map(|v| v.map(from_sql));
    let kind: String = r.get(6)?;
    let tz = || {
        r.get::<_, Option<String>>(8)
            .map(|t| t.unwrap_or_else(|| "UTC".into()))
    };
    let window = match kind.as_str() {
        "rolling" => Window::Rolling(Duration::from_millis(from_sql(
            r.get::<_, Option<i64>>(7)?.unwrap_or(0),
        ))),
        "day" => Window::Calendar {
            unit: CalendarUnit::Day,
            tz: tz()?,
        },
        "week" => Window::Calendar {
            unit: CalendarUnit::Week,
            tz: tz()?,
        },
        _ => Window::Lifetime,
    };
    Ok(PoolSpec {
        name: r.get(0)?,
        limits: PoolLimits {
            max_cost_micros: cap(1)?,
            max_tokens: cap(2)?,
            max_steps: cap(3)?,
            max_runs: cap(4)?,
            max_concurrent_runs: cap(5)?,
        },
        window,
    })
}

impl Ledger for SqliteLedger {
    fn lease_time(&self) -> Duration {
        self.lease
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn join(
        &self,
        run: &RunKey,
        pools: &[PoolSpec],
        now: SystemTime,
    ) -> Result<Admission, LedgerError> {
        self.write(|tx| {
            let mut new = Vec::new();
            for pool in pools {
                pool.window.check()?;
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
            for pool in &new {
                let Some(cap) = pool.limits.max_concurrent_runs else {
                    continue;
                };
                let running = tx.running(&pool.name, now)?.len() as u64;
                if running >= cap {
                    return Ok(Admission::Busy(Busy {
                        pool: pool.name.clone(),
                        running,
                        cap,
                    }));
                }
            }
            for pool in &new {
                tx.insert_member(run, pool, now)?;
            }
            tx.renew(run, now)?;
            pools
                .iter()
                .map(|p| tx.share(p, now))
                .collect::<Result<_, _>>()
                .map(Admission::Admitted)
        })
    }

    fn reserve(
        &self,
        key: &ChargeKey,
        estimate: Usage,
        now: SystemTime,
    ) -> Result<Grant, LedgerError> {
        self.write(|tx| {
            let pools = tx.pools_of(&key.run)?;
            if pools.is_empty() {
                return Err(LedgerError::NotJoined {
                    run: key.run.clone(),
                });
            }
            if tx.key_known(key)?.is_none() {
                for pool in &pools {
                    let spent = tx.spent(pool, now)?;
                    if let Some(refusal) = tx.exhaustion(pool, &spent, &estimate, false, now)? {
                        return Ok(Grant::Refused(refusal));
                    }
                }
                tx.insert_reserved(key, estimate, now)?;
            }
            pools
                .iter()
                .map(|p| tx.share(p, now))
                .collect::<Result<_, _>>()
                .map(Grant::Granted)
        })
    }

    fn settle(
        &self,
        key: &ChargeKey,
        actual: Usage,
        now: SystemTime,
    ) -> Result<Vec<Share>, LedgerError> {
        self.write(|tx| {
            match tx.key_known(key)?.as_deref() {
                Some("reserved") => tx.insert_charged(key, actual, now, true)?,
                Some(_) => {}
                None => tx.insert_charged(key, actual, now, false)?,
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
        self.write(|tx| {
            if tx.pools_of(&key.run)?.is_empty() {
                return Err(LedgerError::NotJoined {
                    run: key.run.clone(),
                });
            }
            if tx.key_known(key)?.is_none() {
                tx.insert_charged(key, actual, now, false)?;
            }
            tx.shares(&key.run, now)
        })
    }

    fn renew(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
        self.write(|tx| tx.renew(run, now))
    }

    fn leave(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
        self.write(|tx| {
            tx.tx
                .execute(
                    "UPDATE pool_members SET left_at = ?2, lease_until = MIN(lease_until, ?2) WHERE run = ?1 AND left_at IS NULL",
                    params![run.as_str(), ms(now)],
                )
                .and_then(|_| tx.tx.execute("DELETE FROM pool_spend WHERE run = ?1 AND state = 'reserved'", [run.as_str()]))
                .map_err(|e| tx.err(e))?;
            Ok(())
        })
    }

    fn allowance(&self, run: &RunKey, now: SystemTime) -> Result<Vec<Share>, LedgerError> {
        // A read, but in the same immediate transaction as the writes, so it never sees half of one.
        self.write(|tx| tx.shares(run, now))
    }

    fn status(&self, pools: &[PoolSpec], now: SystemTime) -> Result<Vec<PoolStatus>, LedgerError> {
        self.write(|tx| pools.iter().map(|pool| tx.status(pool, now)).collect())
    }
}

impl Tx<'_> {
    fn status(&self, pool: &PoolSpec, now: SystemTime) -> Result<PoolStatus, LedgerError> {
        pool.window.check()?;
        let spent = self.spent(pool, now)?;
        let mut measures = Vec::new();
        for m in Measure::ALL {
            let Some(cap) = pool.limits.cap(m) else {
                continue;
            };
            let (charged, reserved) = match m {
                Measure::Runs => (spent.runs, 0),
                _ => (m.of(&spent.charged), m.of(&spent.reserved)),
            };
            let frees_at = if charged == 0 {
                None
            } else {
                self.frees_at(pool, m, 1, now)?
            };
            measures.push(MeasureStatus {
                measure: m,
                charged,
                reserved,
                cap,
                frees_at,
            });
        }
        Ok(PoolStatus {
            spec: pool.clone(),
            measures,
            running: self.running(&pool.name, now)?,
            window_start: pool.window.start(now)?,
        })
    }
}
