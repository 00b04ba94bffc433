//! `stepguard resume`: a stopped run resumed with the CLI's own resume, the chain it makes, and
//! what is refused before anything starts. Stand-in agents here; the real CLIs at the end
//! (`#[ignore]`d like every real-CLI test).

use serde_json::Value;
use stepguard_modelserver::Script;

use crate::agents::{Agent, Cli};
use crate::harness::{Run, Sandbox, fixture};

/// The session id of `real/claude/tools12.jsonl`'s init line.
const SESSION_12: &str = "18ad81ef-1169-49d2-ad1f-e9d09c7e69c0";
/// The session id of `real/claude/tools3.jsonl`'s init line.
const SESSION_3: &str = "8c23ee89-d9d5-41e5-8483-52efeb6b6d2a";

/// A stand-in `claude` (its file name is what the resume template checks): it logs its
/// arguments one invocation a line (`|`-separated), then prints the long recorded stream and
/// waits, or with `--resume` the short one, which succeeds.
fn stand_in(sb: &Sandbox, first_stream: &str) -> (String, std::path::PathBuf) {
    let log = sb.root().join("argv.log");
    let path = sb.write(
        "bin/claude",
        format!(
            "#!/usr/bin/env bash\n\
             for a in \"$@\"; do printf '%s|' \"$a\"; done >> {log}; echo >> {log}\n\
             if printf '%s\\n' \"$@\" | grep -qx -- --resume; then cat {short}; exit 0; fi\n\
             cat {first_stream}\nsleep 30\n",
            log = log.display(),
            short = fixture("real/claude/tools3.jsonl"),
        ),
    );
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    (path.display().to_string(), log)
}

fn claude_run(sb: &Sandbox, claude: &str, max_steps: &str) -> Run {
    sb.run(&[
        "run",
        "-p",
        "claude",
        "--quiet",
        "--max-steps",
        max_steps,
        "--",
        claude,
        "-p",
        "fix the bug",
        "--output-format",
        "stream-json",
        "--verbose",
    ])
}

fn newest(sb: &Sandbox) -> Value {
    sb.run(&["history", "--json", "--last", "1"]).json()[0].clone()
}

#[test]
fn a_run_stopped_at_its_limit_is_resumed_with_the_clis_resume_and_the_chain_is_recorded() {
    let sb = Sandbox::new();
    let (claude, log) = stand_in(&sb, &fixture("real/claude/tools12.jsonl"));
    let first = claude_run(&sb, &claude, "3");
    assert_eq!(first.code, Some(3), "{}", first.stderr);
    let stopped = newest(&sb);
    assert_eq!(stopped["error_type"], "max_steps");
    assert_eq!(stopped["session_id"], SESSION_12);
    assert!(stopped["resumed_from"].is_null());
    let id = stopped["id"].as_i64().unwrap().to_string();

    let resumed = sb.run(&["resume", &id, "--more-steps", "50", "--quiet"]);
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    assert!(
        resumed
            .stderr
            .contains(&format!("resuming run {id} (session {SESSION_12})"))
    );

    // The CLI's own resume: the session, the default prompt, the kept flags, the new native
    // limit; the old prompt and limit left behind.
    let calls = std::fs::read_to_string(&log).unwrap();
    let second: Vec<&str> = calls
        .lines()
        .nth(1)
        .unwrap()
        .trim_end_matches('|')
        .split('|')
        .collect();
    assert_eq!(second[0], "-p");
    assert!(second[1].starts_with("You were stopped before the task was finished (`max_steps`)"));
    assert_eq!(
        second[2..],
        [
            "--resume",
            SESSION_12,
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            "50"
        ]
    );

    let run = newest(&sb);
    assert_eq!(run["outcome"], "success");
    assert_eq!(run["resumed_from"].as_i64().unwrap().to_string(), id);
    assert_eq!(run["session_id"], SESSION_3);
    assert_eq!(run["max_steps"], 50);
    assert_eq!(run["cwd"], stopped["cwd"]);
    let id2 = run["id"].as_i64().unwrap().to_string();

    let history = sb.run(&["history"]);
    assert!(
        history.stdout.contains(&format!("#{id2} ")),
        "{}",
        history.stdout
    );
    assert!(
        history.stdout.contains(&format!("(resumes #{id})")),
        "{}",
        history.stdout
    );
    let show = sb.run(&["show", &id2]);
    let steps = stopped["num_steps_computed"].as_u64().unwrap()
        + run["num_steps_computed"].as_u64().unwrap();
    assert!(
        show.stdout
            .contains(&format!("Chain: #{id} → #{id2} (2 runs)")),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains(&format!("Chain totals: {steps} steps")),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(&format!("Session: {SESSION_3}")),
        "{}",
        show.stdout
    );
}

