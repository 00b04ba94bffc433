//! Plugin loading end to end: real dynamic libraries loaded by the already-built binary.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{Sandbox, plugin_dirs, workspace};

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn find<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

fn stream(sb: &Sandbox) -> PathBuf {
    sb.write(
        "s.jsonl",
        "{\"type\":\"a\",\"step\":1}\n{\"type\":\"b\"}\nnoise\n{\"type\":\"done\"}\n",
    )
}

#[test]
fn good_plugins_load_side_by_side_and_override_a_builtin() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let run = sb.run(&[
        "plugins",
        "--json",
        "--allow-override",
        "--plugin-dir",
        arg(&dirs.good),
    ]);
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
    let human = sb.run(&[
        "plugins",
        "--allow-override",
        "--plugin-dir",
        arg(&dirs.good),
    ]);
    assert!(
        human.stdout.contains("codex 9.9.9 (protocol 1.2.0) from ")
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
        "--allow-override",
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
        ("fixture_new", "protocol 2.0 required, this host speaks 1.8"),
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
fn a_truncated_plugin_file_is_refused_in_one_line_and_never_crashes_stepguard() {
    // A copy cut short (an interrupted copy, a full disk) used to map and then kill every
    // command with SIGBUS (exit 135, no message), built-in providers included.
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let ext = std::env::consts::DLL_EXTENSION;
    let whole = std::fs::read(dirs.good.join(format!("libfixture.{ext}"))).unwrap();
    let stream = workspace().join("tests/fixtures/streams/codex/success_multi_tool.jsonl");
    // Cut inside the loadable segments, inside the program headers, inside the ELF header.
    for keep in [whole.len() / 30, 4096, 100] {
        let dir = sb.root().join(format!("cut-{keep}"));
        std::fs::create_dir_all(&dir).unwrap();
        let cut = dir.join(format!("libcut.{ext}"));
        std::fs::write(&cut, &whole[..keep]).unwrap();
        let list = sb.run(&["plugins", "--plugin-dir", arg(&dir)]);
        assert_eq!(list.code, Some(0), "{keep} bytes: {}", list.stderr);
        let warning = format!("stepguard: warning: skipped plugin {}: ", cut.display());
        let said: Vec<&str> = list
            .stderr
            .lines()
            .filter(|l| l.starts_with(&warning))
            .collect();
        assert_eq!(said.len(), 1, "{keep} bytes: {}", list.stderr);
        assert!(said[0].contains("damaged ELF file"), "{}", said[0]);
        assert!(list.stdout.contains("codex 0.1.0"), "{}", list.stdout);
        let count = sb.run(&[
            "count",
            "-p",
            "codex",
            "--plugin-dir",
            arg(&dir),
            arg(&stream),
        ]);
        assert_eq!(count.code, Some(0), "{keep} bytes: {}", count.stderr);
        assert!(count.stdout.contains("Steps: 9"), "{}", count.stdout);
        let check = sb.run(&["plugins", "check", arg(&cut)]);
        assert_eq!(check.code, Some(4), "{keep} bytes: {}", check.stderr);
        assert!(
            check.stdout.contains("damaged ELF file"),
            "{}",
            check.stdout
        );
    }
}

#[test]
fn a_command_needing_a_provider_that_failed_to_load_exits_4_with_the_same_message() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    for (provider, reason) in [
        ("fixture-new", "protocol 2.0 required, this host speaks 1.8"),
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
        "--allow-override",
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
    // Built-ins accept only the host's `max_steps_unit`: a stray key is named, with the match.
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_step_unit = \"tool\"\n",
    );
    let run = sb.run(&["count", "-p", "codex", arg(&file)]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("codex.max_step_unit: unknown option `max_step_unit` for provider `codex`; did you mean `max_steps_unit`? accepted keys: max_steps_unit"),
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
        "--allow-override",
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

/// Copies a built plugin file into `dir` (created 0755 under the sandbox root) and returns the copy.
fn install(sb: &Sandbox, dir: &str, built: &Path) -> PathBuf {
    let dir = sb.root().join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    chmod(&dir, 0o755);
    let copy = dir.join(built.file_name().unwrap());
    std::fs::copy(built, &copy).unwrap();
    chmod(&copy, 0o755);
    copy
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn dylib(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("lib{name}.{}", std::env::consts::DLL_EXTENSION))
}

#[test]
fn a_world_writable_plugin_file_is_refused_naming_the_file() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    let plugin = install(&sb, "plugins", &dylib(&dirs.good, "fixture"));
    let dir = plugin.parent().unwrap();
    chmod(&plugin, 0o666);
    let problem = "it is writable by others (mode 0666); chmod go-w it";

    let list = sb.run(&["plugins", "--json", "--plugin-dir", arg(dir)]);
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    assert_eq!(
        list.stderr.trim(),
        format!(
            "stepguard: warning: refusing plugin {}: {problem}",
            plugin.display()
        )
    );
    assert!(
        !list.stdout.contains("\"fixture\""),
        "refused, not listed: {}",
        list.stdout
    );

    let count = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--plugin-dir",
        arg(dir),
        arg(&file),
    ]);
    assert_eq!(count.code, Some(4), "{}", count.stderr);
    assert!(
        count.stderr.contains(&format!(
            "stepguard: error: provider `fixture` is unavailable: plugin {} was refused: {problem}",
            plugin.display()
        )),
        "{}",
        count.stderr
    );

    let check = sb.run(&["plugins", "check", arg(&plugin)]);
    assert_eq!(check.code, Some(4));
    assert_eq!(
        check.stdout.trim(),
        format!("{}: does not load: {problem}", plugin.display())
    );

    // The mode was the only problem.
    chmod(&plugin, 0o644);
    let fixed = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--plugin-dir",
        arg(dir),
        arg(&file),
    ]);
    assert_eq!(fixed.code, Some(0), "{}", fixed.stderr);
    assert!(fixed.stderr.is_empty(), "{}", fixed.stderr);
}

