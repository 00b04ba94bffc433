//! `stepguard config` and `stepguard validate` end to end: discovery, precedence, errors.

use serde_json::json;

use crate::harness::{Sandbox, workspace};

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
            "max_tokens": null, "max_tokens_source": "default", "max_tokens_source_file": null,
            "max_cost_usd": null, "max_cost_usd_source": "default",
            "max_cost_usd_source_file": null,
            "loop_limit": 5, "loop_limit_source": "default", "loop_limit_source_file": null,
            "loop_window": 20, "loop_ignore_tools": [],
            "task_type": null, "provider": null, "config_files": [], "provider_options": {},
            "policy": {
                "files": [], "max_steps_ceiling": null, "max_tokens_ceiling": null,
                "max_cost_usd_ceiling": null, "units": {},
                "allow_plugin_override": {"value": false, "source_file": null, "key": null},
                "locked": []
            },
            "pools": [],
            "ledger": {
                "kind": "local", "url": null, "source": null,
                "on_ledger_error": "refuse", "on_ledger_error_source": null
            },
            "errors": [],
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
    // task_types.legacy.max_turns (7) is below global max_steps (40) in precedence: it is
    // ignored, and stepguard says so instead of calling it deprecated.
    assert_eq!(v["max_steps"], 40);
    let project = sb.project().join("stepguard.toml").display().to_string();
    assert_eq!(
        v["warnings"],
        json!([format!(
            "`task_types.legacy.max_turns = 7` in {project} is ignored: `max_steps = 40` in \
             {project} (global) takes precedence; rename it to `task_types.legacy.max_steps` to \
             apply it"
        )])
    );
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

