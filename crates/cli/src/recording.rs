//! Where a run's record goes when it ends: the history database and the `--summary-file`.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use stepguard_core::RunRecord;
use stepguard_runner::{Progress, RunObserver, RunReport, RunStarted};
use stepguard_store::{NewRun, RunId, Store};

use crate::output;

/// How long the end of a run waits for the history database before exiting anyway.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// The writer's answer at the end: the row's id (none when nothing was recorded), or why not.
type Finished = Result<Option<RunId>, String>;

/// What the recorder asks its writer thread to do.
enum Write {
    Begin(Box<NewRun>),
    Progress(u64),
    Finish(Box<RunRecord>),
}

/// Records the run in the history database from a writer thread of its own, so that SQLite
/// (a lock another process holds, a slow disk) never sits on the enforcement path: a `running`
/// row at the start, the live step count at most once a second, the whole record at the end.
/// A history problem never stops the run; it is reported, and the end of a run waits for the
/// database at most `FINISH_WAIT`, and never past the run's exit bound (`RunReport::exit_by`). A
/// record the database did not take by then (or could not take) is written to the spool beside
/// it, which the next stepguard to open the database imports (completing the `running` row, or
/// adding the run when not even that was written).
pub(crate) struct HistoryRecorder {
    path: Option<PathBuf>,
    /// The database, for the spool beside it.
    db: Option<PathBuf>,
    writer: Option<(Sender<Write>, Receiver<Finished>)>,
    last_write: Option<Instant>,
    last_steps: u64,
    /// The git repository of the run, a column to filter on.
    repository: Option<String>,
    /// The row's id, as soon as the writer has one (a checkpoint is named by it).
    row_id: Arc<OnceLock<RunId>>,
}

impl HistoryRecorder {
    /// Records into the database at `path`; `None` records nothing (`--no-record`).
    pub(crate) fn new(path: Option<PathBuf>, repository: Option<String>) -> Self {
        HistoryRecorder {
            db: path.clone(),
            path,
            writer: None,
            last_write: None,
            last_steps: 0,
            repository,
            row_id: Arc::default(),
        }
    }

    /// The row's id, filled as soon as the writer has written the `running` row.
    pub(crate) fn row_id(&self) -> Arc<OnceLock<RunId>> {
        Arc::clone(&self.row_id)
    }

    fn begin(&mut self, run: NewRun) {
        let Some(path) = self.path.take() else { return };
        let (tx, rx) = mpsc::channel::<Write>();
        let (done_tx, done) = mpsc::channel();
        let row_id = Arc::clone(&self.row_id);
        let spawned = std::thread::Builder::new()
            .name("stepguard-history".into())
            .spawn(move || write_history(&path, &rx, &done_tx, &row_id));
        match spawned {
            Ok(_) => {
                let _ = tx.send(Write::Begin(Box::new(run)));
                self.writer = Some((tx, done));
            }
            Err(e) => output::diag("warning", format!("not recording this run: {e}")),
        }
    }
}

/// The writer thread: opens the database, writes the row, and answers the end with the row's
/// id (or why there is none).
fn write_history(
    path: &std::path::Path,
    jobs: &Receiver<Write>,
    done: &Sender<Finished>,
    row_id: &OnceLock<RunId>,
) {
    let mut row: Option<(Store, RunId)> = None;
    let mut failure: Option<String> = None;
    for job in jobs {
        match job {
            Write::Begin(run) => {
                match Store::open(path).and_then(|store| {
                    let id = store.begin_run(&run)?;
                    Ok((store, id))
                }) {
                    Ok(opened) => {
                        tracing::debug!(db = %path.display(), id = opened.1, "recording the run");
                        let _ = row_id.set(opened.1);
                        row = Some(opened);
                    }
                    Err(e) => failure = Some(format!("not recording this run: {e}")),
                }
            }
            Write::Progress(steps) => {
                if let Some((store, id)) = &row
                    && let Err(e) = store.update_progress(*id, steps)
                {
                    tracing::warn!("cannot record progress: {e}");
                }
            }
            Write::Finish(record) => {
                let answer = match (&row, failure.take()) {
                    (_, Some(why)) => Err(why),
                    (Some((store, id)), None) => store
                        .finish_run(*id, &record)
                        .map(|()| Some(*id))
                        .map_err(|e| format!("cannot record the end of this run: {e}")),
                    (None, None) => Ok(None),
                };
                let _ = done.send(answer);
                return;
            }
        }
    }
}

