//! Plugin loading end to end: real dynamic libraries loaded by the already-built binary.

use serde_json::Value;

use crate::harness::{Sandbox, plugin_dirs};

fn arg(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

fn find<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

fn stream(sb: &Sandbox) -> std::path::PathBuf {
    sb.write(
        "s.jsonl",
        "{\"type\":\"a\",\"step\":1}\n{\"type\":\"b\"}\nnoise\n{\"type\":\"done\"}\n",
    )
}

#[test]
fn good_plugins_load_side_by_side_and_override_a_builtin() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let run = sb.run(&["plugins", "--json", "--plugin-dir", arg(&dirs.good)]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.is_empty(),
        "no warnings expected: {}",
        run.stderr
    );
    let list = run.json();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "claude",
            "codex",
            "fixture",
            "fixture-old",
            "fixture-panic",
            "gemini",
            "opencode"
        ]
    );
    let fixture = find(&list, "fixture");
    assert_eq!(fixture["version"], "9.9.9");
    assert_eq!(
        fixture["source"],
        dirs.good
            .join(format!("libfixture.{}", std::env::consts::DLL_EXTENSION))
            .display()
            .to_string()
    );
    assert_eq!(
        fixture["units"][0],
        serde_json::json!({"name": "line", "description": "every JSON line", "default": true})
    );
    assert_eq!(find(&list, "fixture-old")["protocol"], "1.0.0");
    let codex = find(&list, "codex");
    assert_eq!(codex["replaces_builtin"], true);
    assert!(
        codex["source"]
            .as_str()
            .unwrap()
            .ends_with("libcodex_override.so")
    );
    assert_eq!(find(&list, "claude")["source"], "builtin");
    let human = sb.run(&["plugins", "--plugin-dir", arg(&dirs.good)]);
    assert!(
        human.stdout.contains("codex 9.9.9 (protocol 1.1.0) from ")
            && human.stdout.contains("(replaces the built-in)"),
        "{}",
        human.stdout
    );
}

#[test]
fn headline_a_plugin_adds_a_unit_to_the_already_built_binary() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    let without = sb.run(&["count", "-p", "codex", "--unit", "every_line", arg(&file)]);
    assert_eq!(without.code, Some(2));
    assert!(
        without
            .stderr
            .contains("unknown unit `every_line` for provider `codex`"),
        "{}",
        without.stderr
    );
    let with = sb.run(&[
        "count",
        "-p",
        "codex",
        "--unit",
        "every_line",
        "--json",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert_eq!(with.code, Some(0), "{}", with.stderr);
    let v = with.json();
    assert_eq!(
        (
            v["num_steps_computed"].as_u64(),
            v["noise_lines"].as_u64(),
            v["outcome"].as_str()
        ),
        (Some(3), Some(1), Some("success"))
    );
}

#[test]
fn files_that_do_not_load_are_skipped_with_one_warning_each() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let run = sb.run(&["plugins", "--json", "--plugin-dir", arg(&dirs.bad)]);
    assert_eq!(run.code, Some(0));
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("stepguard: warning: skipped plugin "))
        .collect();
    assert_eq!(warnings.len(), 3, "{}", run.stderr);
    let ext = std::env::consts::DLL_EXTENSION;
    for (file, reason) in [
        (
            "not_a_plugin",
            "not a stepguard plugin (it has no `stepguard_plugin_abi_generation` symbol)",
        ),
        (
            "fixture_abi2",
            "built for plugin ABI 2, this stepguard speaks 1; rebuild against stepguard-plugin-api 1.x",
        ),
        ("fixture_new", "protocol 2.0 required, this host speaks 1.1"),
    ] {
        let path = dirs.bad.join(format!("lib{file}.{ext}"));
        let line = format!(
            "stepguard: warning: skipped plugin {}: {reason}",
            path.display()
        );
        assert!(
            warnings.contains(&line.as_str()),
            "missing {line}\n{}",
            run.stderr
        );
        let check = sb.run(&["plugins", "check", arg(&path)]);
        assert_eq!(check.code, Some(4));
        assert_eq!(
            check.stdout.trim(),
            format!("{}: does not load: {reason}", path.display())
        );
    }
    let list = run.json();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["claude", "codex", "gemini"]);
}

#[test]
fn a_command_needing_a_provider_that_failed_to_load_exits_4_with_the_same_message() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    for (provider, reason) in [
        ("fixture-new", "protocol 2.0 required, this host speaks 1.1"),
        (
            "fixture-abi2",
            "built for plugin ABI 2, this stepguard speaks 1",
        ),
    ] {
        let run = sb.run(&[
            "count",
            "-p",
            provider,
            "--plugin-dir",
            arg(&dirs.bad),
            arg(&file),
        ]);
        assert_eq!(run.code, Some(4), "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "stepguard: error: provider `{provider}` is unavailable: plugin "
            )),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains(reason), "{}", run.stderr);
    }
}

