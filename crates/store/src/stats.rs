//! Figures over stored runs: success rates, failure slugs, the spread of steps, tokens and cost
//! per run, and the budgets that would have covered the successful runs; per pool, the
//! runs that joined it, how many it ended and what they spent ([`PoolStats`]).
//!
//! Every suggestion follows one rule: the budget that would have covered 95% of the group's
//! successful runs is their 95th percentile (nearest rank) of what the budget limits. Steps and
//! tokens (input + output, cached input and reasoning output included, as `--max-tokens`
//! counts them) are suggested as that value, at least 1; a cost is rounded up to the next
//! $0.0001 (the precision stepguard prints costs at), at least $0.0001, so the printed figure
//! still covers the run it came from. Only successful runs that reported the figure count as
//! evidence; with none, there is no suggestion.

use std::collections::BTreeMap;

use rusqlite::Connection;
use rusqlite::types::ValueRef;
use serde::Serialize;

use stepguard_core::{Outcome, RunRecord};

use crate::figure::{int, real, total_tokens};
use crate::pool_stats::{self, PoolStats};

/// Returns the `p`th percentile (0–100) of sorted values by the nearest-rank method: the value at
/// rank ⌈p/100 · n⌉ (1-based). `None` for no values.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    nearest_rank(sorted, p)
}

/// The nearest-rank percentile of [`percentile`], for any sorted values.
fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    sorted.get(rank(sorted.len(), p) - 1).copied()
}

/// The nearest rank (1-based) of the `p`th percentile of `n` values, `n` > 0.
fn rank(n: usize, p: f64) -> usize {
    (((p / 100.0) * n as f64).ceil().max(1.0) as usize).min(n)
}

/// The spread of a count over runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Runs with a value.
    pub runs: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: i64,
    /// 95th percentile (nearest rank).
    pub p95: i64,
    /// Largest value.
    pub max: i64,
}

impl Spread {
    fn of(mut values: Vec<i64>) -> Option<Spread> {
        values.sort_unstable();
        let max = *values.last()?;
        // Summed wide: token counts of many runs may pass `i64::MAX` together.
        let mean = values.iter().map(|&v| i128::from(v)).sum::<i128>() as f64 / values.len() as f64;
        Some(Spread {
            runs: values.len(),
            mean: (mean * 100.0).round() / 100.0,
            p50: percentile(&values, 50.0)?,
            p95: percentile(&values, 95.0)?,
            max,
        })
    }
}

/// The spread of a cost in US dollars over runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostSpread {
    /// Runs with a cost.
    pub runs: usize,
    /// Arithmetic mean, rounded to a millionth of a dollar.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 95th percentile (nearest rank).
    pub p95: f64,
    /// Largest value.
    pub max: f64,
}

impl CostSpread {
    fn of(mut values: Vec<f64>) -> Option<CostSpread> {
        values.retain(|v| v.is_finite());
        values.sort_unstable_by(f64::total_cmp);
        let max = *values.last()?;
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        Some(CostSpread {
            runs: values.len(),
            mean: (mean * 1_000_000.0).round() / 1_000_000.0,
            p50: nearest_rank(&values, 50.0)?,
            p95: nearest_rank(&values, 95.0)?,
            max,
        })
    }
}

/// Rounds a cost up to the next $0.0001, at least $0.0001. A value already on the grid (give or
/// take the float error of a decimal such as 0.042) stays as it is.
fn cost_budget(usd: f64) -> f64 {
    let units = usd * 10_000.0;
    let nearest = units.round();
    let units = if (units - nearest).abs() < 1e-6 {
        nearest
    } else {
        units.ceil()
    };
    units.max(1.0) / 10_000.0
}

/// Returns ` with WHAT` when only some of the successful runs reported the figure.
fn evidence(successes: usize, with: usize, what: &str) -> String {
    if with == successes {
        String::new()
    } else {
        format!(" with {what}")
    }
}

