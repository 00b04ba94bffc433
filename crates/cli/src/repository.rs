//! The git repository a run works in, recorded with the run (`history --repo`) and matched by
//! pools (`match = { repository = … }`): the `origin` remote's URL (else the first remote's),
//! or the repository's top-level directory when it has no remote. Read from the files git keeps
//! (`.git/config`, a worktree's `commondir`), without running git.

use std::path::{Path, PathBuf};

/// The repository of `dir`, or `None` outside a git repository.
pub(crate) fn of(dir: &Path) -> Option<String> {
    let top = dir.ancestors().find(|d| d.join(".git").exists())?;
    let git_dir = git_dir(&top.join(".git"))?;
    let common = std::fs::read_to_string(git_dir.join("commondir"))
        .ok()
        .map(|c| git_dir.join(c.trim()))
        .unwrap_or(git_dir);
    let remote = std::fs::read_to_string(common.join("config"))
        .ok()
        .and_then(|config| remote_url(&config));
    Some(remote.unwrap_or_else(|| top.display().to_string()))
}

/// The git directory of a `.git` entry: itself, or where a `gitdir:` file points.
fn git_dir(dot_git: &Path) -> Option<PathBuf> {
    if dot_git.is_dir() {
        return Some(dot_git.to_path_buf());
    }
    let text = std::fs::read_to_string(dot_git).ok()?;
    let target = text.trim().strip_prefix("gitdir:")?.trim();
    let parent = dot_git.parent()?;
    Some(parent.join(target))
}

/// The URL of remote `origin` in a git config file, else of the first remote with a URL.
fn remote_url(config: &str) -> Option<String> {
    let mut section: Option<String> = None;
    let mut first = None;
    for line in config.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = header
                .strip_prefix("remote")
                .map(|name| name.trim().trim_matches('"').to_owned());
            continue;
        }
        let Some(name) = &section else { continue };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("url") {
            let url = value.trim().trim_matches('"').to_owned();
            if name == "origin" {
                return Some(url);
            }
            first.get_or_insert(url);
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_wins_then_the_first_remote_then_none() {
        let config = "[core]\n\tbare = false\n[remote \"upstream\"]\n\turl = https://example.com/up.git\n\
                      [remote \"origin\"]\n\turl = git@example.com:me/fork.git\n\tfetch = +refs/heads/*\n";
        assert_eq!(
            remote_url(config).as_deref(),
            Some("git@example.com:me/fork.git")
        );
        let config = "[remote \"upstream\"]\n    url = https://example.com/up.git\n";
        assert_eq!(
            remote_url(config).as_deref(),
            Some("https://example.com/up.git")
        );
        assert_eq!(remote_url("[core]\n\turl = nope\n"), None);
    }

    #[test]
    fn a_repository_without_remote_is_its_top_level_and_a_worktree_finds_the_common_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).expect("git dir");
        std::fs::create_dir_all(repo.join("src/deep")).expect("src");
        std::fs::write(repo.join(".git/config"), "[core]\n").expect("config");
        assert_eq!(of(&repo.join("src/deep")), Some(repo.display().to_string()));
        // A worktree: `.git` is a file naming its git dir, whose `commondir` leads to the config.
        let wt_git = repo.join(".git/worktrees/wt");
        std::fs::create_dir_all(&wt_git).expect("worktree git dir");
        std::fs::write(wt_git.join("commondir"), "../..\n").expect("commondir");
        std::fs::write(
            repo.join(".git/config"),
            "[remote \"origin\"]\n\turl = /srv/repo.git\n",
        )
        .expect("config");
        let wt = dir.path().join("wt");
        std::fs::create_dir_all(&wt).expect("worktree");
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", wt_git.display())).expect(".git");
        assert_eq!(of(&wt).as_deref(), Some("/srv/repo.git"));
        assert_eq!(of(Path::new("/")), None);
    }
}
