//! Checkpoints of real git repositories in temporary directories.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{Change, CheckpointError, Settings, Start};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgSign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A repository with one commit (`a`, `b`, `.gitignore` ignoring `*.log`).
fn repo() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let top = dir.path().join("repo");
    std::fs::create_dir(&top).expect("mkdir");
    git(&top, &["init", "-q", "-b", "main"]);
    std::fs::write(top.join("a"), "a\n").expect("a");
    std::fs::write(top.join("b"), "b\n").expect("b");
    std::fs::write(top.join(".gitignore"), "*.log\n").expect("ignore");
    git(&top, &["add", "."]);
    git(&top, &["commit", "-qm", "first"]);
    (dir, top)
}

fn deadline() -> Instant {
    Instant::now() + Settings::default().bound
}

/// What the user sees of the repository: status, index bytes, HEAD, refs of branches.
fn user_view(top: &Path) -> (String, Vec<u8>, String, String) {
    (
        git(top, &["status", "--porcelain", "--untracked-files=all"]),
        std::fs::read(top.join(".git/index")).unwrap_or_default(),
        std::fs::read_to_string(top.join(".git/HEAD")).expect("HEAD"),
        git(top, &["for-each-ref", "refs/heads"]),
    )
}

/// The tree of the work tree as `git add -A` in a scratch copy of the repository sees it.
fn work_tree_tree(top: &Path) -> String {
    let scratch = tempfile::tempdir().expect("tempdir");
    let index = scratch.path().join("i");
    let out = Command::new("sh")
        .arg("-c")
        .arg("git add -A && git write-tree")
        .env("GIT_INDEX_FILE", &index)
        .current_dir(top)
        .output()
        .expect("sh");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn the_ref_holds_the_work_tree_and_nothing_the_user_sees_changes() {
    let (_dir, top) = repo();
    let settings = Settings::default();
    // A staged change (a dirty index) before the run, which must stay staged as it is.
    std::fs::write(top.join("a"), "staged\n").expect("a");
    git(&top, &["add", "a"]);
    let start = crate::start(&top, &settings, deadline());
    assert!(start.head.is_some() && start.tree.is_some(), "{start:?}");
    // The run: edits, creates (in a new directory), deletes, and writes an ignored log.
    std::fs::write(top.join("a"), "edited\n").expect("a");
    std::fs::create_dir(top.join("new")).expect("new");
    std::fs::write(top.join("new/c"), "c\n").expect("c");
    std::fs::remove_file(top.join("b")).expect("rm b");
    std::fs::write(top.join("run.log"), "noise\n").expect("log");
    let before = user_view(&top);
    let saved = crate::save(
        &top,
        &settings,
        "7",
        &start,
        "stepguard: run 7 stopped",
        deadline(),
    )
    .expect("saved");
    assert_eq!(
        user_view(&top),
        before,
        "HEAD, index, status and branches are untouched"
    );
    assert_eq!(saved.reference, "refs/stepguard/runs/7");
    assert_eq!(
        git(&top, &["rev-parse", "refs/stepguard/runs/7"]),
        saved.commit
    );
    assert_eq!(
        git(&top, &["rev-parse", &format!("{}^{{tree}}", saved.commit)]),
        work_tree_tree(&top)
    );
    assert_eq!(
        git(&top, &["rev-parse", &format!("{}^", saved.commit)]),
        start.head.clone().unwrap()
    );
    let files = git(&top, &["ls-tree", "-r", "--name-only", &saved.commit]);
    assert_eq!(
        files, ".gitignore\na\nnew/c",
        "no ignored file, no deleted one"
    );
    assert_eq!(
        git(&top, &["log", "-1", "--format=%an <%ae> %s", &saved.commit]),
        "stepguard <stepguard@localhost> stepguard: run 7 stopped"
    );
    let mut changed: Vec<(String, Change)> = saved
        .changed
        .into_iter()
        .map(|c| (c.path, c.change))
        .collect();
    changed.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        changed,
        [
            ("a".into(), Change::Modified),
            ("b".into(), Change::Deleted),
            ("new/c".into(), Change::Added)
        ],
        "measured from the start's work tree (the staged `a` already there), not from HEAD"
    );
    assert!(saved.left_out.is_empty());
    // A second checkpoint of the same id never moves the first.
    let again = crate::save(&top, &settings, "7", &start, "again", deadline());
    assert!(
        matches!(again, Err(CheckpointError::Git { ref step, .. }) if step == "update-ref"),
        "{again:?}"
    );
    assert_eq!(
        git(&top, &["rev-parse", "refs/stepguard/runs/7"]),
        saved.commit
    );
}

