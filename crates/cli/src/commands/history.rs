//! `stepguard history`, `show` and `stats`: reading the run history.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use stepguard_core::loops::{LoopFound, LoopKind};
use stepguard_core::money::usd;
use stepguard_core::{ExitCode, FailureSlug, LedgerKind, PoolLedger, RecordedSlug, TokenUsage};
use stepguard_store::{Filter, Order, PoolStats, RunRecord, StatsReport, Store};

use crate::args::{Cli, HistoryAction, HistoryArgs, ShowArgs, StatsArgs};
use crate::exit::UsageError;
use crate::{history_location, output, settings};

/// Returns where the history database is for this invocation.
pub(crate) fn db_path(cli: &Cli) -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    let project_dir = if cli.db.is_some() {
        None
    } else {
        settings::load_config(cli.config.as_deref())
            .ok()
            .and_then(|c| c.project_dir())
    };
    let location = history_location::locate(cli.db.as_deref(), project_dir.as_deref(), &cwd)?;
    location.import_legacy();
    Ok(location.path)
}

/// The history database of this invocation, if anything was recorded yet.
enum History {
    /// The database exists.
    Found(Store),
    /// Nothing was recorded yet: the default location has no database.
    Empty(PathBuf),
}

/// Opens the history database without creating it. A missing database at the default location is
/// a first run; one named with `--db` or `STEPGUARD_DB` must exist, since a mistyped path is not.
fn open(cli: &Cli) -> anyhow::Result<History> {
    let path = db_path(cli)?;
    if path.exists() {
        return Ok(History::Found(Store::open(&path)?));
    }
    if cli.db.is_some() {
        return Err(UsageError(format!(
            "no history database at {} (named by --db or STEPGUARD_DB)",
            path.display()
        ))
        .into());
    }
    Ok(History::Empty(path))
}

fn nothing_recorded(path: &Path) -> String {
    format!(
        "no runs recorded yet (no history database at {}; `stepguard run` creates it)",
        path.display()
    )
}

/// Returns the filters of `history` as given on the command line, e.g. `--provider codex --failed`.
fn filters(args: &HistoryArgs) -> Vec<String> {
    let mut given = Vec::new();
    if let Some(n) = args.last {
        given.push(format!("--last {n}"));
    }
    if let Some(p) = &args.provider {
        given.push(format!("--provider {p}"));
    }
    if let Some(t) = &args.task_type {
        given.push(format!("--task-type {t}"));
    }
    if let Some(r) = &args.repo {
        given.push(format!("--repo {r}"));
    }
    if let Some(d) = &args.dir {
        given.push(format!("--dir {}", d.display()));
    }
    if args.failed {
        given.push("--failed".to_owned());
    }
    given
}

fn headline(r: &RunRecord) -> String {
    let scope = match (&r.source.unit, &r.source.task_type) {
        (Some(u), Some(t)) => format!("{}/{u} {t}", r.source.provider),
        (Some(u), None) => format!("{}/{u}", r.source.provider),
        (None, Some(t)) => format!("{} {t}", r.source.provider),
        (None, None) => r.source.provider.clone(),
    };
    let started = r.invocation.started_at.as_deref().unwrap_or("-");
    let when = started.get(..19).unwrap_or(started).replace('T', " ");
    let id = r.id.map_or_else(|| "-".to_owned(), |id| id.to_string());
    let resumes = r
        .chain
        .resumed_from
        .map_or_else(String::new, |from| format!(" (resumes #{from})"));
    format!(
        "#{id} {when} {scope}{resumes}: {}{}",
        r.summary_line(),
        loops_brief(r.supervision.loops.as_deref().unwrap_or_default())
    )
}

