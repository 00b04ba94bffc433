//! The local ledger: the common behaviour, concurrent writers (threads and processes), the
//! version check.
#![allow(missing_docs)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use stepguard_ledger::sqlite::{LEDGER_VERSION, SqliteLedger};
use stepguard_ledger::{Grant, Ledger, LedgerError, RunKey, Usage};

fn ledger(dir: &tempfile::TempDir) -> SqliteLedger {
    SqliteLedger::open(&dir.path().join("history.db")).expect("open the ledger")
}

#[test]
fn reserves_settles_and_refuses_with_the_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    reserves_settles_and_refuses(&ledger(&dir));
}

#[test]
fn replays_are_charged_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    replays_are_not_charged_twice(&ledger(&dir));
}

#[test]
fn a_charge_needs_a_membership() {
    let dir = tempfile::tempdir().expect("tempdir");
    charges_need_a_membership(&ledger(&dir));
}

#[test]
fn leases_free_slots_and_reservations_not_spend() {
    let dir = tempfile::tempdir().expect("tempdir");
    leases_expire(&ledger(&dir));
}

#[test]
fn rolling_windows_stay_exact_as_spend_ages_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    rolling_windows_age_out(&ledger(&dir));
}

#[test]
fn spent_pools_refuse_at_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    spent_pools_refuse_joins(&ledger(&dir));
}

/// Each worker reserves `ask` tokens until refused, settling each to exactly what it reserved
/// after a short pause (the model call).
/// Returns the tokens it was granted.
fn drain(ledger: &dyn Ledger, run: &str, ask: u64) -> u64 {
    let pool = tokens_pool("shared", CAP);
    let now = SystemTime::now();
    admitted(ledger.join(&RunKey::new(run), &[pool], now).expect("join"));
    let mut granted = 0;
    for seq in 1.. {
        match ledger
            .reserve(&key(run, seq), Usage::tokens(ask), now)
            .expect("reserve")
        {
            Grant::Granted(_) => {
                granted += ask;
                std::thread::sleep(Duration::from_millis(2));
                ledger
                    .settle(&key(run, seq), Usage::tokens(ask), now)
                    .expect("settle");
            }
            Grant::Refused(_) => break,
        }
    }
    ledger.leave(&RunKey::new(run), now).expect("leave");
    granted
}

const CAP: u64 = 10_000;

/// 50 threads, each with its own connection as a process would have, never overshoot the pool:
/// with reservations settled at their estimate, the bound is 0.
#[test]
fn fifty_threads_never_overshoot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = Arc::new(dir.path().join("history.db"));
    ledger(&dir);
    let workers: Vec<_> = (0..50)
        .map(|i| {
            let path = Arc::clone(&path);
            std::thread::spawn(move || {
                drain(
                    &SqliteLedger::open(&path).expect("open"),
                    &format!("t{i}"),
                    70,
                )
            })
        })
        .collect();
    let granted: u64 = workers
        .into_iter()
        .map(|w| w.join().expect("a worker panicked"))
        .sum();
    let (charged, reserved) = tokens_charged(
        &ledger(&dir),
        &tokens_pool("shared", CAP),
        SystemTime::now(),
    );
    assert_eq!((charged, reserved), (granted, 0));
    // 70-token calls fill 9,940 of 10,000; one more would cross.
    assert_eq!(charged, CAP / 70 * 70);
}

const WORKER_DB: &str = "STEPGUARD_LEDGER_TEST_WORKER_DB";

/// The child side of `several_processes_never_overshoot` (run only by it).
#[test]
#[ignore = "a worker process of several_processes_never_overshoot"]
fn worker_process() {
    let Some(db) = std::env::var_os(WORKER_DB) else {
        eprintln!(
            "skipped: a worker, run only by several_processes_never_overshoot ({WORKER_DB} unset)"
        );
        return;
    };
    let name = std::env::var("STEPGUARD_LEDGER_TEST_WORKER").expect("a worker name");
    let ledger = SqliteLedger::open(Path::new(&db)).expect("open");
    // Every worker starts at the same instant, so their transactions interleave.
    let start: u64 = std::env::var("STEPGUARD_LEDGER_TEST_START")
        .expect("a start")
        .parse()
        .expect("ms");
    let start = SystemTime::UNIX_EPOCH + Duration::from_millis(start);
    if let Ok(wait) = start.duration_since(SystemTime::now()) {
        std::thread::sleep(wait);
    }
    let granted = drain(&ledger, &name, 130);
    println!("granted={granted}");
}

