//! Rough edges a new user hits: error messages, input checking, first run, completions, colour.

use crate::harness::Sandbox;

/// Asserts a usage error (exit 2) whose stderr says `phrase` exactly once.
fn said_once(args: &[&str], run: &crate::harness::Run, phrase: &str) {
    assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
    assert_eq!(
        run.stderr.matches(phrase).count(),
        1,
        "{args:?}: {}",
        run.stderr
    );
}

#[test]
fn an_invalid_budget_is_said_once() {
    let sb = Sandbox::new();
    let args = ["config", "--max-steps", "0"];
    said_once(&args, &sb.run(&args), "0 is not a valid budget");
    let json = sb.run(&["config", "--max-steps", "0", "--json"]).json();
    let message = json["error"]["message"].as_str().unwrap();
    assert_eq!(
        message.matches("0 is not a valid budget").count(),
        1,
        "{message}"
    );
}

#[test]
fn a_missing_config_file_is_said_once() {
    let sb = Sandbox::new();
    let args = ["--config", "/nonexistent.toml", "config"];
    let run = sb.run(&args);
    said_once(&args, &run, "no such file");
    assert!(run.stderr.contains("/nonexistent.toml"), "{}", run.stderr);
}

#[test]
fn a_file_that_is_not_a_database_is_said_once() {
    let sb = Sandbox::new();
    let garbage = sb.write(
        "garbage",
        "this is not an SQLite file, not at all, no.\n".repeat(50),
    );
    let args = ["history", "--db", garbage.to_str().unwrap()];
    said_once(&args, &sb.run(&args), "file is not a database");
}