#[test]
fn a_plugin_in_a_group_writable_directory_is_refused_naming_the_directory() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    let plugin = install(&sb, "shared-plugins", &dylib(&dirs.good, "fixture"));
    let dir = plugin.parent().unwrap();
    chmod(dir, 0o775);
    let run = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--plugin-dir",
        arg(dir),
        arg(&file),
    ]);
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    let problem = format!(
        "its directory {0} is writable by others (mode 0775); chmod go-w {0}",
        dir.display()
    );
    assert!(
        run.stderr.contains(&format!(
            "stepguard: warning: refusing plugin {}: {problem}",
            plugin.display()
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("stepguard: error: provider `fixture` is unavailable: plugin ")
            && run.stderr.contains(&format!("was refused: {problem}")),
        "{}",
        run.stderr
    );
    let check = sb.run(&["plugins", "check", arg(&plugin)]);
    assert_eq!(check.code, Some(4));
    assert!(check.stdout.contains(&problem), "{}", check.stdout);
}

#[test]
fn relative_plugin_path_entries_are_ignored_but_a_relative_plugin_dir_is_explicit() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    // A plugin in the working directory, as an agent with a shell could drop one.
    let plugin = install(&sb, "project", &dylib(&dirs.good, "fixture"));
    let listed = sb.run_env(&["plugins", "--json"], &[("STEPGUARD_PLUGIN_PATH", ".")]);
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    assert_eq!(
        listed.stderr.trim(),
        "stepguard: warning: ignoring relative entry \".\" in STEPGUARD_PLUGIN_PATH; plugin directories there must be absolute"
    );
    assert!(!listed.stdout.contains("\"fixture\""), "{}", listed.stdout);

    let empty_entry = sb.run_env(
        &["count", "-p", "fixture", arg(&file)],
        &[("STEPGUARD_PLUGIN_PATH", "/nonexistent::plugins")],
    );
    assert_eq!(empty_entry.code, Some(2), "{}", empty_entry.stderr);
    for entry in ["\"\"", "\"plugins\""] {
        assert!(
            empty_entry.stderr.contains(&format!(
                "ignoring relative entry {entry} in STEPGUARD_PLUGIN_PATH"
            )),
            "{}",
            empty_entry.stderr
        );
    }
    assert!(
        empty_entry.stderr.contains("unknown provider `fixture`"),
        "{}",
        empty_entry.stderr
    );

    let explicit = sb.run(&[
        "count",
        "-p",
        "fixture",
        "--json",
        "--plugin-dir",
        ".",
        arg(&file),
    ]);
    assert_eq!(explicit.code, Some(0), "{}", explicit.stderr);
    assert!(explicit.stderr.is_empty(), "{}", explicit.stderr);
    let source = explicit.json()["plugin_source"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        Path::new(&source).is_absolute() && source.ends_with("project/libfixture.so"),
        "{source} (want {})",
        plugin.display()
    );
}

