//! Figures over stored runs: success rates, failure slugs, and the spread of steps per run.

use std::collections::BTreeMap;

use serde::Serialize;

use stepguard_core::{Outcome, RunRecord};

/// Returns the `p`th percentile (0–100) of sorted values by the nearest-rank method: the value at
/// rank ⌈p/100 · n⌉ (1-based). `None` for no values.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
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
        let mean = values.iter().sum::<i64>() as f64 / values.len() as f64;
        Some(Spread {
            runs: values.len(),
            mean: (mean * 100.0).round() / 100.0,
            p50: percentile(&values, 50.0)?,
            p95: percentile(&values, 95.0)?,
            max,
        })
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
}

/// Figures for every group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatsReport {
    /// One entry per (provider, task type), sorted.
    pub groups: Vec<GroupStats>,
}

/// Computes the figures over `records` (running rows are left out).
pub fn compute_stats(records: &[RunRecord]) -> StatsReport {
    let mut groups: BTreeMap<(String, Option<String>), Vec<&RunRecord>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome != Outcome::Running) {
        groups
            .entry((r.provider.clone(), r.task_type.clone()))
            .or_default()
            .push(r);
    }
    let groups = groups
        .into_iter()
        .map(|((provider, task_type), rows)| {
            let runs = rows.len();
            let successes = rows
                .iter()
                .filter(|r| r.outcome == Outcome::Success)
                .count();
            let mut failure_slugs = BTreeMap::new();
            for r in &rows {
                if let Some(s) = &r.error_type {
                    *failure_slugs.entry(s.clone()).or_default() += 1;
                }
            }
            let successful_steps: Vec<i64> = rows
                .iter()
                .filter(|r| r.outcome == Outcome::Success)
                .filter_map(|r| r.steps().map(|s| s as i64))
                .collect();
            let suggested_max_steps = Spread::of(successful_steps).map(|s| s.p95.max(1));
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
            }
        })
        .collect();
    StatsReport { groups }
}
