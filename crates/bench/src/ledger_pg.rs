//! The fleet ledger on PostgreSQL: reserve + settle latency (p50/p99) with one client and with
//! several on one pool, and runs started per second with a pool (join + leave, as a run's start
//! and end do), against a throwaway server (`stepguard-pgserver`) or the one at `--url`.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use stepguard_ledger::{
    Admission, ChargeKey, Grant, Ledger, PoolLimits, PoolSpec, RunKey, Usage, Window,
};
use stepguard_ledger_postgres::PgLedger;
use stepguard_pgserver::PgServer;

/// The benchmark's settings.
pub struct Settings {
    /// A server to use instead of a throwaway one.
    pub url: Option<String>,
    /// Reserve + settle pairs per client.
    pub ops: usize,
    /// Clients (threads, one connection each) in the contended measurements.
    pub clients: usize,
    /// Charges already in the window of a fourth measurement's pool (0: no such measurement).
    pub preload: u64,
}

/// Runs the measurements and prints them.
pub fn run(settings: &Settings) -> anyhow::Result<()> {
    let (_server, url) = match &settings.url {
        Some(url) => (None, url.clone()),
        None => {
            let server =
                PgServer::start(&scratch_dir()?).context("start a throwaway PostgreSQL")?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let tag = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_micros()
    );
    println!(
        "PostgreSQL ledger at {}",
        PgLedger::connect(&url)?.describe()
    );

    let single = reserve_settle(&url, &format!("bench-{tag}-one"), 1, settings.ops)?;
    report("reserve+settle, 1 client", &single);
    let many = reserve_settle(
        &url,
        &format!("bench-{tag}-many"),
        settings.clients,
        settings.ops,
    )?;
    report(
        &format!("reserve+settle, {} clients, one pool", settings.clients),
        &many,
    );
    let starts = runs_started(
        &url,
        &format!("bench-{tag}-runs"),
        settings.clients,
        settings.ops,
    )?;
    report(
        &format!(
            "runs started (join+leave), {} clients, one pool",
            settings.clients
        ),
        &starts,
    );
    if settings.preload > 0 {
        let name = format!("bench-{tag}-full");
        preload(&url, &name, settings.preload)?;
        let full = reserve_settle(&url, &name, 1, settings.ops)?;
        let what = format!(
            "reserve+settle, 1 client, {} charges in the window",
            settings.preload
        );
        report(&what, &full);
    }
    Ok(())
}

/// Puts `charges` charges of an hour ago into a pool's window, straight into its table (as
/// many runs would have left them), so that a reservation sums them.
fn preload(url: &str, pool_name: &str, charges: u64) -> anyhow::Result<()> {
    let ledger = PgLedger::connect(url)?;
    let run = RunKey::new(format!("{pool_name}/preload"));
    ledger.join(&run, &[pool(pool_name)], SystemTime::now())?;
    ledger.leave(&run, SystemTime::now())?;
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    let n = i64::try_from(charges)?;
    // One token each, an hour ago, numbered, with the running totals the ledger keeps.
    client.execute(
        "INSERT INTO stepguard_pool_spend (pool, run, seq, state, at, lease_until, cost_micros,
            tokens, steps, charge_no, cum_cost, cum_tokens, cum_steps)
         SELECT $1, $2, g, 'charged', now() - interval '1 hour', now(), 0, 1, 0, g, 0, g, 0
         FROM generate_series(1, $3::BIGINT) AS g",
        &[&pool_name, &run.as_str(), &n],
    )?;
    client.execute(
        "UPDATE stepguard_pools SET charges = $2, cum_tokens = $2,
            last_at = now() - interval '1 hour' WHERE name = $1",
        &[&pool_name, &n],
    )?;
    client.batch_execute("ANALYZE stepguard_pool_spend")?;
    Ok(())
}

/// Timings of one measurement: each operation's latency and the wall time of all.
struct Timings {
    each: Vec<Duration>,
    wall: Duration,
}