/// A bad value of any limit, by flag or by environment, in any command that resolves limits,
/// is one kind of error (`budget`), exit 2, naming the limit and where it was set.
#[test]
fn a_bad_value_of_any_limit_is_one_error_kind() {
    let sb = sandbox();
    let limits = [
        (
            "--max-steps",
            "STEPGUARD_MAX_STEPS",
            "abc",
            "invalid budget at",
        ),
        (
            "--max-tokens",
            "STEPGUARD_MAX_TOKENS",
            "abc",
            "invalid token budget at",
        ),
        (
            "--max-cost-usd",
            "STEPGUARD_MAX_COST_USD",
            "1e3",
            "invalid cost budget at",
        ),
        (
            "--loop-limit",
            "STEPGUARD_LOOP_LIMIT",
            "1",
            "invalid loop limit at",
        ),
    ];
    for (flag, var, bad, words) in limits {
        let by_flag = sb.run(&["config", "--json", flag, bad]);
        let by_env = sb.run_env(&["config", "--json"], &[(var, bad)]);
        for (run, origin) in [(by_flag, flag.to_owned()), (by_env, format!("env {var}"))] {
            assert_eq!(run.code, Some(2), "{origin}: {}", run.stderr);
            let v = run.json();
            assert_eq!(v["error"]["kind"], "budget", "{origin}: {v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("{words} {origin}: ")),
                "{origin}: {message}"
            );
        }
    }
    // The same for `run` (before anything starts) and `count`.
    let run = sb.run(&["run", "-p", "claude", "--max-tokens", "abc", "--", "true"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("invalid token budget at --max-tokens"),
        "{}",
        run.stderr
    );
    let run = sb.run(&[
        "count",
        "-p",
        "claude",
        "--json",
        "--loop-limit",
        "1",
        "x.jsonl",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(run.json()["error"]["kind"], "budget", "{}", run.stdout);
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
            "error: {file}: claude.colour: unknown option `colour` for provider `claude`; accepted keys: max_steps_unit\n\
             error: {file}: codex.max_steps_unit: unknown unit `tools` for provider `codex`; did you mean `tool`? valid units: item, actionable, tool, message, request\n\
             warning: {file}: opencod.x: options for a provider that is not available: unknown provider `opencod`; available providers: claude, codex, gemini\n\
             1 file checked: 2 errors, 1 warning\n"
        )
    );
}

/// A sandbox whose system file is inside it (absent unless written), so the host's
/// /etc/stepguard/stepguard.toml never leaks in.
fn policy_env(sb: &Sandbox) -> (String, Vec<(&'static str, String)>) {
    let system = sb.root().join("etc/stepguard.toml").display().to_string();
    (system.clone(), vec![("STEPGUARD_SYSTEM_CONFIG", system)])
}

fn run_with(sb: &Sandbox, args: &[&str], env: &[(&'static str, String)]) -> crate::harness::Run {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    sb.run_env(args, &env)
}

#[test]
fn policy_ceiling_in_the_user_file_cannot_be_raised_by_project_flags_env_or_unlimited() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", "max_steps = 500\n");
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 80\n",
    );
    let (_, env) = policy_env(&sb);
    let user = sb.user_config().display().to_string();
    let project = sb.project().join("stepguard.toml").display().to_string();
    let policy_source = format!("policy max_steps_ceiling ({user})");

    let run = run_with(&sb, &["config", "--json"], &env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["max_steps"], 80);
    assert_eq!(v["source"], json!(policy_source));
    assert_eq!(v["source_file"], json!(user));
    assert_eq!(
        v["policy"]["max_steps_ceiling"],
        json!({"value": 80, "source_file": user, "key": "policy.max_steps_ceiling"})
    );
    assert_eq!(v["policy"]["files"], json!([user]));
    assert_eq!(
        v["warnings"],
        json!([format!(
            "{project}: max_steps asks for 500 steps, above the policy ceiling of 80 set in \
             {user}: policy.max_steps_ceiling; using 80"
        )])
    );

    for (args, extra, asked) in [
        (
            vec!["--max-steps", "1000"],
            None,
            "--max-steps asks for 1000 steps",
        ),
        (
            vec!["--max-steps", "unlimited"],
            None,
            "--max-steps asks for unlimited steps",
        ),
        (
            vec![],
            Some(("STEPGUARD_MAX_STEPS", "unlimited")),
            "env STEPGUARD_MAX_STEPS asks for unlimited steps",
        ),
        (
            vec!["--profile", "yolo"],
            None,
            "profile yolo asks for 250 steps",
        ),
    ] {
        let mut env = env.clone();
        env.extend(extra.map(|(k, v)| (k, v.to_owned())));
        let mut argv = vec!["config", "--json"];
        argv.extend(&args);
        let run = run_with(&sb, &argv, &env);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        let v = run.json();
        assert_eq!(v["max_steps"], 80, "{args:?}");
        assert_eq!(v["source"], json!(policy_source), "{args:?}");
        let warnings = v["warnings"].to_string();
        assert!(
            warnings.contains(asked) && warnings.contains("using 80"),
            "{args:?}: {warnings}"
        );
    }

    // The text form says the same, and `unlimited` in the project file is bounded too.
    sb.write("project/stepguard.toml", "max_steps = \"unlimited\"\n");
    let run = run_with(&sb, &["config"], &env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout
            .starts_with(&format!("max_steps: 80 (from {policy_source})\n")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!(
            "policy:\n  max_steps_ceiling = 80 (from {user}: policy.max_steps_ceiling)\n"
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr
            .contains("asks for unlimited steps, above the policy ceiling of 80"),
        "{}",
        run.stderr
    );
}

#[test]
fn policy_ceiling_lets_budgets_be_tightened() {
    let sb = Sandbox::new();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 80\n",
    );
    let (_, env) = policy_env(&sb);
    let v = run_with(&sb, &["config", "--json", "--max-steps", "10"], &env).json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(10), json!("--max-steps"))
    );
    assert_eq!(v["warnings"], json!([]));
    let v = run_with(&sb, &["config", "--json", "--profile", "strict"], &env).json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(15), json!("profile strict"))
    );
    // The default (50) is under 80 and stays the default.
    let v = run_with(&sb, &["config", "--json"], &env).json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(50), json!("default"))
    );
}

#[test]
fn policy_in_a_project_file_is_ignored_with_a_warning() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "max_steps = 500\n[policy]\nmax_steps_ceiling = 5\n",
    );
    let (_, env) = policy_env(&sb);
    let project = sb.project().join("stepguard.toml").display().to_string();
    let warning = format!(
        "{project}: policy: [policy] in a project file is ignored; set policy in the user or \
         system file or STEPGUARD_POLICY"
    );
    let run = run_with(&sb, &["config", "--json"], &env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["max_steps"], 500);
    assert_eq!(v["policy"]["max_steps_ceiling"], json!(null));
    assert_eq!(v["warnings"], json!([format!("warning: {warning}")]));
    let run = run_with(&sb, &["config"], &env);
    assert!(
        run.stderr
            .contains(&format!("stepguard: warning: {warning}")),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("policy: none\n"), "{}", run.stdout);
    // `--config` names a project file too.
    let run = run_with(&sb, &["--config", &project, "config", "--json"], &env);
    assert_eq!(run.json()["max_steps"], 500);
    let run = run_with(&sb, &["validate"], &env);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!("warning: {warning}")),
        "{}",
        run.stdout
    );
    assert_eq!(run_with(&sb, &["validate", "--strict"], &env).code, Some(2));
}