/// The chain's lines of `show` (nothing for a run that resumes none): its runs and its totals
/// (steps, tokens as the token budget counts them, cost, time).
pub(crate) fn chain_lines(chain: &[RunRecord]) -> Vec<String> {
    if chain.len() < 2 {
        return Vec::new();
    }
    let ids: Vec<String> = chain
        .iter()
        .map(|r| r.id.map_or_else(|| "#?".to_owned(), |id| format!("#{id}")))
        .collect();
    let steps: u64 = chain
        .iter()
        .filter_map(|r| r.counts.num_steps_computed)
        .sum();
    let tokens: Option<u64> = chain
        .iter()
        .filter_map(|r| r.usage.tokens.as_ref().map(total_tokens))
        .reduce(u64::saturating_add);
    let cost: Option<f64> = chain
        .iter()
        .filter_map(|r| r.usage.cost_usd)
        .reduce(|a, b| a + b);
    let ms: u64 = chain.iter().filter_map(|r| r.invocation.duration_ms).sum();
    let mut totals = format!("{steps} steps");
    if let Some(t) = tokens {
        totals.push_str(&format!(", {t} tokens"));
    }
    if let Some(c) = cost {
        totals.push_str(&format!(", {}", usd(c)));
    }
    totals.push_str(&format!(
        ", {}",
        stepguard_core::stats::format_duration_ms(ms)
    ));
    vec![
        format!("Chain: {} ({} runs)", ids.join(" → "), chain.len()),
        format!("Chain totals: {totals}"),
    ]
}

/// Returns `, loop: TOOL ×N at step S` for each loop found (nothing when none was), the suffix
/// of a run's one-line summary in `history` and `count`.
pub(crate) fn loops_brief(loops: &[LoopFound]) -> String {
    loops
        .iter()
        .map(|l| format!(", loop: {} ×{} at step {}", l.tool, l.count, l.first_step))
        .collect()
}

/// Returns how `show` describes a loop: `shell called 3 times (since step 2)`.
fn loop_detail(l: &LoopFound) -> String {
    match l.kind {
        LoopKind::Repeat => format!(
            "{} called {} times (since step {})",
            l.tool, l.count, l.first_step
        ),
        LoopKind::Cycle { period } => format!(
            "cycle of {period} calls {} repeated {} times (since step {})",
            l.tool, l.count, l.first_step
        ),
        LoopKind::NoProgress => format!(
            "{} failed alike {} times, no progress (since step {})",
            l.tool, l.count, l.first_step
        ),
    }
}

/// The runs `history`'s filters select. `--repo .` is the working directory's repository; a
/// relative `--dir` is taken from the working directory (runs record absolute directories).
fn filter(args: &HistoryArgs) -> anyhow::Result<Filter> {
    let cwd = std::env::current_dir()?;
    let repository = match args.repo.as_deref() {
        Some(".") => Some(crate::repository::of(&cwd).ok_or_else(|| {
            UsageError(format!(
                "--repo .: {} is not in a git repository; name one as recorded (its remote URL \
                 or top-level path)",
                cwd.display()
            ))
        })?),
        other => other.map(str::to_owned),
    };
    let directory = args.dir.as_ref().map(|d| {
        let d = cwd.join(d);
        d.canonicalize().unwrap_or(d).display().to_string()
    });
    Ok(Filter {
        provider: args.provider.clone(),
        task_type: args.task_type.clone(),
        repository,
        directory,
        failed: args.failed,
        last: args.last,
    })
}

/// Runs `stepguard history`.
///
/// No runs (none yet, or none matching the filters) is an answer, not an error: `[]` under
/// `--json`, else a note on stderr; exit 0 either way.
pub(crate) fn history(cli: &Cli, args: &HistoryArgs) -> anyhow::Result<ExitCode> {
    if let Some(HistoryAction::Export { otlp }) = &args.action {
        return export(cli, args, *otlp);
    }
    let records = match open(cli)? {
        History::Found(store) => store.list(&filter(args)?)?,
        History::Empty(path) => {
            if args.json {
                output::json(&Vec::<RunRecord>::new())?;
            } else {
                output::note(nothing_recorded(&path));
            }
            return Ok(ExitCode::Success);
        }
    };
    if args.json {
        output::json(&records)?;
    } else if records.is_empty() {
        let given = filters(args);
        if given.is_empty() {
            output::note("no runs recorded yet");
        } else {
            output::note(format!("no recorded run matches {}", given.join(" ")));
        }
    } else {
        for r in &records {
            output::line(headline(r))?;
        }
    }
    Ok(ExitCode::Success)
}

