//! `stepguard pools`: each pool of the config in effect, with what is spent of each cap, the
//! runs in it now, and when its window frees what.

use std::time::SystemTime;

use serde::Serialize;
use stepguard_config::PoolConfig;
use stepguard_core::ExitCode;
use stepguard_ledger::{Measure, MeasureStatus, PoolStatus, micros_to_usd};

use crate::args::{Cli, PoolsArgs};
use crate::output;
use crate::session::Session;

/// One pool as `--json` prints it.
#[derive(Serialize)]
struct PoolReport {
    name: String,
    window: String,
    /// Which runs join it by themselves (`all`, `task_type = "review"`, `--pool only`).
    r#match: String,
    /// The files that declare it, highest precedence first (`FILE: pools.NAME`).
    declared_in: Vec<String>,
    /// Runs holding a slot now.
    running: usize,
    max_concurrent_runs: Option<u64>,
    /// When the current window started (RFC 3339); null for a lifetime pool.
    window_start: Option<String>,
    limits: Vec<LimitReport>,
}

/// One capped measure: cost in dollars, the others as counts.
#[derive(Serialize)]
struct LimitReport {
    /// `max_cost_usd`, `max_tokens`, `max_steps` or `max_runs`.
    limit: &'static str,
    spent: f64,
    reserved: f64,
    cap: f64,
    left: f64,
    /// When the window next frees some of what is spent (RFC 3339); null when nothing will.
    frees_at: Option<String>,
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn limit(m: &MeasureStatus) -> LimitReport {
    let unit = |v: u64| match m.measure {
        Measure::Cost => micros_to_usd(v),
        _ => v as f64,
    };
    let used = m.charged.saturating_add(m.reserved);
    LimitReport {
        limit: m.measure.key(),
        spent: unit(m.charged),
        reserved: unit(m.reserved),
        cap: unit(m.cap),
        left: unit(m.cap.saturating_sub(used)),
        frees_at: m.frees_at.map(time),
    }
}

fn report(pool: &PoolConfig, status: &PoolStatus) -> PoolReport {
    PoolReport {
        name: pool.name.clone(),
        window: pool.window.to_string(),
        r#match: pool.matcher.to_string(),
        declared_in: pool
            .origins
            .iter()
            .map(|o| format!("{}: {}", o.file().unwrap_or("?"), o.label()))
            .collect(),
        running: status.running.len(),
        max_concurrent_runs: pool.max_concurrent_runs,
        window_start: status.window_start.map(time),
        limits: status.measures.iter().map(limit).collect(),
    }
}

/// Runs `stepguard pools`: exit 0 (none declared is a note), 2 when the ledger cannot be read.
pub(crate) fn run(cli: &Cli, args: &PoolsArgs) -> anyhow::Result<ExitCode> {
    let session = Session::load(cli)?;
    let pools: Vec<&PoolConfig> = session.config.model.pools.values().collect();
    if pools.is_empty() {
        if args.json {
            output::json(&Vec::<PoolReport>::new())?;
        } else {
            output::note("no pool is declared; add a [pools.NAME] table to a config file");
        }
        return Ok(ExitCode::Success);
    }
    let cwd = std::env::current_dir()?;
    // What a pool has spent is read where it is kept: no fallback to the local ledger here,
    // which would show another ledger's figures.
    let ledger =
        crate::ledger::open(&session.history_db(&cwd)?, &session.ledger_choice(), false)?.ledger;
    let specs: Vec<_> = pools.iter().map(|p| p.spec()).collect();
    let status = ledger.status(&specs, SystemTime::now())?;
    let reports: Vec<PoolReport> = pools
        .iter()
        .zip(&status)
        .map(|(p, s)| report(p, s))
        .collect();
    if args.json {
        output::json(&reports)?;
    } else {
        for r in &reports {
            print(r)?;
        }
    }
    Ok(ExitCode::Success)
}

fn print(r: &PoolReport) -> std::io::Result<()> {
    output::line(format!(
        "{} (window {}, match {})",
        r.name, r.window, r.r#match
    ))?;
    let cap = r
        .max_concurrent_runs
        .map_or_else(|| "no cap".to_owned(), |c| format!("of {c}"));
    output::line(format!("  runs now: {} ({cap})", r.running))?;
    for l in &r.limits {
        let show = |v: f64| {
            if l.limit == "max_cost_usd" {
                format!("${v:.2}")
            } else {
                format!("{v}")
            }
        };
        let reserved = if l.reserved > 0.0 {
            format!(" + {} reserved", show(l.reserved))
        } else {
            String::new()
        };
        let frees = l
            .frees_at
            .as_ref()
            .map_or_else(String::new, |t| format!("; frees from {t}"));
        output::line(format!(
            "  {}: {}{reserved} of {} spent, {} left{frees}",
            l.limit,
            show(l.spent),
            show(l.cap),
            show(l.left)
        ))?;
    }
    output::line(format!("  declared in: {}", r.declared_in.join("; ")))
}
