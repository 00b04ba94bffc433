//! History at scale: a generator of large history databases with real record shapes, and the
//! time and peak memory of the commands that read them (`show`, `history --last 20`, `stats`,
//! `history export`), side by side with the equivalent `sqlite3` query when `sqlite3` is there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use stepguard_core::loops::{LoopFound, LoopKind};
use stepguard_core::record::Containment;
use stepguard_core::{FailureSlug, Outcome, RunRecord, RunStats, TokenUsage};
use stepguard_store::Store;

/// A small, seeded generator (xorshift64*): the same database for the same `--runs`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const PROVIDERS: [(&str, &str, &str); 4] = [
    ("codex", "item", "0.64.0"),
    ("claude", "tool_use", "2.0.50"),
    ("gemini", "tool_call", "0.17.1"),
    ("opencode", "tool_call", "1.0.90"),
];

const TASK_TYPES: [Option<&str>; 5] = [
    None,
    Some("review"),
    Some("bugfix"),
    Some("refactor"),
    Some("docs"),
];

const FAILURES: [FailureSlug; 8] = [
    FailureSlug::MaxSteps,
    FailureSlug::MaxSteps,
    FailureSlug::MaxTokens,
    FailureSlug::MaxCost,
    FailureSlug::Timeout,
    FailureSlug::ProviderError,
    FailureSlug::RateLimited,
    FailureSlug::LoopDetected,
];

/// Run `i` of the generated history: ~70% successes, failures with every common slug, a few
/// interrupted runs; starts spread over six months before 2026-11-01, minutes apart.
fn record(rng: &mut Rng, i: u64, runs: u64) -> RunRecord {
    let (provider, unit, version) = *rng.pick(&PROVIDERS);
    let roll = rng.below(100);
    let (outcome, slug) = match roll {
        0..70 => (Outcome::Success, None),
        70..97 => (Outcome::Failed, Some(*rng.pick(&FAILURES))),
        _ => (Outcome::Interrupted, Some(FailureSlug::Interrupted)),
    };
    let steps = 1 + rng.below(60) + if roll < 10 { rng.below(400) } else { 0 };
    let input = 2_000 + rng.below(400_000);
    let output = 200 + rng.below(40_000);
    let mut r = RunRecord::new(provider, outcome);
    r.set_stats(&RunStats {
        num_steps_computed: Some(steps),
        num_steps_reported: (provider == "claude").then_some(steps),
        num_turns_reported: (provider == "claude").then(|| steps.div_ceil(2)),
        slug,
        duration_ms: Some(5_000 + rng.below(1_800_000)),
        tokens: Some(TokenUsage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: Some(input / 2),
            reasoning_output_tokens: (provider == "codex").then_some(output / 3),
        }),
        cost_usd: Some((input as f64 * 1.25 + output as f64 * 10.0) / 1_000_000.0),
        ..RunStats::new(outcome)
    });
    r.source.plugin_version = Some(version.to_owned());
    r.source.plugin_source = Some("built-in".to_owned());
    r.source.unit = Some(unit.to_owned());
    r.source.task_type = rng.pick(&TASK_TYPES).map(str::to_owned);
    r.source.profile = (rng.below(4) == 0).then(|| "ci".to_owned());
    r.step_budget.max_steps = Some(*rng.pick(&[40u32, 80, 120, 200]));
    r.step_budget.max_steps_source = Some(rng.pick(&["flag", "config", "profile"]).to_string());
    r.invocation.command = Some(vec![
        provider.to_owned(),
        "exec".to_owned(),
        "--json".to_owned(),
        format!("fix issue #{}", rng.below(5_000)),
    ]);
    r.invocation.cwd = Some(format!("/home/dev/src/project-{}", rng.below(40)));
    // 1.77e9 s is 2026-02-01; runs go forward a few minutes apart to 2026-11-01.
    let start = 1_769_904_000 + i * (23_587_200 / runs.max(1)) + rng.below(60);
    let at = |s: u64| {
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_secs(s)).to_string()
    };
    r.invocation.started_at = Some(at(start));
    r.invocation.ended_at = Some(at(start + r.invocation.duration_ms.unwrap_or(0) / 1000));
    r.verdict.exit_code = Some(if outcome == Outcome::Success { 0 } else { 3 });
    r.verdict.child_exit_code = Some(0);
    r.supervision.containment = Some(Containment::Cgroup);
    r.supervision.loops = (slug == Some(FailureSlug::LoopDetected)).then(|| {
        vec![LoopFound {
            tool: "shell".to_owned(),
            count: 5,
            kind: LoopKind::Repeat,
            first_step: steps.saturating_sub(5),
        }]
    });
    r
}

