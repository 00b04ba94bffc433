//! The fleet ledger against a real PostgreSQL server (a throwaway one per test, from
//! `stepguard-pgserver`): the ledger's behaviour, concurrent hosts (threads and processes), leases
//! of a killed process, the server stopped and started mid-way, and connection faults.
//!
//! The tests needing the server binaries are `#[ignore]`d: a plain `cargo nextest run` reports
//! them as skipped; `--run-ignored all` (what `.ci/run` uses, after installing PostgreSQL) runs
//! them, and then missing binaries fail them with how to install them.
#![allow(missing_docs)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use stepguard_ledger::{
    Admission, ChargeKey, Grant, Ledger, LedgerError, Measure, PoolLimits, PoolSpec, RunKey, Usage,
    Window,
};
use stepguard_ledger_postgres::{Clock, PgLedger, PgOptions, SCHEMA_VERSION};
use stepguard_pgserver::PgServer;

/// A fresh server under the target directory; missing binaries fail the test with the hint.
fn server() -> PgServer {
    PgServer::start(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL server: {e}"))
}

/// No variables from the test's own environment leak in (PGHOST, PGPASSWORD…).
fn no_env(_: &str) -> Option<String> {
    None
}

fn ledger_with(url: &str, lease: Duration, clock: Clock) -> PgLedger {
    PgLedger::connect_with(url, &no_env, PgOptions { lease, clock }).expect("connect the ledger")
}

fn ledger(server: &PgServer) -> PgLedger {
    ledger_with(&server.url(), Duration::from_secs(30), Clock::Database)
}

fn tokens_pool(name: &str, cap: u64) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        limits: PoolLimits {
            max_tokens: Some(cap),
            ..PoolLimits::default()
        },
        window: Window::Rolling(Duration::from_secs(24 * 3600)),
    }
}

fn key(run: &str, seq: u64) -> ChargeKey {
    ChargeKey {
        run: RunKey::new(run),
        seq,
    }
}

fn admitted(a: Admission) -> Vec<stepguard_ledger::Share> {
    match a {
        Admission::Admitted(shares) => shares,
        other => panic!("expected admission, got {other:?}"),
    }
}