#[test]
fn stepguard_policy_names_a_file_of_which_only_the_policy_counts() {
    let sb = sandbox();
    let policy = sb.write(
        "ci/policy.toml",
        "max_steps = 1\n[policy]\nmax_steps_ceiling = 30\n[policy.codex]\nmax_steps_unit = \"item\"\n",
    );
    let policy = policy.display().to_string();
    let (_, mut env) = policy_env(&sb);
    env.push(("STEPGUARD_POLICY", policy.clone()));
    let run = run_with(
        &sb,
        &[
            "config",
            "--json",
            "--provider",
            "codex",
            "--max-steps",
            "40",
        ],
        &env,
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["max_steps"], 30);
    assert_eq!(
        v["source"],
        json!(format!("policy max_steps_ceiling ({policy})"))
    );
    // Its `max_steps = 1` does not count, and it is not a settings file.
    let project = sb.project().join("stepguard.toml").display().to_string();
    assert_eq!(v["config_files"], json!([project]));
    assert_eq!(v["policy"]["files"], json!([policy]));
    assert_eq!(
        v["policy"]["units"],
        json!({"codex": {"value": "item", "source_file": policy, "key": "policy.codex.max_steps_unit"}})
    );
    // `--config` replaces discovery, not the policy.
    let other = sb.write("elsewhere.toml", "max_steps = 99\n");
    let v = run_with(
        &sb,
        &["--config", other.to_str().unwrap(), "config", "--json"],
        &env,
    )
    .json();
    assert_eq!(v["max_steps"], 30);
    // The project's `[codex] max_steps_unit = "actionable"` contradicts the fixed unit.
    let run = run_with(&sb, &["validate"], &env);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!(
            "error: {project}: codex.max_steps_unit: unit \"actionable\" differs from the unit \
             `item` fixed by policy ({policy}: policy.codex.max_steps_unit)"
        )),
        "{}",
        run.stdout
    );
    // A named policy file that is missing fails closed.
    let (_, mut env) = policy_env(&sb);
    env.push(("STEPGUARD_POLICY", "/nonexistent/policy.toml".to_owned()));
    let run = run_with(&sb, &["config"], &env);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("failed to read config file /nonexistent/policy.toml"),
        "{}",
        run.stderr
    );
}

#[test]
fn tightest_ceiling_of_the_system_user_and_policy_files_wins() {
    let sb = Sandbox::new();
    let (system, mut env) = policy_env(&sb);
    sb.write(
        "etc/stepguard.toml",
        "max_steps = 70\n[policy]\nmax_steps_ceiling = 60\n",
    );
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 80\n",
    );
    let policy = sb.write("ci/policy.toml", "[policy]\nmax_steps_ceiling = 100\n");
    env.push(("STEPGUARD_POLICY", policy.display().to_string()));
    let v = run_with(&sb, &["config", "--json", "--max-steps", "90"], &env).json();
    assert_eq!(v["max_steps"], 60);
    assert_eq!(
        v["source"],
        json!(format!("policy max_steps_ceiling ({system})"))
    );
    assert_eq!(v["policy"]["files"].as_array().unwrap().len(), 3);
    // The system file's settings count, below the user file.
    assert_eq!(v["config_files"].as_array().unwrap().len(), 2);
    let v = run_with(&sb, &["config", "--json"], &env).json();
    assert_eq!(
        (v["max_steps"].clone(), v["source_file"].clone()),
        (json!(60), json!(system))
    );
}

#[test]
fn invalid_policy_values_are_errors_naming_file_and_key() {
    let sb = Sandbox::new();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 0\nallow_plugin_override = \"yes\"\n",
    );
    let (_, env) = policy_env(&sb);
    let user = sb.user_config().display().to_string();
    let run = run_with(&sb, &["validate"], &env);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    assert_eq!(
        run.stdout,
        format!(
            "error: {user}: policy.allow_plugin_override: expected true or false, found a string\n\
             error: {user}: policy.max_steps_ceiling: 0 is not a valid ceiling; use a whole number from 1 to 100000\n\
             1 file checked: 2 errors, 0 warnings\n"
        )
    );
    // A broken policy stops every budget decision rather than being skipped.
    let run = run_with(&sb, &["config", "--max-steps", "5"], &env);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains(&format!(
            "{user}: policy.max_steps_ceiling: 0 is not a valid ceiling"
        )),
        "{}",
        run.stderr
    );
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = \"unlimited\"\n[policy.codex]\nmax_steps_unit = \"tools\"\n",
    );
    let run = run_with(&sb, &["validate"], &env);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stdout.contains(&format!(
            "error: {user}: policy.max_steps_ceiling: \"unlimited\" is not a valid ceiling"
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!(
            "error: {user}: policy.codex.max_steps_unit: unknown unit `tools` for provider `codex`; did you mean `tool`? valid units: item, actionable, tool, message, request"
        )),
        "{}",
        run.stdout
    );
}