/// Writes a history database of `runs` generated runs to `out` (which must not exist), in one
/// transaction.
pub(crate) fn generate(runs: u64, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        bail!(
            "{} exists; give a new file to --out (the generator never adds to a real history)",
            out.display()
        );
    }
    let start = Instant::now();
    let mut store = Store::open(out)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let written = store.insert_records((0..runs).map(|i| record(&mut rng, i, runs)))?;
    let size = std::fs::metadata(out).map_or(0, |m| m.len());
    println!(
        "history-db: {written} runs in {:.1}s, {:.0} MiB at {}",
        start.elapsed().as_secs_f64(),
        size as f64 / 1_048_576.0,
        out.display()
    );
    Ok(())
}

/// Median wall time of `runs` runs of `argv` (stdout to /dev/null), and its peak RSS in KiB as
/// `/usr/bin/time` measures it (exact, from wait4), when that is installed.
fn measure(argv: &[String], runs: usize) -> anyhow::Result<(Duration, Option<u64>)> {
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let status = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("cannot run {}", argv[0]))?;
        times.push(start.elapsed());
        if !status.success() {
            bail!("`{}` failed: {status}", argv.join(" "));
        }
    }
    times.sort();
    let rss = Command::new("/usr/bin/time")
        .args(["-f", "%M"])
        .args(argv)
        .stdout(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            err.lines().last()?.trim().parse().ok()
        });
    Ok((times[times.len() / 2], rss))
}

/// The commands measured (name, arguments), each with its sqlite3 equivalent.
fn cases(show_id: &str) -> Vec<(&'static str, Vec<String>, String)> {
    let steps = "coalesce(json_extract(record, '$.num_steps_computed'), json_extract(record, '$.num_steps_reported'))";
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect();
    vec![
        (
            "show ID",
            args(&["show", show_id]),
            format!("SELECT record FROM runs WHERE id = {show_id}"),
        ),
        (
            "history --last 20",
            args(&["history", "--last", "20"]),
            "SELECT id, record FROM runs ORDER BY id DESC LIMIT 20".to_owned(),
        ),
        (
            "stats",
            args(&["stats"]),
            format!(
                "SELECT provider, task_type, {steps} AS v FROM runs WHERE outcome != 'running' ORDER BY provider, task_type, v"
            ),
        ),
        (
            "history export",
            args(&["history", "export"]),
            "SELECT record FROM runs ORDER BY id".to_owned(),
        ),
    ]
}

/// Times the history commands of `stepguard` on the database `db`, against sqlite3.
pub(crate) fn read(db: &Path, stepguard: &Path, runs: usize) -> anyhow::Result<()> {
    if !db.exists() {
        bail!(
            "no database at {}; make one with `stepguard-bench history-db --runs 1000000 --out FILE`",
            db.display()
        );
    }
    let dbs = db.display().to_string();
    let sqlite3 = Command::new("sqlite3").arg("-version").output().is_ok();
    if !sqlite3 {
        println!("sqlite3 is not installed: no ratio baseline");
    }
    let max_id = Command::new("sqlite3")
        .args([&dbs, "SELECT max(id) FROM runs"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "1".to_owned());
    let show_id = (max_id.parse::<u64>().unwrap_or(2) / 2).to_string();
    println!("| command | stepguard | peak RSS | sqlite3 | peak RSS | ratio |");
    println!("|---|---|---|---|---|---|");
    for (name, args, sql) in cases(&show_id) {
        let mut argv = vec![stepguard.display().to_string(), "--db".into(), dbs.clone()];
        argv.extend(args);
        let (t, rss) = measure(&argv, runs)?;
        let base = if sqlite3 {
            Some(measure(&["sqlite3".into(), dbs.clone(), sql], runs)?)
        } else {
            None
        };
        let mib =
            |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let (bt, brss) = base.map_or((None, None), |(t, r)| (Some(t), r));
        println!(
            "| `{name}` | {:.1} ms | {} | {} | {} | {} |",
            t.as_secs_f64() * 1000.0,
            mib(rss),
            bt.map_or("-".into(), |b| format!(
                "{:.1} ms",
                b.as_secs_f64() * 1000.0
            )),
            mib(brss),
            bt.map_or("-".into(), |b| format!(
                "{:.2}×",
                t.as_secs_f64() / b.as_secs_f64()
            )),
        );
    }
    Ok(())
}
