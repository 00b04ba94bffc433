//! Agents behind wrappers and the user's own mistakes: a native limit goes only into the
//! provider's CLI (never into `env`, `cat`, a script or another CLI, said once), a command that
//! cannot be counted or started is a usage error naming the fix (exit 2), and silence is no
//! stream (no event in the provider's first-event time, or nothing at all and exit 0).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::Sandbox;
use crate::run_cmd::{fixture, run_with_summary, script, summary};

/// A stand-in CLI called `name` that writes each argument it got on a line of `argv.txt` and
/// prints the recorded stream `stream`.
fn recording_cli(sb: &Sandbox, name: &str, stream: &str) -> (String, PathBuf) {
    let argv = sb.root().join(format!("{name}.argv"));
    let path = script(
        sb,
        name,
        &format!(
            "printf '%s\\n' \"$@\" > {}\ncat {}",
            argv.display(),
            fixture(stream).display()
        ),
    );
    (path, argv)
}

fn read(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of stderr that say a native limit was left out.
fn left_out_lines(stderr: &str) -> usize {
    stderr.lines().filter(|l| l.contains("left out")).count()
}

#[test]
fn a_wrapper_gets_no_native_limit_and_the_run_says_so_once() {
    let sb = Sandbox::new();
    let (codex, argv) = recording_cli(&sb, "codex", "real/codex/tools3.jsonl");
    // `env` before the CLI: the token budget's `-c` lines must not reach env (`invalid option`).
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--max-tokens",
            "10000000",
            "--",
            "env",
            "SG_WRAPPED=1",
            &codex,
            "exec",
            "--json",
            "fix it",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(read(&argv), "exec\n--json\nfix it\n");
    assert_eq!(left_out_lines(&run.stderr), 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("native token budget left out of the agent's command: the command runs `env`, not `codex`"),
        "{}",
        run.stderr
    );
    // The CLI itself still gets it, right after the program.
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--max-tokens",
        "10000000",
        "--",
        &codex,
        "exec",
        "--json",
        "fix it",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let got = read(&argv);
    assert!(
        got.starts_with("-c\nfeatures.rollout_budget.enabled=true\n")
            && got.ends_with("exec\n--json\nfix it\n"),
        "{got}"
    );
    assert_eq!(left_out_lines(&run.stderr), 0, "{}", run.stderr);
}

#[test]
fn cat_and_a_script_get_no_max_turns() {
    let sb = Sandbox::new();
    let stream = fixture("real/claude/tools3.jsonl").display().to_string();
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--max-steps",
        "7",
        "--",
        "cat",
        &stream,
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, std::fs::read_to_string(&stream).unwrap());
    assert_eq!(left_out_lines(&run.stderr), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("native step limit left out") && run.stderr.contains("runs `cat`"),
        "{}",
        run.stderr
    );
    let (wrapper, argv) = recording_cli(&sb, "agent.sh", "real/claude/tools3.jsonl");
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--max-steps",
        "7",
        "--",
        &wrapper,
        "-p",
        "do it",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(read(&argv), "-p\ndo it\n");
    assert_eq!(left_out_lines(&run.stderr), 1, "{}", run.stderr);
    // --no-native-limit: nothing to say.
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--no-native-limit",
        "--",
        "cat",
        &stream,
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(left_out_lines(&run.stderr), 0, "{}", run.stderr);
}

#[test]
fn another_providers_cli_is_a_usage_error_naming_the_provider() {
    let sb = Sandbox::new();
    let (claude, claude_argv) = recording_cli(&sb, "claude", "real/claude/tools3.jsonl");
    let (codex, codex_argv) = recording_cli(&sb, "codex", "real/codex/tools3.jsonl");
    let wrong = [
        (
            "codex",
            vec![
                claude.as_str(),
                "-p",
                "hi",
                "--output-format",
                "stream-json",
                "--verbose",
            ],
            "use `-p claude`",
        ),
        (
            "claude",
            vec![codex.as_str(), "exec", "--json", "hi"],
            "use `-p codex`",
        ),
    ];
    for (provider, command, fix) in wrong {
        let mut args = vec!["-p", provider, "--max-tokens", "1000", "--"];
        args.extend(command);
        let run = run_with_summary(&sb, &args);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(run.stderr.contains(fix), "{}", run.stderr);
        assert!(!sb.root().join("summary.json").exists());
    }
    assert!(!claude_argv.exists() && !codex_argv.exists());
    // Past the check (--no-preflight), codex's `-c` never reaches Claude (its --continue).
    let run = run_with_summary(
        &sb,
        &[
            "-p",
            "codex",
            "--no-preflight",
            "--max-tokens",
            "1000",
            "--",
            &claude,
            "-p",
            "hi",
        ],
    );
    assert_eq!(read(&claude_argv), "-p\nhi\n");
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(summary(&sb)["error_type"], "unrecognized_stream");
}

