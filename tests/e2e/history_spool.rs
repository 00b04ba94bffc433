//! No record is lost: a run whose row the database does not take in time is spooled beside it
//! and imported by the next stepguard; many concurrent runs on a large database all land.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::harness::{Sandbox, fixture};

fn agent(sb: &Sandbox, name: &str, body: &str) -> String {
    let path = sb.write(name, format!("#!/usr/bin/env bash\n{body}\n"));
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path.display().to_string()
}

/// The spooled files waiting beside the database at `db`.
fn spooled(db: &std::path::Path) -> Vec<String> {
    let dir = db.with_file_name("history.db.spool");
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn rows(db: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap()
}

/// A database write-locked for 10 s through a whole run: the run exits within its bound (the
/// end waits 2 s for the database), its record goes to the spool, and the next command, once
/// the lock is gone, imports it: the row is there, the spool is empty.
#[test]
fn a_run_against_a_database_locked_for_10s_is_spooled_and_imported_by_the_next_command() {
    let sb = Sandbox::new();
    let db = sb.root().join("history.db");
    let dbs = db.to_str().unwrap();
    let created = sb.run(&[
        "run",
        "-q",
        "--db",
        dbs,
        "-p",
        "codex",
        "--",
        "echo",
        r#"{"type":"thread.started","thread_id":"t"}"#,
    ]);
    assert_eq!(created.code, Some(0), "{}", created.stderr);
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE; INSERT INTO runs (started_at, provider, outcome, record) VALUES ('x', 'lock', 'running', '{}');")
        .unwrap();
    let locked = Instant::now();
    let run = sb.run(&["run", "-q", "--db", dbs, "-p", "codex", "--", &ok]);
    let took = locked.elapsed();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        took < Duration::from_secs(8),
        "took {took:?}: {}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("did not answer within 2s; this run's record is kept in")
            && run
                .stderr
                .contains("the next stepguard to open the database adds it"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("marks it interrupted"),
        "{}",
        run.stderr
    );
    let files = spooled(&db);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with(".json"), "{files:?}");
    // Held for 10 s in all, then let go without writing anything.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(locked.elapsed()));
    lock.execute_batch("ROLLBACK").unwrap();
    assert_eq!(rows(&db), 1);
    let list = sb.run(&["--db", dbs, "history", "--json"]).json();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["outcome"], "success");
    assert_eq!(list[0]["num_steps_computed"], 4);
    assert_eq!(list[0]["provider"], "codex");
    // The spooled record is the whole record: what the start knew is in it too.
    assert!(list[0]["started_at"].is_string(), "{}", list[0]);
    assert!(list[0]["ended_at"].is_string(), "{}", list[0]);
    assert_eq!(list[0]["command"][0], ok.as_str(), "{}", list[0]);
    assert_eq!(list[0]["max_steps_source"], "default", "{}", list[0]);
    assert!(spooled(&db).is_empty(), "{:?}", spooled(&db));
    // Imported once: the next command finds nothing more to add.
    let again = sb.run(&["--db", dbs, "history", "--json"]).json();
    assert_eq!(again.as_array().unwrap().len(), 2);
}

/// 50 runs at once against a database of 20,000 runs, write-locked for their first 6 s (and
/// until one of them spooled), lose none: every run exits 0 and leaves exactly one successful
/// row, whether written directly or through the spool.
#[test]
fn fifty_concurrent_runs_on_a_large_database_lose_no_record() {
    let sb = Sandbox::new();
    let db = sb.root().join("history.db");
    let dbs = db.to_str().unwrap();
    let created = sb.run(&[
        "run",
        "-q",
        "--db",
        dbs,
        "-p",
        "claude",
        "--",
        "echo",
        r#"{"type":"system","subtype":"init","session_id":"s"}"#,
    ]);
    assert_eq!(created.code, Some(0), "{}", created.stderr);
    {
        let mut conn = rusqlite::Connection::open(&db).unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute(
            "INSERT INTO runs (started_at, provider, task_type, outcome, record)
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
             SELECT started_at, provider, 'review', outcome, record FROM runs, n WHERE runs.id = 1",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    assert_eq!(rows(&db), 20_001);
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    // A backup holds the write lock for at least the first 6 s, and until a run has ended
    // meanwhile (however loaded the machine, at most 60 s): runs that end meanwhile spool, the
    // rest write directly.
    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE; DELETE FROM runs WHERE id = 1;")
        .unwrap();
    let held = db.clone();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(6));
        let until = Instant::now() + Duration::from_secs(60);
        while spooled(&held).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        lock.execute_batch("ROLLBACK").unwrap();
    });
    let children: Vec<_> = (0..50)
        .map(|_| {
            sb.cmd(&["--db", dbs, "run", "-q", "-p", "codex", "--", &ok])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut kept = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(!stderr.contains("is lost"), "{stderr}");
        kept += usize::from(stderr.contains("record is kept in"));
    }
    assert!(kept > 0, "no run ended while the lock was held");
    release.join().unwrap();
    let codex = sb
        .run(&["--db", dbs, "history", "--provider", "codex", "--json"])
        .json();
    let codex = codex.as_array().unwrap();
    assert_eq!(codex.len(), 50);
    assert!(
        codex
            .iter()
            .all(|r| r["outcome"] == "success" && r["num_steps_computed"] == 4),
        "{codex:?}"
    );
    assert_eq!(rows(&db), 20_051);
    assert!(spooled(&db).is_empty(), "{:?}", spooled(&db));
}
