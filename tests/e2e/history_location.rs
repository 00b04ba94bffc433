//! Where the history lives: the user's data directory (not the agent's repository), a project
//! database of the old default location imported once, and the repository and directory of
//! each run as filters.

use crate::harness::{Sandbox, fixture};

fn ok_agent(sb: &Sandbox) -> String {
    let path = sb.write(
        "ok.sh",
        format!("#!/bin/sh\ncat {}\n", fixture("real/codex/tools3.jsonl")),
    );
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn ids(sb: &Sandbox, filters: &[&str]) -> Vec<i64> {
    let mut args = vec!["history", "--json"];
    args.extend_from_slice(filters);
    let out = sb.run(&args);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

#[test]
fn a_project_history_is_imported_once_and_says_so() {
    let sb = Sandbox::new();
    let ok = ok_agent(&sb);
    // A run recorded where stepguard used to keep the history.
    std::fs::create_dir_all(sb.project().join(".stepguard")).unwrap();
    let old = sb.project().join(".stepguard/history.db");
    let first = sb.run(&[
        "run",
        "-q",
        "--db",
        old.to_str().unwrap(),
        "-p",
        "codex",
        "--",
        &ok,
    ]);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    // The next command without --db imports it into the user's history.
    let imported = sb.run(&["run", "-q", "-p", "codex", "--", &ok]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        imported.stderr.contains("imported 1 run(s)")
            && imported
                .stderr
                .contains(&sb.history_db().display().to_string()),
        "{}",
        imported.stderr
    );
    assert!(!old.exists());
    assert!(
        sb.project()
            .join(".stepguard/history.db.imported")
            .is_file()
    );
    let history = sb.run(&["history", "--json"]);
    assert!(
        !history.stderr.contains("imported"),
        "imported twice: {}",
        history.stderr
    );
    let runs = history.json();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter().all(|r| r["num_steps_computed"] == 4),
        "{runs:?}"
    );
}

#[test]
fn runs_are_found_by_repository_and_directory() {
    let sb = Sandbox::new();
    let ok = ok_agent(&sb);
    sb.write(
        "project/.git/config",
        "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = git@example.com:team/app.git\n",
    );
    std::fs::create_dir_all(sb.project().join("sub")).unwrap();
    let top = sb.run(&["run", "-q", "-p", "codex", "--", &ok]);
    assert_eq!(top.code, Some(0), "{}", top.stderr);
    let sub = sb
        .cmd(&["run", "-q", "-p", "codex", "--", &ok])
        .current_dir(sb.project().join("sub"))
        .output()
        .unwrap();
    assert!(sub.status.success(), "{sub:?}");
    let elsewhere = sb
        .cmd(&["run", "-q", "-p", "codex", "--", &ok])
        .current_dir(sb.root())
        .output()
        .unwrap();
    assert!(elsewhere.status.success(), "{elsewhere:?}");
    assert_eq!(ids(&sb, &["--repo", "."]), vec![2, 1]);
    assert_eq!(
        ids(&sb, &["--repo", "git@example.com:team/app.git"]),
        vec![2, 1]
    );
    assert_eq!(ids(&sb, &["--dir", "sub"]), vec![2]);
    assert_eq!(ids(&sb, &["--dir", "."]), vec![1]);
    let root = sb.root().display().to_string();
    assert_eq!(ids(&sb, &["--dir", &root]), vec![3]);
    let none = sb.run(&["history", "--repo", "https://example.com/other.git"]);
    assert_eq!(none.code, Some(0));
    assert!(
        none.stderr
            .contains("no recorded run matches --repo https://example.com/other.git"),
        "{}",
        none.stderr
    );
    // Outside a repository, `--repo .` names the fix.
    let outside = sb
        .cmd(&["history", "--repo", "."])
        .current_dir(sb.root())
        .output()
        .unwrap();
    assert_eq!(outside.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&outside.stderr).contains("not in a git repository"));
}