/// Writes an agent script that prints a recorded Codex stream.
fn codex_agent(sb: &Sandbox) -> String {
    let stream = crate::harness::workspace().join("tests/fixtures/streams/codex/long_run.jsonl");
    let path = sb.write("agent.sh", format!("#!/bin/sh\ncat {}\n", stream.display()));
    chmod(&path, 0o755);
    path.display().to_string()
}

#[test]
fn replacing_a_builtin_needs_consent_and_without_it_the_builtin_budget_holds() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let plugin = install(&sb, "plugins", &dylib(&dirs.good, "codex_override"));
    let dir = plugin.parent().unwrap();
    let warning = format!(
        "stepguard: warning: plugin {} would replace the built-in provider `codex`; pass --allow-override to allow it",
        plugin.display()
    );
    let fixture = crate::harness::workspace().join("tests/fixtures/streams/codex/long_run.jsonl");

    // Without consent: the file is not even opened (codex is built in and may not be replaced,
    // so `count -p codex` needs no plugin file), and the built-in counts.
    let count = sb.run(&[
        "count",
        "-p",
        "codex",
        "--json",
        "--plugin-dir",
        arg(dir),
        arg(&fixture),
    ]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    assert_eq!(count.stderr.trim(), "");
    let v = count.json();
    assert_eq!(
        (
            v["plugin_source"].as_str(),
            v["num_steps_computed"].as_u64()
        ),
        (Some("builtin"), Some(42))
    );
    let summary = sb.root().join("summary.json");
    let summary_arg = summary.display().to_string();
    let agent = codex_agent(&sb);
    let run = sb.run(&[
        "run",
        "--summary-file",
        &summary_arg,
        "-p",
        "codex",
        "--max-steps",
        "5",
        "--plugin-dir",
        arg(dir),
        "--",
        &agent,
    ]);
    assert_eq!(
        run.code,
        Some(3),
        "the built-in budget holds: {}",
        run.stderr
    );
    assert!(!run.stderr.contains("would replace"), "{}", run.stderr);
    let s: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(
        (s["plugin_source"].as_str(), s["error_type"].as_str()),
        (Some("builtin"), Some("max_steps"))
    );
    // `plugins`, which inspects every file, says why it was refused.
    let listed = sb.run(&["plugins", "--plugin-dir", arg(dir)]);
    assert!(listed.stderr.contains(&warning), "{}", listed.stderr);

    // With consent: the plugin replaces it and the run record names the file.
    let count = sb.run(&[
        "count",
        "-p",
        "codex",
        "--json",
        "--allow-override",
        "--plugin-dir",
        arg(dir),
        arg(&fixture),
    ]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    assert!(count.stderr.is_empty(), "{}", count.stderr);
    assert_eq!(
        count.json()["plugin_source"].as_str(),
        Some(plugin.display().to_string().as_str())
    );
    std::fs::remove_file(&summary).unwrap();
    let run = sb.run(&[
        "run",
        "--summary-file",
        &summary_arg,
        "--allow-override",
        "-p",
        "codex",
        "--max-steps",
        "5",
        "--plugin-dir",
        arg(dir),
        "--",
        &agent,
    ]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(!run.stderr.contains("would replace"), "{}", run.stderr);
    let s: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(
        s["plugin_source"].as_str(),
        Some(plugin.display().to_string().as_str())
    );
    let listed = sb.run(&[
        "plugins",
        "--json",
        "--allow-override",
        "--plugin-dir",
        arg(dir),
    ]);
    assert_eq!(find(&listed.json(), "codex")["replaces_builtin"], true);
}

#[test]
fn a_policy_that_forbids_overrides_beats_the_flag() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let plugin = install(&sb, "plugins", &dylib(&dirs.good, "codex_override"));
    let dir = plugin.parent().unwrap();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nallow_plugin_override = false\n",
    );
    let fixture = crate::harness::workspace().join("tests/fixtures/streams/codex/long_run.jsonl");
    let count = sb.run(&[
        "count",
        "-p",
        "codex",
        "--json",
        "--allow-override",
        "--plugin-dir",
        arg(dir),
        arg(&fixture),
    ]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    assert!(
        count
            .stderr
            .contains("--allow-override is refused by the policy at"),
        "{}",
        count.stderr
    );
    let v = count.json();
    assert_eq!(
        (
            v["plugin_source"].as_str(),
            v["num_steps_computed"].as_u64()
        ),
        (Some("builtin"), Some(42))
    );
}

/// The recorded Codex stream the built-in counts 42 steps in.
fn codex_stream() -> PathBuf {
    crate::harness::workspace().join("tests/fixtures/streams/codex/long_run.jsonl")
}

#[test]
fn each_refused_file_is_one_line_and_only_plugins_lists_them_all() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    // Three files that do not load (not a plugin, ABI 2, protocol 2.0) and one refused unopened.
    let bad = install(&sb, "bad", &dylib(&dirs.bad, "not_a_plugin"));
    let dir = bad.parent().unwrap();
    for name in ["fixture_abi2", "fixture_new"] {
        install(&sb, "bad", &dylib(&dirs.bad, name));
    }
    let writable = install(&sb, "bad", &dylib(&dirs.good, "fixture"));
    chmod(&writable, 0o666);

    let list = sb.run(&["plugins", "--json", "--plugin-dir", arg(dir)]);
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    let lines: Vec<&str> = list.stderr.lines().collect();
    assert_eq!(lines.len(), 4, "one line per file:\n{}", list.stderr);
    assert!(
        lines.iter().all(|l| l.starts_with("stepguard: warning: ")),
        "{}",
        list.stderr
    );

    // A command that needs none of them says nothing about them.
    let fixture = codex_stream();
    for args in [
        vec![
            "count",
            "-p",
            "codex",
            "--plugin-dir",
            arg(dir),
            arg(&fixture),
        ],
        vec!["config", "--provider", "codex", "--plugin-dir", arg(dir)],
        vec!["validate", "--plugin-dir", arg(dir)],
    ] {
        let run = sb.run(&args);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        assert!(
            !run.stderr.contains("plugin"),
            "{args:?} warned about an unrelated file:\n{}",
            run.stderr
        );
    }

    // A provider found nowhere names the files whose provider could not be read (not the
    // protocol-2.0 one: its manifest says it is `fixture-new`).
    let missing = sb.run(&[
        "count",
        "-p",
        "wanted",
        "--plugin-dir",
        arg(dir),
        arg(&fixture),
    ]);
    assert_eq!(missing.code, Some(2), "{}", missing.stderr);
    let error = missing.stderr.trim();
    assert_eq!(error.lines().count(), 1, "{error}");
    assert!(
        error.starts_with("stepguard: error: unknown provider `wanted`; available providers: "),
        "{error}"
    );
    for (file, reason) in [
        (
            &bad,
            "failed to load: not a stepguard plugin (it has no `stepguard_plugin_abi_generation` symbol)",
        ),
        (
            &writable,
            "was refused: it is writable by others (mode 0666); chmod go-w it",
        ),
    ] {
        let part = format!(
            "; plugin {}, whose provider could not be read, {reason}",
            file.display()
        );
        assert!(error.contains(&part), "missing {part}\n{error}");
    }
    assert!(!error.contains("libfixture_new"), "{error}");
}

