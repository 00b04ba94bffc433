//! The run history of stepguard: a SQLite store with versioned migrations.
//!
//! Every `stepguard run` is a row, written as `running` when the agent starts, updated with the
//! live step count as the run goes (the caller batches), and completed at the end. A row whose
//! supervising stepguard died is found on the next open and marked `interrupted`.
//!
//! Schema versions live in `PRAGMA user_version`. Migrations run on open, each in an immediate
//! transaction that re-reads the version, so concurrent first opens do not race, and no row is
//! rewritten by a migration except by version 8, which keeps every value. A database from a newer stepguard is refused before anything is
//! written to it. WAL mode and a busy timeout let many `stepguard run` processes share one file.
//!
//! * version 1: the runs table with turn-only metrics (`num_turns_reported`, `num_turns_computed`),
//!   as turn-based tools stored them;
//! * version 2: nullable `num_steps_reported` and `num_steps_computed` (NULL for older rows);
//! * version 3: the rest of the run record (`message`, `child_signal`, `breached_at_step`, noise
//!   and token details, `sub_agent_steps`), NULL for older rows;
//! * version 4: `plugin_source` and `containment`, NULL for older rows;
//! * version 5: `loops`, the loops found as JSON (NULL for older rows, and for runs without loop
//!   detection);
//! * version 6: `final_report` (the model's final text when the run wrapped up) and
//!   `model_calls` (model calls the gateway forwarded upstream), NULL for older rows, and for
//!   runs that did not wrap up or had no gateway;
//! * version 7: the token and cost budgets (`max_tokens`, `max_tokens_source`, `max_cost_usd`,
//!   `max_cost_usd_source`) and the token usage per sub-agent (`sub_agent_tokens`, as JSON),
//!   NULL for older rows, and for runs without such a budget or sub-agents. The run's own usage
//!   (input, output, cached input and reasoning output tokens, and the cost) is stored since
//!   versions 1 and 3;
//! * version 8: the record as one JSON column (`record`), beside the columns lists filter and
//!   sort on (`provider`, `task_type`, `outcome`, `started_at`) and the supervisor's identity.
//!   Every row of version 7 is read as version 7 read it and written as its record, so it reads
//!   back the same. From here on a new record field is a new key of the JSON, not a migration;
//!   a new value of one of the record's closed sets (`terminated_by`, `containment`, …) is a new
//!   schema version, so that an older stepguard refuses the file rather than a row;
//! * version 9: an index for every query the commands make (the `running` rows every open
//!   reads, the filters in id order, the groups of `stats`, the supervisor identity the spool
//!   imports by); no row is touched.
//! * version 10: the run's repository and directory as columns to filter on (`history --repo`,
//!   `--dir`), indexed; `directory` is filled from each row's recorded `cwd`, `repository` is
//!   NULL for older rows (it was not known). The ledger of pools keeps tables of its own in the
//!   same file, versioned apart (`stepguard-ledger`).
//!
//! A record the database does not take in time waits in the [`spool`] beside it; every open
//! imports it.
//!
//! Rows are read back as [`RunRecord`], the same shape every stepguard command emits.
//!
//! ```
//! # let dir = tempfile::tempdir().unwrap();
//! use stepguard_store::{NewRun, Store};
//! let store = Store::open(&dir.path().join("history.db")).unwrap();
//! let id = store.begin_run(&NewRun { provider: "codex".into(), ..NewRun::default() }).unwrap();
//! assert_eq!(store.get(id).unwrap().unwrap().verdict.outcome.as_str(), "running");
//! ```
#![forbid(unsafe_code)]

mod export;
mod figure;
mod pool_stats;
pub mod spool;
mod stats;
mod v7;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension as _, Row, params};
use stepguard_core::Outcome;
use stepguard_core::record::{Invocation, Source, StepBudget};

pub use stepguard_core::RunRecord;

pub use pool_stats::PoolStats;
pub use stats::{
    AfterNotice, CostSpread, GroupStats, Spread, StatsReport, compute_stats, percentile,
};

/// The query `mark_dead_runs` makes at every open: this host's `running` rows (index
/// `runs_running`, which holds only them).
const RUNNING_ROWS: &str = "SELECT id, supervisor_boot_id, supervisor_pid, supervisor_start_ticks
    FROM runs WHERE outcome = 'running' AND supervisor_host = ?1";

