//! The work tree as a tree object, through a temporary index; the checkpoint commit and its
//! ref; the files changed since the run began.

use std::path::Path;

use crate::error::CheckpointError;
use crate::repo::Repository;

/// The tree of an empty directory (a run that began on an unborn branch with no files).
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// What the work tree was when a run began: what its changes are measured against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Start {
    /// The commit `HEAD` named (none on an unborn branch, or when it was not read).
    pub head: Option<String>,
    /// The tree of the whole work tree (tracked and untracked files), when it was taken.
    pub tree: Option<String>,
}

/// A file left out of a tree because it is over the size cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    /// Its path from the top of the work tree.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The work tree written as a tree object, and what was left out of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The tree's id.
    pub tree: String,
    /// Files over the cap (untracked ones are missing; tracked ones keep their indexed version).
    pub left_out: Vec<LeftOut>,
}

/// How a file differs between the run's start and its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// New since the start.
    Added,
    /// Its content or mode changed.
    Modified,
    /// Gone since the start.
    Deleted,
    /// A file became a link, or the other way round.
    TypeChanged,
}

/// One file the run changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedFile {
    /// Its path from the top of the work tree.
    pub path: String,
    /// How it changed.
    pub change: Change,
}

/// Copies the user's index with its modification time: git trusts an entry's cached stat
/// only when the entry is older than the index file ("racy git"), so a copy with a newer time
/// would take a file changed in the same second, at the same size, for unchanged.
fn copy_index(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::copy(from, to)?;
    let modified = std::fs::metadata(from)?.modified()?;
    std::fs::File::options()
        .write(true)
        .open(to)?
        .set_modified(modified)
}

impl Repository {
    /// Writes the work tree as it is (tracked and untracked files, not ignored ones) as a tree
    /// object, through a temporary index that starts as a copy of the user's (so unchanged
    /// files are not hashed again). Files over `max_file_bytes` are left out. Nothing but the
    /// object store is written: not the index, the work tree, `HEAD` or any ref.
    pub fn snapshot(&self, max_file_bytes: u64) -> Result<Snapshot, CheckpointError> {
        let scratch = tempfile::tempdir().map_err(|source| CheckpointError::Io {
            what: "create a temporary directory for the checkpoint's index".into(),
            source,
        })?;
        let index = scratch.path().join("index");
        if self.index.exists() {
            copy_index(&self.index, &index).map_err(|source| CheckpointError::Io {
                what: format!("copy the index {}", self.index.display()),
                source,
            })?;
        }
        let git = self.git.with_index(&index);
        let listed = git.run(
            &[
                "ls-files",
                "-z",
                "--others",
                "--modified",
                "--exclude-standard",
            ],
            None,
        )?;
        let left_out = self.over_cap(&listed, max_file_bytes);
        let mut pathspecs: Vec<u8> = b":/\0".to_vec();
        for f in &left_out {
            pathspecs.extend_from_slice(format!(":(exclude,top,literal){}\0", f.path).as_bytes());
        }
        git.run(
            &["add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"],
            Some(&pathspecs),
        )?;
        let tree = git.text(&["write-tree"])?;
        Ok(Snapshot { tree, left_out })
    }

    /// The files of a NUL-separated list (paths from the top) larger than `cap` bytes.
    fn over_cap(&self, listed: &[u8], cap: u64) -> Vec<LeftOut> {
        let mut seen = std::collections::BTreeMap::new();
        for raw in listed.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            let path = String::from_utf8_lossy(raw).into_owned();
            let bytes = std::fs::symlink_metadata(self.top.join(&path))
                .ok()
                .filter(std::fs::Metadata::is_file)
                .map_or(0, |m| m.len());
            if bytes > cap {
                seen.insert(path, bytes);
            }
        }
        seen.into_iter()
            .map(|(path, bytes)| LeftOut { path, bytes })
            .collect()
    }

    /// What the work tree is now, to measure a run's changes against (read at its start).
    pub fn start(&self, max_file_bytes: u64) -> Start {
        let head = self.head().ok().flatten();
        let tree = self.snapshot(max_file_bytes).ok().map(|s| s.tree);
        Start { head, tree }
    }

    /// Commits `tree` with `HEAD` as its parent (none on an unborn branch) and points
    /// `reference` at it, creating it only if it does not exist. Returns the commit.
    pub fn commit(
        &self,
        tree: &str,
        reference: &str,
        message: &str,
    ) -> Result<String, CheckpointError> {
        let head = self.head()?;
        let mut args = vec!["commit-tree", tree, "-m", message];
        if let Some(parent) = head.as_deref() {
            args.extend(["-p", parent]);
        }
        let commit = self.git.text(&args)?;
        // The zero id as the old value: never move a checkpoint that is already there.
        let zero = "0".repeat(commit.len());
        self.git.run(
            &[
                "update-ref",
                "-m",
                "stepguard checkpoint",
                reference,
                &commit,
                &zero,
            ],
            None,
        )?;
        Ok(commit)
    }

    /// The files that differ between the run's start and `tree`: against the start's whole
    /// tree when it was taken, else its `HEAD`, else `HEAD` now, else nothing.
    pub fn changed(&self, start: &Start, tree: &str) -> Result<Vec<ChangedFile>, CheckpointError> {
        let head = match &start.head {
            Some(head) => Some(head.clone()),
            None => self.head()?,
        };
        let base = match (&start.tree, head) {
            (Some(t), _) => t.clone(),
            (None, Some(head)) => format!("{head}^{{tree}}"),
            (None, None) => EMPTY_TREE.to_owned(),
        };
        let out = self.git.run(
            &[
                "diff-tree",
                "-r",
                "-z",
                "--no-renames",
                "--name-status",
                &base,
                tree,
            ],
            None,
        )?;
        let mut fields = out.split(|b| *b == 0).filter(|f| !f.is_empty());
        let mut files = Vec::new();
        while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
            let change = match status.first() {
                Some(b'A') => Change::Added,
                Some(b'D') => Change::Deleted,
                Some(b'T') => Change::TypeChanged,
                _ => Change::Modified,
            };
            files.push(ChangedFile {
                path: String::from_utf8_lossy(path).into_owned(),
                change,
            });
        }
        Ok(files)
    }

    /// The top of the work tree.
    pub fn top(&self) -> &Path {
        &self.top
    }
}