/// How the runs of a group that got a staged notice (the model was told what was left of a
/// limit) ended: by themselves, or at a limit. The effect of the notices, measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AfterNotice {
    /// Finished runs that got at least one notice.
    pub runs: usize,
    /// Of them, the runs that ended by themselves (success).
    pub successes: usize,
    /// Of them, the runs that hit a limit (`max_steps`, `max_tokens`, `max_cost`, `timeout`,
    /// `pool_exhausted`; a run that wrapped up at its budget included).
    pub hit_limit: usize,
}

/// The failure slugs of a run that hit one of its limits.
const LIMIT_SLUGS: [&str; 5] = [
    "max_steps",
    "max_tokens",
    "max_cost",
    "timeout",
    "pool_exhausted",
];

impl AfterNotice {
    fn of<'r>(rows: impl Iterator<Item = &'r RunRecord>) -> AfterNotice {
        let mut a = AfterNotice::default();
        for r in rows.filter(|r| r.gateway.notices.as_ref().is_some_and(|n| !n.is_empty())) {
            a.runs += 1;
            if r.verdict.outcome == Outcome::Success {
                a.successes += 1;
            }
            if r.verdict
                .error_type
                .as_ref()
                .is_some_and(|s| LIMIT_SLUGS.contains(&s.as_str()))
            {
                a.hit_limit += 1;
            }
        }
        a
    }
}

/// Figures for one (provider, task type) group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupStats {
    /// Provider.
    pub provider: String,
    /// Task type (`None` for runs without one).
    pub task_type: Option<String>,
    /// Finished runs (running ones are left out).
    pub runs: usize,
    /// Successful runs.
    pub successes: usize,
    /// successes / runs.
    pub success_rate: f64,
    /// How often each failure slug occurred, as stored.
    pub failure_slugs: BTreeMap<String, usize>,
    /// Steps per run (rows with step metrics).
    pub steps: Option<Spread>,
    /// Legacy turns per run (every row with turn metrics, turn-only rows included).
    pub turns: Option<Spread>,
    /// The budget that would have covered 95% of successful runs (their p95 of steps).
    pub suggested_max_steps: Option<i64>,
    /// Tokens per run, input + output (rows with token usage).
    pub tokens: Option<Spread>,
    /// Cost per run in US dollars (rows with a cost).
    pub cost_usd: Option<CostSpread>,
    /// The `--max-tokens` that would have covered 95% of successful runs (their p95 of tokens).
    pub suggested_max_tokens: Option<i64>,
    /// The `--max-cost-usd` that would have covered 95% of successful runs (their p95 of cost,
    /// rounded up to the next $0.0001).
    pub suggested_max_cost_usd: Option<f64>,
    /// How the runs told of their budget by a staged notice ended.
    pub after_notice: AfterNotice,
    /// Successful runs with token usage: the evidence for `suggested_max_tokens`.
    #[serde(skip)]
    successes_with_tokens: usize,
    /// Successful runs with a cost: the evidence for `suggested_max_cost_usd`.
    #[serde(skip)]
    successes_with_cost: usize,
}

impl GroupStats {
    /// Returns the one-line budget suggestion, when there is evidence for one.
    pub fn suggestion(&self) -> Option<String> {
        let n = self.suggested_max_steps?;
        let successful = self.successes;
        Some(format!(
            "max_steps = {n} would have covered 95% of the {successful} successful run{}",
            if successful == 1 { "" } else { "s" }
        ))
    }

    /// Returns the one-line `--max-tokens` suggestion, when there is evidence for one.
    pub fn token_suggestion(&self) -> Option<String> {
        let n = self.suggested_max_tokens?;
        let with = self.successes_with_tokens;
        Some(format!(
            "max_tokens = {n} would have covered 95% of the {with} successful run{}{}",
            if with == 1 { "" } else { "s" },
            evidence(self.successes, with, "token usage")
        ))
    }