/// Eight processes on one file (as eight `stepguard run`s would be) never overshoot either.
#[test]
fn several_processes_never_overshoot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("history.db");
    ledger(&dir);
    let exe = std::env::current_exe().expect("the test binary");
    let start = SystemTime::now() + Duration::from_secs(2);
    let start = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .to_string();
    let children: Vec<_> = (0..8)
        .map(|i| {
            std::process::Command::new(&exe)
                .args([
                    "worker_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(WORKER_DB, &db)
                .env("STEPGUARD_LEDGER_TEST_WORKER", format!("p{i}"))
                .env("STEPGUARD_LEDGER_TEST_START", &start)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let (mut granted, mut workers_granted) = (0, 0);
    for child in children {
        let out = child.wait_with_output().expect("a worker");
        assert!(out.status.success(), "a worker failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("granted=").map(|(_, n)| n))
            .unwrap_or_else(|| panic!("no result in {text}"));
        let got = line.trim().parse::<u64>().expect("a number");
        granted += got;
        workers_granted += u64::from(got > 0);
    }
    let (charged, reserved) = tokens_charged(
        &ledger(&dir),
        &tokens_pool("shared", CAP),
        SystemTime::now(),
    );
    assert_eq!((charged, reserved), (granted, 0));
    assert_eq!(charged, CAP / 130 * 130);
    assert!(
        workers_granted > 1,
        "the workers did not overlap: one took everything"
    );
}

#[test]
fn a_newer_ledger_is_refused_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("history.db");
    drop(SqliteLedger::open(&db).expect("open"));
    let conn = rusqlite::Connection::open(&db).expect("sqlite");
    conn.execute("UPDATE stepguard_ledger_meta SET version = 99", [])
        .expect("bump");
    match SqliteLedger::open(&db) {
        Err(LedgerError::Newer {
            found: 99,
            supported: LEDGER_VERSION,
            ..
        }) => {}
        other => panic!("expected a refusal of version 99, got {other:?}"),
    }
    let version: i64 = conn
        .query_row("SELECT version FROM stepguard_ledger_meta", [], |r| {
            r.get(0)
        })
        .expect("read");
    assert_eq!(version, 99);
}

#[test]
fn an_unopenable_file_is_unreachable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = SqliteLedger::open(&dir.path().join("missing/dir/history.db"))
        .expect_err("opened a missing directory");
    assert!(matches!(err, LedgerError::Unreachable { .. }), "{err:?}");
}

/// A calendar day in a named zone frees at that zone's midnight.
#[test]
fn a_calendar_day_frees_at_midnight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = ledger(&dir);
    let window = stepguard_ledger::Window::parse("day", Some("Asia/Tokyo")).expect("window");
    let p = pool(
        "jp",
        stepguard_ledger::PoolLimits {
            max_tokens: Some(10),
            ..Default::default()
        },
        window,
    );
    // 2027-01-04T14:59:59Z is 23:59:59 in Tokyo.
    let before = SystemTime::UNIX_EPOCH + Duration::from_secs(1_799_074_799);
    admitted(
        l.join(&RunKey::new("jp"), std::slice::from_ref(&p), before)
            .expect("join"),
    );
    l.charge(&key("jp", 1), Usage::tokens(10), before)
        .expect("charge");
    match l
        .reserve(&key("jp", 2), Usage::tokens(1), before)
        .expect("reserve")
    {
        Grant::Refused(e) => assert_eq!(e.frees_at, Some(before + Duration::from_secs(1))),
        g => panic!("{g:?}"),
    }
    assert!(matches!(
        l.reserve(
            &key("jp", 2),
            Usage::tokens(1),
            before + Duration::from_secs(1)
        )
        .expect("reserve"),
        Grant::Granted(_)
    ));
}

/// The ledger's tables as version 1 wrote them (no running totals), with a pool of one member
/// and charges at three times, one reservation, and a second pool with no charges.
fn write_version_1(db: &Path) {
    let conn = rusqlite::Connection::open(db).expect("sqlite");
    conn.execute_batch(
        "CREATE TABLE stepguard_ledger_meta (version INTEGER NOT NULL);
         INSERT INTO stepguard_ledger_meta VALUES (1);
         CREATE TABLE pool_members (run TEXT NOT NULL, pool TEXT NOT NULL, max_cost_micros INTEGER,
             max_tokens INTEGER, max_steps INTEGER, max_runs INTEGER, max_concurrent_runs INTEGER,
             window_kind TEXT NOT NULL CHECK (window_kind IN ('rolling', 'day', 'week', 'none')),
             window_ms INTEGER, window_tz TEXT, joined_at INTEGER NOT NULL,
             lease_until INTEGER NOT NULL, left_at INTEGER, PRIMARY KEY (run, pool));
         CREATE INDEX pool_members_by_pool ON pool_members (pool, lease_until);
         CREATE INDEX pool_members_joined ON pool_members (pool, joined_at);
         CREATE TABLE pool_spend (pool TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL,
             state TEXT NOT NULL CHECK (state IN ('reserved', 'charged')), at INTEGER NOT NULL,
             lease_until INTEGER NOT NULL, cost_micros INTEGER NOT NULL, tokens INTEGER NOT NULL,
             steps INTEGER NOT NULL, PRIMARY KEY (pool, run, seq));
         CREATE INDEX pool_spend_by_time ON pool_spend (pool, at);
         CREATE INDEX pool_spend_by_run ON pool_spend (run, seq);",
    )
    .expect("version 1 tables");
    let t = |mins: i64| {
        let base = t0()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis() as i64;
        base + mins * 60_000
    };
    for pool in ["old", "idle"] {
        conn.execute(
            "INSERT INTO pool_members VALUES ('r', ?1, NULL, 1000, NULL, NULL, NULL, 'rolling',
                 3600000, NULL, ?2, ?3, NULL)",
            rusqlite::params![pool, t(0), t(100)],
        )
        .expect("member");
    }
    // Inserted out of time order: the migration numbers them by time.
    for (seq, state, mins, tokens) in [
        (2, "charged", 30, 200),
        (1, "charged", 0, 100),
        (3, "charged", 50, 300),
        (4, "reserved", 55, 50),
    ] {
        conn.execute(
            "INSERT INTO pool_spend VALUES ('old', 'r', ?1, ?2, ?3, ?4, 0, ?5, 1)",
            rusqlite::params![seq, state, t(mins), t(100), tokens],
        )
        .expect("spend");
    }
}