#[test]
fn the_chains_step_budget_and_the_resumed_command_are_shown_by_a_dry_run() {
    let sb = Sandbox::new();
    let (claude, log) = stand_in(&sb, &fixture("real/claude/tools12.jsonl"));
    assert_eq!(claude_run(&sb, &claude, "3").code, Some(3));
    let stopped = newest(&sb);
    let id = stopped["id"].as_i64().unwrap().to_string();
    let used = stopped["num_steps_computed"].as_u64().unwrap();
    let dry = sb.run(&[
        "resume",
        &id,
        "--max-steps",
        "20",
        "--prompt",
        "go on",
        "--dry-run",
    ]);
    assert_eq!(dry.code, Some(0), "{}", dry.stderr);
    let lines: Vec<&str> = dry.stdout.lines().collect();
    assert_eq!(lines[0], format!("cd {}", sb.project().display()));
    let left = (20 - used).to_string();
    assert_eq!(
        lines[1..],
        [
            "stepguard",
            "run",
            "--provider",
            "claude",
            "--max-steps",
            &left,
            "--unit",
            "message",
            "--",
            &claude,
            "-p",
            "go on",
            "--resume",
            SESSION_12,
            "--output-format",
            "stream-json",
            "--verbose"
        ]
    );
    // Nothing ran: the stand-in was called once, by the first run.
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
    // The chain has used its steps.
    let spent = sb.run(&["resume", &id, "--max-steps", &used.to_string()]);
    assert_eq!(spent.code, Some(2));
    assert!(
        spent
            .stderr
            .contains("raise --max-steps, or give --more-steps N"),
        "{}",
        spent.stderr
    );
}

#[test]
fn what_cannot_be_resumed_is_refused_before_anything_starts() {
    let sb = Sandbox::new();
    let unknown = sb.run(&["resume", "99"]);
    assert_eq!(unknown.code, Some(2));
    assert!(
        unknown.stderr.contains("no run with id 99"),
        "{}",
        unknown.stderr
    );

    // A stream without its init line names no session.
    let no_init = sb.write(
        "no-init.jsonl",
        std::fs::read_to_string(fixture("real/claude/tools12.jsonl"))
            .unwrap()
            .split_once('\n')
            .unwrap()
            .1,
    );
    let (claude, log) = stand_in(&sb, &no_init.display().to_string());
    assert_eq!(claude_run(&sb, &claude, "3").code, Some(3));
    let id = newest(&sb)["id"].as_i64().unwrap().to_string();
    let refused = sb.run(&["resume", &id]);
    assert_eq!(refused.code, Some(2));
    assert!(
        refused
            .stderr
            .contains(&format!("run {id} has no session id to resume")),
        "{}",
        refused.stderr
    );

    // A run that succeeded needs a prompt.
    let short = fixture("real/claude/tools3.jsonl");
    let ok = sb.run(&["run", "-p", "claude", "--quiet", "--", "cat", &short]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    let id = newest(&sb)["id"].as_i64().unwrap().to_string();
    let refused = sb.run(&["resume", &id]);
    assert_eq!(refused.code, Some(2));
    assert!(
        refused.stderr.contains("succeeded: give `--prompt TEXT`"),
        "{}",
        refused.stderr
    );
    // With one, it is the command (`cat`) that is not the CLI's.
    let wrapped = sb.run(&["resume", &id, "--prompt", "more"]);
    assert_eq!(wrapped.code, Some(2));
    assert!(
        wrapped
            .stderr
            .contains("runs `cat`, not `claude`: only the provider's own CLI can be resumed"),
        "{}",
        wrapped.stderr
    );
    // Nothing was started by any refusal: only the first run called the stand-in.
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
}

/// A real CLI stopped at its limit, then resumed with `stepguard resume` and the CLI's real
/// resume: it finishes the script's rounds in the same session, and the chain is recorded.
fn real_resume(cli: Cli, first_budget: &str) {
    let agent = Agent::start(cli, Script::tool_rounds(5));
    let first = agent.run(&["--max-steps", first_budget]);
    first.assert_exit(3);
    let stopped = agent.last_record();
    assert_eq!(stopped["error_type"], "max_steps", "{stopped}");
    let session = stopped["session_id"]
        .as_str()
        .expect("the stream named its session")
        .to_owned();
    let id = stopped["id"].as_i64().unwrap();
    let before = agent.server.main_requests().len();

    let resumed = agent.resume(&[&id.to_string(), "--more-steps", "30"]);
    resumed.assert_exit(0);
    let run = agent.last_record();
    assert_eq!(run["outcome"], "success", "{run}");
    assert_eq!(run["resumed_from"], id);
    assert!(run["session_id"].is_string(), "{run}");
    // The resumed conversation went on where it stopped: the first request after the resume
    // carried the earlier tool results and the default prompt.
    let requests = agent.server.main_requests();
    let next = &requests[before];
    assert!(
        next.tool_results >= 1,
        "the resumed session lost its history: {:?}",
        next.body
    );
    assert!(
        next.body
            .to_string()
            .contains("You were stopped before the task was finished"),
        "the prompt did not reach the model"
    );
    assert_eq!(agent.server.finals_served(), 1);
    let steps = stopped["num_steps_computed"].as_u64().unwrap()
        + run["num_steps_computed"].as_u64().unwrap();
    let show = agent.show_text(&run["id"].as_i64().unwrap().to_string());
    assert!(show.contains(&format!("Chain: #{id} → #")), "{show}");
    assert!(
        show.contains(&format!("Chain totals: {steps} steps")),
        "{show}"
    );
    // The resumed command named the session the first run's stream gave.
    let command: Vec<&str> = run["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(command.contains(&session.as_str()), "{cli:?}: {command:?}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claude_stopped_at_its_limit_is_resumed_and_finishes() {
    real_resume(Cli::Claude, "3");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_stopped_at_its_limit_is_resumed_and_finishes() {
    real_resume(Cli::Codex, "4");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn gemini_stopped_at_its_limit_is_resumed_and_finishes() {
    real_resume(Cli::Gemini, "2");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn opencode_stopped_at_its_limit_is_resumed_and_finishes() {
    real_resume(Cli::OpenCode, "3");
}