#[test]
fn a_refused_file_is_warned_about_by_the_commands_that_need_its_provider() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let plugin = install(&sb, "plugins", &dylib(&dirs.good, "codex_override"));
    let dir = plugin.parent().unwrap();
    let reason =
        "it would replace the built-in provider `codex`; pass --allow-override to allow it";
    let claude_stream =
        crate::harness::workspace().join("tests/fixtures/streams/claude/long_run.jsonl");

    // Neither `count -p claude` nor `count -p codex` opens it: both are built in and may not be
    // replaced, so neither needs a plugin file.
    let other = sb.run(&[
        "count",
        "-p",
        "claude",
        "--plugin-dir",
        arg(dir),
        arg(&claude_stream),
    ]);
    assert!(other.stderr.is_empty(), "{}", other.stderr);
    let needed = sb.run(&[
        "count",
        "-p",
        "codex",
        "--plugin-dir",
        arg(dir),
        arg(&codex_stream()),
    ]);
    assert_eq!(needed.code, Some(0), "{}", needed.stderr);
    assert_eq!(needed.stderr.trim(), "");

    // `config` and `validate` warn at the file when the provider is one they check.
    let warning = format!(
        "{}: plugin for provider `codex` was refused: {reason}",
        plugin.display()
    );
    let config = sb.run(&["config", "--provider", "codex", "--plugin-dir", arg(dir)]);
    assert_eq!(config.code, Some(0), "{}", config.stderr);
    assert!(config.stderr.contains(&warning), "{}", config.stderr);
    let config = sb.run(&["config", "--provider", "claude", "--plugin-dir", arg(dir)]);
    assert!(!config.stderr.contains("plugin"), "{}", config.stderr);
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"item\"\n",
    );
    let validate = sb.run(&["validate", "--plugin-dir", arg(dir)]);
    assert_eq!(validate.code, Some(0), "{}", validate.stderr);
    assert!(
        validate.stderr.contains(&warning) || validate.stdout.contains(&warning),
        "{}{}",
        validate.stdout,
        validate.stderr
    );
}

