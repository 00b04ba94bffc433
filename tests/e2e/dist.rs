//! `.ci/dist`: the installable tree (`bin/stepguard` plus `lib/stepguard/plugins/*.so`), and the
//! OpenCode plugin found there with no flag at all.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use crate::harness::{Sandbox, target_dir, workspace};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn dist_lays_out_bin_and_lib_and_the_binary_finds_opencode_there() {
    let sb = Sandbox::new();
    let prefix = sb.root().join("prefix");
    // The debug profile in the target directory the plugin fixtures are built in: the plugin is
    // already fresh there and the CLI is built once per machine. (Building into target/ would
    // replace target/debug/stepguard, which the other tests are running, with a build of
    // different features.)
    let out = Command::new(workspace().join(".ci/dist"))
        .args(["--profile", "debug", "--out"])
        .arg(&prefix)
        .env("CARGO_TARGET_DIR", target_dir().join("fixture-plugins"))
        .output()
        .expect("run .ci/dist");
    assert!(
        out.status.success(),
        ".ci/dist failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ext = std::env::consts::DLL_EXTENSION;
    let bin = prefix.join("bin/stepguard");
    let plugins = prefix.join("lib/stepguard/plugins");
    let plugin = plugins.join(format!("libstepguard_plugin_opencode.{ext}"));
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(
        mode(&plugin),
        0o644,
        "the trust check refuses group/other-writable files"
    );
    for dir in ["bin", "lib", "lib/stepguard", "lib/stepguard/plugins"] {
        assert_eq!(mode(&prefix.join(dir)), 0o755, "{dir}");
    }

    // Run like the harness runs the binary under test: isolated from the developer's settings.
    let fixture = workspace().join("tests/fixtures/real/opencode/tools3.jsonl");
    let mut cmd = Command::new(&bin);
    cmd.args(["count", "-p", "opencode", "--json"])
        .arg(&fixture)
        .current_dir(sb.project())
        .env("HOME", sb.root().join("home"))
        .env("XDG_CONFIG_HOME", sb.root().join("xdg-config"))
        .env("XDG_DATA_HOME", sb.root().join("xdg-data"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("STEPGUARD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let run: crate::harness::Run = cmd.output().expect("run dist stepguard").into();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let v = run.json();
    assert_eq!(
        (v["num_steps_computed"].as_u64(), v["outcome"].as_str()),
        (Some(4), Some("success"))
    );
    // Found through the executable's real path, beside which `../lib/stepguard/plugins` is.
    let found = std::fs::canonicalize(&plugin).unwrap();
    assert_eq!(
        v["plugin_source"].as_str(),
        Some(found.display().to_string().as_str())
    );
}
