//! Loops and stalls end to end: the loop limit from every level in `config`, bad `[loops]` in
//! `validate`, a looping agent stopped by `run` and shown by `history`, `show` and `stats`, the
//! idle and startup timeouts, and `count` auditing a recorded loop.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Run, Sandbox};

/// One `command_execution` of `command` in Codex's `exec --json` shape (as in
/// `tests/fixtures/real/codex/tools3.jsonl`): started, then completed.
fn codex_call(id: usize, command: &str) -> String {
    let item = |status: &str, output: &str, exit: &str| {
        json!({
            "type": format!("item.{status}"),
            "item": {
                "id": format!("item_{id}"),
                "type": "command_execution",
                "command": format!("/bin/bash -lc '{command}'"),
                "aggregated_output": output,
                "exit_code": serde_json::from_str::<Value>(exit).unwrap(),
                "status": if status == "started" { "in_progress" } else { "completed" },
            }
        })
        .to_string()
    };
    format!(
        "{}\n{}\n",
        item("started", "", "null"),
        item("completed", "1 failed\n", "1")
    )
}

/// One `command_execution` of `command` that printed `output` and exited with `exit`.
fn codex_run(id: usize, command: &str, output: &str, exit: i64) -> String {
    let item = |status: &str, output: &str, exit: Value| {
        json!({
            "type": format!("item.{status}"),
            "item": {
                "id": format!("item_{id}"),
                "type": "command_execution",
                "command": format!("/bin/bash -lc '{command}'"),
                "aggregated_output": output,
                "exit_code": exit,
                "status": if status == "started" { "in_progress" } else if exit == json!(0) { "completed" } else { "failed" },
            }
        })
        .to_string()
    };
    format!(
        "{}\n{}\n",
        item("started", "", Value::Null),
        item("completed", output, json!(exit))
    )
}

/// A Codex thread of `runs`, then an answer and the end of its turn.
fn codex_stream(runs: &[String]) -> String {
    let mut s = String::from(
        "{\"type\":\"thread.started\",\"thread_id\":\"01a2029f\"}\n{\"type\":\"turn.started\"}\n",
    );
    s.extend(runs.iter().cloned());
    s.push_str(
        "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_99\",\"type\":\"agent_message\",\"text\":\"done\"}}\n\
         {\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":400,\"cached_input_tokens\":0,\"output_tokens\":80}}\n",
    );
    s
}

/// A Codex stream that runs `cargo test` `repeats` times, then answers and ends its turn.
fn looping_stream(repeats: usize) -> String {
    let mut s = String::from(
        "{\"type\":\"thread.started\",\"thread_id\":\"01a2029f\"}\n{\"type\":\"turn.started\"}\n",
    );
    for i in 0..repeats {
        s.push_str(&codex_call(i, "cargo test"));
    }
    s.push_str(
        "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_99\",\"type\":\"agent_message\",\"text\":\"done\"}}\n\
         {\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":400,\"cached_input_tokens\":0,\"output_tokens\":80}}\n",
    );
    s
}

/// An executable script in the sandbox.
fn script(sb: &Sandbox, name: &str, body: &str) -> String {
    let path = sb.write(name, format!("#!/usr/bin/env bash\n{body}\n"));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// An agent printing `stream` a line at a time, a little apart, as a live CLI does.
fn replaying_agent(sb: &Sandbox, name: &str, stream: &str) -> String {
    let file = sb.write(&format!("{name}.jsonl"), stream);
    script(
        sb,
        name,
        &format!(
            "while IFS= read -r line; do printf '%s\\n' \"$line\"; sleep 0.02; done < {}",
            file.display()
        ),
    )
}

/// Runs `stepguard run -q --summary-file … ARGS` and returns the run and its record.
fn run_with_summary(sb: &Sandbox, args: &[&str]) -> (Run, Value) {
    let file = sb.root().join("summary.json");
    let _ = std::fs::remove_file(&file);
    let mut full = vec!["run", "-q", "--summary-file", file.to_str().unwrap()];
    full.extend_from_slice(args);
    let run = sb.run(&full);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("no summary file ({e}); stderr: {}", run.stderr));
    (run, serde_json::from_str(&text).unwrap())
}

/// Arguments, environment, the expected limit and its source.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], Value, &'a str);

const CONFIG: &str = r#"
[loops]
limit = 7
window = 25
ignore_tools = ["read", "grep"]
[task_types.review]
loop_limit = 6
[profiles.nightly]
max_steps = 100
loop_limit = 4
"#;