#[test]
fn the_host_names_undeclared_option_keys_before_the_plugin_judges_values() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let file = stream(&sb);
    sb.write(
        "project/stepguard.toml",
        "[fixture]\nstrictnes = \"low\"\nstrictness = \"extreme\"\n",
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
    assert!(
        run.stderr.contains(
            "fixture.strictnes: unknown option `strictnes` for provider `fixture`; did you mean \
             `strictness`? accepted keys: max_steps_unit, strictness"
        ),
        "{}",
        run.stderr
    );
    // The plugin sees only the declared key, so its own unknown-key message never shows.
    assert!(
        run.stderr.contains(
            "invalid options for provider `fixture`: `strictness` must be \"low\" or \"high\", got \"extreme\""
        ),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("the fixture accepts"),
        "{}",
        run.stderr
    );
}

#[test]
fn count_opencode_without_the_plugin_says_how_to_get_it() {
    let sb = Sandbox::new();
    let real = crate::harness::workspace().join("tests/fixtures/real/opencode/tools3.jsonl");
    let run = sb.run(&["count", "-p", "opencode", arg(&real)]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let error = run.stderr.trim();
    assert_eq!(error.lines().count(), 1, "{error}");
    for needle in [
        "stepguard: error: unknown provider `opencode`; available providers: claude, codex, gemini",
        "`opencode` is an example plugin",
        "build it with `.ci/dist` (installs lib/stepguard/plugins/libstepguard_plugin_opencode.",
        "or `cargo build --release -p stepguard-plugin-opencode` and pass `--plugin-dir target/release`",
    ] {
        assert!(error.contains(needle), "missing {needle}\n{error}");
    }
}

#[test]
fn plugins_new_writes_a_crate_that_builds_tests_and_counts_outside_the_workspace() {
    let sb = Sandbox::new();
    let dir = sb.root().join("stepguard-plugin-myagent");
    let api = workspace().join("crates/plugin-api");
    let made = sb.run(&[
        "plugins",
        "new",
        "myagent",
        "--dir",
        arg(&dir),
        "--api-path",
        arg(&api),
    ]);
    assert_eq!(made.code, Some(0), "{}", made.stderr);
    for file in ["Cargo.toml", "src/lib.rs", "sample.jsonl", "README.md"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("cargo build --release"), "{readme}");
    assert!(
        readme.contains("libstepguard_plugin_myagent.so"),
        "{readme}"
    );
    // Without --api-path the dependency is the plugin API of the checkout stepguard was built
    // from (it used to be a placeholder git URL, so the crate's `cargo test` failed).
    let default = sb.run(&[
        "plugins",
        "new",
        "other",
        "--dir",
        arg(&sb.root().join("o")),
    ]);
    assert_eq!(default.code, Some(0), "{}", default.stderr);
    let manifest = std::fs::read_to_string(sb.root().join("o/Cargo.toml")).unwrap();
    let api_dir = workspace().join("crates/plugin-api");
    assert!(
        manifest.contains(&format!(
            "stepguard-plugin-api = {{ path = \"{}\" }}",
            api_dir.display()
        )),
        "{manifest}"
    );
    assert!(
        default.stderr.contains(&format!(
            "stepguard-plugin-api: the source checkout stepguard was built from ({})",
            api_dir.display()
        )),
        "{}",
        default.stderr
    );
    assert!(!manifest.contains("example.invalid"), "{manifest}");

    // Built as a third party would, outside the workspace (its versions pinned like ours).
    std::fs::copy(workspace().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = crate::harness::target_dir().join("template");
    let cargo_in = |args: &[&str]| {
        let out = std::process::Command::new(&cargo)
            .current_dir(&dir)
            .args(args)
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("run cargo");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "cargo {args:?}:\n{text}");
        text
    };
    let tested = cargo_in(&["test", "--quiet"]);
    assert!(tested.contains("2 passed"), "{tested}");
    cargo_in(&["build", "--quiet"]);
    let plugins = sb.root().join("installed");
    std::fs::create_dir_all(&plugins).unwrap();
    let ext = std::env::consts::DLL_EXTENSION;
    std::fs::copy(
        target.join(format!("debug/libstepguard_plugin_myagent.{ext}")),
        plugins.join(format!("libstepguard_plugin_myagent.{ext}")),
    )
    .unwrap();
    let sample = dir.join("sample.jsonl");
    let count = sb.run(&[
        "count",
        "--json",
        "--plugin-dir",
        arg(&plugins),
        "-p",
        "myagent",
        arg(&sample),
    ]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    assert_eq!(count.json()["num_steps_computed"], 3);
    assert_eq!(count.json()["outcome"], "success");
    let run = sb.run(&[
        "run",
        "--no-record",
        "--plugin-dir",
        arg(&plugins),
        "-p",
        "myagent",
        "--max-steps",
        "2",
        "--",
        "cat",
        arg(&sample),
    ]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
}

#[test]
fn plugins_new_refuses_a_bad_name_and_a_directory_in_use() {
    let sb = Sandbox::new();
    let bad = sb.run(&["plugins", "new", "My Agent"]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr.contains("`My Agent` is not a provider name"),
        "{}",
        bad.stderr
    );
    sb.write("used/keep.txt", "mine");
    let used = sb.run(&["plugins", "new", "x", "--dir", arg(&sb.root().join("used"))]);
    assert_eq!(used.code, Some(2));
    assert!(
        used.stderr.contains("already exists and is not empty"),
        "{}",
        used.stderr
    );
    assert_eq!(
        std::fs::read_to_string(sb.root().join("used/keep.txt")).unwrap(),
        "mine"
    );
}

/// A shared library this test process has mapped (libgcc_s, which Rust binaries link), copied
/// into `dir` as a plugin file: one the loader would really open. `None` when there is none.
fn copy_a_shared_library(dir: &Path) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libgcc_s") || p.contains("libz."))?;
    std::fs::create_dir_all(dir).ok()?;
    let dest = dir.join("libcopied.so");
    std::fs::copy(lib, &dest).ok()?;
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o644)).ok()?;
    Some(dest)
}

