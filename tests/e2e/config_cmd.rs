//! `stepguard config` and `stepguard validate` end to end: discovery, precedence, errors.

use serde_json::json;

use crate::harness::Sandbox;

const PROJECT: &str = r#"
max_steps = 40
[task_types.review]
max_steps = 20
[task_types.legacy]
max_turns = 7
[codex]
max_steps_unit = "actionable"
"#;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", PROJECT);
    sb
}

#[test]
fn config_json_reports_budget_source_options_and_files() {
    let sb = sandbox();
    std::fs::create_dir_all(sb.project().join("sub/dir")).unwrap();
    let mut cmd = sb.cmd(&[
        "config",
        "--task-type",
        "review",
        "--provider",
        "codex",
        "--json",
    ]);
    cmd.current_dir(sb.project().join("sub/dir"));
    let run: crate::harness::Run = cmd.output().unwrap().into();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    let file = sb.project().join("stepguard.toml").display().to_string();
    assert_eq!(v["max_steps"], 20);
    assert_eq!(v["source"], "task_types.review.max_steps");
    assert_eq!(v["source_file"], json!(file));
    assert_eq!(v["config_files"], json!([file]));
    assert_eq!(
        v["provider_options"],
        json!({"codex": {"max_steps_unit": "actionable"}})
    );
    assert_eq!(v["warnings"], json!([]));
}

#[test]
fn config_precedence_flag_env_file_default() {
    let sb = sandbox();
    let v = sb
        .run_env(
            &["config", "--json", "--max-steps", "9"],
            &[("STEPGUARD_MAX_STEPS", "11")],
        )
        .json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(9), json!("--max-steps"))
    );
    let v = sb
        .run_env(
            &["config", "--json", "--task-type", "review"],
            &[("STEPGUARD_MAX_STEPS", "11")],
        )
        .json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(11), json!("env STEPGUARD_MAX_STEPS"))
    );
    let v = sb.run(&["config", "--json"]).json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(40), json!("max_steps"))
    );
    let empty = Sandbox::new();
    let v = empty.run(&["config", "--json"]).json();
    assert_eq!(
        v,
        json!({
            "max_steps": 50, "source": "default", "source_file": null, "profile": null,
            "task_type": null, "provider": null, "config_files": [], "provider_options": {},
            "warnings": []
        })
    );
}

#[test]
fn config_legacy_max_turns_warns_once_naming_the_file() {
    let sb = sandbox();
    let v = sb
        .run(&["config", "--json", "--task-type", "legacy"])
        .json();
    // task_types.legacy.max_turns (7) is below global max_steps (40) in precedence.
    assert_eq!(v["max_steps"], 40);
    assert_eq!(v["warnings"], json!([]));
    let only_turns = Sandbox::new();
    only_turns.write(
        "project/stepguard.toml",
        "[task_types.legacy]\nmax_turns = 7\n",
    );
    let v = only_turns
        .run(&["config", "--json", "--task-type", "legacy"])
        .json();
    assert_eq!(v["max_steps"], 7);
    let file = only_turns
        .project()
        .join("stepguard.toml")
        .display()
        .to_string();
    assert_eq!(
        v["warnings"],
        json!([format!(
            "{file}: task_types.legacy.max_turns: `max_turns` is deprecated; use `max_steps`."
        )])
    );
    let run = only_turns.run(&["config", "--max-turns", "3"]);
    assert_eq!(run.code, Some(0));
    assert!(
        run.stdout.starts_with("max_steps: 3 (from --max-turns)"),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stderr
            .matches("`max_turns` is deprecated; use `max_steps`.")
            .count(),
        1,
        "{}",
        run.stderr
    );
}

#[test]
fn config_profiles_bound_explicit_budgets() {
    let sb = sandbox();
    let v = sb.run(&["config", "--json", "--profile", "strict"]).json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(15), json!("profile strict"))
    );
    let v = sb
        .run_env(&["config", "--json"], &[("STEPGUARD_PROFILE", "smoke")])
        .json();
    assert_eq!(v["max_steps"], 5);
    let v = sb
        .run(&[
            "config",
            "--json",
            "--profile",
            "yolo",
            "--max-steps",
            "unlimited",
        ])
        .json();
    assert_eq!(v["max_steps"], 250);
    let v = sb
        .run(&["config", "--json", "--max-steps", "unlimited"])
        .json();
    assert_eq!(v["max_steps"], json!(null));
}

#[test]
fn config_invalid_values_exit_2_naming_the_source() {
    let sb = sandbox();
    for (args, env, needle) in [
        (
            vec!["config", "--max-steps", "0"],
            vec![],
            "invalid budget at --max-steps: 0 is not a valid budget",
        ),
        (
            vec!["config", "--max-steps", "abc"],
            vec![],
            "invalid budget at --max-steps: \"abc\" is not a number",
        ),
        (
            vec!["config"],
            vec![("STEPGUARD_MAX_STEPS", "-4")],
            "invalid budget at env STEPGUARD_MAX_STEPS: -4 is negative",
        ),
        (
            vec!["config", "--max-steps", "1000000"],
            vec![],
            "above the ceiling of 100000",
        ),
        (
            vec!["config", "--profile", "turbo"],
            vec![],
            "unknown profile `turbo` (from --profile)",
        ),
    ] {
        let run = sb.run_env(&args, &env);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty());
    }
}

