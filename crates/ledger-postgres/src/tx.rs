//! The ledger's SQL, one transaction at a time: the same semantics as the local ledger's
//! (`stepguard_ledger::sqlite`), on PostgreSQL's types (`TIMESTAMPTZ`, `BIGINT`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use postgres::types::ToSql;
use postgres::{Row, Statement, Transaction};
use stepguard_ledger::{
    Busy, CalendarUnit, ChargeKey, Exhaustion, LedgerError, Measure, MeasureStatus, PoolLimits,
    PoolSpec, PoolStatus, RunKey, Share, Usage, Window,
};

/// Why a transaction failed: the server (maybe a lost connection, maybe a conflict to retry),
/// or the ledger's own verdict.
#[derive(Debug)]
pub(crate) enum Fail {
    Pg(postgres::Error),
    Ledger(LedgerError),
}

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Self {
        Fail::Pg(e)
    }
}

impl From<LedgerError> for Fail {
    fn from(e: LedgerError) -> Self {
        Fail::Ledger(e)
    }
}

/// The statements a connection has prepared, by their text.
pub(crate) type Prepared = HashMap<&'static str, Statement>;

/// One transaction, with the ledger's lease and the connection's prepared statements.
pub(crate) struct Tx<'a> {
    pub(crate) tx: Transaction<'a>,
    pub(crate) prepared: &'a mut Prepared,
    pub(crate) lease: Duration,
}

/// What a pool has spent in its window: charged, held by live reservations, runs started.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Spent {
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

pub(crate) fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The start of a window as a bound (a lifetime window starts at the epoch).
fn window_start(pool: &PoolSpec, now: SystemTime) -> Result<SystemTime, LedgerError> {
    Ok(pool.window.start(now)?.unwrap_or(SystemTime::UNIX_EPOCH))
}

const POOLS_OF: &str = "SELECT pool, max_cost_micros, max_tokens, max_steps, max_runs,
        max_concurrent_runs, window_kind, window_ms, window_tz
    FROM stepguard_pool_members WHERE run = $1 ORDER BY pool";

/// What a pool spent in a window starting at `$2`: the running totals of its charges less those
/// before the window (two index lookups however many charges there are), the live reservations
/// (`$3` is now), and, when `$4`, the runs that joined in the window.
const SPENT: &str = "SELECT
        COALESCE(p.cum_cost, 0) - COALESCE(b.cum_cost, 0),
        COALESCE(p.cum_tokens, 0) - COALESCE(b.cum_tokens, 0),
        COALESCE(p.cum_steps, 0) - COALESCE(b.cum_steps, 0),
        r.cost, r.tokens, r.steps,
        CASE WHEN $4 THEN (SELECT COUNT(*) FROM stepguard_pool_members m
                           WHERE m.pool = n.name AND m.joined_at >= $2) ELSE 0 END
    FROM (SELECT $1::TEXT AS name) AS n
    LEFT JOIN stepguard_pools p ON p.name = n.name
    LEFT JOIN LATERAL (
        SELECT s.cum_cost, s.cum_tokens, s.cum_steps FROM stepguard_pool_spend s
        WHERE s.pool = n.name AND s.state = 'charged' AND s.at < $2
        ORDER BY s.at DESC, s.charge_no DESC LIMIT 1
    ) AS b ON TRUE
    CROSS JOIN LATERAL (
        SELECT COALESCE(SUM(s.cost_micros), 0)::BIGINT AS cost,
               COALESCE(SUM(s.tokens), 0)::BIGINT AS tokens,
               COALESCE(SUM(s.steps), 0)::BIGINT AS steps
        FROM stepguard_pool_spend s
        WHERE s.pool = n.name AND s.state = 'reserved' AND s.lease_until > $3 AND s.at >= $2
    ) AS r";

/// The running totals before a window's start (`$2`), for [`Tx::frees_at`].
const CHARGED_BEFORE: &str = "SELECT cum_cost, cum_tokens, cum_steps FROM stepguard_pool_spend
    WHERE pool = $1 AND state = 'charged' AND at < $2 ORDER BY at DESC, charge_no DESC LIMIT 1";

