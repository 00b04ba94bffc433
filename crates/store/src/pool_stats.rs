//! Figures per pool (a budget shared by many runs): the runs that joined it, how many it ended,
//! and what they spent, from the records' `pools` field.
//!
//! A run was **ended by a pool** when its record says so:
//! * refused at the start: slug `pool_exhausted` or `pool_busy`, with the message naming the
//!   pool (`` pool `NAME` is spent`` / `` is full``), as the refusal writes it. A refused run
//!   joined nothing, so its `pools` is null: it counts for the pool its message names;
//! * stopped (or wrapped up) during the run: slug `max_steps`, `max_tokens` or `max_cost` with
//!   that budget's source `pool NAME` (the pool's share was the budget it ran out of), or with
//!   a message saying `` pool `NAME` is spent `` (other runs spent it while the run went on, and
//!   its live keeper stopped or wrapped it up), as `show` reads it.

use std::collections::BTreeMap;

use rusqlite::Connection;
use serde::Serialize;

use stepguard_core::{Outcome, RunRecord};

use crate::figure::{int, real, total_tokens};

/// Figures for one pool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolStats {
    /// The pool's name.
    pub pool: String,
    /// Finished runs that joined it (or were refused by it).
    pub runs: usize,
    /// Runs the pool ended: refused at the start, or out of its share during the run.
    pub ended_by_pool: usize,
    /// Of those, the runs it refused at the start (`pool_exhausted`, `pool_busy`).
    pub refused_at_start: usize,
    /// Tokens its runs spent, input + output (as `--max-tokens` counts them), summed.
    pub tokens: u64,
    /// Dollars its runs spent, summed (to the micro-dollar).
    pub cost_usd: f64,
}

/// What one run says about one of its pools.
pub(crate) struct PoolRun<'a> {
    pub(crate) slug: Option<&'a str>,
    pub(crate) message: Option<&'a str>,
    pub(crate) steps_source: Option<&'a str>,
    pub(crate) tokens_source: Option<&'a str>,
    pub(crate) cost_source: Option<&'a str>,
    pub(crate) tokens: Option<i64>,
    pub(crate) cost_usd: Option<f64>,
}

/// How a pool ended a run, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Refused,
    OutOfShare,
}

impl PoolRun<'_> {
    /// The pool a refusal at the start names (`` pool `NAME` is … ``).
    fn refused_by(&self) -> Option<&str> {
        if !matches!(self.slug, Some("pool_exhausted" | "pool_busy")) {
            return None;
        }
        let rest = self.message?.split_once("pool `")?.1;
        rest.split_once("` ").map(|(name, _)| name)
    }

    /// The pools the run counts for: those it joined, and the one that refused it.
    fn pools<'p>(&'p self, joined: &'p [String]) -> Vec<&'p str> {
        let mut pools: Vec<&str> = joined.iter().map(String::as_str).collect();
        if let Some(name) = self.refused_by().filter(|n| !pools.contains(n)) {
            pools.push(name);
        }
        pools
    }

    /// Whether other runs spent `pool` while this one ran, ending it (its message says so, as
    /// the run's live keeper writes it and `show` reads it).
    fn spent_by_others(&self, pool: &str) -> bool {
        self.message
            .is_some_and(|m| m.contains(&format!("pool `{pool}` is spent")))
    }

    fn ending(&self, pool: &str) -> Option<Ending> {
        let named =
            |source: Option<&str>| source.and_then(|s| s.strip_prefix("pool ")) == Some(pool);
        match self.slug? {
            "pool_exhausted" | "pool_busy" => {
                (self.refused_by() == Some(pool)).then_some(Ending::Refused)
            }
            "max_steps" => (named(self.steps_source) || self.spent_by_others(pool))
                .then_some(Ending::OutOfShare),
            "max_tokens" => (named(self.tokens_source) || self.spent_by_others(pool))
                .then_some(Ending::OutOfShare),
            "max_cost" => (named(self.cost_source) || self.spent_by_others(pool))
                .then_some(Ending::OutOfShare),
            _ => None,
        }
    }
}

/// Pools' figures as runs are added, in any order.
#[derive(Default)]
pub(crate) struct PoolTally {
    pools: BTreeMap<String, (PoolStats, f64)>,
}

