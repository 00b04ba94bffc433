//! The run history of stepguard: a SQLite store with versioned migrations.
//!
//! Every `stepguard run` is a row, written as `running` when the agent starts, updated with the
//! live step count as the run goes (the caller batches), and completed at the end. A row whose
//! supervising stepguard died is found on the next open and marked `interrupted`.
//!
//! Schema versions live in `PRAGMA user_version`. Migrations run on open, each in an immediate
//! transaction that re-reads the version, so concurrent first opens do not race, and no row is
//! ever rewritten by a migration. A database from a newer stepguard is refused before anything is
//! written to it. WAL mode and a busy timeout let many `stepguard run` processes share one file.
//!
//! * version 1: the runs table with turn-only metrics (`num_turns_reported`, `num_turns_computed`),
//!   as turn-based tools stored them;
//! * version 2: nullable `num_steps_reported` and `num_steps_computed` (NULL for older rows).
//!
//! ```
//! # let dir = tempfile::tempdir().unwrap();
//! use stepguard_store::{NewRun, Store};
//! let store = Store::open(&dir.path().join("history.db")).unwrap();
//! let id = store.begin_run(&NewRun { provider: "codex".into(), ..NewRun::default() }).unwrap();
//! assert_eq!(store.get(id).unwrap().unwrap().outcome, "running");
//! ```
#![forbid(unsafe_code)]

mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension as _, Row, params};
use serde::Serialize;
use stepguard_core::{FailureSlug, Outcome, RunStats, TokenUsage};

pub use stats::{GroupStats, Spread, StatsReport, compute_stats, percentile};

/// The schema migrations, in order; index + 1 is the version each one brings the database to.
pub const MIGRATIONS: &[&str] = &[
    // 1: runs with turn-only metrics.
    "CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        provider TEXT NOT NULL,
        plugin_version TEXT,
        unit TEXT,
        task_type TEXT,
        profile TEXT,
        max_steps INTEGER,
        max_steps_source TEXT,
        command TEXT NOT NULL,
        cwd TEXT,
        outcome TEXT NOT NULL,
        failure_slug TEXT,
        exit_code INTEGER,
        child_exit_code INTEGER,
        terminated_by TEXT,
        duration_ms INTEGER,
        num_turns_reported INTEGER,
        num_turns_computed INTEGER,
        input_tokens INTEGER,
        output_tokens INTEGER,
        cost_usd REAL,
        on_limit_decision TEXT,
        supervisor_host TEXT,
        supervisor_boot_id TEXT,
        supervisor_pid INTEGER,
        supervisor_start_ticks INTEGER
    );
    CREATE INDEX runs_by_provider ON runs (provider, task_type, started_at);",
    // 2: step metrics, nullable so that turn-only rows stay what they are.
    "ALTER TABLE runs ADD COLUMN num_steps_reported INTEGER;
     ALTER TABLE runs ADD COLUMN num_steps_computed INTEGER;",
];