const RUNNING: &str = "SELECT run FROM stepguard_pool_members
    WHERE pool = $1 AND lease_until > $2 ORDER BY joined_at, run";

const INSERT_RESERVED: &str = "INSERT INTO stepguard_pool_spend
        (pool, run, seq, state, at, lease_until, cost_micros, tokens, steps)
    SELECT pool, run, $2, 'reserved', $3, $4, $5, $6, $7
    FROM stepguard_pool_members WHERE run = $1";

/// Charges usage in each pool of the run: the pool's running totals grow, and the charge row
/// takes the next number and the totals after it. Its time is never before the pool's last
/// charge (transactions that started earlier may get the lock later), so charge order is time
/// order.
const INSERT_CHARGED: &str = "WITH p AS (
        UPDATE stepguard_pools SET charges = charges + 1, cum_cost = cum_cost + $5,
            cum_tokens = cum_tokens + $6, cum_steps = cum_steps + $7,
            last_at = GREATEST(last_at, $3)
        WHERE name IN (SELECT pool FROM stepguard_pool_members WHERE run = $1)
        RETURNING name, charges, cum_cost, cum_tokens, cum_steps, last_at
    )
    INSERT INTO stepguard_pool_spend (pool, run, seq, state, at, lease_until, cost_micros,
        tokens, steps, charge_no, cum_cost, cum_tokens, cum_steps)
    SELECT name, $1, $2, 'charged', last_at, $4, $5, $6, $7, charges, cum_cost, cum_tokens,
        cum_steps
    FROM p";

/// Turns an open reservation into the charge of the actual usage, as [`INSERT_CHARGED`] does.
const SETTLE_RESERVED: &str = "WITH p AS (
        UPDATE stepguard_pools SET charges = charges + 1, cum_cost = cum_cost + $4,
            cum_tokens = cum_tokens + $5, cum_steps = cum_steps + $6,
            last_at = GREATEST(last_at, $3)
        WHERE name IN (SELECT pool FROM stepguard_pool_spend
                       WHERE run = $1 AND seq = $2 AND state = 'reserved')
        RETURNING name, charges, cum_cost, cum_tokens, cum_steps, last_at
    )
    UPDATE stepguard_pool_spend s SET state = 'charged', at = p.last_at, cost_micros = $4,
        tokens = $5, steps = $6, charge_no = p.charges, cum_cost = p.cum_cost,
        cum_tokens = p.cum_tokens, cum_steps = p.cum_steps
    FROM p WHERE s.pool = p.name AND s.run = $1 AND s.seq = $2";

const INSERT_MEMBER: &str = "INSERT INTO stepguard_pool_members (run, pool, max_cost_micros,
        max_tokens, max_steps, max_runs, max_concurrent_runs, window_kind, window_ms, window_tz,
        joined_at, lease_until)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