impl PoolTally {
    pub(crate) fn add(&mut self, pool: &str, run: &PoolRun<'_>) {
        let (s, cost) = self.pools.entry(pool.to_owned()).or_insert_with(|| {
            (
                PoolStats {
                    pool: pool.to_owned(),
                    runs: 0,
                    ended_by_pool: 0,
                    refused_at_start: 0,
                    tokens: 0,
                    cost_usd: 0.0,
                },
                0.0,
            )
        });
        s.runs += 1;
        match run.ending(pool) {
            Some(Ending::Refused) => {
                s.ended_by_pool += 1;
                s.refused_at_start += 1;
            }
            Some(Ending::OutOfShare) => s.ended_by_pool += 1,
            None => {}
        }
        let tokens = run.tokens.map_or(0, |t| u64::try_from(t).unwrap_or(0));
        s.tokens = s.tokens.saturating_add(tokens);
        *cost += run.cost_usd.unwrap_or(0.0);
    }

    /// The pools by name.
    pub(crate) fn done(self) -> Vec<PoolStats> {
        self.pools
            .into_values()
            .map(|(mut s, cost)| {
                s.cost_usd = (cost * 1e6).round() / 1e6;
                s
            })
            .collect()
    }
}

/// The pools' figures of finished records, in memory.
pub(crate) fn of_records<'a>(records: impl Iterator<Item = &'a RunRecord>) -> Vec<PoolStats> {
    let mut tally = PoolTally::default();
    for r in records.filter(|r| r.verdict.outcome != Outcome::Running) {
        let run = PoolRun {
            slug: r.verdict.error_type.as_ref().map(|s| s.as_str()),
            message: r.verdict.message.as_deref(),
            steps_source: r.step_budget.max_steps_source.as_deref(),
            tokens_source: r.spend.max_tokens_source.as_deref(),
            cost_source: r.spend.max_cost_usd_source.as_deref(),
            tokens: total_tokens(r),
            cost_usd: r.usage.cost_usd,
        };
        for pool in run.pools(r.spend.pools.as_deref().unwrap_or_default()) {
            tally.add(pool, &run);
        }
    }
    tally.done()
}

/// The pools' figures in the database: one pass over the finished runs that joined a pool (the
/// records' `pools` array) or were refused by one, holding one row at a time.
pub(crate) fn in_sql(
    conn: &Connection,
    provider: Option<&str>,
) -> rusqlite::Result<Vec<PoolStats>> {
    let mut stmt = conn.prepare(
        "SELECT json_extract(r.record, '$.pools'),
                json_extract(r.record, '$.error_type'), json_extract(r.record, '$.message'),
                json_extract(r.record, '$.max_steps_source'),
                json_extract(r.record, '$.max_tokens_source'),
                json_extract(r.record, '$.max_cost_usd_source'),
                json_extract(r.record, '$.tokens.input_tokens')
                    + json_extract(r.record, '$.tokens.output_tokens'),
                json_extract(r.record, '$.cost_usd')
         FROM runs AS r
         WHERE r.outcome != 'running' AND (?1 IS NULL OR r.provider = ?1)
           AND (json_array_length(r.record, '$.pools') > 0
                OR json_extract(r.record, '$.error_type') IN ('pool_exhausted', 'pool_busy'))",
    )?;
    let mut rows = stmt.query([provider])?;
    let mut tally = PoolTally::default();
    while let Some(row) = rows.next()? {
        let joined: Vec<String> = row
            .get::<_, Option<String>>(0)?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        let (slug, message): (Option<String>, Option<String>) = (row.get(1)?, row.get(2)?);
        let sources: [Option<String>; 3] = [row.get(3)?, row.get(4)?, row.get(5)?];
        let run = PoolRun {
            slug: slug.as_deref(),
            message: message.as_deref(),
            steps_source: sources[0].as_deref(),
            tokens_source: sources[1].as_deref(),
            cost_source: sources[2].as_deref(),
            tokens: int(row.get_ref(6)?),
            cost_usd: real(row.get_ref(7)?),
        };
        for pool in run.pools(&joined) {
            tally.add(pool, &run);
        }
    }
    Ok(tally.done())
}