/// Runs `stepguard history export`: JSON Lines of run records, oldest first, streamed one row at
/// a time; or an OTLP replay, streamed too.
fn export(cli: &Cli, args: &HistoryArgs, otlp: bool) -> anyhow::Result<ExitCode> {
    let filter = filter(args)?;
    let store = match open(cli)? {
        History::Found(store) => Some(store),
        History::Empty(path) => {
            output::note(nothing_recorded(&path));
            None
        }
    };
    if otlp {
        return replay(cli, store.as_ref(), &filter);
    }
    if let Some(store) = &store {
        // Buffered: one write per block of lines, not per line, at a million runs.
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        store.export(&filter, Order::OldestFirst, |line| {
            out.write_all(output::printable(line).as_bytes())?;
            out.write_all(b"\n")
        })??;
        out.flush()?;
    }
    Ok(ExitCode::Success)
}

/// Runs `stepguard history export --otlp`: the runs, oldest first, to the collector, read and
/// sent a batch at a time.
fn replay(cli: &Cli, store: Option<&Store>, filter: &Filter) -> anyhow::Result<ExitCode> {
    let config = crate::settings::load_config(cli.config.as_deref())?;
    let Some(telemetry) = crate::settings::telemetry(&config.model) else {
        return Err(UsageError(
            "history export --otlp: no collector: set OTEL_EXPORTER_OTLP_ENDPOINT (or `[telemetry] endpoint`)"
                .to_owned(),
        )
        .into());
    };
    for w in telemetry.warnings() {
        output::diag("warning", w);
    }
    let mut replay = stepguard_telemetry::Replay::new(&telemetry)?;
    let mut skipped = 0usize;
    let mut pushed = Ok(());
    if let Some(store) = store {
        pushed = store.each(filter, Order::OldestFirst, |record| {
            if !replay.push(&record)? {
                skipped += 1;
            }
            Ok(())
        })?;
    }
    let sent = pushed
        .and_then(|()| replay.finish())
        .map_err(|e| stopped(e, replay.sent()))?;
    output::note(format!(
        "exported {sent} run{} to the collector ({skipped} still running or unfinished skipped)",
        if sent == 1 { "" } else { "s" },
    ));
    Ok(ExitCode::Success)
}

/// The error of a replay the collector stopped part-way, saying how far it got.
fn stopped(e: stepguard_telemetry::TelemetryError, sent: usize) -> anyhow::Error {
    anyhow::Error::new(e).context(format!(
        "history export --otlp stopped: the collector took the spans of the {sent} oldest \
         run{}, not the rest nor the metrics; run it again once the collector is back (the runs \
         it took are then sent again)",
        if sent == 1 { "" } else { "s" }
    ))
}

/// Returns the history database and run `id` in it, or the error that names what is missing.
pub(crate) fn stored_run(cli: &Cli, id: i64) -> anyhow::Result<(Store, RunRecord)> {
    let store = match open(cli)? {
        History::Found(store) => store,
        History::Empty(path) => {
            return Err(UsageError(format!(
                "no run with id {id}: nothing recorded yet (no history database at {})",
                path.display()
            ))
            .into());
        }
    };
    let Some(r) = store.get(id)? else {
        return Err(UsageError(format!(
            "no run with id {id} in {} (see `stepguard history`)",
            store.path()
        ))
        .into());
    };
    Ok((store, r))
}

/// Returns the runs `run` resumes, oldest first, and `run` last (`resumed_from`, followed
/// back; a broken or circular link ends the chain).
pub(crate) fn chain(store: &Store, run: RunRecord) -> anyhow::Result<Vec<RunRecord>> {
    let mut chain = vec![run];
    let mut seen = std::collections::HashSet::new();
    while let Some(from) = chain.last().and_then(|r| r.chain.resumed_from) {
        if !seen.insert(from) {
            break;
        }
        match store.get(from)? {
            Some(r) => chain.push(r),
            None => break,
        }
    }
    chain.reverse();
    Ok(chain)
}

