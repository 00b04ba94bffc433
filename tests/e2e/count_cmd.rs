//! `stepguard count` end to end: every provider's fixtures, bad input, output formats.

use serde_json::{Value, json};

use crate::harness::{Sandbox, fixture, workspace};

fn count_json(args: &[&str]) -> Vec<Value> {
    let sb = Sandbox::new();
    let mut full = vec!["count", "--json"];
    full.extend_from_slice(args);
    let run = sb.run(&full);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    run.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Replaces the machine-specific fixture directory in `file` fields.
fn portable(mut v: Vec<Value>) -> Vec<Value> {
    let root = workspace().join("tests/fixtures").display().to_string();
    for o in &mut v {
        if let Some(f) = o["file"].as_str() {
            o["file"] = f.replace(&root, "[fixtures]").into();
        }
    }
    v
}

#[test]
fn json_output_snapshot_for_each_provider() {
    for (provider, files) in [
        (
            "codex",
            [
                "streams/codex/long_run.jsonl",
                "streams/codex/error_turn_failed.jsonl",
                "real/codex/error429.jsonl",
            ],
        ),
        (
            "claude",
            [
                "streams/claude/long_run.jsonl",
                "streams/claude/max_turns.jsonl",
                "real/claude/error429.jsonl",
            ],
        ),
        (
            "gemini",
            [
                "streams/gemini/max_session_turns_client_event.jsonl",
                "streams/gemini/stderr_merged_noise.jsonl",
                "real/gemini/error429.jsonl",
            ],
        ),
    ] {
        let paths: Vec<String> = files.iter().map(|f| fixture(f)).collect();
        let mut args = vec!["-p", provider];
        args.extend(paths.iter().map(String::as_str));
        insta::assert_json_snapshot!(
            format!("count_json_{provider}"),
            portable(count_json(&args))
        );
    }
}

#[test]
fn human_output_is_one_summary_line_per_file() {
    let sb = Sandbox::new();
    let file = fixture("streams/claude/long_run.jsonl");
    let run = sb.run(&["count", "-p", "claude", &file]);
    assert_eq!(run.code, Some(0));
    assert_eq!(
        run.stdout,
        format!(
            "{file}: Steps: 35 (legacy turns: 41) | success | tokens: 949582 in / 4927 out | cost: $0.5086 (provider claude, unit message, 0 noise lines)\n"
        )
    );
}

#[test]
fn every_unit_of_every_builtin_over_every_fixture_exits_0() {
    for (provider, units) in [
        ("claude", &["message", "tool_use"][..]),
        ("codex", &["item", "actionable", "tool", "message"]),
        ("gemini", &["tool_use", "turn"]),
    ] {
        let dirs = [format!("streams/{provider}"), format!("real/{provider}")];
        let mut files: Vec<String> = Vec::new();
        for d in &dirs {
            for e in std::fs::read_dir(workspace().join("tests/fixtures").join(d)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "jsonl") {
                    files.push(p.display().to_string());
                }
            }
        }
        for unit in units {
            let mut args = vec!["-p", provider, "--unit", unit];
            args.extend(files.iter().map(String::as_str));
            let out = count_json(&args);
            assert_eq!(out.len(), files.len());
            for o in out {
                assert_eq!(o["unit"], *unit);
                assert!(o["num_steps_computed"].as_u64().is_some());
                assert!(
                    ["success", "failed", "incomplete"].contains(&o["outcome"].as_str().unwrap())
                );
            }
        }
    }
}

#[test]
fn fake_events_inside_payloads_do_not_count() {
    let f = fixture("edge/codex_fake_events_in_payloads.jsonl");
    let v = &count_json(&["-p", "codex", &f])[0];
    assert_eq!(
        (v["num_steps_computed"].as_u64(), v["outcome"].as_str()),
        (Some(3), Some("success"))
    );
    let v = &count_json(&["-p", "codex", "--unit", "tool", &f])[0];
    assert_eq!(v["num_steps_computed"], 2);
}

#[test]
fn truncated_last_line_is_noise_and_the_started_step_counts() {
    let v = &count_json(&[
        "-p",
        "codex",
        &fixture("edge/codex_truncated_last_line.jsonl"),
    ])[0];
    assert_eq!(v["num_steps_computed"], 1);
    assert_eq!(v["noise_lines"], 1);
    assert_eq!(v["truncated_last_line"], true);
    assert_eq!(v["outcome"], "incomplete");
    assert_eq!(v["error_type"], Value::Null);
}

#[test]
fn invalid_utf8_does_not_stop_counting() {
    let v = &count_json(&["-p", "codex", &fixture("edge/codex_invalid_utf8.jsonl")])[0];
    assert_eq!(
        (
            v["num_steps_computed"].as_u64(),
            v["noise_lines"].as_u64(),
            v["outcome"].as_str()
        ),
        (Some(1), Some(1), Some("success"))
    );
}