fn config_json(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut full = vec!["config", "--json"];
    full.extend_from_slice(args);
    let run = sb.run_env(&full, env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    run.json()
}

#[test]
fn config_shows_the_loop_limit_and_its_source_from_each_level() {
    let sb = Sandbox::new();
    let v = config_json(&sb, &[], &[]);
    assert_eq!(
        (
            &v["loop_limit"],
            &v["loop_limit_source"],
            &v["loop_window"],
            &v["loop_ignore_tools"]
        ),
        (&json!(5), &json!("default"), &json!(20), &json!([]))
    );

    let file = sb.write("project/stepguard.toml", CONFIG);
    let file = file.display().to_string();
    let env = [("STEPGUARD_LOOP_LIMIT", "4")];
    let cases: [Case; 8] = [
        (&[], &[], json!(7), "loops.limit"),
        (
            &["--task-type", "review"],
            &[],
            json!(6),
            "task_types.review.loop_limit",
        ),
        (
            &["--task-type", "review"],
            &env,
            json!(4),
            "env STEPGUARD_LOOP_LIMIT",
        ),
        (&["--loop-limit", "3"], &env, json!(3), "--loop-limit"),
        (&["--loop-limit", "off"], &[], Value::Null, "--loop-limit"),
        // A profile's limit bounds an explicit one: strict (3) is under loops.limit (7) …
        (&["--profile", "strict"], &[], json!(3), "profile strict"),
        // … yolo (8) is not, and a configured profile limit replaces the built-in one.
        (&["--profile", "yolo"], &[], json!(7), "loops.limit"),
        (
            &["--profile", "nightly", "--loop-limit", "off"],
            &[],
            json!(4),
            "profiles.nightly.loop_limit",
        ),
    ];
    for (args, env, limit, source) in cases {
        let v = config_json(&sb, args, env);
        assert_eq!(
            (&v["loop_limit"], v["loop_limit_source"].as_str()),
            (&limit, Some(source)),
            "{args:?} {env:?}"
        );
        assert_eq!(v["loop_window"], 25);
        assert_eq!(v["loop_ignore_tools"], json!(["read", "grep"]));
    }
    let v = config_json(&sb, &[], &[]);
    assert_eq!(v["loop_limit_source_file"], json!(file));

    // The text names the level and the file, and says when the profile lowered the limit.
    let text = sb.run(&["config", "--profile", "strict"]);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stdout
            .contains("loop_limit: 3 (from profile strict)\n  explicit loop limit 7 lowered to 3 by profile strict\n"),
        "{}",
        text.stdout
    );
    let text = sb.run(&["config"]);
    assert!(
        text.stdout.contains(&format!(
            "loop_limit: 7 (from loops.limit in {file})\nloop_window: 25 calls\nloop_ignore_tools: read, grep\n"
        )),
        "{}",
        text.stdout
    );

    // A bad flag or environment value is an error naming where it came from.
    let bad = sb.run(&["config", "--loop-limit", "1"]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr.contains(
            "invalid loop limit at --loop-limit: 1 is below 2 (a loop is a call made at least \
             twice); use a whole number from 2 to 1000, or \"off\""
        ),
        "{}",
        bad.stderr
    );
    let bad = sb.run_env(&["config"], &[("STEPGUARD_LOOP_LIMIT", "lots")]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr
            .contains("invalid loop limit at env STEPGUARD_LOOP_LIMIT: \"lots\" is not a number"),
        "{}",
        bad.stderr
    );
}

#[test]
fn a_window_below_a_flags_limit_is_widened_with_a_warning() {
    let sb = Sandbox::new();
    let file = sb.write("project/stepguard.toml", "[loops]\nwindow = 4\n");
    let v = config_json(&sb, &["--loop-limit", "3"], &[]);
    assert_eq!((&v["loop_window"], &v["warnings"]), (&json!(4), &json!([])));
    let v = config_json(&sb, &["--loop-limit", "6"], &[]);
    assert_eq!(v["loop_window"], 6);
    assert_eq!(
        v["warnings"],
        json!([format!(
            "{}: loops.window: the window of 4 calls is below the loop limit of 6 (from \
             --loop-limit); using a window of 6",
            file.display()
        )])
    );
}