/// Runs `stepguard show`.
pub(crate) fn show(cli: &Cli, args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let (store, r) = stored_run(cli, args.id)?;
    if args.json {
        output::json(&r)?;
        return Ok(ExitCode::Success);
    }
    output::line(headline(&r))?;
    let mut lines = show_lines(&r);
    if r.chain.resumed_from.is_some() {
        lines.extend(chain_lines(&chain(&store, r.clone())?));
    }
    if let Some(session) = &r.chain.session_id {
        lines.push(format!("Session: {session}"));
    }
    for l in lines {
        output::line(format!("  {l}"))?;
    }
    if let Some(report) = &r.gateway.final_report {
        for l in final_report_block(report) {
            output::line(l)?;
        }
    }
    Ok(ExitCode::Success)
}

/// The pools the run joined, and the one that ended it: a refusal at the start, a pool the
/// runs in it spent while it ran, or the budget a pool's share lowered and the run ran out of.
fn pool_line(r: &RunRecord) -> Option<String> {
    let pools = r.spend.pools.as_ref().filter(|p| !p.is_empty());
    let slug = r.verdict.error_type.as_ref().map(|s| s.as_str());
    let source = match slug {
        Some("max_tokens") => r.spend.max_tokens_source.as_deref(),
        Some("max_cost") => r.spend.max_cost_usd_source.as_deref(),
        Some("max_steps") => r.step_budget.max_steps_source.as_deref(),
        _ => None,
    };
    // Other runs spent a pool while it ran: the message names it.
    let message = r.verdict.message.as_deref().unwrap_or_default();
    let spent_by_others = pools.and_then(|p| {
        p.iter()
            .find(|name| message.contains(&format!("pool `{name}` is spent")))
    });
    let ended = match (slug, source.and_then(|s| s.strip_prefix("pool "))) {
        (Some("pool_exhausted" | "pool_busy"), _) => {
            Some("refused at the start by a pool".to_owned())
        }
        (Some(_), _) if spent_by_others.is_some() => Some(format!(
            "ended by pool {} (spent by the runs in it)",
            spent_by_others.map_or("", String::as_str)
        )),
        (_, Some(pool)) => Some(format!(
            "ended by pool {pool} (its share was the run's budget)"
        )),
        _ => None,
    };
    match (pools, ended) {
        (None, None) => None,
        (pools, ended) => Some(format!(
            "Pools: {}{}{}",
            pools.map_or_else(|| "-".to_owned(), |p| p.join(", ")),
            ledger_note(r),
            ended.map_or_else(String::new, |e| format!("; {e}"))
        )),
    }
}

/// Where the run's pools were kept, when not simply the local ledger.
fn ledger_note(r: &RunRecord) -> &'static str {
    match r.spend.ledger {
        Some(PoolLedger { fallback: true, .. }) => {
            " (in the local ledger: the fleet ledger was unreachable at the start)"
        }
        Some(PoolLedger {
            kind: LedgerKind::Fleet,
            ..
        }) => " (fleet ledger)",
        _ => "",
    }
}

/// A value as `show` prints it, `-` when unknown.
fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The lines of `show` under the headline, in order.
fn show_lines(r: &RunRecord) -> Vec<String> {
    let budget = r
        .step_budget
        .max_steps
        .map_or_else(|| "unlimited".to_owned(), |m| m.to_string());
    let mut lines = vec![
        format!("Outcome: {}", r.verdict.outcome),
        format!("Failure: {}", opt(r.verdict.error_type.as_ref())),
    ];
    lines.extend(limit_line(r, &budget));
    for l in r.supervision.loops.iter().flatten() {
        lines.push(format!("Loop: {}", loop_detail(l)));
    }
    lines.extend(budget_lines(r, &budget));
    lines.extend(pool_line(r));
    lines.extend(run_lines(r));
    if let Some(calls) = r.gateway.model_calls {
        lines.push(format!("Model calls: {calls}"));
    }
    lines.extend(r.gateway.notices.iter().flatten().map(notice_line));
    lines.extend(end_lines(r));
    lines.extend(crate::checkpointing::show_lines(r));
    lines
}