#[test]
fn a_file_that_is_not_a_scenario_is_said_once() {
    let sb = Sandbox::new();
    let file = sb.write("not-a-scenario.json", r#"{"hello": "world"}"#);
    let args = ["simulate", file.to_str().unwrap()];
    let run = sb.run(&args);
    said_once(&args, &run, "missing field");
    assert!(run.stderr.contains("`name`"), "{}", run.stderr);
}

#[test]
fn history_before_any_run_says_there_are_no_runs_yet() {
    let sb = Sandbox::new();
    let run = sb.run(&["history"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (Some(0), ""),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("no runs recorded yet"),
        "{}",
        run.stderr
    );
    let json = sb.run(&["history", "--json"]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert_eq!(json.json(), serde_json::json!([]));
    assert!(
        !sb.project().join(".stepguard").exists() && !sb.history_db().exists(),
        "history created a database"
    );
}

#[test]
fn stats_before_any_run_says_there_are_no_runs_yet() {
    let sb = Sandbox::new();
    let run = sb.run(&["stats"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (Some(0), ""),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("no runs recorded yet"),
        "{}",
        run.stderr
    );
    let json = sb.run(&["stats", "--json"]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert_eq!(json.json()["groups"], serde_json::json!([]));
}

#[test]
fn show_before_any_run_names_the_id() {
    let sb = Sandbox::new();
    let run = sb.run(&["show", "1"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("no run with id 1"), "{}", run.stderr);
}

#[test]
fn history_with_filters_that_match_nothing_names_them() {
    let sb = Sandbox::new();
    let agent = sb.write("ok.sh", "#!/bin/sh\necho '{\"type\":\"turn.completed\"}'\n");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ok = sb.run(&["run", "-q", "-p", "codex", "--", agent.to_str().unwrap()]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    let run = sb.run(&["history", "--provider", "nosuch", "--failed"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (Some(0), ""),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("no recorded run matches --provider nosuch --failed"),
        "{}",
        run.stderr
    );
    let json = sb.run(&["history", "--provider", "nosuch", "--json"]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert_eq!(json.json(), serde_json::json!([]));
    let show = sb.run(&["show", "99"]);
    assert_eq!(show.code, Some(2), "{}", show.stderr);
    assert!(show.stderr.contains("no run with id 99"), "{}", show.stderr);
}

#[test]
fn a_zero_timeout_is_refused_naming_the_value() {
    let sb = Sandbox::new();
    let marker = sb.root().join("started");
    let touch = format!("touch {}", marker.display());
    for flag in ["--timeout", "--ask-timeout"] {
        let run = sb.run(&["run", "-p", "codex", flag, "0s", "--", "sh", "-c", &touch]);
        assert_eq!(run.code, Some(2), "{flag}: {}", run.stderr);
        assert!(
            run.stderr.contains("`0s` is zero"),
            "{flag}: {}",
            run.stderr
        );
        assert!(!marker.exists(), "{flag}: the agent started");
    }
}

#[test]
fn a_timeout_that_is_not_a_duration_is_named_with_an_example() {
    let sb = Sandbox::new();
    let run = sb.run(&["run", "-p", "codex", "--timeout", "abc", "--", "true"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("`abc` is not a duration; write e.g. 90s, 30m or 1h30m"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("expected number"), "{}", run.stderr);
    let run = sb.run(&["run", "-p", "codex", "--timeout", "30", "--", "true"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("`30` has no unit; add a unit: 30s (seconds) or 30m (minutes)"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_negative_budget_reaches_stepguards_own_check() {
    let sb = Sandbox::new();
    for flag in ["--max-steps", "--max-turns"] {
        let args = ["config", flag, "-1"];
        let run = sb.run(&args);
        said_once(&args, &run, "-1 is negative");
        assert!(
            !run.stderr.contains("unexpected argument"),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn completions_cover_the_subcommands() {
    let sb = Sandbox::new();
    let run = sb.run(&["completions", "bash"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("stepguard"), "{}", run.stdout);
    assert!(run.stdout.contains("history"), "{}", run.stdout);
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let run = sb.run(&["completions", shell]);
        assert_eq!(run.code, Some(0), "{shell}: {}", run.stderr);
        assert!(run.stdout.contains("stepguard"), "{shell}");
    }
    assert_eq!(sb.run(&["completions", "tcsh"]).code, Some(2));
}

#[test]
fn man_prints_roff_or_writes_one_page_per_command() {
    let sb = Sandbox::new();
    let run = sb.run(&["man"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // roff throughout: requests and macros, the title header among the first lines.
    assert!(run.stdout.starts_with('.'), "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .take(5)
            .any(|l| l.starts_with(".TH stepguard 1")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("completions"), "{}", run.stdout);
    let dir = sb.root().join("man");
    let run = sb.run(&["man", "--out-dir", dir.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for page in ["stepguard.1", "stepguard-run.1", "stepguard-history.1"] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(text.contains(".TH"), "{page}");
    }
}

#[test]
fn color_always_paints_an_error_and_no_color_turns_auto_off() {
    let sb = Sandbox::new();
    let always = sb.run(&["--color", "always", "config", "--max-steps", "0"]);
    assert_eq!(always.code, Some(2));
    assert!(always.stderr.contains("\x1b["), "{:?}", always.stderr);
    let auto = sb.run_env(
        &["--color", "auto", "config", "--max-steps", "0"],
        &[("NO_COLOR", "1"), ("CLICOLOR_FORCE", "1")],
    );
    assert_eq!(auto.code, Some(2));
    assert!(!auto.stderr.contains('\x1b'), "{:?}", auto.stderr);
    assert!(
        auto.stderr.starts_with("stepguard: error: "),
        "{}",
        auto.stderr
    );
    let never = sb.run_env(
        &["--color", "never", "config", "--max-steps", "0"],
        &[("CLICOLOR_FORCE", "1")],
    );
    assert!(!never.stderr.contains('\x1b'), "{:?}", never.stderr);
    let line = r#"echo '{"type":"turn.completed"}'"#;
    let run = sb.run(&[
        "--color",
        "always",
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--",
        "sh",
        "-c",
        line,
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains(" | \x1b[32msuccess\x1b[0m"),
        "{:?}",
        run.stderr
    );
}