#[test]
fn a_policy_unit_and_ceiling_hold_for_run_and_count() {
    let sb = Sandbox::new();
    // The repository asks for another unit and no limit; the user's policy says otherwise.
    sb.write(
        "project/stepguard.toml",
        "max_steps = \"unlimited\"\n[codex]\nmax_steps_unit = \"tool\"\n",
    );
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 3\n[policy.codex]\nmax_steps_unit = \"item\"\n",
    );
    let (_, env) = policy_env(&sb);
    let stream = workspace()
        .join("tests/fixtures/streams/codex/long_run.jsonl")
        .display()
        .to_string();
    let run = run_with(&sb, &["count", "-p", "codex", &stream], &env);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("unit `tool`")
            && run.stderr.contains("fixes the unit of `codex` to `item`"),
        "{}",
        run.stderr
    );
    // Without the repository's unit, `run` counts items under the policy's ceiling of 3.
    sb.write("project/stepguard.toml", "max_steps = \"unlimited\"\n");
    let agent = sb.write("agent.sh", format!("#!/bin/sh\ncat {stream}\n"));
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let summary = sb.root().join("summary.json");
    let run = run_with(
        &sb,
        &[
            "run",
            "-q",
            "--no-record",
            "--summary-file",
            summary.to_str().unwrap(),
            "-p",
            "codex",
            "--",
            agent.to_str().unwrap(),
        ],
        &env,
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(record["max_steps"], 3);
    assert_eq!(record["unit"], "item");
    assert_eq!(record["breached_at_step"], 4);
}