#[test]
fn claude_without_verbose_is_a_usage_error_naming_the_fix() {
    let sb = Sandbox::new();
    let (claude, argv) = recording_cli(&sb, "claude", "real/claude/tools3.jsonl");
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--",
        &claude,
        "-p",
        "hi",
        "--output-format",
        "stream-json",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("add `--verbose`"), "{}", run.stderr);
    assert!(!argv.exists());
}

#[test]
fn a_script_exec_would_refuse_is_spawn_failed_naming_the_fix() {
    let sb = Sandbox::new();
    let cases = [
        ("bad.sh", "#!/no/such/sh\necho hi\n", "fix the #! line"),
        (
            "env.sh",
            "#!/usr/bin/env sg-no-such-interp\necho hi\n",
            "`sg-no-such-interp` is not a program on PATH",
        ),
        ("crlf.sh", "#!/bin/sh\r\necho hi\r\n", "carriage return"),
    ];
    for (name, body, fix) in cases {
        let path = sb.write(name, body);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let run = run_with_summary(&sb, &["-p", "codex", "--", &path.display().to_string()]);
        assert_eq!(run.code, Some(2), "{name}: {}", run.stderr);
        assert!(run.stderr.contains(fix), "{name}: {}", run.stderr);
        assert_eq!(summary(&sb)["error_type"], "spawn_failed", "{name}");
    }
    let path = sb.write("noexec.sh", "#!/bin/sh\necho hi\n");
    let shown = path.display().to_string();
    let run = run_with_summary(&sb, &["-p", "codex", "--", &shown]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("chmod +x {shown}")),
        "{}",
        run.stderr
    );
}

#[test]
fn an_agent_that_prints_nothing_and_exits_0_is_unrecognized_stream() {
    let sb = Sandbox::new();
    let agent = script(&sb, "quiet.sh", "echo 'working' >&2\nexit 0");
    let run = run_with_summary(&sb, &["-p", "codex", "--", &agent]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let s = summary(&sb);
    assert_eq!(s["error_type"], "unrecognized_stream", "{s}");
    assert_eq!(s["outcome"], "failed", "{s}");
    assert!(
        run.stderr
            .contains("printed nothing on stdout and exited 0"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_codex_that_stays_silent_past_its_first_event_time_is_stopped() {
    // Codex declares its first event within 10 s; a text-mode CLI that prints nothing while it
    // works is stopped then, not when it ends.
    let sb = Sandbox::new();
    let agent = script(&sb, "silent.sh", "sleep 120");
    let started = Instant::now();
    let run = run_with_summary(&sb, &["-p", "codex", "--", &agent]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(60));
    let s = summary(&sb);
    assert_eq!(
        (s["error_type"].as_str(), s["terminated_by"].as_str()),
        (Some("unrecognized_stream"), Some("unrecognized")),
        "{s}"
    );
    assert!(
        run.stderr
            .contains("no codex event within 10s of the start (nothing on stdout)"),
        "{}",
        run.stderr
    );
}

#[test]
fn wrap_up_never_points_a_wrapper_and_reads_the_clis_own_config() {
    let sb = Sandbox::new();
    let (codex, argv) = recording_cli(&sb, "codex", "real/codex/tools3.jsonl");
    // Pointing Codex means adding `-c openai_base_url=…`: behind `env` that would be env's
    // option, so the run is refused before anything starts, naming the fix.
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--wrap-up",
        "--",
        "env",
        "SG_WRAPPED=1",
        &codex,
        "exec",
        "--json",
        "hi",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("runs `env`, not the CLI")
            && run.stderr.contains("-c openai_base_url="),
        "{}",
        run.stderr
    );
    assert!(!argv.exists(), "the agent never started");
    // A Codex config file that is not TOML is named before the agent starts; the gateway
    // would otherwise forward to a place the user never chose.
    let home = sb.root().join("codex-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("config.toml"), "openai_base_url = [").unwrap();
    let run = sb.run_env(
        &[
            "run",
            "-p",
            "codex",
            "--wrap-up",
            "--",
            &codex,
            "exec",
            "--json",
            "hi",
        ],
        &[("CODEX_HOME", home.to_str().unwrap())],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("config.toml"), "{}", run.stderr);
    assert!(!argv.exists(), "the agent never started");
}
