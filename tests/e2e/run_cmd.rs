//! `stepguard run` end to end, with scripted child processes standing in for agent CLIs.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Pty, Run, Sandbox, plugin_dirs, workspace};

pub(crate) fn fixture(rel: &str) -> PathBuf {
    workspace().join("tests/fixtures").join(rel)
}

/// Writes an executable script into the sandbox.
pub(crate) fn script(sb: &Sandbox, name: &str, body: &str) -> String {
    let path = sb.write(name, format!("#!/usr/bin/env bash\nset -u\n{body}\n"));
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path.display().to_string()
}

pub(crate) fn summary(sb: &Sandbox) -> Value {
    serde_json::from_slice(&std::fs::read(sb.root().join("summary.json")).expect("summary file"))
        .unwrap()
}

pub(crate) fn run_with_summary(sb: &Sandbox, args: &[&str]) -> Run {
    let file = sb.root().join("summary.json").display().to_string();
    let mut full = vec!["run", "--summary-file", &file];
    full.extend_from_slice(args);
    sb.run(&full)
}

pub(crate) fn alive(pid: i32) -> bool {
    // A zombie is dead for our purposes; /proc/PID/stat says Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        state != Some("Z")
    })
}

pub(crate) fn read_pid(path: &Path) -> i32 {
    for _ in 0..100 {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(p) = s.trim().parse()
        {
            return p;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no pid in {}", path.display());
}

/// An agent that replays a stream, with a grandchild (`sleep 300`) whose pid it records.
pub(crate) fn replaying_agent(sb: &Sandbox, stream: &Path) -> String {
    let pid_file = sb.root().join("grandchild.pid");
    script(
        sb,
        "agent.sh",
        &format!(
            "sleep 300 &\necho $! > {}\nwhile IFS= read -r line || [ -n \"$line\" ]; do printf '%s\\n' \"$line\"; sleep 0.005; done < {}\nwait",
            pid_file.display(),
            stream.display()
        ),
    )
}

#[test]
fn success_under_budget_passes_output_through_byte_for_byte() {
    let sb = Sandbox::new();
    let stream = fixture("real/codex/tools3.jsonl");
    let agent = script(&sb, "agent.sh", &format!("cat {}", stream.display()));
    let run = run_with_summary(&sb, &["-p", "codex", "--max-steps", "10", "--", &agent]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout.as_bytes(),
        std::fs::read(&stream).unwrap().as_slice()
    );
    let s = summary(&sb);
    assert_eq!(
        (
            s["outcome"].as_str(),
            s["num_steps_computed"].as_u64(),
            s["exit_code"].as_u64()
        ),
        (Some("success"), Some(4), Some(0))
    );
    assert_eq!(
        (
            s["terminated_by"].clone(),
            s["child_exit_code"].as_i64(),
            s["max_steps"].as_u64()
        ),
        (Value::Null, Some(0), Some(10))
    );
    assert_eq!(s["command"][0], agent.as_str());
    assert!(
        run.stderr
            .contains("stepguard: Steps: 4 (legacy turns: 1) | success"),
        "{}",
        run.stderr
    );
}

#[test]
fn budget_exceeded_stops_the_tree_at_the_breaching_line() {
    let sb = Sandbox::new();
    let stream = fixture("streams/codex/long_run.jsonl");
    let agent = replaying_agent(&sb, &stream);
    let started = Instant::now();
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--max-steps",
            "5",
            "--grace",
            "30s",
            "--",
            &agent,
        ],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    // Well under the grace, however loaded the machine.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the group honoured SIGTERM: no need to wait for the grace"
    );
    let s = summary(&sb);
    assert_eq!(
        (
            s["error_type"].as_str(),
            s["terminated_by"].as_str(),
            s["breached_at_step"].as_u64()
        ),
        (Some("max_steps"), Some("budget"), Some(6))
    );
    assert_eq!(s["num_steps_computed"], 6);
    // Passthrough ends with the line on which step 6 began.
    let original = std::fs::read_to_string(&stream).unwrap();
    assert!(original.starts_with(&run.stdout));
    let last = run.stdout.lines().last().unwrap();
    let event: Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        (event["type"].as_str(), event["item"]["id"].as_str()),
        (Some("item.started"), Some("item_5"))
    );
    assert!(
        !alive(read_pid(&sb.root().join("grandchild.pid"))),
        "the grandchild must be dead"
    );
    assert!(
        run.stderr.contains("failed: max_steps") && run.stderr.contains("stopped at step 6 of 5"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
    let sb = Sandbox::new();
    let line = r#"{"type":"item.started","item":{"id":"item_N","type":"command_execution"}}"#;
    let agent = script(
        &sb,
        "agent.sh",
        &format!(
            "trap '' TERM\nfor i in 1 2 3 4; do echo '{}' | sed \"s/N/$i/\"; done\nwhile true; do sleep 0.05; done",
            line
        ),
    );
    let started = Instant::now();
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--max-steps",
            "2",
            "--grace",
            "400ms",
            "--",
            &agent,
        ],
    );
    let elapsed = started.elapsed();
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(
        elapsed >= Duration::from_millis(400),
        "SIGKILL only after the grace: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(summary(&sb)["child_signal"], 9);
    assert_eq!(run.stdout.lines().count(), 3);
}