#[test]
fn plugin_built_against_an_older_protocol_minor_loads_and_counts() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    let run = sb.run(&[
        "count",
        "-p",
        "fixture-old",
        "--json",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.json()["num_steps_computed"], 3);
}

#[test]
fn a_panicking_plugin_is_an_error_with_exit_4_and_the_host_survives() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    let run = sb.run(&[
        "count",
        "-p",
        "fixture-panic",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert_eq!(
        run.stderr.trim(),
        "stepguard: error: plugin `fixture-panic` failed: plugin panicked: fixture panics on purpose"
    );
}

#[test]
fn bad_provider_options_are_rejected_with_the_plugins_message() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    sb.write(
        "project/stepguard.toml",
        "[fixture]\nstrictness = \"extreme\"\n",
    );
    let run = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("invalid options for provider `fixture`: `strictness` must be \"low\" or \"high\", got \"extreme\""), "{}", run.stderr);
    sb.write(
        "project/stepguard.toml",
        "[fixture]\nstrictness = \"high\"\nmax_steps_unit = \"word\"\n",
    );
    let run = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--json",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (
            run.json()["unit"].as_str(),
            run.json()["num_steps_computed"].as_u64()
        ),
        (Some("word"), Some(1))
    );
    // Built-ins accept no options: a stray key is named.
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_step_unit = \"tool\"\n",
    );
    let run = sb.run(&["count", "-p", "codex", arg(&file)]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("unknown option `max_step_unit` for provider `codex`; it accepts none"),
        "{}",
        run.stderr
    );
}

#[test]
fn plugin_logs_reach_the_hosts_subscriber() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    let run = sb.run(&[
        "-v",
        "count",
        "-p",
        "fixture",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert_eq!(run.code, Some(0));
    assert!(
        run.stderr.contains("fixture counter opened for unit line"),
        "{}",
        run.stderr
    );
    let quiet = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--plugin-dir",
        arg(&dirs.good),
        arg(&file),
    ]);
    assert!(
        !quiet.stderr.contains("fixture counter opened"),
        "{}",
        quiet.stderr
    );
}

#[test]
fn search_path_env_and_never_the_working_directory() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let ext = std::env::consts::DLL_EXTENSION;
    std::fs::copy(
        dirs.good.join(format!("libfixture.{ext}")),
        sb.project().join(format!("libfixture.{ext}")),
    )
    .unwrap();
    let names = |run: crate::harness::Run| -> Vec<String> {
        run.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!names(sb.run(&["plugins", "--json"])).contains(&"fixture".to_owned()));
    let via_env = sb.run_env(
        &["plugins", "--json"],
        &[("STEPGUARD_PLUGIN_PATH", arg(&dirs.opencode))],
    );
    assert!(names(via_env).contains(&"opencode".to_owned()));
    let data_dir = sb.root().join("xdg-data/stepguard/plugins");
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::copy(
        dirs.opencode.join(format!("libopencode.{ext}")),
        data_dir.join(format!("libopencode.{ext}")),
    )
    .unwrap();
    assert!(names(sb.run(&["plugins", "--json"])).contains(&"opencode".to_owned()));
}

#[test]
fn builtin_provider_crate_also_works_as_a_plugin() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let path = dirs
        .builtin_as_plugin
        .join(format!("libcodex.{}", std::env::consts::DLL_EXTENSION));
    let check = sb.run(&["plugins", "check", arg(&path)]);
    assert_eq!(check.code, Some(0), "{}", check.stdout);
    assert!(
        check.stdout.contains("loads: provider `codex`"),
        "{}",
        check.stdout
    );
    let fixture = crate::harness::workspace().join("tests/fixtures/streams/codex/long_run.jsonl");
    let run = sb.run(&[
        "count",
        "-p",
        "codex",
        "--json",
        "--plugin-dir",
        arg(&dirs.builtin_as_plugin),
        arg(&fixture),
    ]);
    assert_eq!(run.json()["num_steps_computed"], 42);
    assert!(run.stderr.is_empty());
}

#[test]
fn opencode_plugin_counts_the_real_recordings() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let real = crate::harness::workspace().join("tests/fixtures/real/opencode");
    for (file, steps, outcome, slug) in [
        ("tools3.jsonl", 4, "success", Value::Null),
        ("steps2.jsonl", 13, "success", Value::Null),
        ("error429.jsonl", 1, "failed", "rate_limited".into()),
    ] {
        let run = sb.run(&[
            "count",
            "-p",
            "opencode",
            "--json",
            "--plugin-dir",
            arg(&dirs.opencode),
            arg(&real.join(file)),
        ]);
        let v = run.json();
        assert_eq!(
            (v["num_steps_computed"].as_u64(), v["outcome"].as_str()),
            (Some(steps), Some(outcome)),
            "{file}"
        );
        assert_eq!(v["error_type"], slug, "{file}");
    }
}
