//! The plugin boundary across versions: `tests/compat` holds the API crate as it was when the ABI
//! froze, a plugin built against it (declaring protocol 1.0) and a host built against it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{Sandbox, plugin_dirs, target_dir, workspace};

/// Builds the compatibility workspace once (cargo skips what is fresh) and returns its output dir.
fn compat_build() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = target_dir().join("compat");
        std::fs::create_dir_all(&target).expect("mkdir");
        let lock = std::fs::File::create(target.join(".lock")).expect("lock file");
        lock.lock().expect("lock");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(workspace())
            .args(["build", "--quiet", "--locked", "--manifest-path"])
            .arg(workspace().join("tests/compat/Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "building tests/compat failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("debug")
    })
}

/// A directory holding only the old plugin, as a user would install it.
fn old_plugin_dir(sb: &Sandbox) -> String {
    let dir = sb.root().join("old-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let ext = std::env::consts::DLL_EXTENSION;
    std::fs::copy(
        compat_build().join(format!("libold_plugin.{ext}")),
        dir.join(format!("libold_plugin.{ext}")),
    )
    .unwrap();
    dir.display().to_string()
}

#[test]
fn a_plugin_built_against_the_frozen_api_declaring_1_0_counts_in_todays_host() {
    let sb = Sandbox::new();
    let dir = old_plugin_dir(&sb);
    let stream = sb.write("old.stream", "read a\nwrite b\n\nrun c\ndone\n");
    let stream = stream.to_str().unwrap();
    let listed = sb.run(&["plugins", "--json", "--plugin-dir", &dir]);
    let old = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "oldlines")
        .cloned()
        .expect("oldlines listed");
    assert_eq!(old["protocol"], "1.0.0");

    let count = sb.run(&[
        "count",
        "--plugin-dir",
        &dir,
        "-p",
        "oldlines",
        "--json",
        stream,
    ]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    let record = count.json();
    assert_eq!(record["num_steps_computed"], 3);
    assert_eq!(record["outcome"], "success");

    // Enforced live like any plugin: the fourth line would be step 3 of a budget of 2.
    let run = sb.run(&[
        "run",
        "--no-record",
        "--plugin-dir",
        &dir,
        "-p",
        "oldlines",
        "--max-steps",
        "2",
        "--",
        "cat",
        stream,
    ]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(run.stdout, "read a\nwrite b\n\nrun c\n");
}

#[test]
fn a_plugin_built_today_loads_in_a_host_of_the_frozen_api_unless_it_needs_newer() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let stream = sb.write(
        "lines.jsonl",
        "{\"type\":\"a\"}\n{\"type\":\"step\"}\nnot json\n{\"type\":\"c\"}\n",
    );
    let old_host = compat_build().join("old-host");
    let ext = std::env::consts::DLL_EXTENSION;
    let host = |plugin: &str| {
        let out = Command::new(&old_host)
            .arg(dirs.good.join(format!("lib{plugin}.{ext}")))
            .arg(&stream)
            .output()
            .expect("run old-host");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // Declares 1.0 explicitly: loads, opens a counter, counts the JSON lines.
    let (code, out) = host("fixture_old");
    assert_eq!(
        (code, out.trim()),
        (Some(0), "fixture-old 1.0.0 steps 3 finish 3")
    );
    // Uses nothing newer than the old host speaks: the protocol it declares is the lowest it
    // needs, so a plain rebuild against today's API does not lock old hosts out.
    let (code, out) = host("fixture");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("fixture 1.0.0 steps 3"), "{out}");
    // Declares how OpenCode resumes a session (protocol 1.8, beside 1.6's tool results): the
    // old host refuses it, naming the version.
    let (code, out) = host("opencode");
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("protocol 1.8 required"), "{out}");
}

#[test]
fn a_plugin_built_against_an_incompatible_api_is_refused_in_one_line() {
    let sb = Sandbox::new();
    let dir = sb.root().join("pre-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let ext = std::env::consts::DLL_EXTENSION;
    let file = dir.join(format!("libpre_plugin.{ext}"));
    std::fs::copy(compat_build().join(format!("libpre_plugin.{ext}")), &file).unwrap();
    let file = file.to_str().unwrap();
    let dir = dir.to_str().unwrap();

    let check = sb.run(&["plugins", "check", file]);
    assert_eq!(check.code, Some(4), "{}{}", check.stdout, check.stderr);
    let said = format!("{}{}", check.stdout, check.stderr);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("type layout does not match"), "{said}");
    assert!(
        said.contains("rebuild it against stepguard-plugin-api 1.x"),
        "{said}"
    );
    // The layout report itself is there for whoever asks.
    let verbose = sb.run(&["plugins", "check", "-v", file]);
    assert!(
        format!("{}{}", verbose.stdout, verbose.stderr).contains("Error:mismatched package"),
        "{}",
        verbose.stderr
    );

    // Listing plugins warns about it once; a command that needs another provider says nothing.
    let listed = sb.run(&["plugins", "--plugin-dir", dir]);
    assert_eq!(
        listed
            .stderr
            .lines()
            .filter(|l| l.contains("libpre_plugin"))
            .count(),
        1,
        "{}",
        listed.stderr
    );
    let stream = crate::harness::fixture("real/codex/tools3.jsonl");
    let count = sb.run(&["count", "--plugin-dir", dir, "-p", "codex", &stream]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    assert!(!count.stderr.contains("libpre_plugin"), "{}", count.stderr);
}
