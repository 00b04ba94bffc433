//! The repository a run works in: found with git itself, and checked before anything is
//! written (an operation under way, a locked index, a read-only object store).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::CheckpointError;
use crate::git::Git;

/// Operations that leave conflicts in the index, the file (or directory) git keeps while
/// one is under way, and how to end it.
const UNDER_WAY: &[(&str, &str, &str)] = &[
    (
        "rebase-merge",
        "rebase",
        "git rebase --continue or git rebase --abort",
    ),
    (
        "rebase-apply",
        "rebase",
        "git rebase --continue or git rebase --abort",
    ),
    (
        "MERGE_HEAD",
        "merge",
        "git merge --continue or git merge --abort",
    ),
    (
        "CHERRY_PICK_HEAD",
        "cherry-pick",
        "git cherry-pick --continue or git cherry-pick --abort",
    ),
    (
        "REVERT_HEAD",
        "revert",
        "git revert --continue or git revert --abort",
    ),
];

/// A git work tree, as git sees it.
#[derive(Clone, Debug)]
pub struct Repository {
    pub(crate) git: Git,
    /// The top of the work tree.
    pub top: PathBuf,
    /// The work tree's git directory (`.git`, or a linked worktree's own).
    pub git_dir: PathBuf,
    /// The directory objects and refs live in (the same as `git_dir` but in a linked worktree).
    pub common_dir: PathBuf,
    /// The user's index.
    pub index: PathBuf,
}

impl Repository {
    /// The repository `dir` is in, with `program` as git, every call done by `deadline`.
    pub fn open(
        program: OsString,
        dir: &Path,
        bound: Duration,
        deadline: Instant,
    ) -> Result<Repository, CheckpointError> {
        let git = Git::new(program, dir, bound, deadline);
        let paths = match git.text(&[
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-dir",
            "--git-common-dir",
            "--git-path",
            "index",
        ]) {
            Ok(paths) => paths,
            Err(CheckpointError::Git { .. }) => {
                return Err(CheckpointError::NotARepository {
                    dir: dir.to_path_buf(),
                });
            }
            Err(e) => return Err(e),
        };
        let mut lines = paths.lines().map(PathBuf::from);
        let (Some(top), Some(git_dir), Some(common_dir), Some(index)) =
            (lines.next(), lines.next(), lines.next(), lines.next())
        else {
            // A bare repository, or a git directory itself: no work tree.
            return Err(CheckpointError::NotARepository {
                dir: dir.to_path_buf(),
            });
        };
        let git = Git::new(git.program().to_owned(), &top, bound, deadline);
        Ok(Repository {
            git,
            top,
            git_dir,
            common_dir,
            index,
        })
    }

    /// Refuses a repository a checkpoint cannot be taken in without touching it: an operation
    /// under way, an index another git holds, objects or refs that cannot be written.
    pub fn check_writable(&self) -> Result<(), CheckpointError> {
        for (file, operation, fix) in UNDER_WAY {
            if self.git_dir.join(file).exists() {
                return Err(CheckpointError::InProgress { operation, fix });
            }
        }
        let lock = self.index.with_extension("lock");
        if lock.exists() {
            return Err(CheckpointError::IndexLocked { lock });
        }
        for dir in [
            self.common_dir.join("objects"),
            self.common_dir.join("refs"),
        ] {
            if read_only(&dir) {
                return Err(CheckpointError::ReadOnly { dir });
            }
        }
        Ok(())
    }

    /// The commit `HEAD` names, or `None` on an unborn branch.
    pub fn head(&self) -> Result<Option<String>, CheckpointError> {
        match self
            .git
            .text(&["rev-parse", "--verify", "-q", "HEAD^{commit}"])
        {
            Ok(id) => Ok(Some(id)),
            Err(CheckpointError::Git { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Whether a directory cannot be written: the file system is mounted read-only, this process
/// may not write it, or nobody may (no write bit; respected even by root, who could write
/// anyway: a user who made `.git` read-only meant it).
fn read_only(dir: &Path) -> bool {
    use rustix::fs::{Access, StatVfsMountFlags};
    let mounted_ro =
        rustix::fs::statvfs(dir).is_ok_and(|s| s.f_flag.contains(StatVfsMountFlags::RDONLY));
    let no_access = rustix::fs::access(dir, Access::WRITE_OK).is_err();
    let no_bit = std::fs::metadata(dir)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o222 == 0)
        .unwrap_or(true);
    mounted_ro || no_access || no_bit
}