#[test]
fn a_project_file_cannot_loosen_enforcement_under_the_users_policy() {
    let sb = Sandbox::new();
    let project = sb.write(
        "project/stepguard.toml",
        "[run]\nunrecognized_stream = \"warn\"\n[loops]\nlimit = \"off\"\n",
    );
    let project = project.display().to_string();
    let user = sb.user_config().display().to_string();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 100\n",
    );
    let (_, env) = policy_env(&sb);
    // The unrecognised stream stops the run (exit 2), as if the project had said nothing.
    let run = run_with(
        &sb,
        &[
            "run",
            "--no-record",
            "-p",
            "codex",
            "--",
            "echo",
            "plain text",
        ],
        &env,
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("unrecognized_stream"), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "{project}: run.unrecognized_stream: \"warn\" would loosen enforcement while a \
             policy is in force ({user}: policy.max_steps_ceiling); ignored: only the user's or \
             the system's config file may loosen it"
        )),
        "{}",
        run.stderr
    );
    let v = run_with(&sb, &["config", "--json"], &env).json();
    assert_eq!(
        (&v["loop_limit"], &v["loop_limit_source"]),
        (&json!(5), &json!("default"))
    );
    assert!(
        v["warnings"].as_array().unwrap().iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("loops.limit: a loop limit of off would loosen")),
        "{v}"
    );
    // The user's own file may loosen it.
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 100\n[run]\nunrecognized_stream = \"warn\"\n",
    );
    let run = run_with(
        &sb,
        &[
            "run",
            "--no-record",
            "-p",
            "codex",
            "--",
            "echo",
            "plain text",
        ],
        &env,
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn a_policy_lock_refuses_the_flags_that_loosen_it() {
    let sb = Sandbox::new();
    let (system, env) = policy_env(&sb);
    sb.write(
        "etc/stepguard.toml",
        "[run]\nwrap_up = true\n[policy]\nlocked = [\"unrecognized_stream\", \"wrap_up\", \"loops\", \
         \"native_limit\", \"preflight\", \"containment\"]\n",
    );
    for (flags, flag) in [
        (&["--unrecognized", "warn"][..], "--unrecognized warn"),
        (&["--no-wrap-up"], "--no-wrap-up"),
        (&["--no-native-limit"], "--no-native-limit"),
        (&["--no-preflight"], "--no-preflight"),
        (
            &["--containment", "process-walk"],
            "--containment process-walk",
        ),
    ] {
        let mut args = vec!["run", "--no-record", "-p", "codex"];
        args.extend(flags);
        args.extend(["--", "echo", "plain text"]);
        let run = run_with(&sb, &args, &env);
        assert_eq!(run.code, Some(2), "{flag}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!("{flag} would loosen"))
                && run
                    .stderr
                    .contains(&format!("which the policy locks ({system}: policy.locked)")),
            "{flag}: {}",
            run.stderr
        );
    }
    // The loop limit is bounded at the default, whatever the flag asks.
    let v = run_with(&sb, &["config", "--json", "--loop-limit", "off"], &env).json();
    assert_eq!(v["loop_limit"], json!(5));
    assert_eq!(
        v["loop_limit_source"],
        json!(format!("policy locked ({system})"))
    );
    assert_eq!(v["policy"]["locked"].as_array().map(Vec::len), Some(6));
    let text = run_with(&sb, &["config"], &env);
    assert!(
        text.stdout.contains(&format!(
            "  locked: preflight (from {system}: policy.locked)\n"
        )),
        "{}",
        text.stdout
    );
}

/// The token and cost budgets (`max_tokens`, `max_cost_usd`) of `config --json`, each with its
/// source and source file.
fn spend(v: &serde_json::Value) -> [serde_json::Value; 6] {
    [
        v["max_tokens"].clone(),
        v["max_tokens_source"].clone(),
        v["max_tokens_source_file"].clone(),
        v["max_cost_usd"].clone(),
        v["max_cost_usd_source"].clone(),
        v["max_cost_usd_source_file"].clone(),
    ]
}

const SPEND_PROJECT: &str = r#"
max_tokens = 500000
[defaults]
max_cost_usd = 20
[task_types.review]
max_tokens = 200000
max_cost_usd = 2.5
[profiles.cheap]
max_steps = 30
max_tokens = 100000
max_cost_usd = "0.75"
"#;

#[test]
fn config_token_and_cost_budgets_flag_env_task_type_global_and_default() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", SPEND_PROJECT);
    let file = sb.project().join("stepguard.toml").display().to_string();
    let env = [
        ("STEPGUARD_MAX_TOKENS", "300000"),
        ("STEPGUARD_MAX_COST_USD", "4.25"),
    ];
    // Flags beat the environment.
    let run = sb.run_env(
        &[
            "config",
            "--json",
            "--task-type",
            "review",
            "--max-tokens",
            "1000",
            "--max-cost-usd",
            "0.5",
        ],
        &env,
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        spend(&run.json()),
        [
            json!(1000),
            json!("--max-tokens"),
            json!(null),
            json!(0.5),
            json!("--max-cost-usd"),
            json!(null)
        ]
    );
    // The environment beats the files.
    let v = sb
        .run_env(&["config", "--json", "--task-type", "review"], &env)
        .json();
    assert_eq!(
        spend(&v),
        [
            json!(300_000),
            json!("env STEPGUARD_MAX_TOKENS"),
            json!(null),
            json!(4.25),
            json!("env STEPGUARD_MAX_COST_USD"),
            json!(null)
        ]
    );
    // The task type beats the global level.
    let v = sb
        .run(&["config", "--json", "--task-type", "review"])
        .json();
    assert_eq!(
        spend(&v),
        [
            json!(200_000),
            json!("task_types.review.max_tokens"),
            json!(file),
            json!(2.5),
            json!("task_types.review.max_cost_usd"),
            json!(file)
        ]
    );
    assert_eq!(v["warnings"], json!([]));
    // The global level: top-level keys and [defaults] alike.
    let v = sb.run(&["config", "--json"]).json();
    assert_eq!(
        spend(&v),
        [
            json!(500_000),
            json!("max_tokens"),
            json!(file),
            json!(20.0),
            json!("defaults.max_cost_usd"),
            json!(file)
        ]
    );
    // `unlimited` on the command line lifts a file's budget; nothing at all is no budget.
    let v = sb
        .run(&["config", "--json", "--max-tokens", "unlimited"])
        .json();
    assert_eq!(
        (v["max_tokens"].clone(), v["max_tokens_source"].clone()),
        (json!(null), json!("--max-tokens"))
    );
    let v = Sandbox::new().run(&["config", "--json"]).json();
    assert_eq!(
        spend(&v),
        [
            json!(null),
            json!("default"),
            json!(null),
            json!(null),
            json!("default"),
            json!(null)
        ]
    );
    // The text form says the same, after the loop settings.
    let run = sb.run(&["config", "--task-type", "review"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!(
            "max_tokens: 200000 (from task_types.review.max_tokens in {file})\n\
             max_cost_usd: 2.5 (from task_types.review.max_cost_usd in {file})\n"
        )),
        "{}",
        run.stdout
    );
    let run = Sandbox::new().run(&["config", "--max-cost-usd", "3"]);
    assert!(
        run.stdout
            .contains("max_tokens: none (from default)\nmax_cost_usd: 3 (from --max-cost-usd)\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn config_a_profile_bounds_explicit_token_and_cost_budgets() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", SPEND_PROJECT);
    let file = sb.project().join("stepguard.toml").display().to_string();
    // The global 500000 tokens and $20 are above cheap's 100000 and $0.75.
    let v = sb.run(&["config", "--json", "--profile", "cheap"]).json();
    assert_eq!(
        spend(&v),
        [
            json!(100_000),
            json!("profiles.cheap.max_tokens"),
            json!(file),
            json!(0.75),
            json!("profiles.cheap.max_cost_usd"),
            json!(file)
        ]
    );
    // A tighter explicit budget stands; `unlimited` cannot loosen the profile's.
    let v = sb
        .run_env(
            &[
                "config",
                "--json",
                "--max-tokens",
                "unlimited",
                "--max-cost-usd",
                "0.5",
            ],
            &[("STEPGUARD_PROFILE", "cheap")],
        )
        .json();
    assert_eq!(
        spend(&v)[..2],
        [json!(100_000), json!("profiles.cheap.max_tokens")]
    );
    assert_eq!(spend(&v)[3..5], [json!(0.5), json!("--max-cost-usd")]);
    // Built-in profiles set neither budget.
    let v = sb
        .run(&[
            "config",
            "--json",
            "--profile",
            "strict",
            "--task-type",
            "none",
        ])
        .json();
    assert_eq!(
        (v["max_tokens"].clone(), v["max_tokens_source"].clone()),
        (json!(500_000), json!("max_tokens"))
    );
    // The text form says when the profile lowered an explicit budget.
    let run = sb.run(&["config", "--profile", "cheap", "--max-tokens", "400000"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!(
            "max_tokens: 100000 (from profiles.cheap.max_tokens in {file})\n  explicit token \
             budget 400000 lowered to 100000 by profile cheap\n"
        )),
        "{}",
        run.stdout
    );
}

#[test]
fn policy_ceilings_bound_token_and_cost_budgets_from_every_level() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", SPEND_PROJECT);
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_tokens_ceiling = 250000\nmax_cost_usd_ceiling = 5\n",
    );
    let (_, env) = policy_env(&sb);
    let user = sb.user_config().display().to_string();
    let project = sb.project().join("stepguard.toml").display().to_string();
    let tokens_source = format!("policy max_tokens_ceiling ({user})");
    let cost_source = format!("policy max_cost_usd_ceiling ({user})");

    // The project's 500000 tokens are lowered; its $20 too.
    let run = run_with(&sb, &["config", "--json"], &env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(
        spend(&v),
        [
            json!(250_000),
            json!(tokens_source),
            json!(user),
            json!(5.0),
            json!(cost_source),
            json!(user)
        ]
    );
    assert_eq!(
        v["warnings"],
        json!([
            format!(
                "{project}: max_tokens asks for 500000 tokens, above the policy ceiling of 250000 \
                 set in {user}: policy.max_tokens_ceiling; using 250000"
            ),
            format!(
                "{project}: defaults.max_cost_usd asks for $20.00, above the policy ceiling of \
                 $5.00 set in {user}: policy.max_cost_usd_ceiling; using $5.00"
            ),
        ])
    );
    assert_eq!(
        v["policy"]["max_tokens_ceiling"],
        json!({"value": 250_000, "source_file": user, "key": "policy.max_tokens_ceiling"})
    );
    assert_eq!(
        v["policy"]["max_cost_usd_ceiling"],
        json!({"value": 5.0, "source_file": user, "key": "policy.max_cost_usd_ceiling"})
    );
    assert_eq!(v["policy"]["files"], json!([user]));

    // Flags, the environment and `unlimited` cannot raise it; budgets under it stand.
    let mut high = env.clone();
    high.push(("STEPGUARD_MAX_COST_USD", "unlimited".to_owned()));
    let v = run_with(&sb, &["config", "--json", "--max-tokens", "900000"], &high).json();
    assert_eq!(spend(&v)[..2], [json!(250_000), json!(tokens_source)]);
    assert_eq!(spend(&v)[3..5], [json!(5.0), json!(cost_source)]);
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("--max-tokens asks for 900000 tokens")
            && warnings.contains("env STEPGUARD_MAX_COST_USD asks for an unlimited cost"),
        "{warnings}"
    );
    let v = run_with(&sb, &["config", "--json", "--task-type", "review"], &env).json();
    assert_eq!(
        spend(&v)[..2],
        [json!(200_000), json!("task_types.review.max_tokens")]
    );
    assert_eq!(v["warnings"], json!([]));

    // With no budget anywhere, the ceiling is the budget, silently.
    sb.write("project/stepguard.toml", "");
    let run = run_with(&sb, &["config"], &env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!(
            "max_tokens: 250000 (from {tokens_source})\nmax_cost_usd: 5 (from {cost_source})\n"
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!(
            "  max_tokens_ceiling = 250000 (from {user}: policy.max_tokens_ceiling)\n  \
             max_cost_usd_ceiling = 5 (from {user}: policy.max_cost_usd_ceiling)\n"
        )),
        "{}",
        run.stdout
    );
    assert!(run.stderr.is_empty(), "{}", run.stderr);

    // A policy ceiling in a project file is ignored, like max_steps_ceiling.
    sb.write(
        "project/stepguard.toml",
        "max_tokens = 900000\n[policy]\nmax_tokens_ceiling = 10\n",
    );
    let v = run_with(&sb, &["config", "--json"], &env).json();
    assert_eq!(v["max_tokens"], 250_000);
}

