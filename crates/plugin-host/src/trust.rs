//! Whether a plugin file may be opened at all, judged by who can change it (like OpenSSH's
//! `StrictModes` and its `safe_path`).
//!
//! A plugin runs inside stepguard and decides how steps are counted, so whoever can write the file,
//! or any directory on the way to it, can change the budget. The file, its directory and every
//! directory above it up to `/` must be owned by root or by the current effective user and must
//! not be writable by group or others. Both the path as given and its canonical form (symbolic
//! links resolved) are walked, so a link cannot lead around the check.
//!
//! One exception, where this differs from OpenSSH's `safe_path` (which has none): a directory
//! *above* the plugin's own may be world-writable when its sticky bit is set (`/tmp`), since
//! others may then add entries to it but not rename or replace the one on the plugin's path.
//! The plugin's own directory never may: anyone could add a plugin file to it.

use std::path::{Path, PathBuf};

use rustix::fs::Mode;
use rustix::process::{Uid, geteuid};

/// Why a plugin file is refused before it is opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct UnsafePlugin {
    /// The directory at fault, or `None` when the file itself is.
    pub dir: Option<PathBuf>,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What makes a plugin file or directory unsafe to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Its group or everyone may write it.
    Writable {
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
    },
    /// It belongs to a user other than root and the current effective user.
    Owner {
        /// Its owner's uid.
        owner: u32,
        /// This process's effective uid.
        euid: u32,
    },
    /// It could not be inspected.
    Unreadable(String),
}

impl UnsafePlugin {
    fn describe(&self) -> String {
        let (subject, fix_target) = match &self.dir {
            None => ("it".to_owned(), "it".to_owned()),
            Some(dir) => (
                format!("its directory {}", dir.display()),
                dir.display().to_string(),
            ),
        };
        match &self.problem {
            Problem::Writable { mode } => {
                format!(
                    "{subject} is writable by others (mode {mode:04o}); chmod go-w {fix_target}"
                )
            }
            Problem::Owner { owner, euid } => {
                format!("{subject} is owned by uid {owner}, neither root nor you (uid {euid})")
            }
            Problem::Unreadable(why) => format!("cannot check who may write {subject}: {why}"),
        }
    }
}

/// Returns what is wrong with a file or directory of this mode and owner, for this effective
/// user, or `None` when it is safe.
pub fn judge(mode: u32, owner: u32, euid: u32) -> Option<Problem> {
    if owner != Uid::ROOT.as_raw() && owner != euid {
        return Some(Problem::Owner { owner, euid });
    }
    if mode & 0o022 != 0 {
        return Some(Problem::Writable {
            mode: mode & 0o7777,
        });
    }
    None
}

/// Returns what is wrong with a directory *above* a plugin's own directory: as [`judge`], except
/// that a world-writable directory with the sticky bit (`/tmp`) is safe, since nobody else may
/// rename or replace the entry on the plugin's path.
pub fn judge_ancestor(mode: u32, owner: u32, euid: u32) -> Option<Problem> {
    match judge(mode, owner, euid) {
        Some(Problem::Writable { .. }) if mode & 0o1000 != 0 => None,
        other => other,
    }
}

/// Checks that only root or the current user can change the plugin file at `path`, the
/// directory it is in and every directory above it, along the path as given and along its
/// canonical form.
pub fn check_plugin_file(path: &Path) -> Result<(), UnsafePlugin> {
    let euid = geteuid().as_raw();
    check_one(path, euid, judge).map_err(|problem| UnsafePlugin { dir: None, problem })?;
    for (dir, own) in dirs_on_the_way(path) {
        let judge = if own { judge } else { judge_ancestor };
        check_one(&dir, euid, judge).map_err(|problem| UnsafePlugin {
            dir: Some(dir.clone()),
            problem,
        })?;
    }
    Ok(())
}

/// Returns the directories on the way to `path`, nearest first, each once, with whether it is
/// the file's own directory: the ancestors of the absolute path as given, then those of the
/// canonical path (a link may lead elsewhere).
fn dirs_on_the_way(path: &Path) -> Vec<(PathBuf, bool)> {
    let given = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let canonical = std::fs::canonicalize(path).ok();
    let mut dirs: Vec<(PathBuf, bool)> = Vec::new();
    for file in std::iter::once(given).chain(canonical) {
        let ancestors = file
            .ancestors()
            .skip(1)
            .filter(|d| !d.as_os_str().is_empty());
        for (i, dir) in ancestors.enumerate() {
            match dirs.iter_mut().find(|(d, _)| d == dir) {
                Some((_, own)) => *own |= i == 0,
                None => dirs.push((dir.to_path_buf(), i == 0)),
            }
        }
    }
    dirs
}

