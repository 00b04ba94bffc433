//! Fail closed and never hang: unrecognised streams, the pre-flight check, the prompt at the limit.

use serde_json::Value;

use crate::harness::{Pty, Sandbox};
use crate::run_cmd::{
    alive, fixture, read_pid, replaying_agent, run_with_summary, script, summary,
};

#[test]
fn text_output_without_json_is_unrecognized_stream_exit_2_never_success() {
    // The user forgot `--json`: before, `Steps: 0 | success`, exit 0.
    let sb = Sandbox::new();
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--max-steps",
            "1",
            "--",
            "bash",
            "-c",
            "for i in 1 2 3 4 5; do echo \"running tool $i\"; done",
        ],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 5, "output still passes through");
    let s = summary(&sb);
    assert_eq!(s["error_type"], "unrecognized_stream");
    assert_eq!(s["outcome"], "failed");
    // The agent ended by itself: stepguard judged, it did not stop anything.
    assert_eq!(s["terminated_by"], Value::Null);
    for words in [
        "output (5 lines)",
        "codex stream",
        "codex exec --json",
        "--provider",
    ] {
        assert!(run.stderr.contains(words), "`{words}` in {}", run.stderr);
    }
    assert!(run.stderr.contains("failed: unrecognized_stream"));
}

#[test]
fn the_wrong_provider_is_unrecognized_stream() {
    let sb = Sandbox::new();
    let stream = fixture("real/codex/tools3.jsonl");
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "claude",
            "--no-native-limit",
            "--max-steps",
            "1",
            "--",
            "cat",
            stream.to_str().unwrap(),
        ],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(summary(&sb)["error_type"], "unrecognized_stream");
    assert!(run.stderr.contains("claude stream"), "{}", run.stderr);
}

#[test]
fn endless_unrecognised_output_is_stopped_with_its_tree() {
    // A CLI in text mode goes on working unseen: stepguard stops it after the window (50
    // lines), with everything it started.
    let sb = Sandbox::new();
    let pid_file = sb.root().join("tool.pid");
    let agent = script(
        &sb,
        "agent.sh",
        &format!(
            "sleep 300 &\necho $! > {}\nfor i in $(seq 60); do echo \"tool output $i\"; done\nsleep 300",
            pid_file.display()
        ),
    );
    let run = run_with_summary(&sb, &["-p", "codex", "--timeout", "60s", "--", &agent]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let s = summary(&sb);
    assert_eq!(s["error_type"], "unrecognized_stream");
    assert_eq!(s["terminated_by"], "unrecognized");
    assert!(
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains("was recognised as a codex stream")),
        "{s}"
    );
    assert!(!alive(read_pid(&pid_file)), "the tool outlived the stop");
}