#[test]
fn config_invalid_token_and_cost_budgets_exit_2_naming_the_source() {
    const TOKENS: &str = "use a whole number of tokens from 1 to 1000000000000, or \"unlimited\"";
    const COST: &str = "use a number of US dollars above 0 and at most 1000000 with at most 4 \
                        decimals (e.g. 2.50), or \"unlimited\"";
    let sb = Sandbox::new();
    for (args, env, needle) in [
        (
            vec!["config", "--max-tokens", "0"],
            vec![],
            format!("invalid token budget at --max-tokens: 0 is not a valid budget; {TOKENS}"),
        ),
        (
            vec!["config", "--max-tokens", "2.5"],
            vec![],
            format!(
                "invalid token budget at --max-tokens: \"2.5\" is not a whole number; {TOKENS}"
            ),
        ),
        (
            vec!["config", "--max-tokens", "2000000000000"],
            vec![],
            format!(
                "invalid token budget at --max-tokens: 2000000000000 is above the maximum of \
                 1000000000000; {TOKENS}"
            ),
        ),
        (
            vec!["config"],
            vec![("STEPGUARD_MAX_TOKENS", "lots")],
            format!(
                "invalid token budget at env STEPGUARD_MAX_TOKENS: \"lots\" is not a number; \
                 {TOKENS}"
            ),
        ),
        (
            vec!["config", "--max-cost-usd", "-1"],
            vec![],
            format!("invalid cost budget at --max-cost-usd: -1 is negative; {COST}"),
        ),
        (
            vec!["config", "--max-cost-usd", "$2"],
            vec![],
            format!("invalid cost budget at --max-cost-usd: \"$2\" is not a number; {COST}"),
        ),
        (
            vec!["config", "--json"],
            vec![("STEPGUARD_MAX_COST_USD", "0.12345")],
            format!(
                "invalid cost budget at env STEPGUARD_MAX_COST_USD: 0.12345 has more than 4 \
                 decimals; {COST}"
            ),
        ),
        (
            vec!["config"],
            vec![("STEPGUARD_MAX_COST_USD", "2000000")],
            format!(
                "invalid cost budget at env STEPGUARD_MAX_COST_USD: 2000000 is above the maximum \
                 of 1000000; {COST}"
            ),
        ),
    ] {
        let run = sb.run_env(&args, &env);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        let shown = if args.contains(&"--json") {
            assert!(run.stderr.is_empty(), "{}", run.stderr);
            run.json()["error"]["message"].as_str().unwrap().to_owned()
        } else {
            assert!(run.stdout.is_empty(), "{}", run.stdout);
            run.stderr
        };
        assert!(shown.contains(&needle), "{args:?} {env:?}: {shown}");
    }
    // A bad flag is an error even when the environment would be fine, and the other way round.
    let run = sb.run_env(
        &["config", "--max-tokens", "100"],
        &[("STEPGUARD_MAX_TOKENS", "-5")],
    );
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("invalid token budget at env STEPGUARD_MAX_TOKENS: -5 is negative"),
        "{}",
        run.stderr
    );
}

