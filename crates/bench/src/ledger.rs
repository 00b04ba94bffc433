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
    named_pool("bench")
}

fn named_pool(name: &str) -> PoolSpec {
    PoolSpec {
        name: name.into(),
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
    reserve_settle_in(ledger, &pool(), run, calls)
}

/// `calls` reserve + settle pairs by one run in `pool`; their latencies in microseconds.
fn reserve_settle_in(
    ledger: &dyn Ledger,
    pool: &PoolSpec,
    run: &str,
    calls: usize,
) -> anyhow::Result<Vec<f64>> {
    let run = RunKey::new(run);
    ledger.join(&run, std::slice::from_ref(pool), SystemTime::now())?;
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

/// Puts `charges` one-token charges of an hour ago into the pool `name`'s window, straight into
/// its table (as many runs would have left them), numbered with running totals when the ledger
/// keeps them (version 2 of its tables).
fn preload(db: &Path, name: &str, charges: u64) -> anyhow::Result<()> {
    let ledger = SqliteLedger::open(db)?;
    let run = RunKey::new(format!("{name}/preload"));
    ledger.join(&run, &[named_pool(name)], SystemTime::now())?;
    ledger.leave(&run, SystemTime::now())?;
    drop(ledger);
    let mut conn = rusqlite::Connection::open(db)?;
    let tx = conn.transaction()?;
    let hour_ago = i64::try_from(
        (SystemTime::now() - Duration::from_secs(3600))
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_millis(),
    )?;
    tx.execute(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?3)
         INSERT INTO pool_spend (pool, run, seq, state, at, lease_until, cost_micros, tokens, steps)
         SELECT ?1, ?2, n, 'charged', ?4 + n / 1000, ?4, 0, 1, 0 FROM g",
        rusqlite::params![name, run.as_str(), i64::try_from(charges)?, hour_ago],
    )?;
    let totals: i64 = tx.query_row(
        "SELECT COUNT(*) FROM sqlite_master WHERE name = 'pool_totals'",
        [],
        |r| r.get(0),
    )?;
    if totals > 0 {
        tx.execute(
            "UPDATE pool_spend SET charge_no = seq, cum_cost = 0, cum_tokens = seq, cum_steps = 0
             WHERE pool = ?1 AND run = ?2",
            rusqlite::params![name, run.as_str()],
        )?;
        tx.execute(
            "INSERT INTO pool_totals (pool, charges, cum_cost, cum_tokens, cum_steps, last_at)
             VALUES (?1, ?2, 0, ?2, 0, ?3)",
            rusqlite::params![
                name,
                i64::try_from(charges)?,
                hour_ago + i64::try_from(charges / 1000)?
            ],
        )?;
    }
    tx.commit()?;
    conn.execute_batch("ANALYZE")?;
    Ok(())
}

/// The local ledger in a fresh database at `db` (removed afterwards); with `preload`, also one
/// writer on a pool that already holds that many charges in its window.
pub(crate) fn run(
    db: &Path,
    calls: usize,
    writers: usize,
    preload_charges: u64,
) -> anyhow::Result<()> {
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
    )
    .and_then(|()| {
        if preload_charges == 0 {
            return Ok(());
        }
        preload(db, "bench-full", preload_charges)?;
        let times = reserve_settle_in(
            &SqliteLedger::open(db)?,
            &named_pool("bench-full"),
            "full",
            calls,
        )?;
        report(
            &format!("  reserve + settle, 1 writer, {preload_charges} charges in the window"),
            times,
        );
        Ok(())
    });
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    result
}