#[test]
fn empty_file_counts_nothing() {
    let v = &count_json(&["-p", "gemini", &fixture("edge/empty.jsonl")])[0];
    assert_eq!(
        v,
        &json!({
            "schema_version": 1, "id": null,
            "file": fixture("edge/empty.jsonl"), "provider": "gemini", "unit": "tool_use",
            "plugin_version": "0.1.0", "plugin_source": "builtin", "task_type": null, "profile": null,
            "pools": null, "ledger": null, "checkpoint": null,
            "max_steps": null, "max_steps_source": null, "command": null, "cwd": null,
            "started_at": null, "ended_at": null, "duration_ms": null,
            "session_id": null, "resumed_from": null,
            "num_steps_computed": 0, "num_steps_reported": null, "num_turns_reported": null,
            "num_turns_computed": 0, "outcome": "incomplete", "error_type": null, "message": null,
            "exit_code": null, "child_exit_code": null, "child_signal": null,
            "terminated_by": null, "containment": null, "breached_at_step": null, "loops": [],
            "on_limit_decisions": [], "final_report": null, "model_calls": null, "notices": null,
            "max_tokens": null, "max_tokens_source": null, "max_cost_usd": null,
            "max_cost_usd_source": null, "sub_agent_tokens": {},
            "noise_lines": 0, "unknown_events": 0, "oversized_lines": 0, "truncated_last_line": false,
            "tokens": null, "cost_usd": null, "sub_agent_steps": {}
        })
    );
}

#[test]
fn a_64_mib_line_is_counted() {
    let sb = Sandbox::new();
    let big = "x".repeat(64 << 20);
    let stream = format!(
        "{{\"type\":\"turn.started\"}}\n{{\"type\":\"item.completed\",\"item\":{{\"id\":\"item_0\",\"type\":\"command_execution\",\"aggregated_output\":\"{big}\"}}}}\n{{\"type\":\"turn.completed\",\"usage\":{{\"input_tokens\":1,\"output_tokens\":1}}}}\n"
    );
    let path = sb.write("big.jsonl", stream);
    let v = &count_json(&["-p", "codex", "--unit", "tool", path.to_str().unwrap()])[0];
    assert_eq!(
        (
            v["num_steps_computed"].as_u64(),
            v["noise_lines"].as_u64(),
            v["outcome"].as_str()
        ),
        (Some(1), Some(0), Some("success"))
    );
}

#[test]
fn stdin_dash_is_read() {
    let sb = Sandbox::new();
    let mut child = sb
        .cmd(&["count", "-p", "codex", "--json", "-"])
        .stdin(std::process::Stdio::from(
            std::fs::File::open(fixture("real/codex/tools3.jsonl")).unwrap(),
        ))
        .output()
        .unwrap();
    assert!(child.status.success());
    let v: Value = serde_json::from_slice(&std::mem::take(&mut child.stdout)).unwrap();
    assert_eq!(
        (v["file"].as_str(), v["num_steps_computed"].as_u64()),
        (Some("-"), Some(4))
    );
}

#[test]
fn missing_files_and_directories_are_named_and_the_rest_still_counted() {
    let sb = Sandbox::new();
    let good = fixture("real/codex/tools3.jsonl");
    let dir = sb.root().to_str().unwrap().to_owned();
    let files = ["/no/such/file.jsonl", dir.as_str(), good.as_str()];
    let run = sb.run(&[&["count", "-p", "codex"][..], &files[..]].concat());
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains(
            "stepguard: error: cannot read /no/such/file.jsonl: No such file or directory"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains(&format!("cannot read {dir}: is a directory")),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout.lines().count(), 1);

    // Under --json each file that cannot be read is an error object in its place, on stdout.
    let run = sb.run(&[&["count", "-p", "codex", "--json"][..], &files[..]].concat());
    assert_eq!(run.code, Some(2));
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert_eq!(lines[0]["error"]["kind"], "io");
    assert_eq!(
        lines[0]["error"]["message"],
        "cannot read /no/such/file.jsonl: No such file or directory (os error 2)"
    );
    assert_eq!(lines[1]["error"]["kind"], "io");
    assert_eq!(
        lines[1]["error"]["message"],
        format!("cannot read {dir}: is a directory")
    );
    assert_eq!(lines[2]["num_steps_computed"], 4, "{}", lines[2]);
    assert_eq!(run.stderr, "");
}

#[test]
fn unknown_provider_or_unit_is_exit_2_with_valid_names() {
    let sb = Sandbox::new();
    let f = fixture("real/codex/tools3.jsonl");
    let run = sb.run(&["count", "-p", "codx", &f]);
    assert_eq!(run.code, Some(2));
    assert_eq!(
        run.stderr.trim(),
        "stepguard: error: unknown provider `codx`; available providers: claude, codex, gemini"
    );
    let run = sb.run(&["count", "-p", "gemini", "--unit", "message", &f]);
    assert_eq!(run.code, Some(2));
    assert_eq!(
        run.stderr.trim(),
        "stepguard: error: unknown unit `message` for provider `gemini` (from --unit); valid units: tool_use, turn, request"
    );
}

#[test]
fn unit_from_config_and_flag_precedence() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"tool\"\n",
    );
    let f = fixture("streams/codex/long_run.jsonl");
    let run = sb.run(&["count", "-p", "codex", "--json", &f]);
    assert_eq!(
        (
            run.json()["unit"].as_str(),
            run.json()["num_steps_computed"].as_u64()
        ),
        (Some("tool"), Some(32))
    );
    let run = sb.run(&["count", "-p", "codex", "--json", "--unit", "message", &f]);
    assert_eq!(run.json()["num_steps_computed"], 2);
    sb.write(
        "project/stepguard.toml",
        "[codex]\nmax_steps_unit = \"tools\"\n",
    );
    let run = sb.run(&["count", "-p", "codex", &f]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains(
            "codex.max_steps_unit: unknown unit `tools` for provider `codex`; did you mean `tool`? valid units: item, actionable, tool, message, request"
        ),
        "{}",
        run.stderr
    );
}