#[test]
fn invalid_token_and_cost_budgets_in_files_are_errors_naming_file_and_key() {
    let sb = Sandbox::new();
    let (_, env) = policy_env(&sb);
    let project = sb.project().join("stepguard.toml").display().to_string();
    let user = sb.user_config().display().to_string();
    for (rel, text, file, key, message) in [
        (
            "project/stepguard.toml",
            "max_tokens = 1.5\n",
            &project,
            "max_tokens",
            "1.5 is not a whole number; use a whole number of tokens from 1 to 1000000000000, or \
             \"unlimited\"",
        ),
        (
            "project/stepguard.toml",
            "[defaults]\nmax_cost_usd = 0\n",
            &project,
            "defaults.max_cost_usd",
            "0 is not a valid budget; use a number of US dollars above 0 and at most 1000000 with \
             at most 4 decimals (e.g. 2.50), or \"unlimited\"",
        ),
        (
            "project/stepguard.toml",
            "[task_types.review]\nmax_cost_usd = \"cheap\"\n",
            &project,
            "task_types.review.max_cost_usd",
            "\"cheap\" is not a number; use a number of US dollars above 0 and at most 1000000 \
             with at most 4 decimals (e.g. 2.50), or \"unlimited\"",
        ),
        (
            "project/stepguard.toml",
            "[profiles.cheap]\nmax_steps = 5\nmax_tokens = -100\n",
            &project,
            "profiles.cheap.max_tokens",
            "-100 is negative; use a whole number of tokens from 1 to 1000000000000, or \
             \"unlimited\"",
        ),
        (
            "xdg-config/stepguard/stepguard.toml",
            "[policy]\nmax_tokens_ceiling = \"unlimited\"\n",
            &user,
            "policy.max_tokens_ceiling",
            "\"unlimited\" is not a valid ceiling; use a whole number of tokens from 1 to \
             1000000000000",
        ),
        (
            "xdg-config/stepguard/stepguard.toml",
            "[policy]\nmax_cost_usd_ceiling = 0.00001\n",
            &user,
            "policy.max_cost_usd_ceiling",
            "0.00001 is not a valid ceiling; use a number of US dollars above 0 and at most \
             1000000 with at most 4 decimals",
        ),
    ] {
        sb.write("project/stepguard.toml", "");
        sb.write("xdg-config/stepguard/stepguard.toml", "");
        sb.write(rel, text);
        let expected = format!("{file}: {key}: {message}");
        // Every budget decision stops, whatever the flags say.
        let run = run_with(
            &sb,
            &["config", "--max-tokens", "5", "--max-cost-usd", "1"],
            &env,
        );
        assert_eq!(run.code, Some(2), "{text}: {}", run.stderr);
        assert!(run.stderr.contains(&expected), "{text}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        let run = run_with(&sb, &["config", "--json"], &env);
        assert_eq!(run.code, Some(2));
        assert_eq!(run.json()["error"]["kind"], "config");
        // `validate` says the same at the key.
        let run = run_with(&sb, &["validate"], &env);
        assert_eq!(run.code, Some(2), "{}", run.stdout);
        assert!(
            run.stdout.contains(&format!("error: {expected}\n")),
            "{text}: {}",
            run.stdout
        );
    }
}

#[test]
fn the_users_policy_holds_without_home_and_a_relative_home_is_refused() {
    let sb = Sandbox::new();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[policy]\nmax_steps_ceiling = 7\n",
    );
    let (_, env) = policy_env(&sb);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // HOME unset: XDG_CONFIG_HOME still places the user's file, and its policy applies.
    let mut cmd = sb.cmd(&["config", "--json"]);
    cmd.env_remove("HOME").envs(env.iter().copied());
    let run: crate::harness::Run = cmd.output().unwrap().into();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.json()["max_steps"], json!(7));
    // A relative HOME would be looked for under the repository: refused, naming the fix. On
    // main, the repository's own `home/.config/stepguard/stepguard.toml` became the user's file.
    sb.write(
        "project/home/.config/stepguard/stepguard.toml",
        "[policy]\nallow_plugin_override = true\n",
    );
    let mut cmd = sb.cmd(&["config"]);
    cmd.env_remove("XDG_CONFIG_HOME")
        .env("HOME", "home")
        .envs(env.iter().copied());
    let run: crate::harness::Run = cmd.output().unwrap().into();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "failed to find the user's config file: HOME is `home`, not an absolute path; set \
             HOME or XDG_CONFIG_HOME to an absolute path"
        ),
        "{}",
        run.stderr
    );
}
