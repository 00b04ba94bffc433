//! `stepguard history`, `show` and `stats`: reading the run history.

use std::path::PathBuf;

use stepguard_core::ExitCode;
use stepguard_store::{Filter, RunRecord, Store, compute_stats};

use crate::args::{Cli, HistoryArgs, ShowArgs, StatsArgs};
use crate::exit::UsageError;
use crate::{output, settings};

/// Returns where the history database is for this invocation.
pub fn db_path(cli: &Cli) -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    let project_dir = if cli.db.is_some() {
        None
    } else {
        settings::load_config(cli.config.as_deref())
            .ok()
            .and_then(|c| c.project_dir())
    };
    Ok(stepguard_store::default_location(
        cli.db.as_deref(),
        project_dir.as_deref(),
        &cwd,
    ))
}

fn open(cli: &Cli) -> anyhow::Result<Store> {
    let path = db_path(cli)?;
    if !path.exists() {
        return Err(UsageError(format!(
            "no history database at {} (nothing recorded yet; see --db)",
            path.display()
        ))
        .into());
    }
    Ok(Store::open(&path)?)
}

fn headline(r: &RunRecord) -> String {
    let scope = match (&r.unit, &r.task_type) {
        (Some(u), Some(t)) => format!("{}/{u} {t}", r.provider),
        (Some(u), None) => format!("{}/{u}", r.provider),
        (None, Some(t)) => format!("{} {t}", r.provider),
        (None, None) => r.provider.clone(),
    };
    let started = r.started_at.as_deref().unwrap_or("-");
    let when = started.get(..19).unwrap_or(started).replace('T', " ");
    let id = r.id.map_or_else(|| "-".to_owned(), |id| id.to_string());
    format!("#{id} {when} {scope}: {}", r.summary_line())
}

/// Runs `stepguard history`.
pub fn history(cli: &Cli, args: &HistoryArgs) -> anyhow::Result<ExitCode> {
    let store = open(cli)?;
    let records = store.list(&Filter {
        provider: args.provider.clone(),
        task_type: args.task_type.clone(),
        failed: args.failed,
        last: args.last,
    })?;
    if args.json {
        output::json(&records)?;
    } else {
        for r in &records {
            output::line(headline(r))?;
        }
    }
    Ok(ExitCode::Success)
}

/// Runs `stepguard show`.
pub fn show(cli: &Cli, args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let store = open(cli)?;
    let Some(r) = store.get(args.id)? else {
        return Err(UsageError(format!("no run #{} in {}", args.id, store.path())).into());
    };
    if args.json {
        output::json(&r)?;
        return Ok(ExitCode::Success);
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    fn num<T: ToString>(v: Option<T>) -> String {
        v.map_or_else(|| "-".into(), |v| v.to_string())
    }
    output::line(headline(&r))?;
    let budget = r
        .max_steps
        .map_or_else(|| "unlimited".to_owned(), |m| m.to_string());
    let mut lines = vec![
        format!("Outcome: {}", r.outcome),
        format!("Failure: {}", opt(&r.error_type)),
    ];
    if r.is_budget_failure() {
        lines.push(format!("Step Limit: {} / {budget}", num(r.steps())));
    }
    lines.extend([
        format!("Budget: {budget} (from {})", opt(&r.max_steps_source)),
        format!(
            "Steps: computed {}, reported {}",
            num(r.num_steps_computed),
            num(r.num_steps_reported)
        ),
        format!(
            "Turns: reported {}, computed {}",
            num(r.num_turns_reported),
            num(r.num_turns_computed)
        ),
        format!(
            "Provider: {} (plugin {}, {}), unit {}",
            r.provider,
            opt(&r.plugin_version),
            opt(&r.plugin_source),
            opt(&r.unit)
        ),
        format!("Containment: {}", opt(&r.containment)),
        format!(
            "Task type: {}, profile {}",
            opt(&r.task_type),
            opt(&r.profile)
        ),
        format!("Started: {}", opt(&r.started_at)),
        format!("Ended: {}", opt(&r.ended_at)),
        format!(
            "Duration: {}",
            r.duration_ms
                .map_or_else(|| "-".into(), stepguard_core::stats::format_duration_ms)
        ),
        format!(
            "Exit code: {} (agent: {})",
            num(r.exit_code),
            num(r.child_exit_code)
        ),
        format!("Terminated by: {}", opt(&r.terminated_by)),
        format!(
            "On-limit decisions: {}",
            if r.on_limit_decisions.is_empty() {
                "-".to_owned()
            } else {
                r.on_limit_decisions.join(", ")
            }
        ),
        format!(
            "Tokens: {} in / {} out, cost {}",
            num(r.tokens.map(|t| t.input_tokens)),
            num(r.tokens.map(|t| t.output_tokens)),
            r.cost_usd
                .map_or_else(|| "-".into(), |c| format!("${c:.4}"))
        ),
        format!("Message: {}", opt(&r.message)),
        format!(
            "Command: {}",
            r.command.as_deref().unwrap_or_default().join(" ")
        ),
        format!("Working directory: {}", opt(&r.cwd)),
    ]);
    for l in lines {
        output::line(format!("  {l}"))?;
    }
    Ok(ExitCode::Success)
}

/// Runs `stepguard stats`.
pub fn stats(cli: &Cli, args: &StatsArgs) -> anyhow::Result<ExitCode> {
    let store = open(cli)?;
    let records = store.list(&Filter {
        provider: args.provider.clone(),
        ..Filter::default()
    })?;
    let report = compute_stats(&records);
    if args.json {
        output::json(&report)?;
        return Ok(ExitCode::Success);
    }
    if report.groups.is_empty() {
        output::line("no finished runs recorded")?;
    }
    for g in &report.groups {
        output::line(format!(
            "{} / {}: {} run{}, {:.1}% success",
            g.provider,
            g.task_type.as_deref().unwrap_or("(no task type)"),
            g.runs,
            if g.runs == 1 { "" } else { "s" },
            g.success_rate * 100.0
        ))?;
        if !g.failure_slugs.is_empty() {
            let slugs: Vec<String> = g
                .failure_slugs
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            output::line(format!("  failures: {}", slugs.join(", ")))?;
        }
        for (label, spread) in [("steps", &g.steps), ("turns", &g.turns)] {
            if let Some(s) = spread {
                output::line(format!(
                    "  {label} per run: mean {:.1}, p50 {}, p95 {}, max {} ({} run{})",
                    s.mean,
                    s.p50,
                    s.p95,
                    s.max,
                    s.runs,
                    if s.runs == 1 { "" } else { "s" }
                ))?;
            }
        }
        if let Some(s) = g.suggestion() {
            output::line(format!("  suggestion: {s}"))?;
        }
    }
    Ok(ExitCode::Success)
}