fn check_one(
    path: &Path,
    euid: u32,
    judge: fn(u32, u32, u32) -> Option<Problem>,
) -> Result<(), Problem> {
    let stat = rustix::fs::stat(path).map_err(|e| Problem::Unreadable(e.to_string()))?;
    let mode = Mode::from_raw_mode(stat.st_mode).bits();
    judge(mode, stat.st_uid, euid).map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn owner_must_be_root_or_the_effective_user() {
        assert_eq!(judge(0o755, 0, 1000), None);
        assert_eq!(judge(0o755, 1000, 1000), None);
        assert_eq!(judge(0o755, 0, 0), None);
        assert_eq!(
            judge(0o755, 1001, 1000),
            Some(Problem::Owner {
                owner: 1001,
                euid: 1000
            })
        );
        assert_eq!(
            judge(0o755, 1000, 0),
            Some(Problem::Owner {
                owner: 1000,
                euid: 0
            })
        );
    }

    #[test]
    fn group_or_world_write_is_refused_sticky_or_not() {
        for mode in [0o644, 0o755, 0o700, 0o555, 0o4755] {
            assert_eq!(judge(mode, 0, 0), None, "{mode:o}");
        }
        for mode in [0o664, 0o666, 0o775, 0o757, 0o1777, 0o100_666] {
            assert_eq!(
                judge(mode, 1000, 1000),
                Some(Problem::Writable {
                    mode: mode & 0o7777
                }),
                "{mode:o}"
            );
        }
    }

    #[test]
    fn a_sticky_directory_above_the_plugins_own_is_safe_but_not_as_its_own() {
        assert_eq!(judge_ancestor(0o1777, 0, 1000), None);
        assert_eq!(judge_ancestor(0o1777, 1000, 1000), None);
        assert_eq!(judge_ancestor(0o755, 0, 1000), None);
        assert_eq!(
            judge_ancestor(0o777, 0, 1000),
            Some(Problem::Writable { mode: 0o777 })
        );
        assert_eq!(
            judge_ancestor(0o1777, 1001, 1000),
            Some(Problem::Owner {
                owner: 1001,
                euid: 1000
            })
        );
        assert_eq!(
            judge(0o1777, 0, 1000),
            Some(Problem::Writable { mode: 0o1777 })
        );
    }

    #[test]
    fn messages_name_the_problem_and_the_fix() {
        let file = UnsafePlugin {
            dir: None,
            problem: Problem::Writable { mode: 0o666 },
        };
        assert_eq!(
            file.to_string(),
            "it is writable by others (mode 0666); chmod go-w it"
        );
        let dir = UnsafePlugin {
            dir: Some(PathBuf::from("/x")),
            problem: Problem::Writable { mode: 0o1777 },
        };
        assert_eq!(
            dir.to_string(),
            "its directory /x is writable by others (mode 1777); chmod go-w /x"
        );
        let owner = UnsafePlugin {
            dir: None,
            problem: Problem::Owner {
                owner: 1001,
                euid: 1000,
            },
        };
        assert_eq!(
            owner.to_string(),
            "it is owned by uid 1001, neither root nor you (uid 1000)"
        );
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn real_files_and_directories_are_checked() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins");
        std::fs::create_dir(&dir).expect("mkdir");
        chmod(&dir, 0o755);
        let file = dir.join("libx.so");
        std::fs::write(&file, b"").expect("write");
        chmod(&file, 0o644);
        assert_eq!(check_plugin_file(&file), Ok(()));

        chmod(&file, 0o666);
        assert_eq!(
            check_plugin_file(&file),
            Err(UnsafePlugin {
                dir: None,
                problem: Problem::Writable { mode: 0o666 }
            })
        );

        chmod(&file, 0o644);
        chmod(&dir, 0o775);
        assert_eq!(
            check_plugin_file(&file),
            Err(UnsafePlugin {
                dir: Some(dir.clone()),
                problem: Problem::Writable { mode: 0o775 }
            })
        );

        // A link from a safe directory into an unsafe one is judged by the target's directory.
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        let target = open.join("liby.so");
        std::fs::write(&target, b"").expect("write");
        chmod(&target, 0o644);
        chmod(&open, 0o777);
        chmod(&dir, 0o755);
        let link = dir.join("liby.so");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let err = check_plugin_file(&link).expect_err("target directory is world-writable");
        assert_eq!(err.problem, Problem::Writable { mode: 0o777 });

        // Every directory above counts too, as in OpenSSH's safe_path: a world-writable one
        // lets anyone swap the directories below it.
        chmod(&open, 0o755);
        let deep = open.join("a/b/plugins");
        std::fs::create_dir_all(&deep).expect("mkdir");
        for d in [open.join("a"), open.join("a/b"), deep.clone()] {
            chmod(&d, 0o755);
        }
        let lib = deep.join("libz.so");
        std::fs::write(&lib, b"").expect("write");
        chmod(&lib, 0o644);
        assert_eq!(check_plugin_file(&lib), Ok(()));
        chmod(&open.join("a"), 0o777);
        assert_eq!(
            check_plugin_file(&lib),
            Err(UnsafePlugin {
                dir: Some(open.join("a")),
                problem: Problem::Writable { mode: 0o777 }
            })
        );
        chmod(&open.join("a"), 0o775);
        let err = check_plugin_file(&lib).expect_err("group-writable ancestor");
        assert_eq!(err.dir, Some(open.join("a")));
        // … unless it is sticky, as /tmp is; the plugin's own directory never may be.
        chmod(&open.join("a"), 0o1777);
        assert_eq!(check_plugin_file(&lib), Ok(()));
        chmod(&deep, 0o1777);
        assert_eq!(
            check_plugin_file(&lib).expect_err("own dir").dir,
            Some(deep.clone())
        );
        chmod(&deep, 0o755);
        // A relative path is walked from the working directory up.
        let relative = check_plugin_file(Path::new("no-such-dir/libz.so")).expect_err("missing");
        assert_eq!(relative.dir, None);
        // A link to the plugin directory through a world-writable directory is judged there.
        chmod(&open.join("a"), 0o777);
        let via = tmp.path().join("via");
        std::os::unix::fs::symlink(&deep, &via).expect("symlink");
        let err = check_plugin_file(&via.join("libz.so")).expect_err("through the link");
        assert_eq!(err.dir, Some(open.join("a")));
        chmod(&open.join("a"), 0o755);

        let missing = check_plugin_file(&dir.join("nope.so")).expect_err("missing");
        assert!(
            matches!(missing.problem, Problem::Unreadable(_)),
            "{missing}"
        );
    }
}