/// The SQL migrations to schema version 7 (one column per record field), in order; index + 1
/// is the version each one brings the database to. Frozen: version 8 ([`to_v8`]) turns the
/// columns into one JSON record.
pub const MIGRATIONS_TO_V7: &[&str] = &[
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
    // 3: the rest of the run record, nullable (older rows did not know them).
    "ALTER TABLE runs ADD COLUMN message TEXT;
     ALTER TABLE runs ADD COLUMN child_signal INTEGER;
     ALTER TABLE runs ADD COLUMN breached_at_step INTEGER;
     ALTER TABLE runs ADD COLUMN noise_lines INTEGER;
     ALTER TABLE runs ADD COLUMN unknown_events INTEGER;
     ALTER TABLE runs ADD COLUMN oversized_lines INTEGER;
     ALTER TABLE runs ADD COLUMN truncated_last_line INTEGER;
     ALTER TABLE runs ADD COLUMN cached_input_tokens INTEGER;
     ALTER TABLE runs ADD COLUMN reasoning_output_tokens INTEGER;
     ALTER TABLE runs ADD COLUMN sub_agent_steps TEXT;",
    // 4: where the provider came from, and how the run was contained.
    "ALTER TABLE runs ADD COLUMN plugin_source TEXT;
     ALTER TABLE runs ADD COLUMN containment TEXT;",
    // 5: the loops found, as the record's JSON array; NULL when detection was off.
    "ALTER TABLE runs ADD COLUMN loops TEXT;",
    // 6: the model gateway's figures: the final report of a wrapped-up run, and the model calls
    // forwarded upstream; NULL when the run did not wrap up or had no gateway.
    "ALTER TABLE runs ADD COLUMN final_report TEXT;
     ALTER TABLE runs ADD COLUMN model_calls INTEGER;",
    // 7: the token and cost budgets with where they came from, and the token usage per
    // sub-agent as the record's JSON object; NULL when the run had no such budget (or none was
    // known: older rows) and no sub-agents.
    "ALTER TABLE runs ADD COLUMN max_tokens INTEGER;
     ALTER TABLE runs ADD COLUMN max_tokens_source TEXT;
     ALTER TABLE runs ADD COLUMN max_cost_usd REAL;
     ALTER TABLE runs ADD COLUMN max_cost_usd_source TEXT;
     ALTER TABLE runs ADD COLUMN sub_agent_tokens TEXT;",
];

/// Version 8: the run record as one JSON column (`record`), beside the columns that lists
/// filter and sort on (`provider`, `task_type`, `outcome`, `started_at`) and the supervisor's
/// identity (which decides whether a `running` row's stepguard is still alive). Adding a record
/// field changes nothing here.
const V8_TABLE: &str = "CREATE TABLE runs_v8 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at TEXT NOT NULL,
        provider TEXT NOT NULL,
        task_type TEXT,
        outcome TEXT NOT NULL,
        supervisor_host TEXT,
        supervisor_boot_id TEXT,
        supervisor_pid INTEGER,
        supervisor_start_ticks INTEGER,
        record TEXT NOT NULL
    );";

/// Version 9: an index for every query the commands make, so that no command reads the whole
/// table to answer about a few rows: the `running` rows of a host (read by every open), the
/// `--provider` and `--task-type` filters in id order, and the (provider, task type) groups of
/// `stats`, and the supervisor identity a spooled run is imported by ([`spool`]). No row is
/// touched.
const V9_INDEXES: &str = "DROP INDEX IF EXISTS runs_by_provider;
    CREATE INDEX runs_by_provider ON runs (provider);
    CREATE INDEX runs_by_group ON runs (provider, task_type);
    CREATE INDEX runs_by_task_type ON runs (task_type);
    CREATE INDEX runs_running ON runs (supervisor_host) WHERE outcome = 'running';
    CREATE INDEX runs_by_supervisor ON runs (supervisor_pid, supervisor_start_ticks);";

/// Version 10: the repository and directory of each run, as columns to filter on; the directory
/// of older rows is their recorded `cwd`.
const V10_COLUMNS: &str = "ALTER TABLE runs ADD COLUMN repository TEXT;
    ALTER TABLE runs ADD COLUMN directory TEXT;
    UPDATE runs SET directory = json_extract(record, '$.cwd');
    CREATE INDEX runs_by_repository ON runs (repository);
    CREATE INDEX runs_by_directory ON runs (directory);";

/// The newest schema version this stepguard knows.
pub const SCHEMA_VERSION: i64 = 10;

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
    /// The git repository of the working directory (remote URL or top-level path).
    pub repository: Option<String>,
    /// Start time (RFC 3339, UTC); now when not given.
    pub started_at: Option<String>,
}

