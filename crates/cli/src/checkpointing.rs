//! `--checkpoint git`: the work tree of a run that does not succeed, saved as a commit on
//! `refs/stepguard/runs/ID` after its tree is stopped ([`stepguard_checkpoint`]), named in the
//! record, `show` and after the summary line.
//!
//! The run's id is its history id when the history has one by the end (the `running` row is
//! written at the start); else (`--no-record`, a history database that did not answer) a run
//! key, `run-YYYYMMDDTHHMMSSZ-PID`, from the run's start and stepguard's pid.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use stepguard_checkpoint::{Change, CheckpointError, Saved, Settings, Start};
use stepguard_config::LoadedConfig;
use stepguard_core::checkpoint::{
    ChangedPath, Checkpoint, LeftOutPath, MAX_LISTED_CHANGES, PathChange,
};
use stepguard_core::{Outcome, RunRecord};
use stepguard_runner::{RunObserver, RunReport, RunStarted};

use crate::args::{CheckpointKind, RunArgs};

/// The checkpoint settings of a run: `--checkpoint`, else `[run] checkpoint`; off by default.
pub(crate) fn settings(args: &RunArgs, config: &LoadedConfig) -> Option<Settings> {
    let c = &config.model.checkpoint;
    let on = match args.checkpoint {
        Some(kind) => kind == CheckpointKind::Git,
        None => c.kind.as_ref().is_some_and(|(k, _)| k == "git"),
    };
    on.then(|| {
        let mut s = Settings::default();
        if let Some((mb, _)) = c.max_file_mb {
            s.max_file_bytes = mb.saturating_mul(1024 * 1024);
        }
        if let Some((bound, _)) = c.timeout {
            s.bound = bound;
        }
        s
    })
}

/// The observer that takes the checkpoint: it reads the work tree as the run starts, on a
/// thread of its own, and saves it at the end of a run that did not succeed, before the history records
/// the run (so the record names the ref). Its time is added to the run's exit bound, so the
/// record keeps its own share.
pub(crate) struct Checkpointer {
    dir: PathBuf,
    settings: Settings,
    history_id: Arc<OnceLock<i64>>,
    start: Option<Receiver<Start>>,
    key: String,
}

impl Checkpointer {
    /// Checkpoints `dir`; `history_id` is filled by the history recorder when it has a row.
    /// Starts reading the work tree at once, on a thread of its own, so the read is well under
    /// way (usually done) before the agent starts writing.
    pub(crate) fn new(dir: PathBuf, settings: Settings, history_id: Arc<OnceLock<i64>>) -> Self {
        let (tx, rx) = mpsc::channel();
        let (at, with) = (dir.clone(), settings.clone());
        let spawned = std::thread::Builder::new()
            .name("stepguard-checkpoint-start".into())
            .spawn(move || {
                let deadline = Instant::now() + with.bound;
                let _ = tx.send(stepguard_checkpoint::start(&at, &with, deadline));
            });
        Checkpointer {
            dir,
            settings,
            history_id,
            start: spawned.ok().map(|_| rx),
            key: String::new(),
        }
    }

    /// The run's id: its history id, else its key.
    fn id(&self) -> String {
        self.history_id
            .get()
            .map_or_else(|| self.key.clone(), ToString::to_string)
    }
}

impl RunObserver for Checkpointer {
    fn started(&mut self, run: &RunStarted<'_>) {
        let stamp = humantime::format_rfc3339_seconds(run.started_at).to_string();
        self.key = format!(
            "run-{}-{}",
            stamp.replace(['-', ':'], ""),
            std::process::id()
        );
    }