/// (charged, reserved) tokens of a pool now.
fn tokens_of(ledger: &dyn Ledger, pool: &PoolSpec) -> (u64, u64) {
    let status = ledger
        .status(std::slice::from_ref(pool), SystemTime::now())
        .expect("status");
    let m = status[0]
        .measures
        .iter()
        .find(|m| m.measure == Measure::Tokens)
        .expect("a token cap");
    (m.charged, m.reserved)
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn reserves_settles_refuses_and_never_charges_a_replay_twice() {
    let server = server();
    let ledger = ledger(&server);
    let pool = tokens_pool("review-daily", 1_000);
    let now = SystemTime::now();
    let run = RunKey::new("host-a/1");
    let shares = admitted(ledger.join(&run, std::slice::from_ref(&pool), now).unwrap());
    assert_eq!(shares[0].tokens, Some(1_000));
    let Grant::Granted(shares) = ledger
        .reserve(&key("host-a/1", 1), Usage::tokens(600), now)
        .unwrap()
    else {
        panic!("the first reservation fits")
    };
    assert_eq!(shares[0].tokens, Some(400));
    // A replay of the same key reserves nothing more.
    ledger
        .reserve(&key("host-a/1", 1), Usage::tokens(600), now)
        .unwrap();
    assert_eq!(tokens_of(&ledger, &pool), (0, 600));
    ledger
        .settle(&key("host-a/1", 1), Usage::tokens(500), now)
        .unwrap();
    ledger
        .settle(&key("host-a/1", 1), Usage::tokens(500), now)
        .unwrap();
    assert_eq!(tokens_of(&ledger, &pool), (500, 0));
    match ledger
        .reserve(&key("host-a/1", 2), Usage::tokens(600), now)
        .unwrap()
    {
        Grant::Refused(e) => {
            assert_eq!(
                (e.pool.as_str(), e.measure, e.spent, e.cap, e.asked),
                ("review-daily", Measure::Tokens, 500, 1_000, 600)
            );
            assert!(
                e.frees_at
                    .is_some_and(|t| t > now + Duration::from_secs(23 * 3600))
            );
        }
        other => panic!("600 more does not fit in 500: {other:?}"),
    }
    // Stream charges: once per key, even over the cap.
    ledger
        .charge(&key("host-a/1", 3), Usage::tokens(700), now)
        .unwrap();
    let shares = ledger
        .charge(&key("host-a/1", 3), Usage::tokens(700), now)
        .unwrap();
    assert_eq!(shares[0].tokens, Some(0));
    assert_eq!(tokens_of(&ledger, &pool), (1_200, 0));
    // A spent pool refuses a new run at the start, naming what is spent.
    match ledger
        .join(&RunKey::new("host-b/1"), std::slice::from_ref(&pool), now)
        .unwrap()
    {
        Admission::Exhausted(e) => assert_eq!(
            (e.pool.as_str(), e.spent, e.cap),
            ("review-daily", 1_200, 1_000)
        ),
        other => panic!("a spent pool admitted a run: {other:?}"),
    }
    // A run that joined nothing cannot be charged.
    let e = ledger
        .charge(&key("stranger", 1), Usage::tokens(1), now)
        .unwrap_err();
    assert!(matches!(e, LedgerError::NotJoined { .. }), "{e}");
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn caller_clock_windows_and_leases_move_with_the_callers_time() {
    let server = server();
    let ledger = ledger_with(&server.url(), Duration::from_secs(30), Clock::Caller);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let pool = PoolSpec {
        limits: PoolLimits {
            max_tokens: Some(100),
            max_concurrent_runs: Some(1),
            ..PoolLimits::default()
        },
        window: Window::Rolling(Duration::from_secs(3600)),
        ..tokens_pool("hourly", 0)
    };
    admitted(
        ledger
            .join(&RunKey::new("r1"), std::slice::from_ref(&pool), t0)
            .unwrap(),
    );
    ledger.charge(&key("r1", 1), Usage::tokens(60), t0).unwrap();
    ledger
        .reserve(&key("r1", 2), Usage::tokens(30), t0)
        .unwrap();
    // The slot is taken while the lease lives…
    assert!(
        matches!(ledger.join(&RunKey::new("r2"), std::slice::from_ref(&pool), t0 + Duration::from_secs(29)).unwrap(), Admission::Busy(b) if b.running == 1 && b.cap == 1)
    );
    // …and free after it, with the reservation gone and the charge kept.
    let later = t0 + Duration::from_secs(31);
    let shares = admitted(
        ledger
            .join(&RunKey::new("r2"), std::slice::from_ref(&pool), later)
            .unwrap(),
    );
    assert_eq!(shares[0].tokens, Some(40));
    // The rolling hour frees the charge.
    let shares = ledger
        .allowance(&RunKey::new("r2"), t0 + Duration::from_secs(3601))
        .unwrap();
    assert_eq!(shares[0].tokens, Some(100));
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn migrations_run_from_empty_and_a_newer_database_is_refused_untouched() {
    let server = server();
    drop(ledger(&server));
    let mut client = postgres::Client::connect(&server.url(), postgres::NoTls).unwrap();
    let version: i32 = client
        .query_one("SELECT version FROM stepguard_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    // Opening again changes nothing.
    drop(ledger(&server));
    let rows: i64 = client
        .query_one("SELECT COUNT(*) FROM stepguard_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
    client
        .execute(
            "UPDATE stepguard_schema SET version = $1",
            &[&(SCHEMA_VERSION + 1)],
        )
        .unwrap();
    let e = PgLedger::connect_with(&server.url(), &no_env, PgOptions::default()).unwrap_err();
    match &e {
        LedgerError::Newer {
            found,
            supported,
            ledger,
        } => {
            assert_eq!(
                (*found, *supported),
                (i64::from(SCHEMA_VERSION + 1), i64::from(SCHEMA_VERSION))
            );
            assert!(!ledger.contains(server.password()), "{ledger}");
        }
        other => panic!("expected Newer, got {other}"),
    }
    let version: i32 = client
        .query_one("SELECT version FROM stepguard_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION + 1);
}

const CAP: u64 = 10_000;

/// Reserves `ask` tokens until refused, settling each to what it reserved after a pause (the
/// model call). Returns the tokens granted.
fn drain(ledger: &dyn Ledger, run: &str, ask: u64) -> u64 {
    let pool = tokens_pool("shared", CAP);
    admitted(
        ledger
            .join(&RunKey::new(run), &[pool], SystemTime::now())
            .expect("join"),
    );
    let mut granted = 0;
    for seq in 1.. {
        match ledger
            .reserve(&key(run, seq), Usage::tokens(ask), SystemTime::now())
            .expect("reserve")
        {
            Grant::Granted(_) => {
                granted += ask;
                std::thread::sleep(Duration::from_millis(2));
                ledger
                    .settle(&key(run, seq), Usage::tokens(ask), SystemTime::now())
                    .expect("settle");
            }
            Grant::Refused(_) => break,
        }
    }
    ledger
        .leave(&RunKey::new(run), SystemTime::now())
        .expect("leave");
    granted
}

/// 50 threads, each with its own connection (as 50 hosts would be), never overshoot: with
/// reservations settled to what they reserved, the bound is 0.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn fifty_threads_never_overshoot() {
    let server = server();
    let url = server.url();
    drop(ledger(&server));
    let barrier = Arc::new(Barrier::new(50));
    let handles: Vec<_> = (0..50)
        .map(|i| {
            let (url, barrier) = (url.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                // 50 SCRAM logins at once on two cores take a while: not what this test measures.
                let url = format!("{url}?connect_timeout=60");
                let ledger = ledger_with(&url, Duration::from_secs(30), Clock::Database);
                barrier.wait();
                drain(&ledger, &format!("t{i}"), 70)
            })
        })
        .collect();
    let grants: Vec<u64> = handles
        .into_iter()
        .map(|h| h.join().expect("a worker"))
        .collect();
    let granted: u64 = grants.iter().sum();
    let (charged, reserved) = tokens_of(&ledger(&server), &tokens_pool("shared", CAP));
    assert_eq!((charged, reserved), (granted, 0));
    assert_eq!(
        charged,
        CAP / 70 * 70,
        "the pool was not used up to its cap"
    );
    assert!(
        grants.iter().filter(|g| **g > 0).count() > 1,
        "the threads did not overlap"
    );
}

const WORKER_URL: &str = "STEPGUARD_PG_TEST_WORKER_URL";

/// The child side of `several_processes_never_overshoot` and `a_killed_process_frees_its_slot_within_the_lease`.
#[test]
#[ignore = "a worker process of the multi-process tests, run only by them"]
fn worker_process() {
    let Ok(url) = std::env::var(WORKER_URL) else {
        eprintln!("skipped: a worker, run only by the multi-process tests ({WORKER_URL} unset)");
        return;
    };
    let name = std::env::var("STEPGUARD_PG_TEST_WORKER").expect("a worker name");
    if std::env::var_os("STEPGUARD_PG_TEST_HOLD").is_some() {
        return hold(&url, &name);
    }
    let ledger = ledger_with(&url, Duration::from_secs(30), Clock::Database);
    let start: u64 = std::env::var("STEPGUARD_PG_TEST_START")
        .expect("a start")
        .parse()
        .expect("ms");
    let start = SystemTime::UNIX_EPOCH + Duration::from_millis(start);
    if let Ok(wait) = start.duration_since(SystemTime::now()) {
        std::thread::sleep(wait);
    }
    println!("granted={}", drain(&ledger, &name, 130));
}

/// Joins the one-slot pool with a short lease, reserves and charges, says so, then waits to be
/// killed.
#[expect(
    clippy::print_stdout,
    reason = "a worker tells the test that started it on stdout"
)]
fn hold(url: &str, name: &str) {
    let ledger = ledger_with(url, LEASE, Clock::Database);
    admitted(
        ledger
            .join(&RunKey::new(name), &[slot_pool()], SystemTime::now())
            .expect("join"),
    );
    ledger
        .charge(&key(name, 1), Usage::tokens(40), SystemTime::now())
        .expect("charge");
    assert!(matches!(
        ledger.reserve(&key(name, 2), Usage::tokens(300), SystemTime::now()),
        Ok(Grant::Granted(_))
    ));
    println!("holding");
    // Long enough to be killed; bounded if the test that started it is gone.
    std::thread::sleep(Duration::from_secs(60));
}

/// Eight processes on one database (as eight hosts would be) never overshoot either.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn several_processes_never_overshoot() {
    let server = server();
    drop(ledger(&server));
    let start = (SystemTime::now() + Duration::from_secs(2))
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .to_string();
    let children: Vec<_> = (0..8)
        .map(|i| {
            worker(&server, &format!("p{i}"))
                .env("STEPGUARD_PG_TEST_START", &start)
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let (mut granted, mut overlapping) = (0, 0);
    for child in children {
        let out = child.wait_with_output().expect("a worker");
        assert!(out.status.success(), "a worker failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let got: u64 = text
            .lines()
            .find_map(|l| {
                l.split_once("granted=")
                    .map(|(_, n)| n.trim().parse().expect("a number"))
            })
            .unwrap_or_else(|| panic!("no result in {text}"));
        granted += got;
        overlapping += u64::from(got > 0);
    }
    let (charged, reserved) = tokens_of(&ledger(&server), &tokens_pool("shared", CAP));
    assert_eq!((charged, reserved), (granted, 0));
    assert_eq!(charged, CAP / 130 * 130);
    assert!(
        overlapping > 1,
        "the workers did not overlap: one took everything"
    );
}

fn worker(server: &PgServer, name: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([
        "worker_process",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(WORKER_URL, server.url())
    .env("STEPGUARD_PG_TEST_WORKER", name)
    .stdout(Stdio::piped());
    cmd
}

const LEASE: Duration = Duration::from_secs(3);

fn slot_pool() -> PoolSpec {
    PoolSpec {
        limits: PoolLimits {
            max_tokens: Some(1_000),
            max_concurrent_runs: Some(1),
            ..PoolLimits::default()
        },
        ..tokens_pool("one-slot", 0)
    }
}

/// A process holding the only slot and a reservation is killed (SIGKILL): by the database's
/// clock, its slot and reservation are free within the lease, and what it was charged stays.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn a_killed_process_frees_its_slot_within_the_lease() {
    use std::io::{BufRead, BufReader};

    let server = server();
    let ledger = ledger_with(&server.url(), LEASE, Clock::Database);
    let mut child = worker(&server, "doomed")
        .env("STEPGUARD_PG_TEST_HOLD", "1")
        .spawn()
        .expect("spawn");
    // libtest says a few words first, on the same line.
    let said = BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
        .find(|l| l.ends_with("holding"));
    assert!(said.is_some(), "the worker never held the slot");

    let pool = slot_pool();
    let me = RunKey::new("survivor");
    assert!(matches!(
        ledger
            .join(&me, std::slice::from_ref(&pool), SystemTime::now())
            .unwrap(),
        Admission::Busy(_)
    ));
    assert_eq!(tokens_of(&ledger, &pool), (40, 300));
    child.kill().expect("SIGKILL");
    let killed = Instant::now();
    child.wait().expect("reap");
    // The slot frees when the lease taken at its join runs out, the reservation (made a moment
    // later) when its own does: both within the lease of the last renewal.
    let bound = LEASE + Duration::from_secs(2);
    loop {
        let admission = ledger
            .join(&me, std::slice::from_ref(&pool), SystemTime::now())
            .unwrap();
        if matches!(admission, Admission::Admitted(_)) {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "the slot was not freed within the lease: {admission:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    while tokens_of(&ledger, &pool) != (40, 0) {
        assert!(
            killed.elapsed() < bound,
            "the reservation outlived the lease: {:?}",
            tokens_of(&ledger, &pool)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // What the dead run was charged stays charged.
    let shares = ledger.allowance(&me, SystemTime::now()).unwrap();
    assert_eq!(shares[0].tokens, Some(960));
}

/// The server stops mid-run: calls fail as unreachable (fast), then work again once it is
/// back, on a new connection; a charge replayed after the restart is not charged twice.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn a_server_stopped_and_restarted_mid_way_is_unreachable_then_recovers_without_double_charges() {
    let mut server = server();
    let ledger = ledger(&server);
    let pool = tokens_pool("restart", 1_000);
    let run = RunKey::new("steady");
    admitted(
        ledger
            .join(&run, std::slice::from_ref(&pool), SystemTime::now())
            .unwrap(),
    );
    ledger
        .charge(&key("steady", 1), Usage::tokens(100), SystemTime::now())
        .unwrap();
    ledger
        .reserve(&key("steady", 2), Usage::tokens(200), SystemTime::now())
        .unwrap();
    server.stop().unwrap();
    let t = Instant::now();
    let e = ledger
        .charge(&key("steady", 3), Usage::tokens(50), SystemTime::now())
        .unwrap_err();
    assert!(matches!(e, LedgerError::Unreachable { .. }), "{e}");
    assert!(
        t.elapsed() < ledger.connect_timeout() * 2 + Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
    let e = ledger.renew(&run, SystemTime::now()).unwrap_err();
    assert!(matches!(e, LedgerError::Unreachable { .. }), "{e}");
    server.start_again().unwrap();
    // The run charges again what it spent while the ledger was away (seq 1 replayed, seq 3 new),
    // and settles its reservation twice (the first answer "lost").
    ledger
        .charge(&key("steady", 1), Usage::tokens(100), SystemTime::now())
        .unwrap();
    ledger
        .charge(&key("steady", 3), Usage::tokens(50), SystemTime::now())
        .unwrap();
    ledger
        .settle(&key("steady", 2), Usage::tokens(150), SystemTime::now())
        .unwrap();
    let shares = ledger
        .settle(&key("steady", 2), Usage::tokens(150), SystemTime::now())
        .unwrap();
    assert_eq!(shares[0].tokens, Some(700));
    assert_eq!(tokens_of(&ledger, &pool), (300, 0));
}

/// A closed port is unreachable at once; a server that takes the connection and never answers
/// is unreachable within the connect timeout; both name the ledger without its password.
#[test]
fn an_unreachable_ledger_at_start_fails_within_the_bound() {
    let closed = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let e = PgLedger::connect_with(
        &format!("postgres://u:hunter2@127.0.0.1:{closed}/db?sslmode=disable"),
        &no_env,
        PgOptions::default(),
    )
    .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let text = e.to_string();
    assert!(matches!(e, LedgerError::Unreachable { .. }), "{text}");
    assert!(
        text.contains(&format!("postgres://u@127.0.0.1:{closed}/db")) && !text.contains("hunter2"),
        "{text}"
    );
    assert!(text.contains("check that the server is up"), "{text}");

    // Accepts (the kernel's backlog) and never says a word.
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = silent.local_addr().unwrap().port();
    let t = Instant::now();
    let e = PgLedger::connect_with(
        &format!("postgres://u:pw@127.0.0.1:{port}/db?sslmode=disable&connect_timeout=2"),
        &no_env,
        PgOptions::default(),
    )
    .unwrap_err();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(e.to_string().contains("no answer within 2 s"), "{e}");
    drop(silent);

    // A bad URL is refused before any connection, without echoing the password.
    let e = PgLedger::connect_with("mysql://u:hunter2@h/db", &no_env, PgOptions::default())
        .unwrap_err();
    assert!(
        matches!(e, LedgerError::Unreachable { .. }) && !e.to_string().contains("hunter2"),
        "{e}"
    );
}

/// The password is really checked: a wrong one is refused naming the fix; PGPASSWORD and a
/// passfile supply it when the URL has none.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn passwords_come_from_the_url_pgpassword_or_a_passfile_and_are_checked() {
    let server = server();
    let bare = format!(
        "postgres://stepguard@127.0.0.1:{}/postgres?sslmode=disable",
        server.port()
    );
    let wrong = server.url().replace(server.password(), "wrong") + "?sslmode=disable";
    let e = PgLedger::connect_with(&wrong, &no_env, PgOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("refused the login")
            && e.to_string().contains("check the user and the password"),
        "{e}"
    );

    let pw = server.password().to_owned();
    let env = move |k: &str| (k == "PGPASSWORD").then(|| pw.clone());
    PgLedger::connect_with(&bare, &env, PgOptions::default()).expect("PGPASSWORD");

    let passfile = server.scratch_dir().join("pgpass");
    std::fs::write(
        &passfile,
        format!(
            "127.0.0.1:{}:postgres:stepguard:{}\n",
            server.port(),
            server.password()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &passfile,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let path = passfile.display().to_string();
    let env = move |k: &str| (k == "PGPASSFILE").then(|| path.clone());
    PgLedger::connect_with(&bare, &env, PgOptions::default()).expect("PGPASSFILE");
    // No password anywhere: the server refuses.
    let e = PgLedger::connect_with(&bare, &no_env, PgOptions::default()).unwrap_err();
    assert!(matches!(e, LedgerError::Unreachable { .. }), "{e}");
}

/// TLS through rustls: trusted with `sslrootcert`, refused (naming the fix) without it.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn tls_verifies_the_server_against_sslrootcert() {
    let server = PgServer::start_tls(Path::new(env!("CARGO_TARGET_TMPDIR"))).expect("a TLS server");
    let ca = server.ca_pem_path().expect("a CA");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url(),
        ca.display()
    );
    let ledger =
        PgLedger::connect_with(&url, &no_env, PgOptions::default()).expect("TLS with the CA");
    let pool = tokens_pool("tls", 10);
    admitted(
        ledger
            .join(&RunKey::new("r"), &[pool], SystemTime::now())
            .unwrap(),
    );
    let mut client = postgres::Client::connect(
        &format!("{}?sslmode=disable", server.url()),
        postgres::NoTls,
    )
    .unwrap();
    let tls_sessions: i64 = client
        .query_one("SELECT COUNT(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE ssl AND application_name = 'stepguard'", &[])
        .unwrap()
        .get(0);
    assert_eq!(tls_sessions, 1, "the ledger's connection is not TLS");
    // Without the CA, `require` and the default `prefer` are refused, never used unverified.
    for url in [format!("{}?sslmode=require", server.url()), server.url()] {
        let e = PgLedger::connect_with(&url, &no_env, PgOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("TLS handshake failed") && e.to_string().contains("sslrootcert"),
            "{url}: {e}"
        );
    }
}

/// A rolling window's spend is what was charged inside it, exactly, as charges age out one by
/// one (the ledger keeps running totals, not a sum per call), and a refusal says when enough
/// will have aged out.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn a_rolling_window_frees_each_charge_as_it_ages_out() {
    let server = server();
    let ledger = ledger_with(&server.url(), Duration::from_secs(30), Clock::Caller);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let min = |m: u64| Duration::from_secs(60 * m);
    let pool = PoolSpec {
        window: Window::Rolling(min(60)),
        ..tokens_pool("hourly", 100)
    };
    let run = RunKey::new("ager");
    admitted(ledger.join(&run, std::slice::from_ref(&pool), t0).unwrap());
    for (i, tokens) in [10, 20, 30, 40].into_iter().enumerate() {
        let at = t0 + min(10 * i as u64);
        ledger
            .charge(&key("ager", i as u64), Usage::tokens(tokens), at)
            .unwrap();
    }
    let now = t0 + min(30);
    for (ask, frees) in [(5, t0 + min(60)), (25, t0 + min(70)), (31, t0 + min(80))] {
        match ledger
            .reserve(&key("ager", 100 + ask), Usage::tokens(ask), now)
            .unwrap()
        {
            Grant::Refused(e) => {
                assert_eq!((e.spent, e.frees_at), (100, Some(frees)), "asking {ask}")
            }
            other => panic!("a spent pool granted {ask}: {other:?}"),
        }
    }
    let second = Duration::from_secs(1);
    for (at, left) in [(60, 10), (70, 30), (80, 60), (90, 100)] {
        let shares = ledger.allowance(&run, t0 + min(at) + second).unwrap();
        assert_eq!(shares[0].tokens, Some(left), "at +{at} min");
    }
}

/// By the database's clock, a run that renews keeps its slot and reservation past the lease;
/// one that stops renewing loses both within it.
#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn renewing_keeps_a_slot_past_the_lease_and_stopping_loses_it() {
    let server = server();
    let lease = Duration::from_secs(3);
    let ledger = ledger_with(&server.url(), lease, Clock::Database);
    let pool = slot_pool();
    let (kept, other) = (RunKey::new("kept"), RunKey::new("other"));
    admitted(
        ledger
            .join(&kept, std::slice::from_ref(&pool), SystemTime::now())
            .unwrap(),
    );
    ledger
        .reserve(&key("kept", 1), Usage::tokens(100), SystemTime::now())
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < lease * 2 {
        ledger.renew(&kept, SystemTime::now()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(matches!(
        ledger
            .join(&other, std::slice::from_ref(&pool), SystemTime::now())
            .unwrap(),
        Admission::Busy(_)
    ));
    assert_eq!(
        tokens_of(&ledger, &pool),
        (0, 100),
        "the renewed reservation lives"
    );
    let stopped = Instant::now();
    while !matches!(
        ledger
            .join(&other, std::slice::from_ref(&pool), SystemTime::now())
            .unwrap(),
        Admission::Admitted(_)
    ) {
        assert!(
            stopped.elapsed() < lease + Duration::from_secs(2),
            "the slot outlived the lease"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The last renewal was at most one pause (and one call) before: the slot lived on for most
    // of a lease.
    assert!(
        stopped.elapsed() >= lease / 2,
        "freed before the lease ran out: {:?}",
        stopped.elapsed()
    );
}