#[test]
fn an_agent_that_ended_is_not_judged_stalled_while_its_leftovers_are_stopped() {
    // The agent prints its stream, goes quiet, and exits leaving a process that ignores
    // SIGTERM: stopping it takes the grace, and by then the idle timeout has passed. The run
    // ended by itself; the clocks of a run whose agent is gone say nothing.
    let sb = Sandbox::new();
    let stream = fixture("streams/codex/success_multi_tool.jsonl");
    let agent = script(
        &sb,
        "agent.sh",
        &format!(
            "cat {}\nsleep 1.2\n(trap '' TERM; sleep 30) &\nexit 0",
            stream.display()
        ),
    );
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--idle-timeout",
            "1500ms",
            "--grace",
            "1s",
            "--no-record",
            "--",
            &agent,
        ],
    );
    let rec = summary(&sb);
    assert_eq!(run.code, Some(0), "{}\n{rec}", run.stderr);
    assert_eq!(rec["outcome"], "success", "{rec}");
    assert_eq!(rec["terminated_by"], Value::Null, "{rec}");
}

#[test]
fn timeout_stops_the_agent_with_exit_124() {
    let sb = Sandbox::new();
    let agent = script(
        &sb,
        "agent.sh",
        "echo '{\"type\":\"turn.started\"}'\nsleep 30",
    );
    let started = Instant::now();
    let run = run_with_summary(&sb, &["-p", "codex", "--timeout", "300ms", "--", &agent]);
    assert_eq!(run.code, Some(124), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(5));
    let s = summary(&sb);
    assert_eq!(
        (s["error_type"].as_str(), s["terminated_by"].as_str()),
        (Some("timeout"), Some("timeout"))
    );
}

#[test]
fn signals_to_stepguard_are_forwarded_and_exit_130() {
    let sb = Sandbox::new();
    let marker = sb.root().join("got-term");
    let agent = script(
        &sb,
        "agent.sh",
        &format!(
            "trap 'echo term > {}; exit 143' TERM\necho '{{\"type\":\"turn.started\"}}'\nwhile true; do sleep 0.05; done",
            marker.display()
        ),
    );
    let file = sb.root().join("summary.json").display().to_string();
    let mut child = sb
        .cmd(&["run", "--summary-file", &file, "-p", "codex", "--", &agent])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "term");
    let s = summary(&sb);
    assert_eq!(
        (s["error_type"].as_str(), s["terminated_by"].as_str()),
        (Some("interrupted"), Some("signal"))
    );
}

#[test]
fn missing_executable_is_spawn_failed_exit_2_naming_it() {
    let sb = Sandbox::new();
    let run = run_with_summary(&sb, &["-p", "codex", "--", "no-such-agent-cli", "exec"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("stepguard: error: cannot run `no-such-agent-cli`: command not found"),
        "{}",
        run.stderr
    );
    assert_eq!(summary(&sb)["error_type"], "spawn_failed");
}

#[test]
fn garbage_output_is_passed_through_and_counted_as_noise() {
    let sb = Sandbox::new();
    let garbage = sb.write("garbage.bin", b"plain text\n\xff\xfe\x00binary\n{\"type\":\"item.completed\",\"item\":{\"id\":\"item_0\",\"type\":\"agent_message\",\"text\":\"hi\"}}\n{broken json\nno newline at the end");
    let agent = script(&sb, "agent.sh", &format!("cat {}", garbage.display()));
    let run = sb
        .cmd(&["run", "-p", "codex", "--", &agent])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0));
    assert_eq!(run.stdout, std::fs::read(&garbage).unwrap());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("stepguard: Steps: 1 (legacy turns: 0) | success"),
        "{stderr}"
    );
}

