//! The spool: where a run's record goes when the database does not take it in time, so that no
//! record is lost. One JSON file per run in `<database>.spool/` beside the database, written to a
//! temporary file and renamed into place (a reader sees a whole file or none). Every open of the
//! database imports the spool and removes each file it imported.
//!
//! Importing is idempotent: a spooled run carries the identity of the stepguard that ran it
//! (host, boot, pid, process start time), which names its row. When that row exists and is
//! still `running` (its begin got in, its end did not) or was since marked `interrupted`, the
//! record completes it; when it exists and is finished, the record is already in and nothing is
//! written; when there is none (not even the begin got in), the record is inserted with that
//! identity, so a second import of the same file finds it.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension as _, params};
use serde::{Deserialize, Serialize};

use crate::{RunRecord, Supervisor, now, to_json};

/// One spooled run: the record and who ran it.
#[derive(Serialize, Deserialize)]
struct Spooled {
    host: Option<String>,
    boot_id: Option<String>,
    pid: Option<u32>,
    start_ticks: Option<u64>,
    record: RunRecord,
}

/// The spool directory of the database at `db`: `history.db.spool` beside `history.db`.
pub fn dir(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".spool");
    db.with_file_name(name)
}

/// Writes `record` to the spool of the database at `db` (temporary file, then rename), as the
/// run of this process; returns the file.
pub fn write(db: &Path, record: &RunRecord) -> std::io::Result<PathBuf> {
    let me = Supervisor::of(std::process::id());
    let mut record = record.clone();
    record.id = None;
    record.file = None;
    record.schema_version = stepguard_core::RECORD_SCHEMA_VERSION;
    if record.invocation.ended_at.is_none() {
        record.invocation.ended_at = Some(now());
    }
    let spooled = Spooled {
        host: me.as_ref().map(|s| s.host.clone()),
        boot_id: me.as_ref().map(|s| s.boot_id.clone()),
        pid: me.as_ref().map(|s| s.pid),
        start_ticks: me.as_ref().map(|s| s.start_ticks),
        record,
    };
    let json = serde_json::to_vec(&spooled).map_err(std::io::Error::other)?;
    let dir = dir(db);
    std::fs::create_dir_all(&dir)?;
    let pid = std::process::id();
    let ticks = spooled.start_ticks.unwrap_or_default();
    let tmp = dir.join(format!(".{pid}-{ticks}.tmp"));
    let path = dir.join(format!("{pid}-{ticks}.json"));
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The spooled files of the database at `db`, in name order (temporary files left out).
fn files(db: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir(db)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// Imports every spooled run of the database at `db` into `conn` and removes its file; returns
/// how many were imported. A file that is not a spooled run is renamed `*.unreadable` and left
/// for a person to look at; it never stops an open.
pub(crate) fn import(conn: &mut Connection, db: &Path) -> rusqlite::Result<usize> {
    let mut imported = 0;
    for file in files(db) {
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let Ok(spooled) = serde_json::from_slice::<Spooled>(&bytes) else {
            let _ = std::fs::rename(&file, file.with_extension("unreadable"));
            continue;
        };
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        import_one(&tx, &spooled)?;
        tx.commit()?;
        // Gone already when another stepguard imported it at the same time.
        let _ = std::fs::remove_file(&file);
        imported += 1;
    }
    Ok(imported)
}

/// Completes, skips or inserts one spooled run (see the module's description).
fn import_one(tx: &rusqlite::Transaction<'_>, s: &Spooled) -> rusqlite::Result<()> {
    let r = &s.record;
    let ticks = s.start_ticks.map(|t| t as i64);
    let row: Option<(i64, String)> = if s.pid.is_some() {
        tx.query_row(
            "SELECT id, outcome FROM runs WHERE supervisor_pid = ?1 AND supervisor_start_ticks = ?2
                AND supervisor_host IS ?3 AND supervisor_boot_id IS ?4",
            params![s.pid, ticks, s.host, s.boot_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?
    } else {
        None
    };
    match row {
        Some((id, outcome)) if outcome == "running" || outcome == "interrupted" => {
            tx.execute(
                "UPDATE runs SET outcome = ?2, record = ?3 WHERE id = ?1",
                params![id, r.verdict.outcome.as_str(), to_json(r)],
            )?;
        }
        Some(_) => {}
        None => {
            tx.execute(
                "INSERT INTO runs (started_at, provider, task_type, outcome, supervisor_host,
                    supervisor_boot_id, supervisor_pid, supervisor_start_ticks, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    r.invocation.started_at.clone().unwrap_or_else(now),
                    r.source.provider,
                    r.source.task_type,
                    r.verdict.outcome.as_str(),
                    s.host,
                    s.boot_id,
                    s.pid,
                    ticks,
                    to_json(r),
                ],
            )?;
        }
    }
    Ok(())
}