#[test]
fn unrecognized_warn_lets_the_run_go_on_with_a_warning() {
    let sb = Sandbox::new();
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--unrecognized",
            "warn",
            "--",
            "echo",
            "plain text",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(summary(&sb)["outcome"], "success");
    assert!(
        run.stderr.contains("was recognised as a codex stream"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_config_can_downgrade_an_unrecognised_stream_to_a_warning_and_the_flag_beats_it() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[run]\nunrecognized_stream = \"warn\"\n",
    );
    let run = sb.run(&["run", "-p", "codex", "--", "echo", "plain text"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("was recognised"), "{}", run.stderr);
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--unrecognized",
        "stop",
        "--",
        "echo",
        "plain text",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    sb.write(
        "project/stepguard.toml",
        "[run]\nunrecognized_stream = \"ignore\"\n",
    );
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stdout
            .contains("run.unrecognized_stream: expected \"stop\" or \"warn\""),
        "{}",
        run.stdout
    );
}

#[test]
fn a_recognised_stream_after_a_few_lines_of_noise_is_counted() {
    // Warnings merged from stderr before the first event are normal.
    let sb = Sandbox::new();
    let stream = fixture("streams/codex/stderr_merged_noise.jsonl");
    let run = run_with_summary(&sb, &["-p", "codex", "--", "cat", stream.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(summary(&sb)["outcome"], "success");
}

#[test]
fn preflight_refuses_a_command_that_cannot_be_counted_naming_the_flag() {
    let sb = Sandbox::new();
    // A stand-in `codex` that would print text: with the pre-flight check it never starts.
    let marker = sb.root().join("started");
    let codex = script(
        &sb,
        "codex",
        &format!("touch {}\necho 'working on it'", marker.display()),
    );
    let run = sb.run(&["run", "-p", "codex", "--", &codex, "exec", "fix the test"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("add `--json` after `codex exec`"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--no-preflight"), "{}", run.stderr);
    assert!(!marker.exists(), "the agent started");

    // `--no-preflight` runs it, and the run-time check still fails it closed.
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--no-preflight",
        "--",
        &codex,
        "exec",
        "x",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(marker.exists());
    assert!(run.stderr.contains("unrecognized_stream"), "{}", run.stderr);

    for (provider, command, fix) in [
        (
            "claude",
            vec!["claude", "-p", "hi"],
            "--output-format stream-json --verbose",
        ),
        ("claude", vec!["claude", "hi"], "print mode"),
        (
            "gemini",
            vec!["gemini", "-p", "hi"],
            "--output-format stream-json",
        ),
        ("codex", vec!["codex", "fix it"], "codex exec --json"),
    ] {
        let mut args = vec!["run", "-p", provider, "--"];
        args.extend(command);
        let run = sb.run(&args);
        assert_eq!(run.code, Some(2), "{provider}: {}", run.stderr);
        assert!(run.stderr.contains(fix), "{provider}: {}", run.stderr);
    }
}

#[test]
fn count_warns_when_a_file_has_lines_but_no_recognised_event() {
    let sb = Sandbox::new();
    let stream = fixture("real/codex/tools3.jsonl");
    let run = sb.run(&["count", "-p", "claude", stream.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("warning:"), "{}", run.stderr);
    assert!(
        run.stderr.contains("was recognised as a claude stream"),
        "{}",
        run.stderr
    );
    let right = sb.run(&["count", "-p", "codex", stream.to_str().unwrap()]);
    assert!(!right.stderr.contains("warning"), "{}", right.stderr);
}

/// Starts a run that asks at the limit on a terminal: `--max-steps 2` over a 12-tool stream.
fn asking_run(
    sb: &Sandbox,
    pty: &Pty,
    extra: &[&str],
) -> (std::process::Child, std::path::PathBuf) {
    let stream = fixture("real/codex/tools12.jsonl");
    let agent = replaying_agent(sb, &stream);
    let file = sb.root().join("summary.json").display().to_string();
    let mut args = vec![
        "run",
        "--summary-file",
        &file,
        "-p",
        "codex",
        "--unit",
        "tool",
        "--max-steps",
        "2",
        "--on-limit",
        "ask",
    ];
    args.extend_from_slice(extra);
    args.extend(["--", agent.as_str()]);
    let child = pty.spawn(&mut sb.cmd(&args));
    (child, sb.root().join("grandchild.pid"))
}

#[test]
fn sigterm_while_the_prompt_waits_stops_the_run_as_interrupted() {
    let sb = Sandbox::new();
    let mut pty = Pty::open();
    let (child, grandchild) = asking_run(&sb, &pty, &[]);
    pty.wait_for("The agent is paused. Answer within 5m.");
    pty.wait_for("? ");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let s = summary(&sb);
    assert_eq!(s["error_type"], "interrupted");
    assert_eq!(s["terminated_by"], "signal");
    assert_eq!(s["on_limit_decisions"], serde_json::json!([]));
    assert!(
        !alive(read_pid(&grandchild)),
        "the paused tree outlived the stop"
    );
}

#[test]
fn the_prompt_gives_up_after_the_ask_timeout_and_stops() {
    let sb = Sandbox::new();
    let mut pty = Pty::open();
    let (child, grandchild) = asking_run(&sb, &pty, &["--ask-timeout", "1s"]);
    pty.wait_for("Answer within 1s.");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let s = summary(&sb);
    assert_eq!(s["error_type"], "max_steps");
    assert_eq!(s["on_limit_decisions"], serde_json::json!(["stop"]));
    assert!(
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains("no answer at the limit within 1s")),
        "{s}"
    );
    assert!(!alive(read_pid(&grandchild)));
}

#[test]
fn the_run_timeout_fires_while_the_prompt_waits() {
    let sb = Sandbox::new();
    let mut pty = Pty::open();
    let (child, _) = asking_run(&sb, &pty, &["--timeout", "2s"]);
    pty.wait_for("The agent is paused.");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(summary(&sb)["error_type"], "timeout");
}

#[test]
fn the_status_line_is_cleared_before_the_agents_stderr() {
    // The agent writes to stderr while the status line is drawn on the same terminal.
    let sb = Sandbox::new();
    let stream = fixture("real/codex/tools3.jsonl");
    let agent = script(
        &sb,
        "noisy.sh",
        &format!(
            "for i in 1 2 3 4 5 6; do echo \"agent-noise $i\" >&2; sleep 0.3; done\ncat {}",
            stream.display()
        ),
    );
    let mut pty = Pty::open();
    let child = pty.spawn(&mut sb.cmd(&["run", "-p", "codex", "--", &agent]));
    pty.wait_for("agent-noise 6");
    pty.wait_for("Steps: ");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        pty.seen.contains("stepguard: 0/"),
        "no status line: {:?}",
        pty.seen
    );
    for (at, _) in pty.seen.match_indices("agent-noise") {
        let before = &pty.seen[..at];
        assert!(
            before.is_empty() || before.ends_with('\n') || before.ends_with("\x1b[2K"),
            "agent stderr collided with the status line: {:?}",
            &pty.seen[at.saturating_sub(60)..at + 13]
        );
    }
}