#[test]
fn validate_reports_bad_loops_keys_and_values_and_run_refuses_them() {
    let sb = Sandbox::new();
    let file = sb.write(
        "project/stepguard.toml",
        "[loops]\nlimit = 0\nwindow = 2.5\nignore_tools = \"read\"\nignore_tool = []\n\
         [task_types.review]\nloop_limit = \"never\"\n[profiles.strict]\nloop_limt = 3\n",
    );
    let file = file.display().to_string();
    let run = sb.run(&["validate", "--json"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["valid"], false);
    let keyed = |list: &Value| -> Vec<(String, String)> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p["file"], json!(file));
                (
                    p["key"].as_str().unwrap().to_owned(),
                    p["message"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let errors = keyed(&v["errors"]);
    let keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "loops.ignore_tools",
            "loops.limit",
            "loops.window",
            "task_types.review.loop_limit"
        ],
        "{errors:?}"
    );
    assert!(errors[1].1.starts_with("0 is below 2"), "{errors:?}");
    assert!(
        errors[2].1.starts_with("2.5 is not a whole number"),
        "{errors:?}"
    );
    assert!(
        errors[3].1.starts_with("\"never\" is not a number"),
        "{errors:?}"
    );
    assert_eq!(
        keyed(&v["warnings"]),
        [
            (
                "loops.ignore_tool".to_owned(),
                "unknown key `ignore_tool`; did you mean `ignore_tools`?".to_owned()
            ),
            (
                "profiles.strict.loop_limt".to_owned(),
                "unknown key `loop_limt`; did you mean `loop_limit`?".to_owned()
            ),
        ]
    );
    // What validate refuses, config and run refuse too, naming the file and the key.
    let config = sb.run(&["config"]);
    assert_eq!(config.code, Some(2));
    assert!(
        config
            .stderr
            .contains(&format!("{file}: loops.limit: 0 is below 2")),
        "{}",
        config.stderr
    );
    let run = sb.run(&["run", "-p", "codex", "--", "true"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("loops.limit"), "{}", run.stderr);
}

#[test]
fn a_looping_agent_is_stopped_recorded_shown_and_counted_in_stats() {
    let sb = Sandbox::new();
    let agent = replaying_agent(&sb, "loop.sh", &looping_stream(10));
    let (run, record) = run_with_summary(&sb, &["-p", "codex", "--loop-limit", "3", "--", &agent]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(record["error_type"], "loop_detected");
    assert_eq!(record["terminated_by"], "loop");
    assert!(!run.stdout.contains("\"done\""), "the agent was stopped");
    let loops = record["loops"].as_array().expect("loops found");
    assert_eq!(loops.len(), 1, "{record}");
    let found = &loops[0];
    assert_eq!(
        (&found["tool"], &found["count"], &found["kind"]),
        (&json!("shell"), &json!(3), &json!("repeat"))
    );
    let first_step = found["first_step"].as_u64().unwrap();
    assert!((1..=3).contains(&first_step), "{found}");
    assert!(found.get("period").is_none(), "{found}");

    let id = sb.recorded_id(&record, &run.stderr);
    let history = sb.run(&["history"]);
    assert!(
        history.stdout.contains("failed: loop_detected")
            && history
                .stdout
                .contains(&format!(", loop: shell ×3 at step {first_step}")),
        "{}",
        history.stdout
    );
    let show = sb.run(&["show", &id]);
    assert!(
        show.stdout.contains(&format!(
            "  Loop: shell called 3 times (since step {first_step})\n"
        )),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("Terminated by: loop"),
        "{}",
        show.stdout
    );
    assert_eq!(sb.run(&["show", &id, "--json"]).json(), record);

    // Off lets the same agent finish; nothing was looked for, so `loops` is null.
    let (run, record) =
        run_with_summary(&sb, &["-p", "codex", "--loop-limit", "off", "--", &agent]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (&record["outcome"], &record["loops"]),
        (&json!("success"), &Value::Null)
    );
    // A run without a loop found has `[]`.
    let calm = replaying_agent(&sb, "calm.sh", &looping_stream(2));
    let (run, record) = run_with_summary(&sb, &["-p", "codex", "--", &calm]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(record["loops"], json!([]));

    let stats = sb.run(&["stats", "--json"]).json();
    let group = &stats["groups"][0];
    assert_eq!(group["runs"], 3);
    assert_eq!(group["failure_slugs"], json!({"loop_detected": 1}));
    let text = sb.run(&["stats"]);
    assert!(
        text.stdout.contains("failures: loop_detected 1"),
        "{}",
        text.stdout
    );
}

#[test]
fn idle_and_startup_timeouts_stop_the_silent_agent() {
    let sb = Sandbox::new();
    let idle = script(
        &sb,
        "idle.sh",
        "echo '{\"type\":\"thread.started\",\"thread_id\":\"t\"}'\nsleep 30",
    );
    let start = Instant::now();
    let (run, record) = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--idle-timeout",
            "1s",
            "--grace",
            "1s",
            "--",
            &idle,
        ],
    );
    assert_eq!(run.code, Some(124), "{}", run.stderr);
    assert_eq!(
        (&record["error_type"], &record["terminated_by"]),
        (&json!("stalled"), &json!("idle"))
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    let quiet = script(&sb, "quiet.sh", "sleep 30");
    let start = Instant::now();
    let (run, record) = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--startup-timeout",
            "1s",
            "--grace",
            "1s",
            "--",
            &quiet,
        ],
    );
    assert_eq!(run.code, Some(124), "{}", run.stderr);
    assert_eq!(
        (&record["error_type"], &record["terminated_by"]),
        (&json!("startup_hang"), &json!("startup"))
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    let stats = sb.run(&["stats", "--json"]).json();
    assert_eq!(
        stats["groups"][0]["failure_slugs"],
        json!({"stalled": 1, "startup_hang": 1})
    );
}

#[test]
fn the_timeout_flags_are_documented_with_their_defaults() {
    let help = Sandbox::new().run(&["run", "--help"]).stdout;
    for needle in [
        "--loop-limit <N|off>",
        "--idle-timeout <DURATION>",
        "--startup-timeout <DURATION>",
        "[default: 10m]",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}

#[test]
fn count_lists_the_loops_of_a_recorded_stream() {
    let sb = Sandbox::new();
    let looping = sb.write("looping.jsonl", looping_stream(8));
    let looping = looping.to_str().unwrap();
    let calm = sb.write("calm.jsonl", looping_stream(2));
    let calm = calm.to_str().unwrap();

    let run = sb.run(&[
        "count",
        "-p",
        "codex",
        "--json",
        "--loop-limit",
        "3",
        looping,
        calm,
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let records: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let loops = records[0]["loops"].as_array().expect("loops looked for");
    // Found at the 3rd call, then looked for afresh: calls 4–6 are the second loop.
    assert_eq!(loops.len(), 2, "{loops:?}");
    assert_eq!(
        (&loops[0]["tool"], &loops[0]["count"], &loops[0]["kind"]),
        (&json!("shell"), &json!(3), &json!("repeat"))
    );
    assert_eq!(records[1]["loops"], json!([]));
    // Each loop says in which step its first counted call was made, even from one big chunk.
    assert_eq!(
        (&loops[0]["first_step"], &loops[1]["first_step"]),
        (&json!(1), &json!(4))
    );

    // The human line names each loop.
    let text = sb.run(&["count", "-p", "codex", "--loop-limit", "3", looping]);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let first = loops[0]["first_step"].as_u64().unwrap();
    assert!(
        text.stdout
            .contains(&format!(", loop: shell ×3 at step {first}")),
        "{}",
        text.stdout
    );
    // The config's [loops] applies, and off looks for nothing.
    sb.write("project/stepguard.toml", "[loops]\nlimit = 8\n");
    let v = sb.run(&["count", "-p", "codex", "--json", looping]).json();
    assert_eq!(v["loops"][0]["count"], 8);
    let v = sb
        .run(&[
            "count",
            "-p",
            "codex",
            "--json",
            "--loop-limit",
            "off",
            looping,
        ])
        .json();
    assert_eq!(v["loops"], Value::Null);
}

#[test]
fn plugins_say_whether_each_provider_reports_tool_calls() {
    let sb = Sandbox::new();
    let list = sb.run(&["plugins", "--json"]).json();
    let builtins: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["source"] == "builtin")
        .collect();
    assert_eq!(builtins.len(), 3, "{list}");
    for p in builtins {
        assert_eq!(p["tool_calls"], true, "{p}");
        assert!(p["model_endpoint"]["dialect"].is_string(), "{p}");
    }
    let text = sb.run(&["plugins"]).stdout;
    assert!(
        text.contains("codex 0.1.0 (protocol 1.8.0) from builtin\n")
            && text.matches("  loop detection: yes\n").count() >= 3
            && text.contains("  wrap-up: yes (openai-responses model calls, via the gateway)\n")
            && text.contains("  unit request: model calls that offer tools"),
        "{text}"
    );
}

/// Test-driven work: an edit, then the tests, six times, each run with one failure fewer.
fn tdd_stream() -> String {
    let mut runs = Vec::new();
    for i in 0..6 {
        runs.push(codex_run(
            2 * i,
            &format!("apply_patch fix_{i}.diff"),
            "Done!\n",
            0,
        ));
        let failed = 5 - i;
        let output =
            format!("test result: FAILED. {i} passed; {failed} failed; finished in 0.{i}4s\n");
        runs.push(codex_run(
            2 * i + 1,
            "cargo test",
            &output,
            i64::from(failed > 0) * 101,
        ));
    }
    codex_stream(&runs)
}

#[test]
fn tests_rerun_after_each_edit_with_fewer_failures_are_no_loop() {
    let sb = Sandbox::new();
    let agent = replaying_agent(&sb, "tdd.sh", &tdd_stream());
    // Six runs of `cargo test` within 12 calls: identical calls, but each with a new result.
    let (run, record) = run_with_summary(&sb, &["-p", "codex", "--", &agent]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (&record["outcome"], &record["loops"]),
        (&json!("success"), &json!([]))
    );
    // The same tests failing the same way each time, whatever was edited, are a loop.
    let mut runs = Vec::new();
    for i in 0..6 {
        runs.push(codex_run(
            2 * i,
            &format!("apply_patch try_{i}.diff"),
            &format!("Done {i}\n"),
            0,
        ));
        runs.push(codex_run(
            2 * i + 1,
            "cargo test",
            "test result: FAILED. 3 passed; 1 failed; finished in 0.31s\n",
            101,
        ));
    }
    let stuck = replaying_agent(&sb, "stuck.sh", &codex_stream(&runs));
    let (run, record) = run_with_summary(&sb, &["-p", "codex", "--", &stuck]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let found = &record["loops"][0];
    assert_eq!(
        (
            &found["tool"],
            &found["count"],
            &found["kind"],
            &found["first_step"]
        ),
        (&json!("cargo"), &json!(5), &json!("no_progress"), &json!(2)),
        "{record}"
    );
    assert!(
        run.stderr
            .contains("`cargo` failed with the same error 5 times (since step 2)"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_same_program_failing_alike_under_other_arguments_is_no_progress() {
    let sb = Sandbox::new();
    // The agent varies the build's arguments and spacing; the error stays the same.
    let commands = [
        "cargo build",
        "RUST_LOG=debug cargo build",
        "cargo  build -q",
        "cd . && cargo build --all-targets",
        "cargo build # once more",
    ];
    let runs: Vec<String> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            codex_run(
                i,
                c,
                "error[E0432]: unresolved import `crate::lexer::Token`\n",
                101,
            )
        })
        .collect();
    let file = sb.write("varied.jsonl", codex_stream(&runs));
    let v = sb
        .run(&["count", "-p", "codex", "--json", file.to_str().unwrap()])
        .json();
    assert_eq!(
        v["loops"],
        json!([{"tool": "cargo", "count": 5, "kind": "no_progress", "first_step": 1}])
    );
    let text = sb.run(&["count", "-p", "codex", file.to_str().unwrap()]);
    assert!(
        text.stdout.contains(", loop: cargo ×5 at step 1"),
        "{}",
        text.stdout
    );
}

#[test]
fn a_loops_first_step_does_not_depend_on_how_the_stream_was_read() {
    let sb = Sandbox::new();
    // Two other calls, then the same failing call five times.
    let mut runs = vec![
        codex_run(0, "ls", "a\n", 0),
        codex_run(1, "cat README", "hello\n", 0),
    ];
    runs.extend((2..7).map(|i| codex_run(i, "make", "make: *** [all] Error 1\n", 2)));
    let stream = codex_stream(&runs);
    let file = sb.write("stuck.jsonl", &stream);
    let trickle = replaying_agent(&sb, "trickle.sh", &stream);
    let whole = script(&sb, "whole.sh", &format!("cat {}", file.display()));
    for agent in [&trickle, &whole] {
        let (run, record) = run_with_summary(&sb, &["-p", "codex", "--", agent]);
        assert_eq!(run.code, Some(3), "{agent}: {}", run.stderr);
        let found = &record["loops"][0];
        assert_eq!(
            (
                &found["tool"],
                &found["count"],
                &found["kind"],
                &found["first_step"]
            ),
            (&json!("shell"), &json!(5), &json!("repeat"), &json!(3)),
            "{agent}: {record}"
        );
    }
}
