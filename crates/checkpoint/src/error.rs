//! Why a checkpoint was not saved, restored or listed.

use std::path::PathBuf;
use std::time::Duration;

/// Why a checkpoint was not taken (or restored, or listed). Every message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// git could not be started.
    #[error(
        "cannot run git ({git}): {source}; install git or turn checkpoints off (--checkpoint none)"
    )]
    GitMissing {
        /// The program stepguard ran.
        git: String,
        /// Why it did not start.
        #[source]
        source: std::io::Error,
    },
    /// The directory is not in a git work tree.
    #[error(
        "{} is not in a git work tree, so there is nothing to checkpoint; run in a repository (git init) or turn checkpoints off (--checkpoint none)",
        dir.display()
    )]
    NotARepository {
        /// The run's directory.
        dir: PathBuf,
    },
    /// A rebase, merge, cherry-pick or revert is under way.
    #[error(
        "the repository is in the middle of a {operation}, so its index holds conflicts; nothing was saved (finish it or abort it: {fix})"
    )]
    InProgress {
        /// What is under way (`rebase`, `merge` …).
        operation: &'static str,
        /// The commands that end it.
        fix: &'static str,
    },
    /// Another git process holds the index.
    #[error(
        "another git process holds the index ({} exists); nothing was saved (wait for it, or remove the lock if no git is running)",
        lock.display()
    )]
    IndexLocked {
        /// The lock file.
        lock: PathBuf,
    },
    /// The repository's objects or refs cannot be written.
    #[error(
        "the repository's {} is read-only, so no commit can be written; nothing was saved (make it writable: chmod -R u+w {})",
        dir.display(), dir.display()
    )]
    ReadOnly {
        /// The directory that is not writable.
        dir: PathBuf,
    },
    /// The bound passed before the ref was written.
    #[error(
        "the checkpoint did not finish within {} (it was at `git {step}`); no ref was written (raise [run] checkpoint_timeout)",
        humanize(*after)
    )]
    TimedOut {
        /// The bound.
        after: Duration,
        /// The git command that was running.
        step: String,
    },
    /// A git command failed.
    #[error("`git {step}` failed ({status}): {stderr}")]
    Git {
        /// The git command.
        step: String,
        /// How it exited.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// No checkpoint of that id in this repository.
    #[error(
        "no checkpoint {reference} in this repository (see `stepguard checkpoint list`, run in the run's repository)"
    )]
    NoSuchCheckpoint {
        /// The ref looked for.
        reference: String,
    },
    /// The id cannot name a ref.
    #[error(
        "`{id}` is not a checkpoint id: use the number or key `stepguard checkpoint list` shows"
    )]
    BadId {
        /// What was given.
        id: String,
    },
    /// Restoring would overwrite changes that are in no commit.
    #[error(
        "the work tree has changes a restore would overwrite ({count} paths, e.g. {first}); commit or stash them (git stash -u), or pass --force"
    )]
    WouldOverwrite {
        /// How many paths `git status` lists.
        count: usize,
        /// The first of them.
        first: String,
    },
    /// A file could not be read or written.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// A duration in whole milliseconds, as people read it (`10s`, `1s 500ms`).
fn humanize(d: Duration) -> String {
    let ms = d.as_millis();
    match (ms / 1000, ms % 1000) {
        (0, ms) => format!("{ms}ms"),
        (s, 0) => format!("{s}s"),
        (s, ms) => format!("{s}s {ms}ms"),
    }
}