    /// Returns the one-line `--max-cost-usd` suggestion, when there is evidence for one.
    pub fn cost_suggestion(&self) -> Option<String> {
        let usd = self.suggested_max_cost_usd?;
        let with = self.successes_with_cost;
        Some(format!(
            "max_cost_usd = {usd} would have covered 95% of the {with} successful run{}{}",
            if with == 1 { "" } else { "s" },
            evidence(self.successes, with, "a cost")
        ))
    }

    /// Returns every suggestion there is evidence for: steps, tokens, cost, in that order.
    pub fn suggestions(&self) -> Vec<String> {
        [
            self.suggestion(),
            self.token_suggestion(),
            self.cost_suggestion(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Figures for every group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatsReport {
    /// One entry per (provider, task type), sorted.
    pub groups: Vec<GroupStats>,
    /// One entry per pool the runs joined, by name (none when no run joined a pool).
    pub pools: Vec<PoolStats>,
}

/// Computes the figures over `records` (running rows are left out).
pub fn compute_stats(records: &[RunRecord]) -> StatsReport {
    let mut groups: BTreeMap<(String, Option<String>), Vec<&RunRecord>> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| r.verdict.outcome != Outcome::Running)
    {
        groups
            .entry((r.source.provider.clone(), r.source.task_type.clone()))
            .or_default()
            .push(r);
    }
    let groups = groups
        .into_iter()
        .map(|((provider, task_type), rows)| {
            let runs = rows.len();
            let successes = rows
                .iter()
                .filter(|r| r.verdict.outcome == Outcome::Success)
                .count();
            let mut failure_slugs = BTreeMap::new();
            for r in &rows {
                if let Some(s) = &r.verdict.error_type {
                    *failure_slugs.entry(s.as_str().to_owned()).or_default() += 1;
                }
            }
            let successful_steps: Vec<i64> = rows
                .iter()
                .filter(|r| r.verdict.outcome == Outcome::Success)
                .filter_map(|r| r.steps().map(|s| s as i64))
                .collect();
            let suggested_max_steps = Spread::of(successful_steps).map(|s| s.p95.max(1));
            let successful = || {
                rows.iter()
                    .filter(|r| r.verdict.outcome == Outcome::Success)
            };
            let successful_tokens =
                Spread::of(successful().filter_map(|r| total_tokens(r)).collect());
            let successful_cost =
                CostSpread::of(successful().filter_map(|r| r.usage.cost_usd).collect());
            GroupStats {
                provider,
                task_type,
                runs,
                successes,
                success_rate: if runs == 0 {
                    0.0
                } else {
                    (successes as f64 / runs as f64 * 10_000.0).round() / 10_000.0
                },
                failure_slugs,
                steps: Spread::of(
                    rows.iter()
                        .filter_map(|r| r.steps().map(|s| s as i64))
                        .collect(),
                ),
                turns: Spread::of(
                    rows.iter()
                        .filter_map(|r| r.turns().map(|t| t as i64))
                        .collect(),
                ),
                suggested_max_steps,
                tokens: Spread::of(rows.iter().filter_map(|r| total_tokens(r)).collect()),
                cost_usd: CostSpread::of(rows.iter().filter_map(|r| r.usage.cost_usd).collect()),
                suggested_max_tokens: successful_tokens.as_ref().map(|s| s.p95.max(1)),
                suggested_max_cost_usd: successful_cost.as_ref().map(|s| cost_budget(s.p95)),
                after_notice: AfterNotice::of(rows.iter().copied()),
                successes_with_tokens: successful_tokens.map_or(0, |s| s.runs),
                successes_with_cost: successful_cost.map_or(0, |s| s.runs),
            }
        })
        .collect();
    StatsReport {
        groups,
        pools: pool_stats::of_records(records.iter()),
    }
}

/// A figure of a run: a column of the `stats_figures` table [`in_sql`] fills from the records,
/// what [`RunRecord::steps`], [`RunRecord::turns`], `total_tokens` and the cost read.
#[derive(Clone, Copy)]
enum Metric {
    Steps,
    Turns,
    Tokens,
    Cost,
}

impl Metric {
    fn sql(self) -> &'static str {
        match self {
            Metric::Steps => "steps",
            Metric::Turns => "turns",
            Metric::Tokens => "tokens",
            Metric::Cost => "cost",
        }
    }
}

/// The figures of every finished run (of one provider with `?1`), read out of the records
/// once: every later pass sorts these few columns, never parses a record again. A temporary
/// table, so on disk past SQLite's cache, and gone with the read transaction.
pub(crate) fn figures_sql(provider: bool) -> String {
    format!(
        "CREATE TEMP TABLE stats_figures AS SELECT provider, task_type, outcome,
            coalesce(json_extract(record, '$.num_steps_computed'), json_extract(record, '$.num_steps_reported')) AS steps,
            coalesce(json_extract(record, '$.num_turns_reported'), json_extract(record, '$.num_turns_computed')) AS turns,
            json_extract(record, '$.tokens.input_tokens') + json_extract(record, '$.tokens.output_tokens') AS tokens,
            json_extract(record, '$.cost_usd') AS cost,
            json_extract(record, '$.error_type') AS slug,
            coalesce(json_array_length(record, '$.notices'), 0) > 0 AS noticed
         FROM runs WHERE outcome != 'running'{}",
        if provider { " AND provider = ?1" } else { "" }
    )
}

/// The groups in (provider, task type) order, with their run and success counts and how many
/// of their runs (then of their successful runs) have each figure: one pass.
pub(crate) const GROUPS_SQL: &str =
    "SELECT provider, task_type, count(*), total(outcome = 'success'),
        count(steps), count(turns), count(tokens), count(cost),
        count(CASE WHEN outcome = 'success' THEN steps END),
        count(CASE WHEN outcome = 'success' THEN turns END),
        count(CASE WHEN outcome = 'success' THEN tokens END),
        count(CASE WHEN outcome = 'success' THEN cost END),
        count(CASE WHEN noticed THEN 1 END),
        count(CASE WHEN noticed AND outcome = 'success' THEN 1 END),
        count(CASE WHEN noticed AND slug IN
            ('max_steps', 'max_tokens', 'max_cost', 'timeout', 'pool_exhausted') THEN 1 END)
    FROM temp.stats_figures GROUP BY provider, task_type ORDER BY provider, task_type";

/// How often each failure slug occurred in each group.
const SLUGS_SQL: &str = "SELECT provider, task_type, slug, count(*) FROM temp.stats_figures
    WHERE slug IS NOT NULL GROUP BY provider, task_type, slug";

/// Every value of `metric` with its group and whether its run succeeded, sorted by group, then
/// value: one sorted pass gives every group's percentiles of all runs and of successful ones.
pub(crate) fn sorted_sql(metric_sql: &str) -> String {
    format!(
        "SELECT provider, task_type, outcome = 'success', {metric_sql} FROM temp.stats_figures
         WHERE {metric_sql} IS NOT NULL ORDER BY provider, task_type, {metric_sql}"
    )
}

/// What one walk over sorted values keeps: the count, the sum, and the values at the ranks.
struct Ranked<T, S> {
    n: usize,
    sum: S,
    p50: T,
    p95: T,
    max: T,
}

/// Keeps, while a group's sorted values go by, their count, their sum and the values at the
/// nearest ranks of the 50th and 95th percentiles of `n` values (counted beforehand in the
/// same snapshot).
struct Ranker<T, S> {
    ranks: (usize, usize),
    i: usize,
    sum: S,
    p50: Option<T>,
    p95: Option<T>,
    max: Option<T>,
}

impl<T: Copy, S> Ranker<T, S> {
    fn new(n: usize, zero: S) -> Self {
        Ranker {
            ranks: if n == 0 {
                (0, 0)
            } else {
                (rank(n, 50.0), rank(n, 95.0))
            },
            i: 0,
            sum: zero,
            p50: None,
            p95: None,
            max: None,
        }
    }

    fn add(&mut self, v: T, add: fn(&mut S, T)) {
        self.i += 1;
        add(&mut self.sum, v);
        if self.i == self.ranks.0 {
            self.p50 = Some(v);
        }
        if self.i == self.ranks.1 {
            self.p95 = Some(v);
        }
        self.max = Some(v);
    }

    fn done(self) -> Option<Ranked<T, S>> {
        match (self.p50, self.p95, self.max) {
            (Some(p50), Some(p95), Some(max)) => Some(Ranked {
                n: self.i,
                sum: self.sum,
                p50,
                p95,
                max,
            }),
            _ => None,
        }
    }
}

/// A (provider, task type) group.
type GroupKey = (String, Option<String>);

/// Per group, the ranked values of all its runs and of its successful runs.
type RankedPerGroup<T, S> = Vec<(Option<Ranked<T, S>>, Option<Ranked<T, S>>)>;

/// A group as the groups query gives it.
struct GroupCounts {
    key: GroupKey,
    runs: usize,
    successes: usize,
    /// Runs with steps, turns, tokens, cost; then successful runs with each.
    with: [usize; 8],
    after_notice: AfterNotice,
}

/// One sorted pass over the values of `metric` (column `index` of the counts): for each group,
/// the ranked values of all its runs and of its successful ones.
fn ranked<T: Copy, S: Copy>(
    conn: &Connection,
    (metric, index): (Metric, usize),
    groups: &[GroupCounts],
    read: fn(ValueRef<'_>) -> Option<T>,
    (zero, add): (S, fn(&mut S, T)),
) -> rusqlite::Result<RankedPerGroup<T, S>> {
    let fresh = |g: &GroupCounts| {
        (
            Ranker::new(g.with[index], zero),
            Ranker::new(g.with[index + 4], zero),
        )
    };
    let mut rankers: Vec<(Ranker<T, S>, Ranker<T, S>)> = groups.iter().map(fresh).collect();
    let mut stmt = conn.prepare(&sorted_sql(metric.sql()))?;
    let mut rows = stmt.query([])?;
    let mut at = 0;
    while let Some(row) = rows.next()? {
        let provider = row.get_ref(0)?.as_str()?;
        let task_type = row.get_ref(1)?.as_str_or_null()?;
        // Both queries order groups alike: the row's group is this one or a later one.
        while groups
            .get(at)
            .is_some_and(|g| (g.key.0.as_str(), g.key.1.as_deref()) != (provider, task_type))
        {
            at += 1;
        }
        let (Some((all, ok)), Some(v)) = (rankers.get_mut(at), read(row.get_ref(3)?)) else {
            continue;
        };
        all.add(v, add);
        if row.get::<_, bool>(2)? {
            ok.add(v, add);
        }
    }
    Ok(rankers
        .into_iter()
        .map(|(all, ok)| (all.done(), ok.done()))
        .collect())
}

fn spread(r: Option<&Ranked<i64, i128>>) -> Option<Spread> {
    r.map(|r| {
        let mean = r.sum as f64 / r.n as f64;
        Spread {
            runs: r.n,
            mean: (mean * 100.0).round() / 100.0,
            p50: r.p50,
            p95: r.p95,
            max: r.max,
        }
    })
}

fn cost_spread(r: Option<&Ranked<f64, f64>>) -> Option<CostSpread> {
    r.map(|r| {
        let mean = r.sum / r.n as f64;
        CostSpread {
            runs: r.n,
            mean: (mean * 1_000_000.0).round() / 1_000_000.0,
            p50: r.p50,
            p95: r.p95,
            max: r.max,
        }
    })
}

/// The groups with their counts, in (provider, task type) order.
fn group_counts(conn: &Connection) -> rusqlite::Result<Vec<GroupCounts>> {
    let mut stmt = conn.prepare(GROUPS_SQL)?;
    let count = |r: &rusqlite::Row<'_>, i: usize| {
        r.get::<_, i64>(i).map(|n| usize::try_from(n).unwrap_or(0))
    };
    stmt.query_map([], |r| {
        let mut with = [0usize; 8];
        for (i, slot) in with.iter_mut().enumerate() {
            *slot = count(r, 4 + i)?;
        }
        Ok(GroupCounts {
            key: (r.get(0)?, r.get(1)?),
            runs: count(r, 2)?,
            successes: r.get::<_, f64>(3)? as usize,
            with,
            after_notice: AfterNotice {
                runs: count(r, 12)?,
                successes: count(r, 13)?,
                hit_limit: count(r, 14)?,
            },
        })
    })?
    .collect()
}

/// How often each failure slug occurred, per group.
fn slugs(conn: &Connection) -> rusqlite::Result<BTreeMap<GroupKey, BTreeMap<String, usize>>> {
    let mut stmt = conn.prepare(SLUGS_SQL)?;
    let mut rows = stmt.query([])?;
    let mut slugs: BTreeMap<_, BTreeMap<String, usize>> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let key = (r.get(0)?, r.get(1)?);
        let n = usize::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
        slugs.entry(key).or_default().insert(r.get(2)?, n);
    }
    Ok(slugs)
}

/// The figures of [`compute_stats`], computed in the database in one read snapshot: the records
/// are read once into a narrow table of figures, then one pass counts the groups, one counts
/// the slugs, and one sorted pass per figure gives every group's percentiles. Memory holds the
/// groups' counts and one value at a time, whatever the number of runs.
pub(crate) fn in_sql(conn: &Connection, provider: Option<&str>) -> rusqlite::Result<StatsReport> {
    // Rolled back when done: the temporary table goes with it.
    let snapshot = conn.unchecked_transaction()?;
    match provider {
        Some(p) => snapshot.execute(&figures_sql(true), [p])?,
        None => snapshot.execute(&figures_sql(false), [])?,
    };
    let counts = group_counts(&snapshot)?;
    let mut slugs = slugs(&snapshot)?;
    let add_int: fn(&mut i128, i64) = |s, v| *s += i128::from(v);
    let add_real: fn(&mut f64, f64) = |s, v| *s += v;
    let steps = ranked(&snapshot, (Metric::Steps, 0), &counts, int, (0, add_int))?;
    let turns = ranked(&snapshot, (Metric::Turns, 1), &counts, int, (0, add_int))?;
    let tokens = ranked(&snapshot, (Metric::Tokens, 2), &counts, int, (0, add_int))?;
    let cost = ranked(&snapshot, (Metric::Cost, 3), &counts, real, (0.0, add_real))?;
    let groups = counts
        .into_iter()
        .zip(steps.iter().zip(&turns).zip(tokens.iter().zip(&cost)))
        .map(|(g, ((steps, turns), (tokens, cost)))| {
            let ok_tokens = spread(tokens.1.as_ref());
            let ok_cost = cost_spread(cost.1.as_ref());
            GroupStats {
                failure_slugs: slugs.remove(&g.key).unwrap_or_default(),
                steps: spread(steps.0.as_ref()),
                turns: spread(turns.0.as_ref()),
                tokens: spread(tokens.0.as_ref()),
                cost_usd: cost_spread(cost.0.as_ref()),
                suggested_max_steps: spread(steps.1.as_ref()).map(|s| s.p95.max(1)),
                suggested_max_tokens: ok_tokens.as_ref().map(|s| s.p95.max(1)),
                suggested_max_cost_usd: ok_cost.as_ref().map(|s| cost_budget(s.p95)),
                successes_with_tokens: ok_tokens.map_or(0, |s| s.runs),
                successes_with_cost: ok_cost.map_or(0, |s| s.runs),
                after_notice: g.after_notice,
                provider: g.key.0,
                task_type: g.key.1,
                success_rate: if g.runs == 0 {
                    0.0
                } else {
                    (g.successes as f64 / g.runs as f64 * 10_000.0).round() / 10_000.0
                },
                runs: g.runs,
                successes: g.successes,
            }
        })
        .collect();
    let pools = pool_stats::in_sql(&snapshot, provider)?;
    Ok(StatsReport { groups, pools })
}
