//! Benchmarks of stepguard, run by hand (never in tests): `cargo run --release -p stepguard-bench -- --help`.
//!
//! * `corpus`: a realistic corpus of agent streams per provider (ids unique per stream as the
//!   CLIs print them, seeded, its step count known by construction), and `count-corpus`:
//!   `stepguard count` on it, checked against that count, side by side with `wc -l` and jq;
//! * `count`: `stepguard count` throughput on a ≥ 1 GiB corpus built from the Codex fixtures,
//!   side by side with `jq -c 'select(.type=="item.completed")' | wc -l` and `wc -l`, with peak
//!   memory;
//! * `boundary`: per-line cost of a counter called directly, through the plugin interface
//!   (built-in), and through a dynamically loaded plugin library;
//! * `contain`: breach → no process of the run left, for an agent with 200 descendants that
//!   ignore SIGTERM, under `--containment cgroup` and `--containment process-walk`;
//! * `gateway`: the model gateway's added latency to first byte on loopback (p50/p99, goal p99
//!   under 1 ms added), for a ~20 KB streamed Anthropic main request sent directly to an upstream
//!   and through a gateway in front of it, alternately, on keep-alive connections;
//! * `prices`: the first decode of genai-prices' bundled data, and the time to price one model
//!   call (p50/p99) for the pinned CLIs' default models and an unpriced one.
//! * `loops`: precision and recall of three loop rules (identical calls, Gemini CLI's five in a
//!   row, by progress) on the labelled corpus in `tests/fixtures/loops/`, and of the rule of
//!   progress over other limits and windows.
//! * `history-db`: a history database of generated runs with real record shapes, and
//!   `history`: `show`, `history --last 20`, `stats` and `history export` on it (wall time,
//!   peak memory), against the equivalent sqlite3 query.
//! * `ledger`: a pool's cost to a run: reserve + settle of one model call (p50/p99), alone and
//!   with concurrent writers, and runs admitted per second, on the local ledger.
//! * `startup`: what a run costs before and around its agent: `stepguard run -p codex -- true`
//!   against `true` alone, wall and CPU (every process started) per run.
//! * `checkpoint`: stop-to-exit time of a run with `--checkpoint git` on a 10,000-file
//!   repository, against the same run with `--checkpoint none`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use stepguard_plugin_api::{CounterRequest, ProviderPlugin};

mod checkpoint;
mod corpus;
mod gateway;
mod history;
mod ledger;
mod ledger_pg;
mod loops;
mod prices;
mod startup;

