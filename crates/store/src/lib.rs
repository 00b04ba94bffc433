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
//!   versions 1 and 3.
//!
//! Rows are read back as [`RunRecord`], the same shape every stepguard command emits.
//!
//! ```
//! # let dir = tempfile::tempdir().unwrap();
//! use stepguard_store::{NewRun, Store};
//! let store = Store::open(&dir.path().join("history.db")).unwrap();
//! let id = store.begin_run(&NewRun { provider: "codex".into(), ..NewRun::default() }).unwrap();
//! assert_eq!(store.get(id).unwrap().unwrap().outcome.as_str(), "running");
//! ```
#![forbid(unsafe_code)]

mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension as _, Row, params};
use stepguard_core::{Outcome, TokenUsage};

pub use stepguard_core::RunRecord;

pub use stats::{CostSpread, GroupStats, Spread, StatsReport, compute_stats, percentile};

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
                    run.started_at.clone().unwrap_or_else(now),
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

    /// Completes a run with its record; the row keeps the start fields [`Store::begin_run`] wrote.
    ///
    /// The token and cost budgets (`max_tokens`, `max_cost_usd` and their sources) are written
    /// here, from the record, so a row reads them as null while it is `running` (and when its
    /// stepguard died before the end).
    pub fn finish_run(&self, id: RunId, run: &RunRecord) -> Result<(), StoreError> {
        let i = |v: Option<u64>| v.map(|v| v as i64);
        let tokens = run.tokens;
        let decisions =
            (!run.on_limit_decisions.is_empty()).then(|| run.on_limit_decisions.join(","));
        let sub_agents = run
            .sub_agent_steps
            .as_ref()
            .and_then(|m| serde_json::to_string(m).ok());
        let loops = run
            .loops
            .as_ref()
            .and_then(|l| serde_json::to_string(l).ok());
        let sub_agent_tokens = run
            .sub_agent_tokens
            .as_ref()
            .and_then(|m| serde_json::to_string(m).ok());
        self.conn
            .execute(
                "UPDATE runs SET ended_at = ?2, outcome = ?3, failure_slug = ?4, exit_code = ?5,
                    child_exit_code = ?6, terminated_by = ?7, duration_ms = ?8, num_steps_reported = ?9,
                    num_steps_computed = ?10, num_turns_reported = ?11, num_turns_computed = ?12,
                    input_tokens = ?13, output_tokens = ?14, cost_usd = ?15, on_limit_decision = ?16,
                    message = ?17, child_signal = ?18, breached_at_step = ?19, noise_lines = ?20,
                    unknown_events = ?21, oversized_lines = ?22, truncated_last_line = ?23,
                    cached_input_tokens = ?24, reasoning_output_tokens = ?25, sub_agent_steps = ?26,
                    plugin_source = ?27, containment = ?28, loops = ?29, final_report = ?30,
                    model_calls = ?31, max_tokens = ?32, max_tokens_source = ?33,
                    max_cost_usd = ?34, max_cost_usd_source = ?35, sub_agent_tokens = ?36
                 WHERE id = ?1",
                params![
                    id,
                    run.ended_at.clone().unwrap_or_else(now),
                    run.outcome.as_str(),
                    run.error_type,
                    run.exit_code,
                    run.child_exit_code,
                    run.terminated_by,
                    i(run.duration_ms),
                    i(run.num_steps_reported),
                    i(run.num_steps_computed),
                    i(run.num_turns_reported),
                    i(run.num_turns_computed),
                    i(tokens.map(|t| t.input_tokens)),
                    i(tokens.map(|t| t.output_tokens)),
                    run.cost_usd,
                    decisions,
                    run.message,
                    run.child_signal,
                    i(run.breached_at_step),
                    i(run.noise_lines),
                    i(run.unknown_events),
                    i(run.oversized_lines),
                    run.truncated_last_line,
                    i(tokens.and_then(|t| t.cached_input_tokens)),
                    i(tokens.and_then(|t| t.reasoning_output_tokens)),
                    sub_agents,
                    run.plugin_source,
                    run.containment,
                    loops,
                    run.final_report,
                    i(run.model_calls),
                    i(run.max_tokens),
                    run.max_tokens_source,
                    run.max_cost_usd,
                    run.max_cost_usd_source,
                    sub_agent_tokens,
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
    input_tokens, output_tokens, cost_usd, on_limit_decision, message, child_signal, breached_at_step,
    noise_lines, unknown_events, oversized_lines, truncated_last_line, cached_input_tokens,
    reasoning_output_tokens, sub_agent_steps, plugin_source, containment, loops, final_report,
    model_calls, max_tokens, max_tokens_source, max_cost_usd, max_cost_usd_source, sub_agent_tokens";

/// Reads one row as a run record; counts stored as SQLite integers come back unsigned.
fn record(r: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let n = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?
            .and_then(|v| u64::try_from(v).ok()))
    };
    let command: String = r.get(10)?;
    let outcome: String = r.get(12)?;
    let decisions: Option<String> = r.get(25)?;
    let sub_agents: Option<String> = r.get(35)?;
    let tokens = match (n(22)?, n(23)?) {
        (Some(input_tokens), Some(output_tokens)) => Some(TokenUsage {
            input_tokens,
            output_tokens,
            cached_input_tokens: n(33)?,
            reasoning_output_tokens: n(34)?,
        }),
        _ => None,
    };
    // Outcomes are written by this crate only; an unreadable one is shown as a failed run.
    let mut rec = RunRecord::new(
        r.get::<_, String>(3)?,
        outcome.parse().unwrap_or(Outcome::Failed),
    );
    rec.id = r.get(0)?;
    rec.started_at = r.get(1)?;
    rec.ended_at = r.get(2)?;
    rec.plugin_version = r.get(4)?;
    rec.unit = r.get(5)?;
    rec.task_type = r.get(6)?;
    rec.profile = r.get(7)?;
    rec.max_steps = r
        .get::<_, Option<i64>>(8)?
        .and_then(|v| u32::try_from(v).ok());
    rec.max_steps_source = r.get(9)?;
    rec.command = Some(serde_json::from_str(&command).unwrap_or_else(|_| vec![command]));
    rec.cwd = r.get(11)?;
    rec.error_type = r.get(13)?;
    rec.exit_code = r.get(14)?;
    rec.child_exit_code = r.get(15)?;
    rec.terminated_by = r.get(16)?;
    rec.duration_ms = n(17)?;
    rec.num_steps_reported = n(18)?;
    rec.num_steps_computed = n(19)?;
    rec.num_turns_reported = n(20)?;
    rec.num_turns_computed = n(21)?;
    rec.tokens = tokens;
    rec.cost_usd = r.get(24)?;
    // Stored comma-joined; decisions (`stop`, `allow:N`, `continue`) never contain a comma.
    rec.on_limit_decisions = decisions
        .map(|d| {
            d.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    rec.message = r.get(26)?;
    rec.child_signal = r.get(27)?;
    rec.breached_at_step = n(28)?;
    rec.noise_lines = n(29)?;
    rec.unknown_events = n(30)?;
    rec.oversized_lines = n(31)?;
    rec.truncated_last_line = r.get(32)?;
    rec.sub_agent_steps = sub_agents.and_then(|s| serde_json::from_str(&s).ok());
    rec.plugin_source = r.get(36)?;
    rec.containment = r.get(37)?;
    rec.loops = r
        .get::<_, Option<String>>(38)?
        .and_then(|s| serde_json::from_str(&s).ok());
    rec.final_report = r.get(39)?;
    rec.model_calls = n(40)?;
    rec.max_tokens = n(41)?;
    rec.max_tokens_source = r.get(42)?;
    rec.max_cost_usd = r.get(43)?;
    rec.max_cost_usd_source = r.get(44)?;
    rec.sub_agent_tokens = r
        .get::<_, Option<String>>(45)?
        .and_then(|s| serde_json::from_str(&s).ok());
    Ok(rec)
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
