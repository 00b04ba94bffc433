//! `ledger`: what a pool costs a run. Reserve + settle of one model call (p50/p99), alone and
//! with concurrent writers each on a connection of its own (as concurrent `stepguard run`s are),
//! and runs admitted per second (join + leave of a pool), on the local ledger. Every measurement
//! takes the ledger through a factory, so the fleet ledger (PostgreSQL) runs the same ones.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use stepguard_ledger::sqlite::SqliteLedger;
use stepguard_ledger::{ChargeKey, Grant, Ledger, PoolLimits, PoolSpec, RunKey, Usage, Window};

/// Opens a ledger (a connection of its own) for one writer.
pub(crate) type Factory = dyn Fn() -> anyhow::Result<Box<dyn Ledger>> + Send + Sync;

/// A pool large enough that no reservation of the benchmark is refused.
fn pool() -> PoolSpec {
    PoolSpec {
        name: "bench".into(),
        limits: PoolLimits {
            max_tokens: Some(u64::MAX / 2),
            max_cost_micros: Some(u64::MAX / 2),
            max_concurrent_runs: Some(1_000_000),
            ..PoolLimits::default()
        },
        window: Window::Rolling(Duration::from_secs(24 * 3600)),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `calls` reserve + settle pairs by one run; their latencies in microseconds.
fn reserve_settle(ledger: &dyn Ledger, run: &str, calls: usize) -> anyhow::Result<Vec<f64>> {
    let run = RunKey::new(run);
    ledger.join(&run, &[pool()], SystemTime::now())?;
    let mut times = Vec::with_capacity(calls);
    for seq in 0..calls as u64 {
        let key = ChargeKey {
            run: run.clone(),
            seq,
        };
        let estimate = Usage {
            tokens: 4_000,
            cost_micros: 20_000,
            steps: 1,
        };
        let t = Instant::now();
        let Grant::Granted(_) = ledger.reserve(&key, estimate, SystemTime::now())? else {
            anyhow::bail!("a reservation was refused");
        };
        ledger.settle(
            &key,
            Usage {
                tokens: 3_500,
                ..estimate
            },
            SystemTime::now(),
        )?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    ledger.leave(&run, SystemTime::now())?;
    Ok(times)
}

/// Runs `f` on `writers` threads at once, each with a ledger of its own; their results.
fn on_threads<T: Send + 'static>(
    factory: &Arc<Factory>,
    writers: usize,
    f: impl Fn(&dyn Ledger, usize) -> anyhow::Result<T> + Send + Sync + 'static,
) -> anyhow::Result<Vec<T>> {
    let f = Arc::new(f);
    let threads: Vec<_> = (0..writers)
        .map(|i| {
            let (factory, f) = (Arc::clone(factory), Arc::clone(&f));
            std::thread::spawn(move || f(factory()?.as_ref(), i))
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?)
        .collect()
}

fn report(what: &str, mut times: Vec<f64>) {
    times.sort_by(f64::total_cmp);
    println!(
        "{what}: p50 {:.0} µs, p99 {:.0} µs ({} calls)",
        percentile(&times, 50.0),
        percentile(&times, 99.0),
        times.len()
    );
}

/// Every measurement on the ledgers `factory` opens.
pub(crate) fn measure(
    name: &str,
    factory: Arc<Factory>,
    calls: usize,
    writers: usize,
) -> anyhow::Result<()> {
    println!("{name}");
    report(
        "  reserve + settle, 1 writer",
        reserve_settle(factory()?.as_ref(), "solo", calls)?,
    );
    let per = (calls / writers).max(1);
    let all = on_threads(&factory, writers, move |l, i| {
        reserve_settle(l, &format!("w{i}"), per)
    })?;
    report(
        &format!("  reserve + settle, {writers} writers"),
        all.concat(),
    );
    for threads in [1, writers] {
        let joins = (calls / threads).max(1);
        let start = Instant::now();
        on_threads(&factory, threads, move |l, i| {
            for r in 0..joins {
                let run = RunKey::new(format!("run-{i}-{r}"));
                l.join(&run, &[pool()], SystemTime::now())?;
                l.leave(&run, SystemTime::now())?;
            }
            Ok(())
        })?;
        let rate = (joins * threads) as f64 / start.elapsed().as_secs_f64();
        println!("  runs admitted (join + leave), {threads} writer(s): {rate:.0} per second");
    }
    Ok(())
}

/// The local ledger in a fresh database at `db` (removed afterwards).
pub(crate) fn run(db: &Path, calls: usize, writers: usize) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    if let Some(dir) = db.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let path = db.to_path_buf();
    let factory: Arc<Factory> =
        Arc::new(move || Ok(Box::new(SqliteLedger::open(&path)?) as Box<dyn Ledger>));
    let result = measure(
        &format!("local ledger (SQLite, WAL) at {}", db.display()),
        factory,
        calls,
        writers,
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    result
}
