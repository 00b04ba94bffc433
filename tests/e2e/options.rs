//! Provider options and configuration checks agree across `config`, `validate`, `run` and `count`.

use serde_json::json;

use crate::harness::{Run, Sandbox, fixture, workspace};

fn project_file(sb: &Sandbox) -> String {
    sb.project().join("stepguard.toml").display().to_string()
}

/// Runs `config`, `validate`, `count` and `run` (of `true`, which never starts: the check comes
/// first) in the sandbox, returning each with its name.
fn every_command(sb: &Sandbox) -> Vec<(&'static str, Run)> {
    let stream = fixture("real/codex/tools3.jsonl");
    vec![
        ("config", sb.run(&["config"])),
        ("validate", sb.run(&["validate"])),
        ("count", sb.run(&["count", "-p", "codex", &stream])),
        (
            "run",
            sb.run(&["run", "-q", "--no-record", "-p", "codex", "--", "true"]),
        ),
    ]
}

/// Asserts that every command exits 2 and shows `message` as an error (`validate` on stdout,
/// the others on stderr).
fn assert_same_error_everywhere(sb: &Sandbox, message: &str) {
    for (name, run) in every_command(sb) {
        assert_eq!(run.code, Some(2), "{name}: {}{}", run.stdout, run.stderr);
        let shown = if name == "validate" {
            run.stdout.lines().any(|l| l == format!("error: {message}"))
        } else {
            run.stderr
                .lines()
                .any(|l| l == format!("stepguard: error: {message}"))
        };
        assert!(
            shown,
            "{name} does not say {message:?}:\n{}{}",
            run.stdout, run.stderr
        );
    }
}

#[test]
fn typo_of_max_steps_unit_is_the_same_error_with_did_you_mean_in_every_command() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_step_unit = \"item\"\n",
    );
    let message = format!(
        "{}: codex.max_step_unit: unknown option `max_step_unit` for provider `codex`; did you \
         mean `max_steps_unit`? accepted keys: max_steps_unit",
        project_file(&sb)
    );
    assert_same_error_everywhere(&sb, &message);
    // `config --json` reports it under `errors`, and still shows what the file says.
    let run = sb.run(&["config", "--json"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["errors"], json!([message]));
    assert_eq!(
        v["provider_options"],
        json!({"codex": {"max_step_unit": "item"}})
    );
}

#[test]
fn bad_unit_value_names_the_providers_units_in_every_command() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"bogus\"\n",
    );
    let message = format!(
        "{}: codex.max_steps_unit: unknown unit `bogus` for provider `codex`; valid units: item, \
         actionable, tool, message, request",
        project_file(&sb)
    );
    assert_same_error_everywhere(&sb, &message);
    // A close miss gets a suggestion; a value that is not a string says so.
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"tools\"\n[gemini]\nmax_steps_unit = 3\n",
    );
    let v = sb.run(&["config", "--json"]).json();
    let file = project_file(&sb);
    assert_eq!(
        v["errors"],
        json!([
            format!(
                "{file}: codex.max_steps_unit: unknown unit `tools` for provider `codex`; did you \
                 mean `tool`? valid units: item, actionable, tool, message, request"
            ),
            format!(
                "{file}: gemini.max_steps_unit: expected a unit name (a string) for provider \
                 `gemini`, found 3; valid units: tool_use, turn, request"
            ),
        ])
    );
    // `--provider` narrows `config` to one provider's table.
    let run = sb.run(&["config", "--json", "--provider", "claude"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.json()["errors"], json!([]));
}