impl Tx<'_> {
    /// Runs a statement prepared once per connection.
    pub(crate) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Fail> {
        let stmt = match self.prepared.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.tx.prepare(sql)?;
                self.prepared.insert(sql, s.clone());
                s
            }
        };
        Ok(self.tx.query(&stmt, params)?)
    }

    fn execute(&mut self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> Result<(), Fail> {
        self.query(sql, params).map(drop)
    }

    /// The pools a run joined, with the caps it declared.
    pub(crate) fn pools_of(&mut self, run: &RunKey) -> Result<Vec<PoolSpec>, Fail> {
        self.query(POOLS_OF, &[&run.as_str()])?
            .iter()
            .map(spec_row)
            .collect()
    }

    /// Takes the pools' row locks, in name order (so two transactions never wait on each other
    /// in a circle), creating the rows of pools never seen when `create`.
    pub(crate) fn lock_pools(&mut self, names: &[&str], create: bool) -> Result<(), Fail> {
        let mut names: Vec<&str> = names.to_vec();
        names.sort_unstable();
        names.dedup();
        if create {
            self.execute(
                "INSERT INTO stepguard_pools (name) SELECT n FROM unnest($1::TEXT[]) AS n ORDER BY n
                 ON CONFLICT DO NOTHING",
                &[&names],
            )?;
        }
        self.execute(
            "SELECT name FROM stepguard_pools WHERE name = ANY($1) ORDER BY name FOR UPDATE",
            &[&names],
        )
    }

    pub(crate) fn spent(&mut self, pool: &PoolSpec, now: SystemTime) -> Result<Spent, Fail> {
        let start = window_start(pool, now)?;
        let runs = pool.limits.max_runs.is_some();
        let rows = self.query(SPENT, &[&pool.name, &start, &now, &runs])?;
        let Some(r) = rows.first() else {
            return Ok(Spent::default());
        };
        let u = |a: usize| Usage {
            cost_micros: from_sql(r.get(a)),
            tokens: from_sql(r.get(a + 1)),
            steps: from_sql(r.get(a + 2)),
        };
        Ok(Spent {
            charged: u(0),
            reserved: u(3),
            runs: from_sql(r.get(6)),
        })
    }

    pub(crate) fn running(&mut self, pool: &str, now: SystemTime) -> Result<Vec<RunKey>, Fail> {
        let rows = self.query(RUNNING, &[&pool, &now])?;
        Ok(rows.iter().map(|r| RunKey(r.get(0))).collect())
    }

    /// The first capped measure that cannot pay `ask` (when joining, one more run).
    pub(crate) fn exhaustion(
        &mut self,
        pool: &PoolSpec,
        spent: &Spent,
        ask: &Usage,
        join: bool,
        now: SystemTime,
    ) -> Result<Option<Exhaustion>, Fail> {
        for m in Measure::ALL {
            let Some(cap) = pool.limits.cap(m) else {
                continue;
            };
            if m == Measure::Runs && !join {
                continue;
            }
            let asked = if m == Measure::Runs { 1 } else { m.of(ask) };
            let used = spent.of(m);
            if used >= cap || used.saturating_add(asked) > cap {
                let need = used.saturating_add(asked.max(1)) - cap;
                let frees_at = self.frees_at(pool, m, need, now)?;
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
        &mut self,
        pool: &PoolSpec,
        m: Measure,
        need: u64,
        now: SystemTime,
    ) -> Result<Option<SystemTime>, Fail> {
        let Window::Rolling(_) = pool.window else {
            return Ok(pool.window.frees(now)?);
        };
        let start = window_start(pool, now)?;
        let found = match m {
            Measure::Runs => self.nth_join(&pool.name, start, need)?,
            _ => self.charge_reaching(&pool.name, start, m, need)?,
        };
        if let Some(at) = found {
            return Ok(pool.window.frees(at)?);
        }
        // What is left is held by reservations: they settle or expire within a lease.
        let last = self
            .query(
                "SELECT last_at FROM stepguard_pools WHERE name = $1 AND last_at >= $2",
                &[&pool.name, &start],
            )?
            .first()
            .map(|r| r.get::<_, SystemTime>(0));
        let last = last.map(|at| pool.window.frees(at)).transpose()?.flatten();
        let lease = now + self.lease;
        Ok(Some(last.map_or(lease, |l: SystemTime| l.max(lease))))
    }

    /// When the `need`-th run that joined in the window joined.
    fn nth_join(
        &mut self,
        pool: &str,
        start: SystemTime,
        need: u64,
    ) -> Result<Option<SystemTime>, Fail> {
        let rows = self.query(
            "SELECT joined_at FROM stepguard_pool_members
             WHERE pool = $1 AND joined_at >= $2 ORDER BY joined_at OFFSET $3 LIMIT 1",
            &[&pool, &start, &to_sql(need.saturating_sub(1))],
        )?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    /// When the charge was made after which the window's charges of `m` reach `need`.
    fn charge_reaching(
        &mut self,
        pool: &str,
        start: SystemTime,
        m: Measure,
        need: u64,
    ) -> Result<Option<SystemTime>, Fail> {
        let before = self.query(CHARGED_BEFORE, &[&pool, &start])?;
        let column = match m {
            Measure::Cost => 0,
            Measure::Tokens => 1,
            _ => 2,
        };
        let base: i64 = before.first().map_or(0, |r| r.get(column));
        let target = base.saturating_add(to_sql(need));
        let sql = match m {
            Measure::Cost => {
                "SELECT at FROM stepguard_pool_spend WHERE pool = $1 AND state = 'charged'
                 AND at >= $2 AND cum_cost >= $3 ORDER BY at, charge_no LIMIT 1"
            }
            Measure::Tokens => {
                "SELECT at FROM stepguard_pool_spend WHERE pool = $1 AND state = 'charged'
                 AND at >= $2 AND cum_tokens >= $3 ORDER BY at, charge_no LIMIT 1"
            }
            _ => {
                "SELECT at FROM stepguard_pool_spend WHERE pool = $1 AND state = 'charged'
                 AND at >= $2 AND cum_steps >= $3 ORDER BY at, charge_no LIMIT 1"
            }
        };
        let rows = self.query(sql, &[&pool, &start, &target])?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    pub(crate) fn share(&mut self, pool: &PoolSpec, now: SystemTime) -> Result<Share, Fail> {
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

    /// What each pool of the run has left; a run that joined none is a caller's error.
    pub(crate) fn shares(&mut self, run: &RunKey, now: SystemTime) -> Result<Vec<Share>, Fail> {
        let pools = self.pools_of(run)?;
        if pools.is_empty() {
            return Err(LedgerError::NotJoined { run: run.clone() }.into());
        }
        pools.iter().map(|p| self.share(p, now)).collect()
    }

    pub(crate) fn is_member(&mut self, run: &RunKey, pool: &str) -> Result<bool, Fail> {
        let rows = self.query(
            "SELECT 1 FROM stepguard_pool_members WHERE run = $1 AND pool = $2",
            &[&run.as_str(), &pool],
        )?;
        Ok(!rows.is_empty())
    }

    /// The key's state: `reserved` while any pool holds it open, else `charged`, else `None`.
    pub(crate) fn key_known(&mut self, key: &ChargeKey) -> Result<Option<String>, Fail> {
        let rows = self.query(
            "SELECT MAX(state) FROM stepguard_pool_spend WHERE run = $1 AND seq = $2",
            &[&key.run.as_str(), &to_sql(key.seq)],
        )?;
        Ok(rows.first().and_then(|r| r.get(0)))
    }

    /// Holds `usage` for the key in every pool of the run, for a lease.
    pub(crate) fn insert_reserved(
        &mut self,
        key: &ChargeKey,
        usage: Usage,
        now: SystemTime,
    ) -> Result<(), Fail> {
        self.insert_spend(INSERT_RESERVED, key, usage, now)
    }

    /// Charges `usage` for the key in every pool of the run.
    pub(crate) fn insert_charged(
        &mut self,
        key: &ChargeKey,
        usage: Usage,
        now: SystemTime,
    ) -> Result<(), Fail> {
        self.insert_spend(INSERT_CHARGED, key, usage, now)
    }

    /// Runs one of the spend inserts (`INSERT_RESERVED`, `INSERT_CHARGED`): the same row shape,
    /// held for a lease from `now`.
    fn insert_spend(
        &mut self,
        sql: &'static str,
        key: &ChargeKey,
        usage: Usage,
        now: SystemTime,
    ) -> Result<(), Fail> {
        let until = now + self.lease;
        self.execute(
            sql,
            &[
                &key.run.as_str(),
                &to_sql(key.seq),
                &now,
                &until,
                &to_sql(usage.cost_micros),
                &to_sql(usage.tokens),
                &to_sql(usage.steps),
            ],
        )
    }

    /// Turns an open reservation into the charge of the actual usage, at `now`.
    pub(crate) fn settle_reserved(
        &mut self,
        key: &ChargeKey,
        actual: Usage,
        now: SystemTime,
    ) -> Result<(), Fail> {
        self.execute(
            SETTLE_RESERVED,
            &[
                &key.run.as_str(),
                &to_sql(key.seq),
                &now,
                &to_sql(actual.cost_micros),
                &to_sql(actual.tokens),
                &to_sql(actual.steps),
            ],
        )
    }

    pub(crate) fn insert_member(
        &mut self,
        run: &RunKey,
        pool: &PoolSpec,
        now: SystemTime,
    ) -> Result<(), Fail> {
        let (kind, window_ms, tz): (&str, Option<i64>, Option<&str>) = match &pool.window {
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
        let until = now + self.lease;
        self.execute(
            INSERT_MEMBER,
            &[
                &run.as_str(),
                &pool.name,
                &l.max_cost_micros.map(to_sql),
                &l.max_tokens.map(to_sql),
                &l.max_steps.map(to_sql),
                &l.max_runs.map(to_sql),
                &l.max_concurrent_runs.map(to_sql),
                &kind,
                &window_ms,
                &tz,
                &now,
                &until,
            ],
        )
    }

    /// Extends the run's slot and open reservations to `now` + the lease.
    pub(crate) fn renew(&mut self, run: &RunKey, now: SystemTime) -> Result<(), Fail> {
        let until = now + self.lease;
        self.execute(
            "UPDATE stepguard_pool_members SET lease_until = $2 WHERE run = $1 AND left_at IS NULL",
            &[&run.as_str(), &until],
        )?;
        self.execute(
            "UPDATE stepguard_pool_spend SET lease_until = $2 WHERE run = $1 AND state = 'reserved'",
            &[&run.as_str(), &until],
        )
    }

    /// Ends the run's membership: slot freed, open reservations dropped, charges kept.
    pub(crate) fn leave(&mut self, run: &RunKey, now: SystemTime) -> Result<(), Fail> {
        self.execute(
            "UPDATE stepguard_pool_members SET left_at = $2, lease_until = LEAST(lease_until, $2)
             WHERE run = $1 AND left_at IS NULL",
            &[&run.as_str(), &now],
        )?;
        self.execute(
            "DELETE FROM stepguard_pool_spend WHERE run = $1 AND state = 'reserved'",
            &[&run.as_str()],
        )
    }

    /// The first pool whose concurrency cap is full, among `pools`.
    pub(crate) fn first_busy(
        &mut self,
        pools: &[&PoolSpec],
        now: SystemTime,
    ) -> Result<Option<Busy>, Fail> {
        for pool in pools {
            let Some(cap) = pool.limits.max_concurrent_runs else {
                continue;
            };
            let running = self.running(&pool.name, now)?.len() as u64;
            if running >= cap {
                return Ok(Some(Busy {
                    pool: pool.name.clone(),
                    running,
                    cap,
                }));
            }
        }
        Ok(None)
    }

    pub(crate) fn status(&mut self, pool: &PoolSpec, now: SystemTime) -> Result<PoolStatus, Fail> {
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

fn spec_row(r: &Row) -> Result<PoolSpec, Fail> {
    let cap = |i: usize| r.get::<_, Option<i64>>(i).map(from_sql);
    let kind: &str = r.get(6);
    let tz = || {
        r.get::<_, Option<String>>(8)
            .unwrap_or_else(|| "UTC".into())
    };
    let window = match kind {
        "rolling" => Window::Rolling(Duration::from_millis(from_sql(
            r.get::<_, Option<i64>>(7).unwrap_or(0),
        ))),
        "day" => Window::Calendar {
            unit: CalendarUnit::Day,
            tz: tz(),
        },
        "week" => Window::Calendar {
            unit: CalendarUnit::Week,
            tz: tz(),
        },
        _ => Window::Lifetime,
    };
    Ok(PoolSpec {
        name: r.get(0),
        limits: PoolLimits {
            max_cost_micros: cap(1),
            max_tokens: cap(2),
            max_steps: cap(3),
            max_runs: cap(4),
            max_concurrent_runs: cap(5),
        },
        window,
    })
}