/// A staged notice as `show` lists it: the limit and threshold, when, and what the model read.
fn notice_line(n: &stepguard_core::BudgetNotice) -> String {
    format!(
        "Notice: {} {}% at step {} (model call {}): {}",
        n.limit.as_str(),
        (n.threshold * 100.0).round(),
        n.at_step,
        n.model_call,
        output::printable(&n.text)
    )
}

/// The limit the run failed on, against what it spent, for a budget failure.
fn limit_line(r: &RunRecord, budget: &str) -> Option<String> {
    match r.verdict.error_type.as_ref().and_then(RecordedSlug::slug) {
        Some(FailureSlug::MaxTokens) => Some(format!(
            "Token Limit: {} / {}",
            opt(r.usage.tokens.map(|t| total_tokens(&t))),
            opt(r.spend.max_tokens)
        )),
        Some(FailureSlug::MaxCost) => Some(format!(
            "Cost Limit: {} / {}",
            r.usage
                .cost_usd
                .map_or_else(|| "-".into(), |c| format!("${c:.4}")),
            r.spend.max_cost_usd.map_or_else(|| "-".into(), usd)
        )),
        _ if r.is_budget_failure() => Some(format!("Step Limit: {} / {budget}", opt(r.steps()))),
        _ => None,
    }
}

/// The run's budgets and where each came from.
fn budget_lines(r: &RunRecord, budget: &str) -> Vec<String> {
    let mut lines = vec![format!(
        "Budget: {budget} (from {})",
        opt(r.step_budget.max_steps_source.as_ref())
    )];
    if let Some(max) = r.spend.max_tokens {
        lines.push(format!(
            "Token budget: {max} (from {})",
            opt(r.spend.max_tokens_source.as_ref())
        ));
    }
    if let Some(max) = r.spend.max_cost_usd {
        lines.push(format!(
            "Cost budget: {} (from {})",
            usd(max),
            opt(r.spend.max_cost_usd_source.as_ref())
        ));
    }
    lines
}

/// Counts, provider, containment, times, exits and who ended the run.
fn run_lines(r: &RunRecord) -> Vec<String> {
    let (source, invocation, verdict) = (&r.source, &r.invocation, &r.verdict);
    vec![
        format!(
            "Steps: computed {}, reported {}",
            opt(r.counts.num_steps_computed),
            opt(r.counts.num_steps_reported)
        ),
        format!(
            "Turns: reported {}, computed {}",
            opt(r.counts.num_turns_reported),
            opt(r.counts.num_turns_computed)
        ),
        format!(
            "Provider: {} (plugin {}, {}), unit {}",
            source.provider,
            opt(source.plugin_version.as_ref()),
            opt(source.plugin_source.as_ref()),
            opt(source.unit.as_ref())
        ),
        format!("Containment: {}", opt(r.supervision.containment)),
        format!(
            "Task type: {}, profile {}",
            opt(source.task_type.as_ref()),
            opt(source.profile.as_ref())
        ),
        format!("Started: {}", opt(invocation.started_at.as_ref())),
        format!("Ended: {}", opt(invocation.ended_at.as_ref())),
        format!(
            "Duration: {}",
            invocation
                .duration_ms
                .map_or_else(|| "-".into(), stepguard_core::stats::format_duration_ms)
        ),
        format!(
            "Exit code: {} (agent: {})",
            opt(verdict.exit_code),
            opt(verdict.child_exit_code)
        ),
        format!("Terminated by: {}", opt(verdict.terminated_by)),
    ]
}