fn report(what: &str, t: &Timings) {
    let mut sorted = t.each.clone();
    sorted.sort_unstable();
    let pct = |p: f64| {
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted.get(i).copied().unwrap_or_default().as_secs_f64() * 1000.0
    };
    println!(
        "{what:<52} p50 {:>6.2} ms  p99 {:>6.2} ms  {:>8.0}/s  ({} ops)",
        pct(0.5),
        pct(0.99),
        t.each.len() as f64 / t.wall.as_secs_f64(),
        t.each.len()
    );
}

fn pool(name: &str) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        limits: PoolLimits {
            max_tokens: Some(u64::MAX / 2),
            max_concurrent_runs: Some(1_000),
            ..PoolLimits::default()
        },
        window: Window::Rolling(Duration::from_secs(24 * 3600)),
    }
}

/// `clients` threads, each reserving and settling `ops` times in one pool.
fn reserve_settle(
    url: &str,
    pool_name: &str,
    clients: usize,
    ops: usize,
) -> anyhow::Result<Timings> {
    let spec = pool(pool_name);
    in_threads(url, clients, move |ledger, client| {
        let run = RunKey::new(format!("{}/{client}", spec.name));
        match ledger.join(&run, std::slice::from_ref(&spec), SystemTime::now())? {
            Admission::Admitted(_) => {}
            other => bail!("the benchmark's pool refused a run: {other:?}"),
        }
        let mut each = Vec::with_capacity(ops);
        for seq in 0..ops as u64 {
            let key = ChargeKey {
                run: run.clone(),
                seq,
            };
            let t = Instant::now();
            let Grant::Granted(_) =
                ledger.reserve(&key, Usage::tokens(1_000), SystemTime::now())?
            else {
                bail!("the benchmark's pool refused a reservation");
            };
            ledger.settle(&key, Usage::tokens(900), SystemTime::now())?;
            each.push(t.elapsed());
        }
        ledger.leave(&run, SystemTime::now())?;
        Ok(each)
    })
}

/// `clients` threads, each starting (join) and ending (leave) `ops` runs in one pool.
fn runs_started(url: &str, pool_name: &str, clients: usize, ops: usize) -> anyhow::Result<Timings> {
    let spec = pool(pool_name);
    in_threads(url, clients, move |ledger, client| {
        let mut each = Vec::with_capacity(ops);
        for i in 0..ops {
            let run = RunKey::new(format!("{}/{client}/{i}", spec.name));
            let t = Instant::now();
            match ledger.join(&run, std::slice::from_ref(&spec), SystemTime::now())? {
                Admission::Admitted(_) => {}
                other => bail!("the benchmark's pool refused a run: {other:?}"),
            }
            ledger.leave(&run, SystemTime::now())?;
            each.push(t.elapsed());
        }
        Ok(each)
    })
}

/// Connects `clients` ledgers (before the clock starts), then runs `work` on each at once.
fn in_threads<F>(url: &str, clients: usize, work: F) -> anyhow::Result<Timings>
where
    F: Fn(&PgLedger, usize) -> anyhow::Result<Vec<Duration>> + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|client| {
            let (url, work, barrier) = (url.to_owned(), Arc::clone(&work), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let ledger = PgLedger::connect(&url);
                barrier.wait();
                work(&ledger?, client)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut each = Vec::new();
    for h in handles {
        let got = h
            .join()
            .map_err(|_| anyhow::anyhow!("a benchmark client panicked"))??;
        each.extend(got);
    }
    Ok(Timings {
        each,
        wall: start.elapsed(),
    })
}

/// `tmp/` of the target directory the benchmark was built in.
fn scratch_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/stepguard-bench
    let target = exe
        .parent()
        .and_then(|p| p.parent())
        .context("the benchmark binary is not in a target directory")?;
    Ok(target.join("tmp"))
}