#[test]
fn a_child_that_closes_stdout_early_but_keeps_running_is_waited_for() {
    let sb = Sandbox::new();
    let agent = script(
        &sb,
        "agent.sh",
        "echo '{\"type\":\"turn.started\"}'\nexec 1>&-\nsleep 0.4\nexit 0",
    );
    let started = Instant::now();
    let run = sb.run(&["run", "-p", "codex", "--", &agent]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[test]
fn agent_failure_without_terminal_event_is_exit_1() {
    let sb = Sandbox::new();
    let agent = script(
        &sb,
        "agent.sh",
        "echo '{\"type\":\"turn.started\"}'\nexit 7",
    );
    let run = run_with_summary(&sb, &["-p", "codex", "--", &agent]);
    assert_eq!(run.code, Some(1));
    let s = summary(&sb);
    assert_eq!(
        (s["error_type"].as_str(), s["child_exit_code"].as_i64()),
        (Some("provider_error"), Some(7))
    );
}

#[test]
fn provider_terminal_event_decides_when_the_agent_exits_by_itself() {
    let sb = Sandbox::new();
    for (file, rc, code, slug) in [
        ("real/claude/maxturns2.jsonl", 1, 3, "max_steps"),
        ("real/claude/error429.jsonl", 1, 1, "rate_limited"),
        ("real/gemini/maxturns2.jsonl", 53, 3, "max_steps"),
    ] {
        let provider = file.split('/').nth(1).unwrap();
        let agent = script(
            &sb,
            "agent.sh",
            &format!("cat {}\nexit {rc}", fixture(file).display()),
        );
        let run = run_with_summary(&sb, &["-p", provider, "--no-native-limit", "--", &agent]);
        assert_eq!(run.code, Some(code), "{file}: {}", run.stderr);
        assert_eq!(summary(&sb)["error_type"], slug, "{file}");
        assert_eq!(summary(&sb)["terminated_by"], Value::Null, "{file}");
    }
}

#[test]
fn native_limit_is_added_unless_present_or_opted_out() {
    let sb = Sandbox::new();
    let args_file = sb.root().join("args.txt");
    let fake_claude = script(
        &sb,
        "claude",
        &format!(
            "for a in \"$@\"; do echo \"$a\"; done > {}\ncat {}",
            args_file.display(),
            fixture("real/claude/tools3.jsonl").display()
        ),
    );
    let args = || std::fs::read_to_string(&args_file).unwrap();
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--no-preflight",
        "--max-steps",
        "7",
        "--",
        &fake_claude,
        "-p",
        "do it",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(args(), "-p\ndo it\n--max-turns\n7\n");
    sb.run(&[
        "run",
        "-p",
        "claude",
        "--no-preflight",
        "--max-steps",
        "7",
        "--no-native-limit",
        "--",
        &fake_claude,
        "-p",
        "do it",
    ]);
    assert_eq!(args(), "-p\ndo it\n");
    sb.run(&[
        "run",
        "-p",
        "claude",
        "--no-preflight",
        "--max-steps",
        "7",
        "--",
        &fake_claude,
        "--max-turns=3",
    ]);
    assert_eq!(args(), "--max-turns=3\n");
    sb.run(&[
        "run",
        "-p",
        "claude",
        "--no-preflight",
        "--max-steps",
        "unlimited",
        "--",
        &fake_claude,
    ]);
    assert_eq!(args(), "");
}

#[test]
fn plugin_error_mid_run_stops_the_agent_with_exit_4() {
    let dirs = plugin_dirs();
    let sb = Sandbox::new();
    let agent = replaying_agent(&sb, &fixture("real/codex/tools12.jsonl"));
    let dir = dirs.good.display().to_string();
    let run = run_with_summary(
        &sb,
        &["--plugin-dir", &dir, "-p", "fixture-panic", "--", &agent],
    );
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("plugin panicked: fixture panics on purpose"),
        "{}",
        run.stderr
    );
    let s = summary(&sb);
    assert_eq!(
        (s["error_type"].as_str(), s["terminated_by"].as_str()),
        (Some("plugin_error"), Some("plugin"))
    );
    assert!(!alive(read_pid(&sb.root().join("grandchild.pid"))));
    assert!(run.stdout.is_empty(), "nothing uncounted is passed through");
    // The plugin's own words are kept with the run, and `show` says them.
    assert!(
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains("plugin panicked: fixture panics on purpose")),
        "{s}"
    );
    let id = sb.recorded_id(&s, &run.stderr);
    let show = sb.run(&["show", &id]);
    assert!(
        show.stdout
            .contains("plugin panicked: fixture panics on purpose"),
        "{}",
        show.stdout
    );
    let json = sb.run(&["show", &id, "--json"]).json();
    assert_eq!(json["message"], s["message"]);
}