    fn finished(&mut self, report: &mut RunReport) {
        if report.record.verdict.outcome == Outcome::Success || report.spawn_error.is_some() {
            return;
        }
        let began = Instant::now();
        let deadline = began + self.settings.bound;
        // The start's work tree, if read by now (else its HEAD is read with the checkpoint).
        let start = self
            .start
            .take()
            .and_then(|rx| rx.recv_timeout(self.settings.bound / 2).ok())
            .unwrap_or_default();
        let id = self.id();
        let slug = report
            .record
            .verdict
            .error_type
            .as_ref()
            .map_or("failed", |s| s.as_str());
        let message = format!("stepguard: run {id} ended ({slug})");
        let saved =
            stepguard_checkpoint::save(&self.dir, &self.settings, &id, &start, &message, deadline);
        report.record.checkpoint = Some(recorded(saved));
        // The checkpoint's time is its own: the history and the summary keep their share.
        report.exit_by += began.elapsed();
    }
}

/// A checkpoint (or why there is none) as the record holds it.
fn recorded(saved: Result<Saved, CheckpointError>) -> Checkpoint {
    let saved = match saved {
        Ok(saved) => saved,
        Err(e) => {
            return Checkpoint {
                error: Some(e.to_string()),
                ..Checkpoint::default()
            };
        }
    };
    Checkpoint {
        reference: Some(saved.reference),
        commit: Some(saved.commit),
        changed_total: saved.changed.len() as u64,
        changed: saved
            .changed
            .into_iter()
            .take(MAX_LISTED_CHANGES)
            .map(|c| ChangedPath {
                path: c.path,
                change: match c.change {
                    Change::Added => PathChange::Added,
                    Change::Deleted => PathChange::Deleted,
                    Change::TypeChanged => PathChange::TypeChanged,
                    Change::Modified => PathChange::Modified,
                },
            })
            .collect(),
        left_out: saved
            .left_out
            .into_iter()
            .map(|l| LeftOutPath {
                path: l.path,
                bytes: l.bytes,
            })
            .collect(),
        error: None,
    }
}

/// What the end of a run says of its checkpoint: where the work is and how to get it back, or
/// (as the error) why it was not saved, which is a warning.
pub(crate) fn told(record: &RunRecord) -> Option<Result<String, String>> {
    let c = record.checkpoint.as_ref()?;
    let Some(reference) = &c.reference else {
        let why = c.error.as_deref().unwrap_or("unknown");
        return Some(Err(format!("no checkpoint of the work tree: {why}")));
    };
    let id = reference
        .strip_prefix(stepguard_checkpoint::REF_PREFIX)
        .unwrap_or(reference);
    let mut text = format!(
        "checkpoint: the work tree at the stop is saved as {reference} ({} changed since the start); \
         get it back with `stepguard checkpoint restore {id}` or `git restore --source={reference} --worktree -- :/`",
        files(c.changed_total)
    );
    if !c.left_out.is_empty() {
        text.push_str(&format!("; left out (over the size cap): {}", left_out(c)));
    }
    Some(Ok(text))
}

/// The lines `show` prints for a run's checkpoint.
pub(crate) fn show_lines(record: &RunRecord) -> Vec<String> {
    let Some(c) = &record.checkpoint else {
        return Vec::new();
    };
    let Some(reference) = &c.reference else {
        return vec![format!(
            "Checkpoint: none ({})",
            c.error.as_deref().unwrap_or("unknown")
        )];
    };
    let mut lines = vec![format!(
        "Checkpoint: {reference} ({})",
        files(c.changed_total)
    )];
    for f in &c.changed {
        let change = match f.change {
            PathChange::Added => "added",
            PathChange::Deleted => "deleted",
            PathChange::TypeChanged => "type changed",
            _ => "modified",
        };
        lines.push(format!("  {change:<12} {}", f.path));
    }
    if c.changed_total > c.changed.len() as u64 {
        lines.push(format!(
            "  … and {} more",
            c.changed_total - c.changed.len() as u64
        ));
    }
    if !c.left_out.is_empty() {
        lines.push(format!("  left out (over the size cap): {}", left_out(c)));
    }
    lines
}

fn files(n: u64) -> String {
    if n == 1 {
        "1 file".to_owned()
    } else {
        format!("{n} files")
    }
}

fn left_out(c: &Checkpoint) -> String {
    c.left_out
        .iter()
        .map(|l| format!("{} ({} MiB)", l.path, l.bytes.div_ceil(1024 * 1024)))
        .collect::<Vec<_>>()
        .join(", ")
}