/// Which runs to list.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this provider.
    pub provider: Option<String>,
    /// Only this task type.
    pub task_type: Option<String>,
    /// Only runs in this repository (remote URL or top-level path, as recorded).
    pub repository: Option<String>,
    /// Only runs whose working directory is this one.
    pub directory: Option<String>,
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
    /// Opens (creating if needed) the database at `path`, migrates it, imports the runs spooled
    /// beside it ([`spool`]), and marks runs whose stepguard died as `interrupted`.
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
        spool::import(&mut conn, path).map_err(sql)?;
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
        let mut record = RunRecord::new(run.provider.clone(), Outcome::Running);
        record.source.plugin_version.clone_from(&run.plugin_version);
        record.source.unit.clone_from(&run.unit);
        record.source.task_type.clone_from(&run.task_type);
        record.source.profile.clone_from(&run.profile);
        record.step_budget = StepBudget {
            max_steps: run.max_steps,
            max_steps_source: run.max_steps_source.clone(),
        };
        record.invocation.command = Some(run.command.clone());
        record.invocation.cwd.clone_from(&run.cwd);
        record.invocation.started_at = Some(run.started_at.clone().unwrap_or_else(now));
        self.conn
            .execute(
                "INSERT INTO runs (started_at, provider, task_type, outcome, supervisor_host,
                    supervisor_boot_id, supervisor_pid, supervisor_start_ticks, record,
                    repository, directory)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    record.invocation.started_at,
                    record.source.provider,
                    record.source.task_type,
                    record.verdict.outcome.as_str(),
                    me.as_ref().map(|s| s.host.clone()),
                    me.as_ref().map(|s| s.boot_id.clone()),
                    me.as_ref().map(|s| s.pid),
                    me.as_ref().map(|s| s.start_ticks as i64),
                    to_json(&record),
                    run.repository,
                    record.invocation.cwd,
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Updates the live step count of a running run.
    pub fn update_progress(&self, id: RunId, steps_computed: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE runs SET record = json_set(record, '$.num_steps_computed', ?2)
                 WHERE id = ?1 AND outcome = 'running'",
                params![id, steps_computed as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Completes a run with its record; the row keeps the start fields [`Store::begin_run`] wrote
    /// (provider, plugin version, unit, task type, profile, step budget, command, working
    /// directory, start time). A record names no file and no id: the row's id is its id.
    pub fn finish_run(&self, id: RunId, run: &RunRecord) -> Result<(), StoreError> {
        let Some(started) = self.get(id)? else {
            return Ok(());
        };
        let mut record = run.clone();
        record.id = None;
        record.file = None;
        record.schema_version = stepguard_core::RECORD_SCHEMA_VERSION;
        let outcome = record.verdict.outcome;
        record.source = Source {
            plugin_source: record.source.plugin_source.take(),
            ..started.source
        };
        record.step_budget = started.step_budget;
        record.invocation = Invocation {
            ended_at: Some(record.invocation.ended_at.take().unwrap_or_else(now)),
            duration_ms: record.invocation.duration_ms,
            ..started.invocation
        };
        self.conn
            .execute(
                "UPDATE runs SET outcome = ?2, record = ?3 WHERE id = ?1",
                params![id, outcome.as_str(), to_json(&record)],
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
        let mut stmt = self.conn.prepare(RUNNING_ROWS).map_err(|e| self.err(e))?;
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
                        "UPDATE runs SET outcome = 'interrupted', record = json_set(record,
                            '$.outcome', 'interrupted', '$.error_type', 'interrupted',
                            '$.ended_at', ?2)
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
            .query_row("SELECT id, record FROM runs WHERE id = ?1", [id], record)
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Returns runs matching `filter`, newest first.
    pub fn list(&self, filter: &Filter) -> Result<Vec<RunRecord>, StoreError> {
        let mut records = Vec::new();
        self.each(filter, Order::NewestFirst, |r| {
            records.push(r);
            Ok::<(), std::convert::Infallible>(())
        })?
        .map_err(|never| match never {})?;
        Ok(records)
    }

    /// Calls `f` with each run matching `filter`, one row at a time (only one record is in
    /// memory at once), in `order`; with [`Filter::last`], the newest ones. Stops at the first
    /// error of `f` and returns it, inside.
    pub fn each<E>(
        &self,
        filter: &Filter,
        order: Order,
        mut f: impl FnMut(RunRecord) -> Result<(), E>,
    ) -> Result<Result<(), E>, StoreError> {
        let (sql, args) = list_sql(filter, order);
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(args.iter()))
            .map_err(|e| self.err(e))?;
        while let Some(row) = rows.next().map_err(|e| self.err(e))? {
            if let Err(e) = f(record(row).map_err(|e| self.err(e))?) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Calls `f` with each run matching `filter` as one line of JSON (no newline), the record
    /// with its id, one row at a time, in `order`: what [`Store::each`] gives, serialized. A
    /// record is written as stored when that is byte for byte what reading and serializing it
    /// would give (see `export.rs`), so that a million runs cost little more than reading them.
    /// Stops at the first error of `f` and returns it, inside.
    pub fn export<E>(
        &self,
        filter: &Filter,
        order: Order,
        mut f: impl FnMut(&str) -> Result<(), E>,
    ) -> Result<Result<(), E>, StoreError> {
        let (sql, args) = list_sql(filter, order);
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(args.iter()))
            .map_err(|e| self.err(e))?;
        let mut exporter = export::Exporter::new();
        while let Some(row) = rows.next().map_err(|e| self.err(e))? {
            let line = export::line(row, &mut exporter).map_err(|e| self.err(e))?;
            if let Err(e) = f(line) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Computes the figures of `stats` in the database (running rows are left out), in bounded
    /// memory: each record read once into a temporary table of figures, then counts by SQL and
    /// percentiles over sorted cursors. The same figures as
    /// [`compute_stats`] over the same records.
    pub fn stats(&self, provider: Option<&str>) -> Result<StatsReport, StoreError> {
        stats::in_sql(&self.conn, provider).map_err(|e| self.err(e))
    }

    /// Inserts finished records as they are, in one transaction with one prepared statement
    /// (bulk loads: imports, benchmarks); returns how many. The rows name no supervisor, so
    /// a `running` record stays `running`; their directory is the record's `cwd`, their
    /// repository unknown.
    pub fn insert_records(
        &mut self,
        records: impl IntoIterator<Item = RunRecord>,
    ) -> Result<usize, StoreError> {
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        let n = insert_in(&tx, records).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(n)
    }
}

/// Inserts finished records as they are through one prepared statement, in `tx`.
fn insert_in(
    tx: &rusqlite::Transaction<'_>,
    records: impl IntoIterator<Item = RunRecord>,
) -> rusqlite::Result<usize> {
    let mut insert = tx.prepare(
        "INSERT INTO runs (started_at, provider, task_type, outcome, record,
            repository, directory)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut n = 0;
    for mut r in records {
        r.id = None;
        r.file = None;
        let started = r.invocation.started_at.clone().unwrap_or_else(now);
        insert.execute(params![
            started,
            r.source.provider,
            r.source.task_type,
            r.verdict.outcome.as_str(),
            to_json(&r),
            None::<String>,
            r.invocation.cwd,
        ])?;
        n += 1;
    }
    Ok(n)
}

/// The order [`Store::each`] gives runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Highest id first (`history`).
    NewestFirst,
    /// Lowest id first (`history export`).
    OldestFirst,
}

/// The query of a list: the SQL and its arguments. Each filter has an index that keeps id
/// order (`runs_by_provider`, `runs_by_group`, `runs_by_task_type`), so `--last N` reads N rows.
fn list_sql(filter: &Filter, order: Order) -> (String, Vec<String>) {
    let mut sql = "SELECT id, record FROM runs WHERE 1=1".to_owned();
    let mut args: Vec<String> = Vec::new();
    if let Some(p) = &filter.provider {
        args.push(p.clone());
        sql.push_str(&format!(" AND provider = ?{}", args.len()));
    }
    if let Some(t) = &filter.task_type {
        args.push(t.clone());
        sql.push_str(&format!(" AND task_type = ?{}", args.len()));
    }
    if let Some(r) = &filter.repository {
        args.push(r.clone());
        sql.push_str(&format!(" AND repository = ?{}", args.len()));
    }
    if let Some(d) = &filter.directory {
        args.push(d.clone());
        sql.push_str(&format!(" AND directory = ?{}", args.len()));
    }
    if filter.failed {
        sql.push_str(" AND outcome NOT IN ('success', 'running')");
    }
    sql.push_str(" ORDER BY id DESC");
    if let Some(n) = filter.last {
        sql.push_str(&format!(" LIMIT {n}"));
    }
    if order == Order::OldestFirst {
        sql = format!("SELECT id, record FROM ({sql}) ORDER BY id");
    }
    (sql, args)
}

/// The record as stored: its JSON.
fn to_json(record: &RunRecord) -> String {
    // A record of strings, numbers and maps of them always serializes.
    serde_json::to_string(record).unwrap_or_default()
}

/// Reads `id, record` as a run record with its id.
fn record(r: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let json: String = r.get(1)?;
    let mut record: RunRecord = serde_json::from_str(&json).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e))
    })?;
    record.id = r.get(0)?;
    Ok(record)
}

