//! Saves a run's work tree as a git commit on `refs/stepguard/runs/ID`, and restores it.
//!
//! When a run ends by a limit, a loop, a stall, a timeout, a signal or an error, what the agent
//! wrote so far would otherwise be left as loose changes a next attempt may overwrite. A
//! checkpoint keeps it as a commit without touching anything the user works with:
//!
//! * a temporary index (`GIT_INDEX_FILE`) starts as a copy of the user's, `git add -A` brings it
//!   to the work tree (tracked and untracked files, not ignored ones), `write-tree` makes the
//!   tree ([`Repository::snapshot`]);
//! * `commit-tree` (parent: `HEAD`, none on an unborn branch) and `update-ref` with the zero id
//!   as the old value ([`Repository::commit`]): the ref is written last, in one step, so a
//!   checkpoint that did not finish leaves no ref;
//! * `HEAD`, the user's index (byte for byte), the work tree and every branch stay as they
//!   were; only objects and the one ref are written.
//!
//! Every git call is isolated (no hooks: `core.hooksPath=/dev/null`; no signing; no
//! file-system monitor; no automatic gc; author and committer `stepguard`; no prompts) and
//! bounded by one deadline: a call still running then is killed with its process group and the
//! checkpoint is [`CheckpointError::TimedOut`]. Files larger than a cap are left out and named
//! ([`LeftOut`]). A repository where a checkpoint cannot be taken without touching it (not a
//! repository, a rebase or merge under way, an index another git holds, a read-only `.git`, no
//! git) is refused with a message that says what to do ([`CheckpointError`]).
//!
//! The git CLI rather than a library: it is what the user's repository is kept with (its
//! extensions, its filters, its index versions), and a separate process can be killed at a
//! deadline, which a library call cannot.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use stepguard_checkpoint::{Settings, Start};
//! let settings = Settings::default();
//! let deadline = Instant::now() + settings.bound;
//! let saved = stepguard_checkpoint::save(std::path::Path::new("."), &settings, "42",
//!     &Start::default(), "stepguard: run 42 stopped (max_steps)", deadline)?;
//! println!("{} holds {} changed files", saved.reference, saved.changed.len());
//! # Ok::<(), stepguard_checkpoint::CheckpointError>(())
//! ```

#![forbid(unsafe_code)]

mod error;
mod git;
mod repo;
mod restore;
mod save;
#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

pub use error::CheckpointError;
pub use repo::Repository;
pub use restore::{Listed, REF_PREFIX, reference};
pub use save::{Change, ChangedFile, LeftOut, Snapshot, Start};

/// The default bound of one checkpoint.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(10);

/// The default size cap of one file: larger files are left out (GitHub refuses files over it).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// How checkpoints are taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The git program (found on `PATH` when it is a bare name).
    pub git: OsString,
    /// Files larger than this are left out.
    pub max_file_bytes: u64,
    /// How long one checkpoint may take.
    pub bound: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            git: "git".into(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            bound: DEFAULT_BOUND,
        }
    }
}

/// A checkpoint that was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    /// The ref (`refs/stepguard/runs/ID`).
    pub reference: String,
    /// The commit it names.
    pub commit: String,
    /// The files changed since the run began.
    pub changed: Vec<ChangedFile>,
    /// The files left out (over the cap).
    pub left_out: Vec<LeftOut>,
}

/// Opens the repository of `dir` with `settings`, bounded by `deadline`.
pub fn open(
    dir: &Path,
    settings: &Settings,
    deadline: Instant,
) -> Result<Repository, CheckpointError> {
    Repository::open(settings.git.clone(), dir, settings.bound, deadline)
}

/// Saves the work tree of `dir` as checkpoint `id` (see the crate's docs), its changes measured
/// from `start`, all by `deadline`.
pub fn save(
    dir: &Path,
    settings: &Settings,
    id: &str,
    start: &Start,
    message: &str,
    deadline: Instant,
) -> Result<Saved, CheckpointError> {
    let reference = reference(id)?;
    let repo = open(dir, settings, deadline)?;
    repo.check_writable()?;
    let snapshot = repo.snapshot(settings.max_file_bytes)?;
    let changed = repo.changed(start, &snapshot.tree)?;
    let commit = repo.commit(&snapshot.tree, &reference, message)?;
    Ok(Saved {
        reference,
        commit,
        changed,
        left_out: snapshot.left_out,
    })
}

/// What the work tree of `dir` is at a run's start (nothing when it is not a repository or a
/// checkpoint cannot be taken there): read off the enforcement path, by `deadline`.
pub fn start(dir: &Path, settings: &Settings, deadline: Instant) -> Start {
    match open(dir, settings, deadline) {
        Ok(repo) if repo.check_writable().is_ok() => repo.start(settings.max_file_bytes),
        _ => Start::default(),
    }
}