#[test]
fn an_unborn_branch_gets_a_root_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    git(dir.path(), &["init", "-q"]);
    std::fs::write(dir.path().join("x"), "x\n").expect("x");
    let start = crate::start(dir.path(), &Settings::default(), deadline());
    assert_eq!(start.head, None);
    let saved = crate::save(
        dir.path(),
        &Settings::default(),
        "run-1",
        &Start::default(),
        "m",
        deadline(),
    )
    .expect("saved");
    assert_eq!(
        git(dir.path(), &["rev-list", "--parents", "-1", &saved.commit]),
        saved.commit,
        "no parent"
    );
    assert_eq!(saved.changed.len(), 1);
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "?? x");
}

#[test]
fn a_file_over_the_cap_is_left_out_and_named() {
    let (_dir, top) = repo();
    // 2 GiB, sparse: nothing is written to the disk, and nothing must be hashed.
    let big = std::fs::File::create(top.join("huge.bin")).expect("huge");
    big.set_len(2 << 30).expect("sparse");
    std::fs::write(top.join("small"), "s\n").expect("small");
    let started = Instant::now();
    let saved = crate::save(
        &top,
        &Settings::default(),
        "1",
        &Start::default(),
        "m",
        deadline(),
    )
    .expect("saved");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the big file was not read"
    );
    assert_eq!(
        saved.left_out,
        [crate::LeftOut {
            path: "huge.bin".into(),
            bytes: 2 << 30
        }]
    );
    let files = git(&top, &["ls-tree", "-r", "--name-only", &saved.commit]);
    assert!(
        files.contains("small") && !files.contains("huge.bin"),
        "{files}"
    );
    // A smaller cap leaves out a modified tracked file too: it keeps its committed version.
    std::fs::write(top.join("a"), "a much longer line\n").expect("a");
    let settings = Settings {
        max_file_bytes: 10,
        ..Settings::default()
    };
    let saved =
        crate::save(&top, &settings, "2", &Start::default(), "m", deadline()).expect("saved");
    let left: Vec<&str> = saved.left_out.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(left, ["a", "huge.bin"]);
    assert_eq!(git(&top, &["show", &format!("{}:a", saved.commit)]), "a");
}

#[test]
fn refusals_say_what_to_do_and_leave_no_ref() {
    let (_dir, top) = repo();
    let settings = Settings::default();
    let refs = |top: &Path| git(top, &["for-each-ref", "refs/stepguard"]);
    // Not a repository.
    let plain = tempfile::tempdir().expect("tempdir");
    let e = crate::save(
        plain.path(),
        &settings,
        "1",
        &Start::default(),
        "m",
        deadline(),
    )
    .unwrap_err();
    assert!(matches!(e, CheckpointError::NotARepository { .. }), "{e}");
    assert!(e.to_string().contains("--checkpoint none"), "{e}");
    // No git.
    let missing = Settings {
        git: "/nonexistent/git".into(),
        ..Settings::default()
    };
    let e = crate::save(&top, &missing, "1", &Start::default(), "m", deadline()).unwrap_err();
    assert!(
        matches!(e, CheckpointError::GitMissing { .. }) && e.to_string().contains("install git"),
        "{e}"
    );
    // A merge under way.
    std::fs::write(
        top.join(".git/MERGE_HEAD"),
        git(&top, &["rev-parse", "HEAD"]),
    )
    .expect("merge");
    let e = crate::save(&top, &settings, "1", &Start::default(), "m", deadline()).unwrap_err();
    assert!(
        e.to_string().contains("middle of a merge") && e.to_string().contains("git merge --abort"),
        "{e}"
    );
    std::fs::remove_file(top.join(".git/MERGE_HEAD")).expect("rm");
    // An index another git holds.
    std::fs::write(top.join(".git/index.lock"), "").expect("lock");
    let e = crate::save(&top, &settings, "1", &Start::default(), "m", deadline()).unwrap_err();
    assert!(matches!(e, CheckpointError::IndexLocked { .. }), "{e}");
    std::fs::remove_file(top.join(".git/index.lock")).expect("rm");
    // A bad id.
    let e = crate::save(&top, &settings, "../x", &Start::default(), "m", deadline()).unwrap_err();
    assert!(matches!(e, CheckpointError::BadId { .. }), "{e}");
    assert_eq!(refs(&top), "");
}

#[test]
fn a_rebase_under_way_is_refused() {
    let (_dir, top) = repo();
    git(&top, &["checkout", "-qb", "side"]);
    std::fs::write(top.join("a"), "side\n").expect("a");
    git(&top, &["commit", "-qam", "side"]);
    git(&top, &["checkout", "-q", "main"]);
    std::fs::write(top.join("a"), "main\n").expect("a");
    git(&top, &["commit", "-qam", "main"]);
    git(&top, &["checkout", "-q", "side"]);
    let rebase = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "rebase",
            "main",
        ])
        .current_dir(&top)
        .output()
        .expect("git");
    assert!(!rebase.status.success(), "the rebase stops at the conflict");
    let before = user_view(&top);
    let e = crate::save(
        &top,
        &Settings::default(),
        "1",
        &Start::default(),
        "m",
        deadline(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("middle of a rebase")
            && e.to_string().contains("git rebase --abort"),
        "{e}"
    );
    assert_eq!(user_view(&top), before);
}

