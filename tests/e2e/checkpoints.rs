//! `run --checkpoint git`: the work tree of a run that does not succeed is saved on
//! `refs/stepguard/runs/ID` (real git repositories in the sandbox's project directory), the
//! user's HEAD, index and status are left as they were, and `checkpoint restore` brings it back.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::harness::{Run, Sandbox};

/// git in `dir`, never refreshing the index as a side effect (the test compares its bytes).
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
        .env("GIT_OPTIONAL_LOCKS", "0")
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

/// The project as a repository: `a`, `b`, `.gitignore` (`*.log`) committed, `a` then changed
/// and staged (a dirty index).
fn repository(sb: &Sandbox) {
    let p = sb.project();
    git(&p, &["init", "-q", "-b", "main"]);
    std::fs::write(p.join("a"), "a\n").unwrap();
    std::fs::write(p.join("b"), "b\n").unwrap();
    std::fs::write(p.join(".gitignore"), "*.log\n").unwrap();
    git(&p, &["add", "."]);
    git(&p, &["commit", "-qm", "first"]);
    std::fs::write(p.join("a"), "staged\n").unwrap();
    git(&p, &["add", "a"]);
}

/// The absolute path of a program (the agents run with a `PATH` that may lack it).
fn which(program: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A Codex-stream agent that runs `work` (shell) first, then begins five steps and, unless
/// `succeed`, hangs until stopped.
fn agent(sb: &Sandbox, work: &str, succeed: bool) -> String {
    let mut body = format!("#!/bin/sh\n{work}\n");
    for i in 0..5 {
        body.push_str(&format!(
            "echo '{{\"type\":\"item.started\",\"item\":{{\"id\":\"item_{i}\",\"type\":\"command_execution\",\"command\":\"echo {i}\"}}}}'\n"
        ));
    }
    body.push_str(&if succeed {
        "echo '{\"type\":\"turn.completed\"}'\n".to_owned()
    } else {
        format!("exec {} 30\n", which("sleep"))
    });
    let path = sb.write(if succeed { "ok.sh" } else { "agent.sh" }, body);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// What the run edits: `a` rewritten, `new/c` created, `b` deleted, an ignored log written;
/// after a second, as an agent's first edit comes after a model reply (the work tree at the
/// start is read meanwhile).
fn edits() -> String {
    format!(
        "{} 1\necho edited > a\n{} -p new\necho c > new/c\n{} b\necho noise > run.log",
        which("sleep"),
        which("mkdir"),
        which("rm")
    )
}

/// `stepguard run` with a summary file; the run and its record.
fn stepguard(sb: &Sandbox, extra: &[&str], agent: &str, env: &[(&str, &str)]) -> (Run, Value) {
    let file = sb.root().join("summary.json");
    let _ = std::fs::remove_file(&file);
    let mut args = vec![
        "run",
        "--summary-file",
        file.to_str().unwrap(),
        "-p",
        "codex",
    ];
    args.extend_from_slice(extra);
    args.extend(["--", agent]);
    let run = sb.run_env(&args, env);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("no summary file ({e}); stderr: {}", run.stderr));
    (run, serde_json::from_str(&text).unwrap())
}

/// The tree `git add -A` makes of the work tree, in an index of its own.
fn work_tree(dir: &Path) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new("sh")
        .args(["-c", "git add -A && git write-tree"])
        .env("GIT_INDEX_FILE", scratch.path().join("i"))
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn the_ref_holds_the_work_tree_at_the_stop_and_restore_brings_it_back() {
    let sb = Sandbox::new();
    let p = sb.project();
    repository(&sb);
    let (index, head, branches) = (
        std::fs::read(p.join(".git/index")).unwrap(),
        git(&p, &["rev-parse", "HEAD"]),
        git(&p, &["for-each-ref", "refs/heads"]),
    );
    let agent = agent(&sb, &edits(), false);
    let (run, record) = stepguard(
        &sb,
        &["--max-steps", "2", "--checkpoint", "git"],
        &agent,
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(record["error_type"], "max_steps");
    let id = sb.recorded_id(&record, &run.stderr);
    let reference = format!("refs/stepguard/runs/{id}");
    let c = &record["checkpoint"];
    assert_eq!(c["ref"], reference.as_str(), "{c}");
    assert_eq!(c["error"], Value::Null);
    // The ref holds exactly the work tree at the stop, on top of HEAD.
    let tree = work_tree(&p);
    assert_eq!(
        git(&p, &["rev-parse", &format!("{reference}^{{tree}}")]),
        tree,
        "the ref's files, then the work tree's:\n{}\n{}",
        git(&p, &["ls-tree", "-r", &reference]),
        git(&p, &["ls-tree", "-r", &tree])
    );
    assert_eq!(git(&p, &["rev-parse", &format!("{reference}^")]), head);
    assert_eq!(c["commit"], git(&p, &["rev-parse", &reference]).as_str());
    assert_eq!(
        git(&p, &["ls-tree", "-r", "--name-only", &reference]),
        ".gitignore\na\nnew/c"
    );
    // The files changed since the start: the staged `a` was already there, so it is modified.
    assert_eq!(
        c["changed"],
        serde_json::json!([
            {"path": "a", "change": "modified"},
            {"path": "b", "change": "deleted"},
            {"path": "new/c", "change": "added"}
        ])
    );
    assert_eq!(c["changed_total"], 3);
    // The user's repository: the same HEAD, index bytes, branches; the status is the agent's.
    assert_eq!(
        std::fs::read(p.join(".git/index")).unwrap(),
        index,
        "the index is byte-identical"
    );
    assert_eq!(git(&p, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&p, &["for-each-ref", "refs/heads"]), branches);
    assert_eq!(
        git(&p, &["status", "--porcelain", "--untracked-files=all"]),
        "MM a\n D b\n?? new/c"
    );
    // The summary says how to get it back; `show` names the ref and the files.
    assert!(
        run.stderr
            .contains(&format!("stepguard checkpoint restore {id}")),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains(&format!(
        "git restore --source={reference} --worktree -- :/"
    )));
    let show = sb.run(&["show", &id]);
    assert!(
        show.stdout
            .contains(&format!("Checkpoint: {reference} (3 files)")),
        "{}",
        show.stdout
    );
    assert!(show.stdout.contains("deleted      b"), "{}", show.stdout);
    // Restore: refused over changes, then on a clean work tree it puts the run's tree back.
    let refused = sb.run(&["checkpoint", "restore", &id]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("--force"), "{}", refused.stderr);
    git(&p, &["reset", "-q", "--hard"]);
    git(&p, &["clean", "-qfd"]);
    let restored = sb.run(&["checkpoint", "restore", &id]);
    assert_eq!(restored.code, Some(0), "{}", restored.stderr);
    assert_eq!(work_tree(&p), tree);
    let listed = sb.run(&["checkpoint", "list", "--json"]).json();
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["ref"], reference.as_str());
}

#[test]
fn success_makes_no_ref_and_none_turns_the_config_off() {
    let sb = Sandbox::new();
    let p = sb.project();
    repository(&sb);
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[run]\ncheckpoint = \"git\"\n",
    );
    let ok = agent(&sb, &edits(), true);
    let (run, record) = stepguard(&sb, &[], &ok, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(record["checkpoint"], Value::Null);
    let stopped = agent(&sb, "", false);
    let (run, record) = stepguard(
        &sb,
        &["--max-steps", "2", "--checkpoint", "none"],
        &stopped,
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(record["checkpoint"], Value::Null);
    assert_eq!(git(&p, &["for-each-ref", "refs/stepguard"]), "");
    // From the config alone, and without a history row: the run key names the ref.
    let (run, record) = stepguard(&sb, &["--max-steps", "2", "--no-record"], &stopped, &[]);
    assert_eq!(record["id"], Value::Null);
    let reference = record["checkpoint"]["ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", run.stderr));
    let key = reference.strip_prefix("refs/stepguard/runs/run-").unwrap();
    assert!(
        key.len() > 17 && key.as_bytes()[8] == b'T' && key.contains("Z-"),
        "{key}"
    );
    assert_eq!(
        git(
            &p,
            &["for-each-ref", "--format=%(refname)", "refs/stepguard"]
        ),
        reference
    );
}

#[test]
fn where_no_checkpoint_can_be_taken_the_run_says_why_and_ends_as_it_would() {
    let sb = Sandbox::new();
    let stopped = agent(&sb, "", false);
    // Not a repository.
    let (run, record) = stepguard(
        &sb,
        &["--max-steps", "2", "--checkpoint", "git"],
        &stopped,
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let error = record["checkpoint"]["error"].as_str().unwrap();
    assert!(
        error.contains("not in a git work tree") && error.contains("--checkpoint none"),
        "{error}"
    );
    assert_eq!(record["checkpoint"]["ref"], Value::Null);
    assert!(
        run.stderr
            .contains("warning: no checkpoint of the work tree:"),
        "{}",
        run.stderr
    );
    // A merge under way.
    repository(&sb);
    let p = sb.project();
    std::fs::write(
        p.join(".git/MERGE_HEAD"),
        git(&p, &["rev-parse", "HEAD"]) + "\n",
    )
    .unwrap();
    let (before, index) = (
        git(&p, &["status", "--porcelain"]),
        std::fs::read(p.join(".git/index")).unwrap(),
    );
    let (run, record) = stepguard(
        &sb,
        &["--max-steps", "2", "--checkpoint", "git"],
        &stopped,
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(
        record["checkpoint"]["error"]
            .as_str()
            .unwrap()
            .contains("git merge --abort")
    );
    assert_eq!(git(&p, &["status", "--porcelain"]), before);
    assert_eq!(std::fs::read(p.join(".git/index")).unwrap(), index);
    std::fs::remove_file(p.join(".git/MERGE_HEAD")).unwrap();
    // No git on PATH (the agent needs none).
    let empty = sb.root().join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let (run, record) = stepguard(
        &sb,
        &["--max-steps", "2", "--checkpoint", "git"],
        &stopped,
        &[("PATH", empty.to_str().unwrap())],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(
        record["checkpoint"]["error"]
            .as_str()
            .unwrap()
            .contains("install git"),
        "{record}"
    );
    assert_eq!(git(&p, &["for-each-ref", "refs/stepguard"]), "");
}

#[test]
fn a_checkpoint_past_its_bound_says_so_leaves_no_ref_and_exits_soon_after() {
    let sb = Sandbox::new();
    let p = sb.project();
    repository(&sb);
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[run]\ncheckpoint = \"git\"\ncheckpoint_timeout = \"1s\"\n",
    );
    // A git that hangs at commit-tree.
    let bin = sb.root().join("slow-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let slow = bin.join("git");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = commit-tree ] && exec {} 60; done\nexec {} \"$@\"\n",
            which("sleep"),
            which("git")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let stopped = agent(&sb, &edits(), false);
    let started = std::time::Instant::now();
    let (run, record) = stepguard(
        &sb,
        &["--max-steps", "2"],
        &stopped,
        &[("PATH", bin.to_str().unwrap())],
    );
    let took = started.elapsed();
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let error = record["checkpoint"]["error"].as_str().unwrap();
    assert!(
        error.contains("did not finish within 1s") && error.contains("no ref was written"),
        "{error}"
    );
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
    assert_eq!(git(&p, &["for-each-ref", "refs/stepguard"]), "");
}