impl RunObserver for HistoryRecorder {
    fn started(&mut self, run: &RunStarted<'_>) {
        self.begin(NewRun {
            provider: run.meta.provider.clone(),
            plugin_version: run.meta.plugin_version.clone(),
            unit: run.meta.unit.clone(),
            task_type: run.meta.task_type.clone(),
            profile: run.meta.profile.clone(),
            max_steps: run.budget.get(),
            max_steps_source: Some(run.budget_source.to_owned()),
            command: run.command.to_vec(),
            cwd: run.meta.cwd.clone(),
            repository: self.repository.clone(),
            started_at: Some(humantime::format_rfc3339_millis(run.started_at).to_string()),
        });
    }

    fn tick(&mut self, p: &Progress) {
        let Some((writer, _)) = &self.writer else {
            return;
        };
        let due = self
            .last_write
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if due && p.steps != self.last_steps {
            // Queued, never waited for: the writer catches up when the database lets it.
            let _ = writer.send(Write::Progress(p.steps));
            self.last_write = Some(Instant::now());
            self.last_steps = p.steps;
        }
    }

    fn finished(&mut self, report: &mut RunReport) {
        if self.writer.is_none() {
            // A run that could not start is history too.
            let r = &report.record;
            self.begin(NewRun {
                provider: r.source.provider.clone(),
                plugin_version: r.source.plugin_version.clone(),
                unit: r.source.unit.clone(),
                task_type: r.source.task_type.clone(),
                profile: r.source.profile.clone(),
                max_steps: r.step_budget.max_steps,
                max_steps_source: r.step_budget.max_steps_source.clone(),
                command: r.invocation.command.clone().unwrap_or_default(),
                cwd: r.invocation.cwd.clone(),
                repository: self.repository.clone(),
                started_at: r.invocation.started_at.clone(),
            });
        }
        let Some((writer, done)) = self.writer.take() else {
            return;
        };
        let _ = writer.send(Write::Finish(Box::new(report.record.clone())));
        // Within the run's one exit bound, and never more than FINISH_WAIT.
        let wait = report
            .exit_by
            .saturating_duration_since(Instant::now())
            .min(FINISH_WAIT);
        let why = match done.recv_timeout(wait) {
            Ok(Ok(id)) => {
                report.record.id = id;
                return;
            }
            Ok(Err(why)) => why,
            Err(_) => format!(
                "the history database did not answer within {}",
                humantime::format_duration(Duration::from_millis(wait.as_millis() as u64))
            ),
        };
        self.spool(why, &report.record);
    }
}

impl HistoryRecorder {
    /// Keeps the record of a run the database did not take in the spool beside it, which the
    /// next stepguard to open the database imports; says where, or that the record is lost.
    fn spool(&self, why: String, record: &RunRecord) {
        let Some(db) = &self.db else { return };
        let said = match stepguard_store::spool::write(db, record) {
            Ok(file) => format!(
                "{why}; this run's record is kept in {} and the next stepguard to open the database adds it",
                file.display()
            ),
            Err(e) => format!(
                "{why}; this run's record is lost: cannot write it to {}: {e}",
                stepguard_store::spool::dir(db).display()
            ),
        };
        output::diag("warning", said);
    }
}

/// Writes the run record as one JSON line to `--summary-file`.
pub(crate) struct SummaryFile(pub Option<PathBuf>);

impl RunObserver for SummaryFile {
    fn finished(&mut self, report: &mut RunReport) {
        let Some(path) = &self.0 else { return };
        let written = serde_json::to_vec(&report.record)
            .map_err(std::io::Error::other)
            .and_then(|mut json| {
                json.push(b'\n');
                std::fs::write(path, json)
            });
        if let Err(e) = written {
            output::diag(
                "warning",
                format!("cannot write the summary file {}: {e}", path.display()),
            );
        }
    }
}