/// Decisions at the limit, usage, sub-agents, the message, the command and where it ran.
fn end_lines(r: &RunRecord) -> Vec<String> {
    let decisions = &r.supervision.on_limit_decisions;
    let mut lines = vec![
        format!(
            "On-limit decisions: {}",
            if decisions.is_empty() {
                "-".to_owned()
            } else {
                decisions
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        format!(
            "Tokens: {}, cost {}",
            r.usage
                .tokens
                .map_or_else(|| "- in / - out".to_owned(), |t| usage(&t, true)),
            r.usage
                .cost_usd
                .map_or_else(|| "-".into(), |c| format!("${c:.4}"))
        ),
    ];
    for (name, t) in r.sub_agent_tokens.iter().flatten() {
        lines.push(format!(
            "Sub-agent {}: {}",
            output::one_line(name),
            usage(t, false)
        ));
    }
    lines.extend([
        format!("Message: {}", opt(r.verdict.message.as_ref())),
        format!(
            "Command: {}",
            r.invocation
                .command
                .as_deref()
                .unwrap_or_default()
                .join(" ")
        ),
        format!("Working directory: {}", opt(r.invocation.cwd.as_ref())),
    ]);
    lines
}

/// Returns a run's tokens as the token budget counts them: input + output.
fn total_tokens(t: &TokenUsage) -> u64 {
    t.input_tokens.saturating_add(t.output_tokens)
}

/// Returns how `show` prints token usage: `1200 in (800 cached) / 300 out (40 reasoning)`,
/// the details only when known, and `, 1500 total` (what `--max-tokens` counts) when asked.
fn usage(t: &TokenUsage, total: bool) -> String {
    let detail =
        |n: Option<u64>, what: &str| n.map_or_else(String::new, |n| format!(" ({n} {what})"));
    let mut text = format!(
        "{} in{} / {} out{}",
        t.input_tokens,
        detail(t.cached_input_tokens, "cached"),
        t.output_tokens,
        detail(t.reasoning_output_tokens, "reasoning")
    );
    if total {
        text.push_str(&format!(", {} total", total_tokens(t)));
    }
    text
}

/// Returns how `show` prints a run's final report: a heading, then the report indented under
/// it. The text is the model's, so control characters (terminal escapes, lone carriage returns)
/// are shown escaped rather than sent to the terminal; blank lines stay blank.
fn final_report_block(report: &str) -> Vec<String> {
    let text = report.trim_end().trim_start_matches(['\n', '\r']);
    if text.trim().is_empty() {
        return vec!["  Final report: (empty)".to_owned()];
    }
    let mut block = vec!["  Final report:".to_owned()];
    for line in text.lines() {
        let shown = output::printable(line.trim_end());
        block.push(if shown.is_empty() {
            String::new()
        } else {
            format!("    {shown}")
        });
    }
    block
}

/// How the runs told of their budget ended, when any was; the share of them that ended by
/// themselves is the notices' effect.
fn after_notice_line(a: &stepguard_store::AfterNotice) -> Option<String> {
    (a.runs > 0).then(|| {
        format!(
            "  after a budget notice: {} run{}, {} ended by {} ({:.1}%), {} hit the limit",
            a.runs,
            if a.runs == 1 { "" } else { "s" },
            a.successes,
            if a.successes == 1 {
                "itself"
            } else {
                "themselves"
            },
            a.successes as f64 / a.runs as f64 * 100.0,
            a.hit_limit
        )
    })
}

/// Runs `stepguard stats`.
///
/// No runs is an answer, not an error: the report with no groups under `--json`, else a note on
/// stderr; exit 0 either way.
pub(crate) fn stats(cli: &Cli, args: &StatsArgs) -> anyhow::Result<ExitCode> {
    let (report, empty_db) = match open(cli)? {
        History::Found(store) => (store.stats(args.provider.as_deref())?, None),
        History::Empty(path) => (
            StatsReport {
                groups: Vec::new(),
                pools: Vec::new(),
            },
            Some(path),
        ),
    };
    if args.json {
        output::json(&report)?;
        return Ok(ExitCode::Success);
    }
    if report.groups.is_empty() {
        output::note(match (&empty_db, &args.provider) {
            (Some(path), _) => nothing_recorded(path),
            (None, Some(p)) => format!("no finished run recorded for provider {p}"),
            (None, None) => "no finished runs recorded yet".to_owned(),
        });
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
        for (label, spread) in [
            ("steps", &g.steps),
            ("turns", &g.turns),
            ("tokens", &g.tokens),
        ] {
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
        if let Some(c) = &g.cost_usd {
            output::line(format!(
                "  cost per run: mean ${:.4}, p50 ${:.4}, p95 ${:.4}, max ${:.4} ({} run{})",
                c.mean,
                c.p50,
                c.p95,
                c.max,
                c.runs,
                if c.runs == 1 { "" } else { "s" }
            ))?;
        }
        if let Some(line) = after_notice_line(&g.after_notice) {
            output::line(line)?;
        }
        for s in g.suggestions() {
            output::line(format!("  suggestion: {s}"))?;
        }
    }
    for p in &report.pools {
        output::line(pool_stats_line(p))?;
    }
    Ok(ExitCode::Success)
}

/// One pool's line of `stats`: its runs, those it ended (refused at the start, or out of its
/// share), and what they spent.
fn pool_stats_line(p: &PoolStats) -> String {
    format!(
        "pool {}: {} run{}, {} ended by the pool ({} refused at the start), spent {} tokens, ${:.4}",
        p.pool,
        p.runs,
        if p.runs == 1 { "" } else { "s" },
        p.ended_by_pool,
        p.refused_at_start,
        p.tokens,
        p.cost_usd
    )
}

#[cfg(test)]
mod tests {
    use super::{TokenUsage, after_notice_line, final_report_block, notice_line, usage};

    #[test]
    fn notices_are_listed_and_their_effect_counted() {
        let n = stepguard_core::BudgetNotice {
            limit: stepguard_core::NoticeLimit::Steps,
            threshold: 0.8,
            at_step: 8,
            model_call: 9,
            text: "system notice: 2 of 10 steps left.\u{1b}[2J".into(),
        };
        let line = notice_line(&n);
        assert!(
            line.starts_with(
                "Notice: steps 80% at step 8 (model call 9): system notice: 2 of 10 steps left."
            ),
            "{line}"
        );
        assert!(!line.contains('\u{1b}'), "escaped: {line}");
        let a = |runs, successes, hit_limit| stepguard_store::AfterNotice {
            runs,
            successes,
            hit_limit,
        };
        assert_eq!(after_notice_line(&a(0, 0, 0)), None);
        assert_eq!(
            after_notice_line(&a(4, 3, 1)).unwrap(),
            "  after a budget notice: 4 runs, 3 ended by themselves (75.0%), 1 hit the limit"
        );
        assert_eq!(
            after_notice_line(&a(1, 1, 0)).unwrap(),
            "  after a budget notice: 1 run, 1 ended by itself (100.0%), 0 hit the limit"
        );
    }
    use crate::output::one_line;

    #[test]
    fn usage_shows_the_details_it_knows_and_the_total_the_budget_counts() {
        let full = TokenUsage {
            input_tokens: 1200,
            output_tokens: 300,
            cached_input_tokens: Some(800),
            reasoning_output_tokens: Some(40),
        };
        assert_eq!(
            usage(&full, true),
            "1200 in (800 cached) / 300 out (40 reasoning), 1500 total"
        );
        let plain = TokenUsage {
            input_tokens: 7,
            output_tokens: 3,
            ..TokenUsage::default()
        };
        assert_eq!(usage(&plain, false), "7 in / 3 out");
    }

    #[test]
    fn stream_names_are_shown_with_control_characters_escaped() {
        assert_eq!(one_line("task\u{1b}[2J-1"), "task\\u{1b}[2J-1");
        assert_eq!(one_line("agent — 完了"), "agent — 完了");
    }

    #[test]
    fn the_final_report_is_an_indented_block_under_a_heading() {
        assert_eq!(
            final_report_block("Done: the parser.\n\nLeft:\n- the docs\n"),
            [
                "  Final report:",
                "    Done: the parser.",
                "",
                "    Left:",
                "    - the docs",
            ]
        );
        assert_eq!(
            final_report_block("\n\nline one\r\nline two"),
            ["  Final report:", "    line one", "    line two"]
        );
    }

    #[test]
    fn control_characters_in_the_report_are_shown_escaped() {
        assert_eq!(
            final_report_block("\u{1b}[2Jcleared\rover\tok"),
            ["  Final report:", "    \\u{1b}[2Jcleared\\rover\tok"]
        );
    }

    #[test]
    fn an_empty_report_says_so() {
        assert_eq!(final_report_block(""), ["  Final report: (empty)"]);
        assert_eq!(final_report_block(" \n\n"), ["  Final report: (empty)"]);
    }
}