/// The newest schema version this stepguard knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a writer waits for another one before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A failure of the history store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database belongs to a newer stepguard; it was not modified.
    #[error(
        "history database {path} has schema version {found}, newer than this stepguard knows ({known}); refusing to modify it (upgrade stepguard or use --db)"
    )]
    NewerSchema {
        /// The file.
        path: String,
        /// Its version.
        found: i64,
        /// The newest version known here.
        known: i64,
    },
    /// SQLite failed.
    #[error("history database {path}: {source}")]
    Sqlite {
        /// The file.
        path: String,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The directory could not be created.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The row id of a run.
pub type RunId = i64;

/// What is known when a run starts.
#[derive(Clone, Debug, Default)]
pub struct NewRun {
    /// Provider name.
    pub provider: String,
    /// Version of the provider plugin.
    pub plugin_version: Option<String>,
    /// Step unit.
    pub unit: Option<String>,
    /// Task type.
    pub task_type: Option<String>,
    /// Profile.
    pub profile: Option<String>,
    /// Budget (`None` = unlimited).
    pub max_steps: Option<u32>,
    /// Where the budget came from.
    pub max_steps_source: Option<String>,
    /// The agent command.
    pub command: Vec<String>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// What is known when a run ends.
#[derive(Clone, Debug)]
pub struct FinishedRun {
    /// The run's numbers and outcome.
    pub stats: RunStats,
    /// stepguard's exit code.
    pub exit_code: i32,
    /// The agent's exit code, when it exited normally.
    pub child_exit_code: Option<i32>,
    /// `budget`, `timeout`, `signal`, `plugin`, or none.
    pub terminated_by: Option<String>,
    /// The human's decisions at the limit, comma-separated (e.g. `allow:2,stop`).
    pub on_limit_decision: Option<String>,
}

/// One stored run, as read back.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunRecord {
    /// Row id.
    pub id: RunId,
    /// Start time (RFC 3339, UTC).
    pub started_at: String,
    /// End time.
    pub ended_at: Option<String>,
    /// Provider.
    pub provider: String,
    /// Plugin version.
    pub plugin_version: Option<String>,
    /// Unit.
    pub unit: Option<String>,
    /// Task type.
    pub task_type: Option<String>,
    /// Profile.
    pub profile: Option<String>,
    /// Budget (`None` = unlimited, or unknown for old rows).
    pub max_steps: Option<i64>,
    /// Where the budget came from.
    pub max_steps_source: Option<String>,
    /// The agent command.
    pub command: Vec<String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// `running`, `success`, `failed`, `incomplete` or `interrupted`.
    pub outcome: String,
    /// Failure slug as stored (legacy `max_turns` stays `max_turns`).
    pub failure_slug: Option<String>,
    /// stepguard's exit code.
    pub exit_code: Option<i64>,
    /// The agent's exit code.
    pub child_exit_code: Option<i64>,
    /// Who stopped the agent.
    pub terminated_by: Option<String>,
    /// Duration.
    pub duration_ms: Option<i64>,
    /// Steps the provider reported.
    pub num_steps_reported: Option<i64>,
    /// Steps stepguard counted.
    pub num_steps_computed: Option<i64>,
    /// Legacy turns the provider reported.
    pub num_turns_reported: Option<i64>,
    /// Legacy turns counted.
    pub num_turns_computed: Option<i64>,
    /// Input tokens.
    pub input_tokens: Option<i64>,
    /// Output tokens.
    pub output_tokens: Option<i64>,
    /// Cost in US dollars.
    pub cost_usd: Option<f64>,
    /// Decisions at the limit.
    pub on_limit_decision: Option<String>,
}

impl RunRecord {
    /// Returns the core's stats view of the row (for the summary line).
    pub fn run_stats(&self) -> RunStats {
        let n = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
        RunStats {
            num_steps_reported: n(self.num_steps_reported),
            num_steps_computed: n(self.num_steps_computed),
            num_turns_reported: n(self.num_turns_reported),
            num_turns_computed: n(self.num_turns_computed),
            outcome: self.outcome.parse().unwrap_or(Outcome::Failed),
            // Unknown slugs are shown as stored by `slug_label`, not here.
            slug: self
                .failure_slug
                .as_deref()
                .and_then(|s| s.parse::<FailureSlug>().ok()),
            duration_ms: n(self.duration_ms),
            tokens: match (n(self.input_tokens), n(self.output_tokens)) {
                (Some(i), Some(o)) => Some(TokenUsage {
                    input_tokens: i,
                    output_tokens: o,
                    ..TokenUsage::default()
                }),
                _ => None,
            },
            cost_usd: self.cost_usd,
        }
    }

    /// Returns the summary line; legacy slugs are shown as stored, marked as legacy.
    pub fn summary_line(&self) -> String {
        let line = self.run_stats().summary_line();
        match self.failure_slug.as_deref() {
            Some(s) if FailureSlug::is_legacy_name(s) => {
                line.replace("max_steps", &format!("{s} (legacy name of max_steps)"))
            }
            _ => line,
        }
    }

    /// Returns the step count to judge budgets by: computed, else reported.
    pub fn steps(&self) -> Option<i64> {
        self.num_steps_computed.or(self.num_steps_reported)
    }

    /// Returns the turn count: reported, else computed.
    pub fn turns(&self) -> Option<i64> {
        self.num_turns_reported.or(self.num_turns_computed)
    }
}

/// Which runs to list.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this provider.
    pub provider: Option<String>,
    /// Only this task type.
    pub task_type: Option<String>,
    /// Only runs that did not succeed (and are not running).
    pub failed: bool,
    /// At most this many, newest first.
    pub last: Option<usize>,
}

/// A running row's supervisor identity: (id, boot id, pid, start ticks).
type SupervisorRow = (RunId, Option<String>, Option<i64>, Option<i64>);

/// The history database.
pub struct Store {
    conn: Connection,
    path: String,
}

/// This process, as recorded in a row, so that a later open can tell whether it is still alive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Supervisor {
    host: String,
    boot_id: String,
    pid: u32,
    start_ticks: u64,
}