#[test]
fn validate_json_reports_validity_files_errors_and_warnings() {
    let sb = Sandbox::new();
    let run = sb.run(&["validate", "--json"]);
    assert_eq!(run.code, Some(0));
    assert_eq!(
        run.json(),
        json!({"valid": true, "files": [], "errors": [], "warnings": []})
    );
    sb.write(
        "project/stepguard.toml",
        "max_stpes = 3\n[codex]\nmax_step_unit = \"item\"\n",
    );
    let file = project_file(&sb);
    let run = sb.run(&["validate", "--json"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(
        run.json(),
        json!({
            "valid": false,
            "files": [file],
            "errors": [{
                "file": file, "key": "codex.max_step_unit",
                "message": "unknown option `max_step_unit` for provider `codex`; did you mean \
                            `max_steps_unit`? accepted keys: max_steps_unit"
            }],
            "warnings": [{
                "file": file, "key": "max_stpes",
                "message": "unknown key `max_stpes`; did you mean `max_steps`?"
            }]
        })
    );
    // --strict makes the warning an error; valid files are valid.
    let strict = sb.run(&["validate", "--json", "--strict"]).json();
    assert_eq!(strict["errors"].as_array().map(Vec::len), Some(2));
    assert_eq!(strict["warnings"], json!([]));
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"tool\"\n",
    );
    let run = sb.run(&["validate", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert_eq!(run.json()["valid"], true);
    // A config file that cannot be read is the usual JSON error object.
    let run = sb.run(&["--config", "/nonexistent.toml", "validate", "--json"]);
    assert_eq!(run.code, Some(2));
    assert_eq!(run.json()["error"]["kind"], "config");
}

#[test]
fn config_with_an_unknown_provider_is_an_error_listing_the_known_ones() {
    let sb = Sandbox::new();
    let run = sb.run(&["config", "--provider", "nosuch"]);
    assert_eq!(run.code, Some(2));
    assert_eq!(
        run.stderr.trim(),
        "stepguard: error: unknown provider `nosuch`; available providers: claude, codex, gemini"
    );
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let run = sb.run(&["config", "--provider", "nosuch", "--json"]);
    assert_eq!(run.code, Some(2));
    assert_eq!(run.json()["error"]["kind"], "unknown_provider");
}

#[test]
fn unknown_task_type_is_a_warning_for_config_and_run_listing_the_known_ones() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "max_steps = 40\n[task_types.review]\nmax_steps = 20\n[task_types.migrate]\nmax_steps = 60\n",
    );
    let warning = "unknown task type `reveiw`: no [task_types.reveiw] in the config files in \
                   effect (known task types: migrate, review); its budget is resolved without one";
    let run = sb.run(&["config", "--json", "--task-type", "reveiw"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(40), json!("max_steps"))
    );
    assert_eq!(v["warnings"], json!([warning]));
    let run = sb.run(&["config", "--task-type", "reveiw"]);
    assert!(
        run.stderr
            .contains(&format!("stepguard: warning: {warning}")),
        "{}",
        run.stderr
    );
    let run = sb.run(&[
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--task-type",
        "reveiw",
        "--",
        "echo",
        r#"{"type":"turn.completed"}"#,
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr
            .contains(&format!("stepguard: warning: {warning}")),
        "{}",
        run.stderr
    );
    // A configured task type is not warned about.
    let run = sb.run(&["config", "--json", "--task-type", "review"]);
    assert_eq!(run.json()["warnings"], json!([]));
}

#[test]
fn missing_plugin_dir_is_warned_about_once_naming_it() {
    let sb = Sandbox::new();
    let not_a_dir = sb.write("plugins.txt", "");
    let not_a_dir = not_a_dir.to_str().unwrap();
    let stream = fixture("real/codex/tools3.jsonl");
    let run = sb.run(&[
        "--plugin-dir",
        "/nonexistent/plugins",
        "--plugin-dir",
        "/nonexistent/plugins",
        "--plugin-dir",
        not_a_dir,
        "count",
        "-p",
        "codex",
        &stream,
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let missing = "stepguard: warning: plugin directory /nonexistent/plugins (--plugin-dir) does \
                   not exist; no plugins are loaded from it";
    assert_eq!(run.stderr.matches(missing).count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "stepguard: warning: plugin directory {not_a_dir} (--plugin-dir) is not a directory"
        )),
        "{}",
        run.stderr
    );
    // `validate` loads plugins to check provider options, and says so too.
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"tool\"\n",
    );
    let run = sb.run(&["--plugin-dir", "/nonexistent/plugins", "validate"]);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert_eq!(run.stderr.matches(missing).count(), 1, "{}", run.stderr);
}

#[test]
fn legacy_max_turns_shadowed_by_a_global_max_steps_is_warned_about() {
    let sb = Sandbox::new();
    // The global budget is in the user's file, the legacy one in the project's.
    sb.write(
        "project/stepguard.toml",
        "[task_types.migrate]\nmax_turns = 60\n",
    );
    sb.write("xdg-config/stepguard/stepguard.toml", "max_steps = 40\n");
    let project = project_file(&sb);
    let user = sb.user_config().display().to_string();
    let run = sb.run(&["config", "--json", "--task-type", "migrate"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["max_steps"], 40);
    assert_eq!(
        v["warnings"],
        json!([format!(
            "`task_types.migrate.max_turns = 60` in {project} is ignored: `max_steps = 40` in \
             {user} (global) takes precedence; rename it to `task_types.migrate.max_steps` to \
             apply it"
        )])
    );
    // `validate` says the same at the key.
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!(
            "warning: {project}: task_types.migrate.max_turns: ignored: `max_steps = 40` in \
             {user} (global) takes precedence"
        )),
        "{}",
        run.stdout
    );
    // Both spellings in one table: the `max_steps` one wins, the other is named.
    sb.write(
        "project/stepguard.toml",
        "[task_types.migrate]\nmax_steps = 30\nmax_turns = 60\n",
    );
    let v = sb
        .run(&["config", "--json", "--task-type", "migrate"])
        .json();
    assert_eq!(v["max_steps"], 30);
    assert_eq!(
        v["warnings"],
        json!([format!(
            "`task_types.migrate.max_turns = 60` in {project} is ignored: \
             `task_types.migrate.max_steps = 30` in {project} (task type `migrate`) takes \
             precedence; remove it"
        )])
    );
}