#[test]
fn a_version_1_ledger_migrates_with_its_spend() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("history.db");
    write_version_1(&db);
    let ledger = SqliteLedger::open(&db).expect("migrate");
    let old = tokens_pool_in("old", 1_000);
    let minutes = |m: u64| t0() + Duration::from_secs(m * 60);
    // At +56 min all three charges (600) are in the hour, and the reservation (lease to +100).
    assert_eq!(tokens_charged(&ledger, &old, minutes(56)), (600, 50));
    // At +61 min the first charge (100) has aged out; at +91 the second (200) too.
    assert_eq!(tokens_charged(&ledger, &old, minutes(61)), (500, 50));
    assert_eq!(tokens_charged(&ledger, &old, minutes(91)), (300, 50));
    // New charges continue the numbering and the totals.
    ledger
        .charge(&key("r", 5), Usage::tokens(10), minutes(92))
        .expect("charge");
    assert_eq!(tokens_charged(&ledger, &old, minutes(92)), (310, 50));
    let idle = tokens_pool_in("idle", 1_000);
    assert_eq!(tokens_charged(&ledger, &idle, minutes(92)), (10, 0));
    // Settling the migrated reservation charges it (its pool's running totals too).
    ledger
        .settle(&key("r", 4), Usage::tokens(40), minutes(93))
        .expect("settle");
    assert_eq!(tokens_charged(&ledger, &old, minutes(93)), (350, 0));
    let conn = rusqlite::Connection::open(&db).expect("sqlite");
    let rows: Vec<(i64, i64, i64)> = conn
        .prepare("SELECT seq, charge_no, cum_tokens FROM pool_spend WHERE pool = 'old' ORDER BY charge_no")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        rows,
        vec![
            (1, 1, 100),
            (2, 2, 300),
            (3, 3, 600),
            (5, 4, 610),
            (4, 5, 650)
        ]
    );
    let version: i64 = conn
        .query_row("SELECT version FROM stepguard_ledger_meta", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(version, LEDGER_VERSION);
}

fn tokens_pool_in(name: &str, cap: u64) -> stepguard_ledger::PoolSpec {
    pool(
        name,
        stepguard_ledger::PoolLimits {
            max_tokens: Some(cap),
            ..Default::default()
        },
        stepguard_ledger::Window::Rolling(HOUR),
    )
}
