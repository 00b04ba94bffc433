//! The local ledger: the common behaviour, concurrent writers (threads and processes), the
//! version check.
#![allow(missing_docs)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use stepguard_ledger::sqlite::SqliteLedger;
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
            supported: 1,
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