impl Supervisor {
    fn of(pid: u32) -> Option<Self> {
        let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
        let stat = read(&format!("/proc/{pid}/stat"))?;
        // Field 22 (start time in clock ticks), counted after the command name's `)`.
        let start_ticks = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(19)?
            .parse()
            .ok()?;
        Some(Supervisor {
            host: read("/proc/sys/kernel/hostname").unwrap_or_default(),
            boot_id: read("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
            pid,
            start_ticks,
        })
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Store {
    /// Opens (creating if needed) the database at `path`, migrates it, and marks runs whose
    /// stepguard died as `interrupted`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let display = path.display().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let sql = |source| StoreError::Sqlite {
            path: display.clone(),
            source,
        };
        let mut conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql)?;
        // Refuse a newer database before writing anything (WAL mode included).
        let found: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql)?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: display,
                found,
                known: SCHEMA_VERSION,
            });
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        migrate(&mut conn, SCHEMA_VERSION).map_err(|e| match e {
            Migrate::Newer(found) => StoreError::NewerSchema {
                path: display.clone(),
                found,
                known: SCHEMA_VERSION,
            },
            Migrate::Sqlite(source) => StoreError::Sqlite {
                path: display.clone(),
                source,
            },
        })?;
        let store = Store {
            conn,
            path: display,
        };
        store.mark_dead_runs()?;
        Ok(store)
    }

    /// Returns the database path.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Records a run that has just started, as `running`.
    pub fn begin_run(&self, run: &NewRun) -> Result<RunId, StoreError> {
        let me = Supervisor::of(std::process::id());
        let command = serde_json::to_string(&run.command).unwrap_or_else(|_| "[]".into());
        self.conn
            .execute(
                "INSERT INTO runs (started_at, provider, plugin_version, unit, task_type, profile, max_steps,
                    max_steps_source, command, cwd, outcome, supervisor_host, supervisor_boot_id,
                    supervisor_pid, supervisor_start_ticks)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'running', ?11, ?12, ?13, ?14)",
                params![
                    now(),
                    run.provider,
                    run.plugin_version,
                    run.unit,
                    run.task_type,
                    run.profile,
                    run.max_steps,
                    run.max_steps_source,
                    command,
                    run.cwd,
                    me.as_ref().map(|s| s.host.clone()),
                    me.as_ref().map(|s| s.boot_id.clone()),
                    me.as_ref().map(|s| s.pid),
                    me.as_ref().map(|s| s.start_ticks as i64),
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Updates the live step count of a running run.
    pub fn update_progress(&self, id: RunId, steps_computed: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE runs SET num_steps_computed = ?2 WHERE id = ?1 AND outcome = 'running'",
                params![id, steps_computed as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Completes a run.
    pub fn finish_run(&self, id: RunId, run: &FinishedRun) -> Result<(), StoreError> {
        let s = &run.stats;
        let i = |v: Option<u64>| v.map(|v| v as i64);
        self.conn
            .execute(
                "UPDATE runs SET ended_at = ?2, outcome = ?3, failure_slug = ?4, exit_code = ?5,
                    child_exit_code = ?6, terminated_by = ?7, duration_ms = ?8, num_steps_reported = ?9,
                    num_steps_computed = ?10, num_turns_reported = ?11, num_turns_computed = ?12,
                    input_tokens = ?13, output_tokens = ?14, cost_usd = ?15, on_limit_decision = ?16
                 WHERE id = ?1",
                params![
                    id,
                    now(),
                    s.outcome.as_str(),
                    s.slug.map(|x| x.as_str()),
                    run.exit_code,
                    run.child_exit_code,
                    run.terminated_by,
                    i(s.duration_ms),
                    i(s.num_steps_reported),
                    i(s.num_steps_computed),
                    i(s.num_turns_reported),
                    i(s.num_turns_computed),
                    i(s.tokens.map(|t| t.input_tokens)),
                    i(s.tokens.map(|t| t.output_tokens)),
                    s.cost_usd,
                    run.on_limit_decision,
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Marks `running` rows whose stepguard is gone as `interrupted`; returns how many.
    ///
    /// Only rows written on this host are judged (a database on a shared disk may hold runs of
    /// other machines). A row is dead when the machine rebooted since, or its pid is gone or now
    /// belongs to a process that started at another time.
    pub fn mark_dead_runs(&self) -> Result<usize, StoreError> {
        let me = Supervisor::of(std::process::id());
        let Some(me) = me else { return Ok(0) };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, supervisor_boot_id, supervisor_pid, supervisor_start_ticks FROM runs
                 WHERE outcome = 'running' AND supervisor_host = ?1",
            )
            .map_err(|e| self.err(e))?;
        let rows: Vec<SupervisorRow> = stmt
            .query_map([&me.host], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        let mut marked = 0;
        for (id, boot_id, pid, ticks) in rows {
            let alive = boot_id.as_deref() == Some(me.boot_id.as_str())
                && pid
                    .and_then(|p| u32::try_from(p).ok())
                    .and_then(Supervisor::of)
                    .is_some_and(|s| Some(s.start_ticks as i64) == ticks);
            if !alive {
                marked += self
                    .conn
                    .execute(
                        "UPDATE runs SET outcome = 'interrupted', failure_slug = 'interrupted', ended_at = ?2
                         WHERE id = ?1 AND outcome = 'running'",
                        params![id, now()],
                    )
                    .map_err(|e| self.err(e))?;
            }
        }
        Ok(marked)
    }

    /// Returns one run.
    pub fn get(&self, id: RunId) -> Result<Option<RunRecord>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM runs WHERE id = ?1"),
                [id],
                record,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Returns runs matching `filter`, newest first.
    pub fn list(&self, filter: &Filter) -> Result<Vec<RunRecord>, StoreError> {
        let mut sql = format!("SELECT {COLUMNS} FROM runs WHERE 1=1");
        let mut args: Vec<String> = Vec::new();
        if let Some(p) = &filter.provider {
            args.push(p.clone());
            sql.push_str(&format!(" AND provider = ?{}", args.len()));
        }
        if let Some(t) = &filter.task_type {
            args.push(t.clone());
            sql.push_str(&format!(" AND task_type = ?{}", args.len()));
        }
        if filter.failed {
            sql.push_str(" AND outcome NOT IN ('success', 'running')");
        }
        sql.push_str(" ORDER BY id DESC");
        if let Some(n) = filter.last {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        stmt.query_map(rusqlite::params_from_iter(args.iter()), record)
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))
    }
}

const COLUMNS: &str = "id, started_at, ended_at, provider, plugin_version, unit, task_type, profile, max_steps,
    max_steps_source, command, cwd, outcome, failure_slug, exit_code, child_exit_code, terminated_by,
    duration_ms, num_steps_reported, num_steps_computed, num_turns_reported, num_turns_computed,
    input_tokens, output_tokens, cost_usd, on_limit_decision";

fn record(r: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let command: String = r.get(10)?;
    Ok(RunRecord {
        id: r.get(0)?,
        started_at: r.get(1)?,
        ended_at: r.get(2)?,
        provider: r.get(3)?,
        plugin_version: r.get(4)?,
        unit: r.get(5)?,
        task_type: r.get(6)?,
        profile: r.get(7)?,
        max_steps: r.get(8)?,
        max_steps_source: r.get(9)?,
        command: serde_json::from_str(&command).unwrap_or_else(|_| vec![command]),
        cwd: r.get(11)?,
        outcome: r.get(12)?,
        failure_slug: r.get(13)?,
        exit_code: r.get(14)?,
        child_exit_code: r.get(15)?,
        terminated_by: r.get(16)?,
        duration_ms: r.get(17)?,
        num_steps_reported: r.get(18)?,
        num_steps_computed: r.get(19)?,
        num_turns_reported: r.get(20)?,
        num_turns_computed: r.get(21)?,
        input_tokens: r.get(22)?,
        output_tokens: r.get(23)?,
        cost_usd: r.get(24)?,
        on_limit_decision: r.get(25)?,
    })
}

enum Migrate {
    Newer(i64),
    Sqlite(rusqlite::Error),
}

impl From<rusqlite::Error> for Migrate {
    fn from(e: rusqlite::Error) -> Self {
        Migrate::Sqlite(e)
    }
}

/// Brings the database to `target`, one migration per immediate transaction.
fn migrate(conn: &mut Connection, target: i64) -> Result<(), Migrate> {
    loop {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // Re-read inside the write lock: another process may have migrated meanwhile.
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > SCHEMA_VERSION {
            return Err(Migrate::Newer(version));
        }
        if version >= target {
            return Ok(());
        }
        let index = usize::try_from(version).unwrap_or(0);
        tx.execute_batch(MIGRATIONS[index])?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
}

/// Opens a database at exactly `version` (for tests of migrations from older versions).
#[doc(hidden)]
pub fn create_at_version(path: &Path, version: i64) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open(path)?;
    migrate(&mut conn, version).map_err(|e| match e {
        Migrate::Sqlite(e) => e,
        Migrate::Newer(_) => rusqlite::Error::InvalidQuery,
    })?;
    Ok(conn)
}

/// Where the history database lives: `--db`/`STEPGUARD_DB` when given, else
/// `.stepguard/history.db` beside the config file in effect, else in the working directory.
pub fn default_location(
    explicit: Option<&Path>,
    project_dir: Option<&Path>,
    cwd: &Path,
) -> PathBuf {
    match explicit {
        Some(p) => p.to_path_buf(),
        None => project_dir
            .unwrap_or(cwd)
            .join(".stepguard")
            .join("history.db"),
    }
}

#[cfg(test)]
mod tests;
