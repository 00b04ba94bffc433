//! Where a run's record goes when it ends: the history database and the `--summary-file`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use stepguard_runner::{Progress, RunObserver, RunReport, RunStarted};
use stepguard_store::{NewRun, RunId, Store};

use crate::output;

/// Records the run in the history database: a `running` row at the start, the live step count
/// at most once a second, the whole record at the end. A history problem never stops the run:
/// enforcing the budget comes first, so it is reported and the run goes on unrecorded.
pub struct HistoryRecorder {
    path: Option<PathBuf>,
    row: Option<(Store, RunId)>,
    last_write: Option<Instant>,
    last_steps: u64,
}

impl HistoryRecorder {
    /// Records into the database at `path`; `None` records nothing (`--no-record`).
    pub fn new(path: Option<PathBuf>) -> Self {
        HistoryRecorder {
            path,
            row: None,
            last_write: None,
            last_steps: 0,
        }
    }

    fn begin(&mut self, run: NewRun) {
        let Some(path) = self.path.take() else { return };
        let opened = Store::open(&path).and_then(|store| {
            let id = store.begin_run(&run)?;
            Ok((store, id))
        });
        match opened {
            Ok(row) => {
                tracing::debug!(db = %path.display(), id = row.1, "recording the run");
                self.row = Some(row);
            }
            Err(e) => output::diag("warning", format!("not recording this run: {e}")),
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
            started_at: Some(humantime::format_rfc3339_millis(run.started_at).to_string()),
        });
    }

    fn tick(&mut self, p: &Progress) {
        let Some((store, id)) = &self.row else { return };
        let due = self
            .last_write
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if due && p.steps != self.last_steps {
            if let Err(e) = store.update_progress(*id, p.steps) {
                tracing::warn!("cannot record progress: {e}");
            }
            self.last_write = Some(Instant::now());
            self.last_steps = p.steps;
        }
    }

    fn finished(&mut self, report: &mut RunReport) {
        if self.row.is_none() {
            // A run that could not start is history too.
            let r = &report.record;
            self.begin(NewRun {
                provider: r.provider.clone(),
                plugin_version: r.plugin_version.clone(),
                unit: r.unit.clone(),
                task_type: r.task_type.clone(),
                profile: r.profile.clone(),
                max_steps: r.max_steps,
                max_steps_source: r.max_steps_source.clone(),
                command: r.command.clone().unwrap_or_default(),
                cwd: r.cwd.clone(),
                started_at: r.started_at.clone(),
            });
        }
        let Some((store, id)) = &self.row else { return };
        match store.finish_run(*id, &report.record) {
            Ok(()) => report.record.id = Some(*id),
            Err(e) => output::diag("warning", format!("cannot record the end of this run: {e}")),
        }
    }
}

/// Writes the run record as one JSON line to `--summary-file`.
pub struct SummaryFile(pub Option<PathBuf>);

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