#[test]
fn a_command_of_a_builtin_provider_opens_no_plugin_file() {
    let sb = Sandbox::new();
    let dir = sb.root().join("plugins");
    let Some(lib) = copy_a_shared_library(&dir) else {
        eprintln!("SKIPPED: no shared library mapped in this process to copy as a plugin file");
        return;
    };
    let stream = sb.write(
        "s.jsonl",
        std::fs::read(workspace().join("tests/fixtures/streams/codex/long_run.jsonl")).unwrap(),
    );
    // glibc's loader names every file it opens under LD_DEBUG=files.
    let opened = |args: &[&str]| {
        let mut full = vec!["--plugin-dir", arg(&dir)];
        full.extend(args);
        let run = sb.run_env(&full, &[("LD_DEBUG", "files")]);
        (run.code, run.stderr.contains(arg(&lib)), run.stderr)
    };
    for args in [
        &["count", "-p", "codex", arg(&stream)][..],
        &[
            "run",
            "--no-record",
            "-q",
            "-p",
            "codex",
            "--",
            "cat",
            arg(&stream),
        ],
    ] {
        let (code, opened, stderr) = opened(args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(!opened, "{args:?} opened {}", lib.display());
    }
    // `plugins` inspects every file (the control: the loader does report this one), and a
    // provider that is not built in needs them all.
    let (_, opened_all, stderr) = opened(&["plugins"]);
    assert!(
        opened_all,
        "`plugins` did not open {}: {stderr}",
        lib.display()
    );
    let (code, opened_all, _) = opened(&["count", "-p", "nosuch", arg(&stream)]);
    assert_eq!(code, Some(2));
    assert!(opened_all);
}