#[test]
fn explicit_config_replaces_discovery_and_missing_file_is_exit_2() {
    let sb = sandbox();
    let other = sb.write("elsewhere.toml", "max_steps = 3\n");
    let v = sb
        .run(&["--config", other.to_str().unwrap(), "config", "--json"])
        .json();
    assert_eq!(v["max_steps"], 3);
    assert_eq!(v["config_files"], json!([other.display().to_string()]));
    let run = sb.run(&["config", "--config", "/nonexistent/stepguard.toml"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("failed to read config file /nonexistent/stepguard.toml"),
        "{}",
        run.stderr
    );
}

#[test]
fn user_config_is_used_below_the_project_file() {
    let sb = sandbox();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[task_types.ops]\nmax_steps = 12\n",
    );
    let v = sb.run(&["config", "--json", "--task-type", "ops"]).json();
    assert_eq!(v["max_steps"], 12);
    assert_eq!(
        v["source_file"],
        json!(sb.user_config().display().to_string())
    );
    assert_eq!(v["config_files"].as_array().unwrap().len(), 2);
}

#[test]
fn syntax_error_reports_file_line_and_column() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", "max_steps = 3\nmax_turns = = 4\n");
    let run = sb.run(&["config"]);
    assert_eq!(run.code, Some(2));
    let file = sb.project().join("stepguard.toml").display().to_string();
    assert!(run.stderr.contains(&format!("{file}:2:")), "{}", run.stderr);
}

#[test]
fn validate_reports_problems_with_file_and_key() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "max_steps = 10\nmax_turns = 5\nmax_stpes = 1\n[task_types.review]\nmax_steps = 0\n",
    );
    let file = sb.project().join("stepguard.toml").display().to_string();
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    let expected = format!(
        "warning: {file}: max_stpes: unknown key `max_stpes`; did you mean `max_steps`?\n\
         error: {file}: task_types.review.max_steps: 0 is not a valid budget; use a whole number from 1 to 100000, or \"unlimited\"\n\
         warning: {file}: max_turns: `max_steps` (10) and `max_turns` (5) are both set at one level; `max_steps` wins. Remove `max_turns`.\n\
         1 file checked: 1 error, 2 warnings\n"
    );
    assert_eq!(run.stdout, expected);
}

#[test]
fn validate_conflict_is_a_warning_unless_strict() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", "max_steps = 10\nmax_turns = 5\n");
    assert_eq!(sb.run(&["validate"]).code, Some(0));
    let strict = sb.run(&["validate", "--strict"]);
    assert_eq!(strict.code, Some(2));
    assert!(
        strict.stdout.contains("1 error, 0 warnings"),
        "{}",
        strict.stdout
    );
}

#[test]
fn validate_with_no_config_and_with_broken_files() {
    let sb = Sandbox::new();
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(0));
    assert!(run.stdout.starts_with("no config file in effect"));
    sb.write("project/stepguard.toml", "[task_types\n");
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "max_steps = \"lots\"\n",
    );
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stdout.contains("invalid TOML"), "{}", run.stdout);
    assert!(
        run.stdout.contains("max_steps: \"lots\" is not a number"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("2 files checked: 2 errors"),
        "{}",
        run.stdout
    );
}

#[test]
fn help_documents_exit_codes_and_usage_errors_exit_2() {
    let sb = Sandbox::new();
    let run = sb.run(&["--help"]);
    assert_eq!(run.code, Some(0));
    for code in stepguard_core::ExitCode::ALL {
        assert!(
            run.stdout
                .contains(&format!("{:>3}  {}", code.code(), code.meaning())),
            "{}",
            run.stdout
        );
    }
    assert_eq!(sb.run(&["no-such-command"]).code, Some(2));
    assert_eq!(sb.run(&["config", "--bogus"]).code, Some(2));
}

#[test]
fn validate_asks_plugins_about_provider_options_and_units() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", "[codex]\nmax_steps_unit = \"tools\"\n[claude]\ncolour = \"red\"\n[opencod]\nx = 1\n[gemini]\nmax_steps_unit = \"turn\"\n");
    let file = sb.project().join("stepguard.toml").display().to_string();
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(2));
    assert_eq!(
        run.stdout,
        format!(
            "error: {file}: claude.colour: invalid options: unknown option `colour` for provider `claude`; it accepts none\n\
             error: {file}: codex.max_steps_unit: unknown unit \"tools\" for provider `codex`; valid units: item, actionable, tool, message\n\
             warning: {file}: opencod.x: options for a provider that is not available: unknown provider `opencod`; available providers: claude, codex, gemini\n\
             1 file checked: 2 errors, 1 warning\n"
        )
    );
}