#[derive(Parser)]
#[command(about = "stepguard benchmarks")]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Writes a realistic corpus of agent streams (many streams one after another, seeded)
    /// and prints the steps it holds by construction.
    Corpus {
        /// The provider whose streams to write.
        #[arg(short, long, value_enum)]
        provider: corpus::Provider,
        /// At least this much (whole streams): e.g. 512MiB, 1GiB.
        #[arg(long, default_value = "512MiB", value_parser = corpus::parse_size)]
        size: u64,
        /// The seed: the same seed writes the same bytes.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// `stepguard count` on a generated corpus per provider, checked against the steps it was
    /// built with, against `wc -l` and the jq one-liner, with peak memory.
    CountCorpus {
        /// Providers to measure (default: all four; opencode needs its plugin built next to
        /// the stepguard binary).
        #[arg(short, long, value_enum)]
        provider: Vec<corpus::Provider>,
        /// Corpus size per provider.
        #[arg(long, default_value = "512MiB", value_parser = corpus::parse_size)]
        size: u64,
        /// The corpus seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Timed runs of stepguard and wc (the median is reported; jq runs once).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
        /// Where the corpora are written (about `--size` each).
        #[arg(long, default_value = "target/bench")]
        dir: PathBuf,
        /// Skip jq.
        #[arg(long)]
        no_jq: bool,
    },
    /// Count throughput against jq and wc -l on a corpus built from the fixtures.
    Count {
        /// Corpus size in MiB.
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        /// Timed runs of stepguard and wc (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
        /// Skip jq (it takes minutes on 1 GiB).
        #[arg(long)]
        no_jq: bool,
    },
    /// Enforcement latency: breaching line written by the child → SIGTERM delivered to it.
    Latency {
        /// Number of supervised runs.
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
        /// Record each run in a history database (in target/bench), as a default run does.
        #[arg(long)]
        record: bool,
    },
    /// Containment: breaching line passed through → no process of the run left, for an agent
    /// with many descendants that ignore SIGTERM (`--grace 0s`), per containment path.
    Contain {
        /// Supervised runs per containment path.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Descendants the agent starts (a quarter of them in sessions of their own).
        #[arg(long, default_value_t = 200)]
        descendants: usize,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
    },
    /// Per-line cost of the plugin boundary.
    Boundary {
        /// Lines fed per measurement.
        #[arg(long, default_value_t = 2_000_000)]
        lines: usize,
        /// A plugin library to load as a third variant, e.g. the codex provider built with
        /// `cargo build --release -p stepguard-provider-codex --features plugin`.
        #[arg(long)]
        plugin: Option<PathBuf>,
    },
    /// Model gateway: added latency to first byte of a streamed main request on loopback,
    /// direct to an upstream vs through the gateway.
    Gateway {
        /// Measured requests per path (after 200 of warm-up).
        #[arg(long, default_value_t = 2000)]
        requests: usize,
    },
    /// Pricing: the bundled data's first decode, then the time to price one model call.
    Prices {
        /// Calls priced per model.
        #[arg(long, default_value_t = 10_000)]
        calls: usize,
    },
    /// Loop rules: precision and recall on the labelled corpus in tests/fixtures/loops.
    Loops,
    /// Pools: reserve + settle latency (p50/p99), alone and with concurrent writers, and runs
    /// admitted per second, on the local ledger.
    Ledger {
        /// Reserve + settle pairs (and joins) measured.
        #[arg(long, default_value_t = 2_000)]
        calls: usize,
        /// Concurrent writers, each on a connection of its own.
        #[arg(long, default_value_t = 8)]
        writers: usize,
        /// The database (created afresh, removed afterwards).
        #[arg(long, default_value = "target/bench/ledger.db")]
        db: PathBuf,
        /// Also measure one writer on a pool with this many charges already in its window.
        #[arg(long, default_value_t = 0)]
        preload: u64,
    },
    /// Generates a history database of real record shapes (providers, outcomes, slugs, task
    /// types, months of start times), in one transaction.
    HistoryDb {
        /// Runs to write.
        #[arg(long, default_value_t = 1_000_000)]
        runs: u64,
        /// The database to create (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Stop-to-exit time with `--checkpoint git` on a repository of many files, against
    /// `--checkpoint none` (alternating; the work tree reset between runs).
    Checkpoint {
        /// Timed runs of each mode (after 2 of warm-up).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Files in the repository.
        #[arg(long, default_value_t = 10_000)]
        files: usize,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
    },
    /// Start-up cost: `stepguard run -p codex -- true` against `true`, wall and CPU per run.
    Startup {
        /// Timed runs of each (after 5 of warm-up).
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
        /// Run with `--no-record` (no history database).
        #[arg(long)]
        no_record: bool,
    },
    /// History commands (`show`, `history --last 20`, `stats`, `history export`) on a database:
    /// wall time and peak memory, against the equivalent sqlite3 query.
    History {
        /// The database (make one with `history-db`).
        #[arg(long)]
        db: PathBuf,
        /// The stepguard binary (build it with `cargo build --release -p stepguard-cli`).
        #[arg(long, default_value = "target/release/stepguard")]
        stepguard: PathBuf,
        /// Timed runs of each command (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// The fleet ledger on PostgreSQL: reserve + settle latency (p50/p99) with one client and
    /// several on one pool, and runs started per second with a pool; a throwaway server from
    /// the installed binaries unless `--url` names one.
    LedgerPg {
        /// A PostgreSQL URL to use instead of a throwaway server (the ledger's tables are made there).
        #[arg(long)]
        url: Option<String>,
        /// Operations per client.
        #[arg(long, default_value_t = 2_000)]
        ops: usize,
        /// Clients (one connection each) in the contended measurements.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Also measure one client on a pool with this many charges already in its window.
        #[arg(long, default_value_t = 0)]
        preload: u64,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().bench {
        Bench::Corpus {
            provider,
            size,
            seed,
            out,
        } => {
            let expected = corpus::generate(provider, size, seed, &out)?;
            println!(
                "{}: {} bytes, {} streams, {} lines, {} steps",
                out.display(),
                expected.bytes,
                expected.streams,
                expected.lines,
                expected.steps
            );
            Ok(())
        }
        Bench::CountCorpus {
            provider,
            size,
            seed,
            runs,
            stepguard,
            dir,
            no_jq,
        } => {
            use clap::ValueEnum as _;
            let providers = if provider.is_empty() {
                corpus::Provider::value_variants().to_vec()
            } else {
                provider
            };
            corpus::count_bench(&corpus::CountBench {
                providers: &providers,
                size,
                seed,
                runs,
                stepguard: &stepguard,
                dir: &dir,
                no_jq,
            })
        }
        Bench::Count {
            size_mib,
            runs,
            stepguard,
            no_jq,
        } => count(size_mib, runs, &stepguard, no_jq),
        Bench::Boundary { lines, plugin } => boundary(lines, plugin.as_deref()),
        Bench::Latency {
            runs,
            stepguard,
            record,
        } => latency(runs, &stepguard, record),
        Bench::Contain {
            runs,
            descendants,
            stepguard,
        } => contain(runs, descendants, &stepguard),
        Bench::Gateway { requests } => gateway::run(requests),
        Bench::Prices { calls } => prices::run(calls),
        Bench::Loops => loops::run(),
        Bench::Ledger {
            calls,
            writers,
            db,
            preload,
        } => ledger::run(&db, calls, writers.max(1), preload),
        Bench::HistoryDb { runs, out } => history::generate(runs, &out),
        Bench::History {
            db,
            stepguard,
            runs,
        } => history::read(&db, &stepguard, runs),
        Bench::LedgerPg {
            url,
            ops,
            clients,
            preload,
        } => ledger_pg::run(&ledger_pg::Settings {
            url,
            ops,
            clients,
            preload,
        }),
        Bench::Startup {
            runs,
            stepguard,
            no_record,
        } => startup::run(&stepguard, runs, no_record),
        Bench::Checkpoint {
            runs,
            files,
            stepguard,
        } => checkpoint::run(&stepguard, runs, files),
    }
}

/// Every JSON line of the Codex fixtures (jq stops at non-JSON lines, so noise is left out).
fn codex_lines() -> anyhow::Result<Vec<Vec<u8>>> {
    let mut lines = Vec::new();
    for dir in ["tests/fixtures/streams/codex", "tests/fixtures/real/codex"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("run from the workspace root: cannot read {dir}"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|e| e == "jsonl")
                    && !p.to_string_lossy().contains("legacy")
            })
            .collect();
        files.sort();
        for f in files {
            for line in std::fs::read(&f)?.split(|b| *b == b'\n') {
                if serde_json::from_slice::<serde_json::Value>(line).is_ok() {
                    lines.push(line.to_vec());
                }
            }
        }
    }
    Ok(lines)
}

fn build_corpus(size_mib: u64) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(format!("target/bench/codex-corpus-{size_mib}MiB.jsonl"));
    let want = size_mib << 20;
    if path.metadata().is_ok_and(|m| m.len() >= want) {
        return Ok(path);
    }
    std::fs::create_dir_all("target/bench")?;
    let mut blob = Vec::new();
    for line in codex_lines()? {
        blob.extend_from_slice(&line);
        blob.push(b'\n');
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let mut written = 0;
    while written < want {
        out.write_all(&blob)?;
        written += blob.len() as u64;
    }
    out.flush()?;
    Ok(path)
}

/// Runs a shell command, returning wall time and peak resident memory (KiB, sampled).
fn timed(shell: &str) -> anyhow::Result<(Duration, u64, String)> {
    let start = Instant::now();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(shell)
        .stdout(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let mut peak = 0;
    let output = loop {
        if let Some(status) = child.try_wait()? {
            let mut out = String::new();
            std::io::Read::read_to_string(child.stdout.as_mut().context("stdout")?, &mut out)?;
            if !status.success() {
                bail!("`{shell}` failed: {status}");
            }
            break out;
        }
        peak = peak.max(peak_rss_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok((start.elapsed(), peak, output))
}

/// Peak RSS of a process and its children (the shell's pipeline), from /proc.
fn peak_rss_kib(shell_pid: u32) -> Option<u64> {
    let children = std::fs::read_to_string(format!("/proc/{shell_pid}/task/{shell_pid}/children"))
        .unwrap_or_default();
    std::iter::once(shell_pid)
        .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
        .filter_map(|pid: u32| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .max()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn count(size_mib: u64, runs: usize, stepguard: &Path, no_jq: bool) -> anyhow::Result<()> {
    if !stepguard.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p stepguard-cli`",
            stepguard.display()
        );
    }
    let corpus = build_corpus(size_mib)?;
    let bytes = corpus.metadata()?.len();
    let file = corpus.display().to_string();
    println!(
        "corpus: {file} ({:.2} GiB)",
        bytes as f64 / (1u64 << 30) as f64
    );
    // Warm the page cache so every tool reads from memory.
    timed(&format!("cat {file} > /dev/null"))?;
    let mut results = Vec::new();
    let tools = [
        (
            "stepguard count -p codex",
            format!("{} count -p codex {file}", stepguard.display()),
        ),
        ("wc -l", format!("wc -l {file}")),
    ];
    for (name, cmd) in &tools {
        let mut times = Vec::new();
        let mut peak = 0;
        for _ in 0..runs {
            let (t, p, _) = timed(cmd)?;
            times.push(t);
            peak = peak.max(p);
        }
        results.push((*name, median(times), peak));
    }
    if !no_jq {
        if Command::new("jq").arg("--version").output().is_ok() {
            let (t, p, out) = timed(&format!(
                "jq -c 'select(.type==\"item.completed\")' {file} | wc -l"
            ))?;
            println!("jq matched {} item.completed lines", out.trim());
            results.push(("jq -c 'select(.type==\"item.completed\")' | wc -l", t, p));
        } else {
            println!("jq not found (apt-get install jq); skipping it");
        }
    }
    println!(
        "{:<52} {:>9} {:>10} {:>10}",
        "tool", "seconds", "MB/s", "peak KiB"
    );
    for (name, t, peak) in &results {
        let mbs = bytes as f64 / 1e6 / t.as_secs_f64();
        println!("{name:<52} {:>9.3} {mbs:>10.0} {peak:>10}", t.as_secs_f64());
    }
    let sg = results[0].1.as_secs_f64();
    println!(
        "stepguard vs wc -l: {:.1}x slower",
        sg / results[1].1.as_secs_f64()
    );
    if let Some(jq) = results.get(2) {
        println!("stepguard vs jq: {:.0}x faster", jq.1.as_secs_f64() / sg);
    }
    Ok(())
}

fn boundary(lines: usize, plugin: Option<&Path>) -> anyhow::Result<()> {
    let corpus = codex_lines()?;
    // A blob that stays in cache, fed `rounds` times, so the variants compare CPU cost only.
    let blob_lines = 20_000;
    let rounds = lines.div_ceil(blob_lines);
    let lines = rounds * blob_lines;
    let mut blob = Vec::new();
    for line in corpus.iter().cycle().take(blob_lines) {
        blob.extend_from_slice(line);
        blob.push(b'\n');
    }
    // The host hands over runs of whole lines, as its line splitter yields them from 64 KiB reads.
    let mut chunks: Vec<&[u8]> = Vec::new();
    let mut rest = &blob[..];
    while !rest.is_empty() {
        let cut = rest.len().min(64 << 10);
        let end = rest[..cut]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(rest.len(), |p| p + 1);
        chunks.push(&rest[..end]);
        rest = &rest[end..];
    }
    let request = CounterRequest::new("item");
    let runs = 9;
    let per_line = |d: Duration| d.as_nanos() as f64 / lines as f64;

    // The same counter, called directly, splitting the same chunks into lines itself.
    let direct = median(
        (0..runs)
            .map(|_| {
                let mut counter = stepguard_provider_codex::CodexPlugin
                    .open_counter(&request)
                    .expect("counter");
                let start = Instant::now();
                for chunk in std::iter::repeat_n(&chunks, rounds).flatten() {
                    std::hint::black_box(
                        stepguard_plugin_api::testing::feed_chunk(
                            counter.as_mut(),
                            chunk,
                            u64::MAX,
                        )
                        .expect("feed"),
                    );
                }
                start.elapsed()
            })
            .collect(),
    );
    let through = |provider: &stepguard_plugin_api::host::Provider, per_line_calls: bool| {
        median(
            (0..runs)
                .map(|_| {
                    let mut counter = provider.open_counter(&request).expect("counter");
                    let start = Instant::now();
                    for chunk in std::iter::repeat_n(&chunks, rounds).flatten() {
                        if per_line_calls {
                            for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                                std::hint::black_box(counter.feed(line).expect("feed"));
                            }
                        } else {
                            std::hint::black_box(
                                counter.feed_chunk(chunk, u64::MAX).expect("feed"),
                            );
                        }
                    }
                    start.elapsed()
                })
                .collect(),
        )
    };
    let report = |label: &str, d: Duration| {
        println!(
            "{label:<44} {:7.1} ns/line ({:+.1}% vs direct)",
            per_line(d),
            (per_line(d) / per_line(direct) - 1.0) * 100.0
        );
    };
    println!("{lines} lines of the Codex fixtures, unit item, median of {runs} runs");
    println!(
        "{:<44} {:7.1} ns/line",
        "direct call of the counter",
        per_line(direct)
    );
    let builtin = stepguard_plugin_api::host::Provider::new(stepguard_provider_codex::provider())?;
    report(
        "plugin interface, built in, chunks",
        through(&builtin, false),
    );
    report(
        "plugin interface, built in, one call a line",
        through(&builtin, true),
    );
    if let Some(path) = plugin {
        let mut registry = stepguard_plugin_host::Registry::new(Vec::new());
        registry.load_dirs(&[path.parent().context("plugin path")?.to_path_buf()]);
        let entry = registry
            .entries()
            .find(|e| e.provider.manifest().name == "codex")
            .context("no codex plugin loaded from that directory")?;
        report("loaded library, chunks", through(&entry.provider, false));
        report(
            "loaded library, one call a line",
            through(&entry.provider, true),
        );
    }
    Ok(())
}

/// The child for the latency benchmark: writes two steps, notes the time, writes the breaching
/// line, and notes when SIGTERM arrives (both on CLOCK_MONOTONIC, which every process shares).
const LATENCY_CHILD: &str = r#"
import os, signal, sys, time
out = sys.argv[1]
state = {}
def on_term(sig, frame):
    with open(out, "w") as f:
        f.write(str(time.monotonic_ns() - state["written"]))
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
line = '{"type":"item.started","item":{"id":"item_%d","type":"command_execution"}}\n'
for i in range(2):
    os.write(1, (line % i).encode())
time.sleep(0.05)
state["written"] = time.monotonic_ns()
os.write(1, (line % 2).encode())
time.sleep(30)
"#;

fn latency(runs: usize, stepguard: &Path, record: bool) -> anyhow::Result<()> {
    if !stepguard.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p stepguard-cli`",
            stepguard.display()
        );
    }
    std::fs::create_dir_all("target/bench")?;
    let child = Path::new("target/bench/latency_child.py");
    std::fs::write(child, LATENCY_CHILD)?;
    let result = Path::new("target/bench/latency_result.txt");
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let _ = std::fs::remove_file(result);
        let status = Command::new(stepguard)
            .args([
                "run",
                "-q",
                if record {
                    "--db=target/bench/latency-history.db"
                } else {
                    "--no-record"
                },
                "-p",
                "codex",
                "--max-steps",
                "2",
                "--grace",
                "2s",
                "--",
            ])
            .arg("python3")
            .arg(child)
            .arg(result)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.code() != Some(3) {
            bail!("stepguard exited with {status}, expected 3");
        }
        let ns: u64 = std::fs::read_to_string(result)
            .context("the child recorded no SIGTERM")?
            .trim()
            .parse()?;
        samples.push(Duration::from_nanos(ns));
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "enforcement latency over {runs} runs, {} (breaching line written -> SIGTERM received by the child)",
        if record {
            "each recorded in a history database"
        } else {
            "--no-record"
        }
    );
    println!(
        "median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(at(0.5)),
        ms(at(0.9)),
        ms(at(0.99)),
        ms(at(1.0))
    );
    Ok(())
}

/// The agent for the containment benchmark: ignores SIGTERM, starts `$2` descendants that inherit
/// that (every fourth in a session of its own, the others in the agent's group), waits until each
/// runs `sleep`, writes every pid (its own first) to `$1`, then writes one step, and the
/// breaching step 100 ms later.
const CONTAIN_AGENT: &str = r#"trap '' TERM
out=$1
n=$2
pids=$$
i=0
while [ "$i" -lt "$n" ]; do
    if [ $((i % 4)) -eq 0 ]; then
        setsid sh -c 'trap "" TERM; exec sleep 300' >/dev/null &
    else
        sh -c 'trap "" TERM; exec sleep 300' >/dev/null &
    fi
    pids="$pids $!"
    i=$((i + 1))
done
for p in $pids; do
    [ "$p" = "$$" ] && continue
    while :; do
        read -r c < "/proc/$p/comm"
        [ "$c" = sleep ] && break
    done
done
echo "$pids" > "$out.tmp"
mv "$out.tmp" "$out"
line='{"type":"item.started","item":{"id":"item_%d","type":"command_execution"}}\n'
printf "$line" 0
sleep 0.1
printf "$line" 1
exec sleep 300
"#;

/// A process's start time (field 22 of `/proc/PID/stat`), or `None` when it is gone or a zombie.
fn live_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields that follow start after the
    // last ')'.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// One supervised run: the time from the breaching line reaching us to every recorded pid gone,
/// and how many were still alive after 10 s.
fn contain_run(
    stepguard: &Path,
    containment: &str,
    agent: &Path,
    pid_file: &Path,
    descendants: usize,
) -> anyhow::Result<(Duration, usize)> {
    let _ = std::fs::remove_file(pid_file);
    let mut child = Command::new(stepguard)
        .args([
            "run",
            "-q",
            "--no-record",
            "-p",
            "codex",
            "--max-steps",
            "1",
            "--grace",
            "0s",
            "--containment",
            containment,
            "--",
            "sh",
        ])
        .arg(agent)
        .arg(pid_file)
        .arg(descendants.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    // The first step: every descendant runs and the pid file is complete.
    if out.read_line(&mut line)? == 0 {
        bail!(
            "stepguard ended before the agent's first step: {}",
            child.wait()?
        );
    }
    let pids: Vec<(u32, u64)> = std::fs::read_to_string(pid_file)
        .context("the agent wrote no pid file")?
        .split_whitespace()
        .map(|p| {
            let pid: u32 = p.parse()?;
            let start = live_start_time(pid).with_context(|| format!("pid {pid} is not alive"))?;
            Ok((pid, start))
        })
        .collect::<anyhow::Result<_>>()?;
    if pids.len() != descendants + 1 {
        bail!(
            "the agent recorded {} pids, expected {}",
            pids.len(),
            descendants + 1
        );
    }
    // The breaching line, passed through right after the group's SIGTERM.
    line.clear();
    if out.read_line(&mut line)? == 0 {
        bail!(
            "stepguard ended before the breaching line: {}",
            child.wait()?
        );
    }
    let breach = Instant::now();
    let mut alive = pids;
    let elapsed = loop {
        alive.retain(|&(pid, start)| live_start_time(pid) == Some(start));
        if alive.is_empty() || breach.elapsed() > Duration::from_secs(10) {
            break breach.elapsed();
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let survivors = alive.len();
    if survivors > 0 {
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(alive.iter().map(|(pid, _)| pid.to_string()))
            .status();
    }
    std::io::copy(&mut out, &mut std::io::sink())?;
    let status = child.wait()?;
    if status.code() != Some(3) {
        bail!("stepguard exited with {status}, expected 3");
    }
    Ok((elapsed, survivors))
}

fn contain(runs: usize, descendants: usize, stepguard: &Path) -> anyhow::Result<()> {
    if !stepguard.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p stepguard-cli`",
            stepguard.display()
        );
    }
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    std::fs::create_dir_all("target/bench")?;
    let agent = Path::new("target/bench/contain_agent.sh");
    std::fs::write(agent, CONTAIN_AGENT)?;
    let pid_file = Path::new("target/bench/contain_pids.txt");
    println!(
        "breaching line passed through -> no process of the run left, {descendants} descendants \
         ignoring SIGTERM (a quarter in sessions of their own), --grace 0s, {runs} runs a path"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for containment in ["cgroup", "process-walk"] {
        let probe = Command::new(stepguard)
            .args(["run", "-q", "--no-record", "-p", "codex", "--containment"])
            .args([containment, "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !probe.success() {
            println!(
                "{containment:<13} skipped: `stepguard run --containment {containment} -- true` \
                 fails here ({probe})"
            );
            continue;
        }
        let mut samples = Vec::with_capacity(runs);
        let mut survivors = 0;
        for _ in 0..runs {
            let (t, s) = contain_run(stepguard, containment, agent, pid_file, descendants)?;
            samples.push(t);
            survivors += s;
        }
        samples.sort();
        println!(
            "{containment:<13} median {:7.2} ms, p90 {:7.2} ms, max {:7.2} ms, survivors {survivors}",
            ms(quantile(&samples, 0.5)),
            ms(quantile(&samples, 0.9)),
            ms(quantile(&samples, 1.0)),
        );
    }
    Ok(())
}