/// Version 8: every row's columns become one JSON record ([`V8_TABLE`]), read the way version
/// 7 read them, so every migrated row reads back as it did.
fn to_v8(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(V8_TABLE)?;
    let sql = format!(
        "SELECT {}, supervisor_host, supervisor_boot_id, supervisor_pid, supervisor_start_ticks
         FROM runs ORDER BY id",
        v7::COLUMNS
    );
    let mut select = tx.prepare(&sql)?;
    let mut insert = tx.prepare(
        "INSERT INTO runs_v8 (id, started_at, provider, task_type, outcome, supervisor_host,
            supervisor_boot_id, supervisor_pid, supervisor_start_ticks, record)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    let supervisor = v7::COLUMN_COUNT;
    let mut rows = select.query([])?;
    while let Some(row) = rows.next()? {
        let mut record = v7::record(row)?;
        let id = record.id.take();
        insert.execute(params![
            id,
            record.invocation.started_at,
            record.source.provider,
            record.source.task_type,
            record.verdict.outcome.as_str(),
            row.get::<_, Option<String>>(supervisor)?,
            row.get::<_, Option<String>>(supervisor + 1)?,
            row.get::<_, Option<i64>>(supervisor + 2)?,
            row.get::<_, Option<i64>>(supervisor + 3)?,
            to_json(&record),
        ])?;
    }
    drop(rows);
    drop(select);
    drop(insert);
    // Ids are never reused: the new table continues the old one's sequence.
    tx.execute_batch(
        "UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'runs'))
             WHERE name = 'runs_v8';
         DROP TABLE runs;
         ALTER TABLE runs_v8 RENAME TO runs;
         CREATE INDEX runs_by_provider ON runs (provider, task_type, started_at);",
    )
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
        match (MIGRATIONS_TO_V7.get(index), version) {
            (Some(sql), _) => tx.execute_batch(sql)?,
            (None, 7) => to_v8(&tx)?,
            (None, 8) => tx.execute_batch(V9_INDEXES)?,
            (None, _) => tx.execute_batch(V10_COLUMNS)?,
        }
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
/// `stepguard/history.db` in the user's data directory (`data_dir`, `$XDG_DATA_HOME` or
/// `~/.local/share`), one history for every run of the user, so that pools see them all.
pub fn default_location(explicit: Option<&Path>, data_dir: &Path) -> PathBuf {
    match explicit {
        Some(p) => p.to_path_buf(),
        None => data_dir.join("stepguard").join("history.db"),
    }
}

/// Where stepguard before version 10 of the history kept it by default: `.stepguard/history.db`
/// beside the config file in effect, else in the working directory. Such a file is imported
/// into the user's history ([`Store::import_legacy`]).
pub fn legacy_location(project_dir: Option<&Path>, cwd: &Path) -> PathBuf {
    project_dir
        .unwrap_or(cwd)
        .join(".stepguard")
        .join("history.db")
}

/// The suffix a project database gets once imported, so that it is imported once.
pub const IMPORTED_SUFFIX: &str = "imported";

impl Store {
    /// Imports every run of the project database at `old` (the default location before the
    /// history moved to the user's data directory), in one transaction, then renames `old` to
    /// `old.imported` so that it is never imported twice; returns how many runs came, or `None`
    /// when another stepguard imported it first. The user's database's write lock is taken
    /// before `old` is looked at, so stepguards starting together import it once. Runs keep
    /// their records (a new id each); a run the old file still shows `running` is imported as
    /// it is and judged by the next open.
    pub fn import_legacy(&mut self, old: &Path) -> Result<Option<usize>, StoreError> {
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        if !old.is_file() {
            return Ok(None);
        }
        let source = Store::open(old)?;
        let mut records = Vec::new();
        source
            .each(&Filter::default(), Order::OldestFirst, |r| {
                records.push(r);
                Ok::<(), std::convert::Infallible>(())
            })?
            .map_err(|never| match never {})?;
        drop(source);
        let n = insert_in(&tx, records).map_err(err)?;
        let renamed = old.with_extension(format!("db.{IMPORTED_SUFFIX}"));
        std::fs::rename(old, &renamed).map_err(|source| StoreError::Io {
            path: old.display().to_string(),
            source,
        })?;
        if let Err(e) = tx.commit() {
            // Not imported after all: the project database goes back where it was.
            let _ = std::fs::rename(&renamed, old);
            return Err(err(e));
        }
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests;
