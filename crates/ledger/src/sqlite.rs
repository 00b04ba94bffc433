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
//!   while its lease lives) or a charge (counted while its time is in the window).
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
pub const LEDGER_VERSION: i64 = 1;

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

/// Creates the ledger's tables when missing, in one immediate transaction that re-reads the
/// version (concurrent first opens do not race); refuses tables of a newer version.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), Migrate> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS stepguard_ledger_meta (version INTEGER NOT NULL)",
    )?;
    let found: Option<i64> = tx
        .query_row("SELECT version FROM stepguard_ledger_meta", [], |r| {
            r.get(0)
        })
        .optional()?;
    match found {
        Some(v) if v > LEDGER_VERSION => {
            return Err(Migrate::Newer(LedgerError::Newer {
                ledger: path.display().to_string(),
                found: v,
                supported: LEDGER_VERSION,
            }));
        }
        Some(_) => {}
        None => {
            tx.execute_batch(SCHEMA_V1)?;
            tx.execute(
                "INSERT INTO stepguard_ledger_meta (version) VALUES (?1)",
                [LEDGER_VERSION],
            )?;
        }
    }
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

    fn spent(&self, pool: &PoolSpec, now: SystemTime) -> Result<Spent, LedgerError> {
        let start = pool.window.start(now)?.map_or(i64::MIN, ms);
        let now = ms(now);
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT
                   COALESCE(SUM(CASE WHEN state = 'charged' THEN cost_micros END), 0),
                   COALESCE(SUM(CASE WHEN state = 'charged' THEN tokens END), 0),
                   COALESCE(SUM(CASE WHEN state = 'charged' THEN steps END), 0),
                   COALESCE(SUM(CASE WHEN state = 'reserved' THEN cost_micros END), 0),
                   COALESCE(SUM(CASE WHEN state = 'reserved' THEN tokens END), 0),
                   COALESCE(SUM(CASE WHEN state = 'reserved' THEN steps END), 0)
                 FROM pool_spend
                 WHERE pool = ?1 AND at >= ?2 AND (state = 'charged' OR lease_until > ?3)",
            )
            .map_err(|e| self.err(e))?;
        let mut spent = stmt
            .query_row(params![pool.name, start, now], |r| {
                let u = |a: i64, b: i64, c: i64| Usage {
                    cost_micros: from_sql(a),
                    tokens: from_sql(b),
                    steps: from_sql(c),
                };
                Ok(Spent {
                    charged: u(r.get(0)?, r.get(1)?, r.get(2)?),
                    reserved: u(r.get(3)?, r.get(4)?, r.get(5)?),
                    runs: 0,
                })
            })
            .map_err(|e| self.err(e))?;
        spent.runs = self
            .tx
            .query_row(
                "SELECT COUNT(*) FROM pool_members WHERE pool = ?1 AND joined_at >= ?2",
                params![pool.name, start],
                |r| r.get::<_, i64>(0),
            )
            .map(from_sql)
            .map_err(|e| self.err(e))?;
        Ok(spent)
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

    /// When the window will have freed `need` of a measure: the oldest charges age out first.
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
        let sql = match m {
            Measure::Runs => {
                "SELECT joined_at, 1 FROM pool_members WHERE pool = ?1 AND joined_at >= ?2 ORDER BY joined_at"
            }
            Measure::Cost => {
                "SELECT at, cost_micros FROM pool_spend WHERE pool = ?1 AND at >= ?2 AND state = 'charged' ORDER BY at"
            }
            Measure::Tokens => {
                "SELECT at, tokens FROM pool_spend WHERE pool = ?1 AND at >= ?2 AND state = 'charged' ORDER BY at"
            }
            Measure::Steps => {
                "SELECT at, steps FROM pool_spend WHERE pool = ?1 AND at >= ?2 AND state = 'charged' ORDER BY at"
            }
        };
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(e))?;
        let mut rows = stmt
            .query(params![pool.name, start])
            .map_err(|e| self.err(e))?;
        let (mut freed, mut last) = (0u64, None);
        while let Some(row) = rows.next().map_err(|e| self.err(e))? {
            let at: i64 = row.get(0).map_err(|e| self.err(e))?;
            freed = freed.saturating_add(from_sql(row.get(1).map_err(|e| self.err(e))?));
            last = pool.window.frees(time(at))?;
            if freed >= need {
                return Ok(last);
            }
        }
        // What is left is held by reservations: they settle or expire within a lease.
        let lease = now + self.ledger.lease;
        Ok(Some(last.map_or(lease, |l| l.max(lease))))
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

    fn insert_spend(
        &self,
        key: &ChargeKey,
        state: &str,
        usage: Usage,
        now: SystemTime,
    ) -> Result<(), LedgerError> {
        let lease_until = ms(now + self.ledger.lease);
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT INTO pool_spend (pool, run, seq, state, at, lease_until, cost_micros, tokens, steps)
                 SELECT pool, run, ?2, ?3, ?4, ?5, ?6, ?7, ?8 FROM pool_members WHERE run = ?1",
            )
            .map_err(|e| self.err(e))?;
        stmt.execute(params![
            key.run.as_str(),
            to_sql(key.seq),
            state,
            ms(now),
            lease_until,
            to_sql(usage.cost_micros),
            to_sql(usage.tokens),
            to_sql(usage.steps)
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
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
                tx.insert_spend(key, "reserved", estimate, now)?;
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
                Some("reserved") => {
                    tx.tx
                        .execute(
                            "UPDATE pool_spend SET state = 'charged', at = ?3, cost_micros = ?4, tokens = ?5, steps = ?6
                             WHERE run = ?1 AND seq = ?2",
                            params![
                                key.run.as_str(),
                                to_sql(key.seq),
                                ms(now),
                                to_sql(actual.cost_micros),
                                to_sql(actual.tokens),
                                to_sql(actual.steps)
                            ],
                        )
                        .map_err(|e| tx.err(e))?;
                }
                Some(_) => {}
                None => tx.insert_spend(key, "charged", actual, now)?,
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
                tx.insert_spend(key, "charged", actual, now)?;
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
