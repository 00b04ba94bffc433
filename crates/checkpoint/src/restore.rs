//! Reading checkpoints back: the list of a repository's checkpoints, and a restore of one into
//! the work tree.

use crate::error::CheckpointError;
use crate::repo::Repository;

/// Where every checkpoint ref lives.
pub const REF_PREFIX: &str = "refs/stepguard/runs/";

/// One checkpoint of a repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The run's id (the history id, or the key of a run that had none).
    pub id: String,
    /// The commit.
    pub commit: String,
    /// When it was taken (ISO 8601, the committer date).
    pub date: String,
    /// The commit message's first line (how the run ended).
    pub subject: String,
}

/// The ref of the checkpoint of run `id` (a history id, a run key, or the ref itself).
pub fn reference(id: &str) -> Result<String, CheckpointError> {
    let id = id.strip_prefix(REF_PREFIX).unwrap_or(id);
    let fine = !id.is_empty()
        && !id.starts_with(['.', '-'])
        && !id.ends_with(".lock")
        && !id.contains("..")
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fine {
        Ok(format!("{REF_PREFIX}{id}"))
    } else {
        Err(CheckpointError::BadId { id: id.to_owned() })
    }
}

impl Repository {
    /// The repository's checkpoints, newest first.
    pub fn list(&self) -> Result<Vec<Listed>, CheckpointError> {
        let out = self.git.text(&[
            "for-each-ref",
            "--sort=-committerdate",
            "--format=%(refname)%09%(objectname)%09%(committerdate:iso8601-strict)%09%(subject)",
            REF_PREFIX,
        ])?;
        Ok(out
            .lines()
            .filter_map(|line| {
                let mut f = line.splitn(4, '\t');
                let id = f.next()?.strip_prefix(REF_PREFIX)?.to_owned();
                Some(Listed {
                    id,
                    commit: f.next()?.to_owned(),
                    date: f.next()?.to_owned(),
                    subject: f.next().unwrap_or_default().to_owned(),
                })
            })
            .collect())
    }

    /// Puts the work tree of checkpoint `id` back: every file it holds is written, and tracked
    /// files it does not hold are removed; the index, `HEAD` and the branches are left alone,
    /// and so are untracked files it does not hold. Refuses a work tree with changes unless
    /// `force`. Returns the ref.
    pub fn restore(&self, id: &str, force: bool) -> Result<String, CheckpointError> {
        let reference = reference(id)?;
        let commit = format!("{reference}^{{commit}}");
        if self
            .git
            .text(&["rev-parse", "--verify", "-q", &commit])
            .is_err()
        {
            return Err(CheckpointError::NoSuchCheckpoint { reference });
        }
        if !force {
            let status = self.git.run(&["status", "--porcelain", "-z"], None)?;
            let mut paths = status.split(|b| *b == 0).filter(|p| !p.is_empty());
            if let Some(first) = paths.next() {
                return Err(CheckpointError::WouldOverwrite {
                    count: 1 + paths.count(),
                    first: String::from_utf8_lossy(first.get(3..).unwrap_or(first)).into_owned(),
                });
            }
        }
        let source = format!("--source={reference}");
        self.git
            .run(&["restore", &source, "--worktree", "--", ":/"], None)?;
        Ok(reference)
    }
}