#[test]
fn a_read_only_git_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let (_dir, top) = repo();
    std::fs::write(top.join("new"), "n\n").expect("new");
    let objects = top.join(".git/objects");
    let before = git(&top, &["count-objects"]);
    std::fs::set_permissions(&objects, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let e = crate::save(
        &top,
        &Settings::default(),
        "1",
        &Start::default(),
        "m",
        deadline(),
    )
    .unwrap_err();
    std::fs::set_permissions(&objects, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(
        matches!(e, CheckpointError::ReadOnly { .. }) && e.to_string().contains("chmod -R u+w"),
        "{e}"
    );
    assert_eq!(git(&top, &["count-objects"]), before, "no object written");
    assert_eq!(git(&top, &["for-each-ref", "refs/stepguard"]), "");
}

#[test]
fn a_checkpoint_past_its_bound_is_killed_and_leaves_no_ref() {
    use std::os::unix::fs::PermissionsExt as _;
    let (dir, top) = repo();
    std::fs::write(top.join("new"), "n\n").expect("new");
    // A git that hangs at commit-tree, with a child of its own that hangs too.
    let slow = dir.path().join("slow-git");
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .expect("sh")
            .stdout,
    )
    .expect("utf8");
    std::fs::write(
        &slow,
        format!("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = commit-tree ] && {{ sleep 30 & wait; }}; done\nexec {} \"$@\"\n", real.trim()),
    )
    .expect("slow git");
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let settings = Settings {
        git: slow.into(),
        bound: Duration::from_millis(800),
        ..Settings::default()
    };
    let started = Instant::now();
    let e = crate::save(
        &top,
        &settings,
        "1",
        &Start::default(),
        "m",
        started + settings.bound,
    )
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(e, CheckpointError::TimedOut { ref step, .. } if step == "commit-tree"),
        "{e}"
    );
    assert!(
        e.to_string().contains("800ms") && e.to_string().contains("no ref was written"),
        "{e}"
    );
    assert_eq!(git(&top, &["for-each-ref", "refs/stepguard"]), "");
}

#[test]
fn restore_puts_the_work_tree_back_and_list_shows_it() {
    let (_dir, top) = repo();
    std::fs::write(top.join("a"), "edited\n").expect("a");
    std::fs::write(top.join("c"), "c\n").expect("c");
    std::fs::remove_file(top.join("b")).expect("rm");
    let saved = crate::save(
        &top,
        &Settings::default(),
        "12",
        &Start::default(),
        "stepguard: run 12 stopped (max_steps)",
        deadline(),
    )
    .expect("saved");
    let tree = work_tree_tree(&top);
    let repo = crate::open(&top, &Settings::default(), deadline()).expect("open");
    // Changes in the way are refused.
    let e = repo.restore("12", false).unwrap_err();
    assert!(
        matches!(e, CheckpointError::WouldOverwrite { count: 3, .. })
            && e.to_string().contains("--force"),
        "{e}"
    );
    git(&top, &["reset", "-q", "--hard"]);
    git(&top, &["clean", "-qfd"]);
    let index = std::fs::read(top.join(".git/index")).expect("index");
    assert_eq!(
        repo.restore("refs/stepguard/runs/12", false)
            .expect("restored"),
        "refs/stepguard/runs/12"
    );
    assert_eq!(work_tree_tree(&top), tree);
    assert_eq!(
        std::fs::read(top.join(".git/index")).expect("index"),
        index,
        "the index is left alone"
    );
    assert!(matches!(
        repo.restore("13", false),
        Err(CheckpointError::NoSuchCheckpoint { .. })
    ));
    let listed = repo.list().expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].commit.as_str()),
        ("12", saved.commit.as_str())
    );
    assert_eq!(listed[0].subject, "stepguard: run 12 stopped (max_steps)");
}

#[test]
fn a_file_changed_in_the_same_second_at_the_same_size_is_seen() {
    // The index's entry for `a` and the edit share their second and size: only the index
    // file's own time tells git to compare contents ("racy git"), so the copy must keep it.
    let (_dir, top) = repo();
    std::fs::write(top.join("a"), "staged\n").expect("a");
    git(&top, &["add", "a"]);
    std::fs::write(top.join("a"), "edited\n").expect("a");
    let index = std::fs::metadata(top.join(".git/index"))
        .expect("index")
        .modified()
        .expect("time");
    std::thread::sleep(Duration::from_millis(1100));
    let saved = crate::save(
        &top,
        &Settings::default(),
        "1",
        &Start::default(),
        "m",
        deadline(),
    )
    .expect("saved");
    assert_eq!(
        git(&top, &["show", &format!("{}:a", saved.commit)]),
        "edited"
    );
    let after = std::fs::metadata(top.join(".git/index"))
        .expect("index")
        .modified()
        .expect("time");
    assert_eq!(after, index, "the user's index is not rewritten");
}