#[test]
fn example_project_config_honours_its_legacy_max_turns() {
    let sb = Sandbox::new();
    let example = workspace().join("examples/project/stepguard.toml");
    let example = example.to_str().unwrap();
    let config = |task: &str| {
        let run = sb.run(&["--config", example, "config", "--json", "--task-type", task]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        run.json()
    };
    let v = config("migrate");
    assert_eq!(
        (v["max_steps"].clone(), v["source"].clone()),
        (json!(60), json!("task_types.migrate.max_turns"))
    );
    assert_eq!(
        v["warnings"],
        json!([format!(
            "{example}: task_types.migrate.max_turns: `max_turns` is deprecated; use `max_steps`."
        )])
    );
    let v = config("review");
    assert_eq!(
        (v["max_steps"].clone(), v["warnings"].clone()),
        (json!(20), json!([]))
    );
    let run = sb.run(&["--config", example, "validate"]);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(run.stdout.contains("0 errors, 1 warning"), "{}", run.stdout);
}

#[test]
fn profile_line_only_when_the_profile_lowered_the_budget() {
    let sb = Sandbox::new();
    let run = sb.run(&["config", "--max-steps", "5", "--profile", "strict"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout
            .starts_with("max_steps: 5 (from --max-steps)\nprofile: strict\n"),
        "{}",
        run.stdout
    );
    let run = sb.run(&["config", "--max-steps", "40", "--profile", "strict"]);
    assert!(
        run.stdout.starts_with(
            "max_steps: 15 (from profile strict)\n  explicit budget 40 lowered to 15 by profile \
             strict\nprofile: strict\n"
        ),
        "{}",
        run.stdout
    );
}

#[test]
fn bad_token_or_cost_budget_in_a_file_stops_every_command_naming_file_and_key() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[task_types.review]\nmax_cost_usd = 2.12345\n",
    );
    let message = format!(
        "{}: task_types.review.max_cost_usd: 2.12345 has more than 4 decimals; use a number of \
         US dollars above 0 and at most 1000000 with at most 4 decimals (e.g. 2.50), or \
         \"unlimited\"",
        project_file(&sb)
    );
    // Even for runs of another task type: a typo never lies in wait.
    for (name, run) in every_command(&sb) {
        assert_eq!(run.code, Some(2), "{name}: {}{}", run.stdout, run.stderr);
        let shown = if name == "validate" {
            &run.stdout
        } else {
            &run.stderr
        };
        assert!(
            shown.lines().any(|l| l.ends_with(&message)),
            "{name} does not say {message:?}:\n{}{}",
            run.stdout,
            run.stderr
        );
    }
}

#[test]
fn misspelled_token_and_cost_keys_are_warnings_with_did_you_mean() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "max_token = 5000\n[task_types.review]\nmax_cost = 2\n",
    );
    let file = project_file(&sb);
    let run = sb.run(&["config", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["max_tokens"], json!(null));
    assert_eq!(
        v["warnings"],
        json!([
            format!(
                "warning: {file}: max_token: unknown key `max_token`; did you mean `max_tokens`?"
            ),
            format!(
                "warning: {file}: task_types.review.max_cost: unknown key `max_cost`; did you \
                 mean `max_cost_usd`?"
            ),
        ])
    );
    let run = sb.run(&["validate", "--strict"]);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    assert!(
        run.stdout.contains("2 errors, 0 warnings"),
        "{}",
        run.stdout
    );
}

#[test]
fn run_and_config_take_the_token_and_cost_flags() {
    let sb = Sandbox::new();
    for command in ["run", "config"] {
        let run = sb.run(&[command, "--help"]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(
            run.stdout.contains("--max-tokens <N>") && run.stdout.contains("--max-cost-usd <USD>"),
            "{command}: {}",
            run.stdout
        );
    }
    // Negative values reach the parser, which says why they are refused.
    let run = sb.run(&["config", "--max-cost-usd", "-0.5"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("invalid cost budget at --max-cost-usd: -0.5 is negative"),
        "{}",
        run.stderr
    );
}