#[test]
fn usage_and_config_errors_are_exit_2_before_anything_runs() {
    let sb = Sandbox::new();
    let marker = sb.root().join("ran");
    let agent = script(&sb, "agent.sh", &format!("touch {}", marker.display()));
    for args in [
        vec!["run", "-p", "codex", "--max-steps", "0", "--", &agent],
        vec!["run", "-p", "nope", "--", &agent],
        vec!["run", "-p", "codex", "--unit", "bogus", "--", &agent],
        vec!["run", "-p", "codex", "--timeout", "soon", "--", &agent],
        vec!["run", "-p", "codex"],
    ] {
        assert_eq!(sb.run(&args).code, Some(2), "{args:?}");
    }
    assert!(!marker.exists());
}

#[test]
fn on_limit_ask_through_a_pseudo_terminal() {
    let sb = Sandbox::new();
    let stream = fixture("real/codex/tools12.jsonl");
    let agent = replaying_agent(&sb, &stream);
    let mut pty = Pty::open();
    let file = sb.root().join("summary.json").display().to_string();
    let child = pty.spawn(&mut sb.cmd(&[
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
        "--",
        &agent,
    ]));
    pty.wait_for("step 3 began, the budget is 2");
    pty.wait_for("[c]ontinue without a limit? ");
    pty.type_text("a 2\n");
    pty.wait_for("step 5 began, the budget is 4");
    pty.wait_for("[c]ontinue without a limit? ");
    pty.type_text("s\n");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let s = summary(&sb);
    assert_eq!(
        s["on_limit_decisions"],
        serde_json::json!(["allow:2", "stop"])
    );
    assert_eq!(
        (
            s["num_steps_computed"].as_u64(),
            s["breached_at_step"].as_u64()
        ),
        (Some(5), Some(3))
    );
    let passed: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    let last: Value = serde_json::from_str(passed.last().unwrap()).unwrap();
    assert_eq!(last["item"]["id"], "item_4");
}

#[test]
fn three_invalid_answers_at_the_prompt_stop_the_run_saying_why() {
    let sb = Sandbox::new();
    let agent = replaying_agent(&sb, &fixture("real/codex/tools12.jsonl"));
    let mut pty = Pty::open();
    let file = sb.root().join("summary.json").display().to_string();
    let child = pty.spawn(&mut sb.cmd(&[
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
        "--",
        &agent,
    ]));
    for answer in ["maybe\n", "a lot\n", "x\n"] {
        pty.wait_for("[c]ontinue without a limit? ");
        pty.type_text(answer);
    }
    pty.wait_for("stepguard: no valid answer in 3 tries; stopping the agent (as [s]top would)");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        summary(&sb)["on_limit_decisions"],
        serde_json::json!(["stop"])
    );
}

#[test]
fn on_limit_ask_without_a_terminal_behaves_like_stop() {
    let sb = Sandbox::new();
    let agent = replaying_agent(&sb, &fixture("real/codex/tools12.jsonl"));
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--max-steps",
            "2",
            "--on-limit",
            "ask",
            "--",
            &agent,
        ],
    );
    assert_eq!(run.code, Some(3));
    assert_eq!(summary(&sb)["on_limit_decisions"], serde_json::json!([]));
}

#[test]
fn budget_and_unit_come_from_config_like_everywhere_else() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[task_types.review]\nmax_steps = 3\n[codex]\nmax_steps_unit = \"tool\"\n",
    );
    let agent = replaying_agent(&sb, &fixture("real/codex/tools12.jsonl"));
    let run = run_with_summary(&sb, &["-p", "codex", "--task-type", "review", "--", &agent]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let s = summary(&sb);
    assert_eq!(
        (
            s["unit"].as_str(),
            s["max_steps"].as_u64(),
            s["max_steps_source"].as_str()
        ),
        (Some("tool"), Some(3), Some("task_types.review.max_steps"))
    );
}
