//! `stepguard run --wrap-up`: the real CLIs, offline, through the model gateway. The budget's
//! last model call goes out without tools and with one `system notice:`, the CLI ends by
//! itself, and no model call past the budget reaches the model server.

use serde_json::Value;
use stepguard_modelserver::{ModelServer, RecordedRequest, Reply, Script};

use crate::agents::{Agent, AgentRun, Cli};
use crate::harness::Sandbox;

const FINAL: &str = "Summary: ran 4 of the 12 rounds asked for; 8 are left. Continue from round 5.";

/// Twelve tool rounds on offer, a final answer that reads as a status summary.
fn twelve_rounds() -> Script {
    Script::tool_rounds(12).final_answer(FINAL)
}

/// The main requests (those offering tools) the server saw.
fn main_requests(agent: &Agent) -> Vec<RecordedRequest> {
    agent.server.main_requests()
}

/// `--wrap-up --max-steps 5` with 12 rounds on offer: exactly `calls` main requests reached the
/// server, the last with tools disabled and one notice, the others untouched; the CLI exited by
/// itself; exit 3, `max_steps`, `terminated_by` `wrap_up`, the final text in the record, and
/// the history row agrees.
fn wraps_up(cli: Cli, args: &[&str], calls: usize, steps: u64) -> (Agent, AgentRun, Value) {
    wraps_up_agent(Agent::start(cli, twelve_rounds()), args, calls, steps)
}

/// [`wraps_up`] with an agent set up by the caller.
fn wraps_up_agent(
    agent: Agent,
    args: &[&str],
    calls: usize,
    steps: u64,
) -> (Agent, AgentRun, Value) {
    let mut all = vec!["--wrap-up", "--max-steps", "5"];
    all.extend_from_slice(args);
    let run = agent.run(&all);
    run.assert_exit(3);
    let main = main_requests(&agent);
    assert_eq!(
        main.len(),
        calls,
        "main requests: {:?}",
        main.iter()
            .map(|r| (r.seq, r.tools_disabled, r.notices))
            .collect::<Vec<_>>()
    );
    let (last, before) = main.split_last().unwrap();
    assert!(last.tools_disabled, "the last call had tools disabled");
    assert_eq!(last.notices, 1, "one notice on the last call");
    for r in before {
        // Only a staged budget notice (the default thresholds) may ride on a call before.
        let staged = r.body.to_string().contains(" steps left.");
        assert!(
            !r.tools_disabled && r.notices == usize::from(staged),
            "request {} was rewritten",
            r.seq
        );
    }
    assert!(
        matches!(last.reply, Reply::ToolsDisabled { .. }),
        "the model answered the last call in text: {:?}",
        last.reply
    );
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_steps", "{rec}");
    assert_eq!(rec["terminated_by"], "wrap_up", "{rec}");
    assert_eq!(rec["exit_code"], 3, "{rec}");
    assert_eq!(rec["final_report"], FINAL, "{rec}");
    assert_eq!(rec["model_calls"], calls as u64, "{rec}");
    assert_eq!(rec["num_steps_computed"], steps, "{rec}");
    // The CLI ended by itself: an exit code, no signal, nothing stopped.
    assert!(rec["child_exit_code"].is_i64(), "{rec}");
    assert_eq!(rec["child_signal"], Value::Null, "{rec}");
    assert_eq!(rec["breached_at_step"], Value::Null, "{rec}");
    assert!(
        run.run.stderr.contains("wrapped up"),
        "the summary says so: {}",
        run.run.stderr
    );
    // The history row agrees.
    let history = agent.history_rows();
    let row = history.last().unwrap();
    for key in [
        "error_type",
        "terminated_by",
        "model_calls",
        "num_steps_computed",
    ] {
        assert_eq!(row[key], rec[key], "{key}: {row}");
    }
    (agent, run, rec)
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claude_wraps_up_at_the_budgets_last_message() {
    // Claude's default configuration: ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY only.
    // Unit `message`: one per model call; the native --max-turns 5 stays as a second line.
    wraps_up(Cli::Claude, &[], 5, 5);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_wraps_up_at_the_budgets_last_item() {
    // Unit `item`: one command per round, then the agent message of the last call.
    wraps_up(Cli::Codex, &[], 5, 5);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn gemini_wraps_up_at_the_budgets_last_request() {
    // Gemini's default configuration for an API key: GOOGLE_GEMINI_BASE_URL, GEMINI_API_KEY
    // and the auth type its first start saves (docs/wrap-up.md says why it is needed).
    // Unit `request`: the gateway counts model calls; the router's side call does not count.
    wraps_up(Cli::Gemini, &["--unit", "request"], 5, 5);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn gemini_tool_use_unit_wraps_up_after_the_budgets_last_tool() {
    // Unit `tool_use` costs nothing for a text reply: five tools run, the sixth call is the
    // tool-less last one.
    wraps_up(Cli::Gemini, &[], 6, 5);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn opencode_wraps_up_at_the_budgets_last_step() {
    // Unit `step`: one per model call. OpenCode's tool-less title request does not count.
    let (agent, _, _) = wraps_up(Cli::OpenCode, &[], 5, 5);
    assert!(
        agent.server.model_requests().len() > 5,
        "the title request went through the gateway too"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_default_provider_wraps_up_through_the_gateway() {
    // Codex's built-in OpenAI provider, `-c openai_base_url=…` on the user's command (the
    // record keeps the user's command, its URL hidden; stepguard's override named the gateway), no
    // custom provider: every model call went through the gateway, the last one tool-less.
    let agent = Agent::start_default(Cli::Codex, twelve_rounds());
    let (agent, _, rec) = wraps_up_agent(agent, &[], 5, 5);
    let command: Vec<&str> = rec["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !command.iter().any(|a| a.contains("model_provider")),
        "no custom provider: {command:?}"
    );
    // The user's own base URL, hidden in the record (the agent's user can read the history).
    assert!(command.contains(&"openai_base_url=<hidden>"), "{command:?}");
    let upstream = agent.server.addr().to_string();
    assert!(
        !command.iter().any(|a| a.contains(&upstream)),
        "{command:?}"
    );
    // The gateway answered Codex's WebSocket attempt 426, so it went to HTTP at once: no
    // reconnects, no error item spent as a step.
    let gets = agent.server.count(|r| r.method == "GET");
    assert_eq!(gets, 0, "no WebSocket attempt reached the server");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_default_model_is_counted_and_wrapped_up_by_the_gateway() {
    // Codex's own default model sends its tools as an `additional_tools` input item: the
    // gateway counts its call as a model call and sends the budget's last one tool-less.
    let agent = Agent::start_default(Cli::Codex, twelve_rounds()).own_model();
    let run = agent.run(&["--wrap-up", "--unit", "request", "--max-steps", "1"]);
    run.assert_exit(3);
    let calls: Vec<_> = agent
        .server
        .model_requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].tools_disabled,
        "the budget's last call had tool use off"
    );
    assert_eq!(calls[0].notices, 1, "one notice on the last call");
    let rec = agent.last_record();
    assert_eq!(rec["model_calls"], 1, "{rec}");
    assert_eq!(rec["terminated_by"], "wrap_up", "{rec}");
    assert_eq!(rec["error_type"], "max_steps", "{rec}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_model_that_calls_a_tool_on_the_last_step_is_stopped_by_the_backstop() {
    let agent = Agent::start(Cli::Claude, twelve_rounds().ignore_tool_choice());
    let run = agent.run(&["--wrap-up", "--max-steps", "5", "--no-native-limit"]);
    run.assert_exit(3);
    let main = main_requests(&agent);
    assert!(
        main.len() <= 5,
        "the upstream saw {} main requests",
        main.len()
    );
    assert!(main[4].tools_disabled, "the 5th call was the tool-less one");
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_steps", "{rec}");
    assert_eq!(
        rec["terminated_by"], "budget",
        "the tree was stopped: {rec}"
    );
    assert_eq!(rec["breached_at_step"], 6, "{rec}");
    assert_eq!(rec["model_calls"], 5, "{rec}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn the_gateway_forwards_to_a_tls_upstream_trusted_through_ssl_cert_file() {
    let server = ModelServer::start_tls(twelve_rounds()).expect("a TLS model server");
    let ca = server.ca_pem().expect("its CA");
    let agent = Agent::with_server(Cli::Claude, server);
    let ca_file = agent.work().with_file_name("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let ca_path = ca_file.display().to_string();
    let run = agent.run_env(
        &["--wrap-up", "--max-steps", "3"],
        &[("SSL_CERT_FILE", &ca_path)],
    );
    run.assert_exit(3);
    let main = main_requests(&agent);
    assert_eq!(main.len(), 3);
    assert!(main[2].tools_disabled);
    assert_eq!(agent.last_record()["final_report"], FINAL);
    // Without the CA, the upstream's certificate is not trusted: a prompt provider error.
    let started = std::time::Instant::now();
    let run = agent.run(&["--wrap-up", "--max-steps", "3"]);
    run.assert_exit(1);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "provider_error", "{rec}");
    assert_eq!(rec["terminated_by"], "upstream", "{rec}");
    assert!(
        rec["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot reach the model upstream https://127.0.0.1:"),
        "{rec}"
    );
    assert_eq!(
        main_requests(&agent).len(),
        3,
        "nothing more reached the server"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn an_upstream_that_is_down_is_a_prompt_provider_error() {
    let agent = Agent::start(Cli::Claude, twelve_rounds());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let run = agent.run_env(
        &["--wrap-up", "--max-steps", "5"],
        &[("ANTHROPIC_BASE_URL", &down)],
    );
    run.assert_exit(1);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "provider_error", "{rec}");
    assert_eq!(rec["terminated_by"], "upstream", "{rec}");
    assert!(agent.server.requests().is_empty());
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn step_notices_and_recorded_requests() {
    let agent = Agent::start(Cli::Claude, twelve_rounds());
    let dir = agent.work().with_file_name("requests");
    let dir_arg = dir.display().to_string();
    let run = agent.run(&[
        "--wrap-up",
        "--notices",
        "every",
        "--max-steps",
        "3",
        "--record-requests",
        &dir_arg,
    ]);
    run.assert_exit(3);
    let main = main_requests(&agent);
    assert_eq!(main.len(), 3);
    for (i, r) in main.iter().enumerate() {
        assert_eq!(r.notices, 1, "request {i}");
        let text = r.body.to_string();
        if i < 2 {
            assert!(
                text.contains(&format!("system notice: this is step {} of 3", i + 1)),
                "{text}"
            );
        }
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains("dummy"),
            "credentials were recorded in {}",
            f.display()
        );
    }
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with("-last.json")).count(),
        1,
        "{names:?}"
    );
}

#[test]
fn wrap_up_flags_are_checked_before_anything_starts() {
    let env = Sandbox::new();
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "run",
                "-p",
                "codex",
                "--notices",
                "every",
                "--",
                "codex",
                "exec",
                "--json",
                "x",
            ],
            "need the model gateway: add `--wrap-up`",
        ),
        (
            &[
                "run", "-p", "codex", "--unit", "request", "--", "codex", "exec", "--json", "x",
            ],
            "unit `request` counts model calls at the model gateway",
        ),
        (
            &[
                "run",
                "-p",
                "codex",
                "--wrap-up",
                "--",
                "codex",
                "exec",
                "--json",
                "-c",
                "model_provider=mine",
                "x",
            ],
            "model_providers.mine.base_url",
        ),
        (
            &[
                "run",
                "-p",
                "claude",
                "--wrap-up",
                "--on-limit",
                "ask",
                "--",
                "claude",
                "-p",
                "x",
                "--output-format",
                "stream-json",
                "--verbose",
            ],
            "`--wrap-up` and `--on-limit ask` do not go together",
        ),
    ];
    for (args, needle) in cases {
        let run = env.run(args);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
    let run = env.run(&[
        "count",
        "-p",
        "claude",
        "--unit",
        "request",
        &crate::harness::fixture("streams/claude/error_api_midrun.jsonl"),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("only the model gateway"),
        "{}",
        run.stderr
    );
}

/// The loop ladder with the gateway on (#16): at the first loop the model is told once, on its
/// next call; at the second its next call is its last, without tools; the run ends as a loop.
fn loop_ladder(cli: Cli, tool: &str) {
    // The command takes a moment, so the loop is seen before the next model call goes out.
    let agent = Agent::start(
        cli,
        Script::same_call(30, "sleep 0.3; cat status.txt").final_answer(FINAL),
    );
    std::fs::write(agent.work().join("status.txt"), "still running\n").unwrap();
    let run = agent.run(&["--wrap-up", "--max-steps", "30", "--loop-limit", "3"]);
    run.assert_exit(3);
    let main = main_requests(&agent);
    let told: Vec<&RecordedRequest> = main
        .iter()
        .filter(|r| {
            r.body
                .to_string()
                .contains("system notice: you have called")
        })
        .collect();
    assert_eq!(told.len(), 1, "the loop notice reached the model once");
    assert!(
        told[0]
            .body
            .to_string()
            .contains("with the same arguments 3 times"),
        "{}",
        told[0].body
    );
    let (last, before) = main.split_last().unwrap();
    assert!(
        last.tools_disabled && last.notices == 1,
        "the last call was the wrap-up"
    );
    assert!(before.iter().all(|r| !r.tools_disabled));
    assert!(
        main.len() <= 8,
        "{} model calls for two loops of 3",
        main.len()
    );
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "loop_detected", "{rec}");
    assert_eq!(rec["terminated_by"], "loop", "{rec}");
    assert_eq!(rec["final_report"], FINAL, "{rec}");
    assert_eq!(
        rec["child_signal"],
        Value::Null,
        "the CLI ended by itself: {rec}"
    );
    let loops = rec["loops"].as_array().unwrap();
    assert_eq!(loops.len(), 2, "{rec}");
    assert_eq!(loops[0]["tool"], tool, "{rec}");
    assert!(
        rec["message"]
            .as_str()
            .unwrap()
            .contains("wrapped up as a loop"),
        "{rec}"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claude_loop_is_noticed_once_then_wrapped_up() {
    loop_ladder(Cli::Claude, "Bash");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_loop_is_noticed_once_then_wrapped_up() {
    loop_ladder(Cli::Codex, "shell");
}

#[test]
fn an_agent_whose_model_calls_bypass_the_gateway_is_stopped_as_such() {
    // A stand-in agent that prints a Claude stream without calling any model: its steps come
    // from nowhere the gateway sees (as a CLI reading its URL from a config file would).
    let sb = Sandbox::new();
    let stream = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let script = format!("cat '{stream}'; sleep 30");
    let started = std::time::Instant::now();
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--wrap-up",
        "--max-steps",
        "50",
        "--no-native-limit",
        "--quiet",
        "--no-record",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "not waited out"
    );
    assert!(
        run.stderr
            .contains("no model call through the model gateway")
            && run.stderr.contains("gateway_bypassed"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_short_run_whose_calls_bypass_the_gateway_is_always_judged_so() {
    // The same stand-in, ending at once: the end-of-run judgement decides, not a watchdog
    // racing the end (3 of 4 such runs used to end `success` with `model_calls: 0`).
    let sb = Sandbox::new();
    let stream = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let script = format!("cat '{stream}'");
    let summary = sb.root().join("summary.json");
    for attempt in 0..4 {
        let run = sb.run(&[
            "run",
            "-p",
            "claude",
            "--wrap-up",
            "--max-steps",
            "50",
            "--no-native-limit",
            "--quiet",
            "--no-record",
            "--summary-file",
            summary.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ]);
        assert_eq!(run.code, Some(2), "attempt {attempt}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("no model call through the model gateway"),
            "attempt {attempt}: {}",
            run.stderr
        );
        let rec: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        assert_eq!(rec["error_type"], "gateway_bypassed", "{rec}");
        assert_eq!(rec["terminated_by"], "bypassed", "{rec}");
        assert_eq!(rec["model_calls"], 0, "{rec}");
        assert_eq!(
            rec["child_exit_code"], 0,
            "the agent ended by itself: {rec}"
        );
        assert!(rec["num_steps_computed"].as_u64().unwrap_or(0) > 0, "{rec}");
    }
}

/// A model that calls a tool on its tool-less last call, counted in model calls: the CLI runs
/// the tool and calls again; the gateway answers that call itself with a final text, the CLI
/// ends cleanly on it, and the model never saw more calls than the budget.
fn a_refused_call_ends_the_cli_cleanly(cli: Cli) {
    let agent = Agent::start(cli, twelve_rounds().ignore_tool_choice());
    let run = agent.run(&["--wrap-up", "--unit", "request", "--max-steps", "3"]);
    run.assert_exit(3);
    let main = main_requests(&agent);
    assert_eq!(main.len(), 3, "the model saw the budget's calls only");
    assert!(main[2].tools_disabled);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_steps", "{rec}");
    assert_eq!(rec["terminated_by"], "wrap_up", "ended by itself: {rec}");
    assert_eq!(rec["child_signal"], Value::Null, "{rec}");
    assert_eq!(rec["model_calls"], 3, "{rec}");
    assert_eq!(rec["num_steps_computed"], 3, "{rec}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claude_ends_cleanly_on_a_refused_call() {
    a_refused_call_ends_the_cli_cleanly(Cli::Claude);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_ends_cleanly_on_a_refused_call() {
    a_refused_call_ends_the_cli_cleanly(Cli::Codex);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn gemini_ends_cleanly_on_a_refused_call() {
    a_refused_call_ends_the_cli_cleanly(Cli::Gemini);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn opencode_ends_cleanly_on_a_refused_call() {
    a_refused_call_ends_the_cli_cleanly(Cli::OpenCode);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_proxy_setting_does_not_divert_calls_meant_for_the_gateway() {
    // HTTP(S)_PROXY point at a closed port; NO_PROXY no longer lists loopback: stepguard adds
    // 127.0.0.1 for the agent, so its calls still reach the gateway directly.
    let agent = Agent::start(Cli::Claude, twelve_rounds());
    let run = agent.run_env(
        &["--wrap-up", "--max-steps", "3"],
        &[("NO_PROXY", ""), ("no_proxy", "example.com")],
    );
    run.assert_exit(3);
    assert_eq!(main_requests(&agent).len(), 3);
    assert_eq!(agent.last_record()["terminated_by"], "wrap_up");
}

/// A stand-in agent that calls the model through the gateway every 50 ms without tools (as a
/// CLI's title or token-count side calls do), printing nothing after an optional first line.
const SIDE_CALL_FLOOD: &str = r#"
import json, os, sys, time, urllib.request
if len(sys.argv) > 1:
    with open(sys.argv[1]) as f:
        print(f.readline(), end="", flush=True)
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
body = json.dumps({"model": "claude-haiku-4-5", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "a title for this chat"}]}).encode()
end = time.time() + 12
while time.time() < end:
    req = urllib.request.Request(url, data=body, headers={
        "content-type": "application/json", "x-api-key": "test", "anthropic-version": "2023-06-01"})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except Exception as e:
        print(e, file=sys.stderr)
    time.sleep(0.05)
"#;

/// A stand-in agent: one model call with tools through the gateway, then the stream of the
/// file named by its argument, whose own token counts are not the server's.
const ONE_CALL_THEN_STREAM: &str = r#"
import json, os, sys, urllib.request
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": False,
                   "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                   "messages": [{"role": "user", "content": "run it"}]}).encode()
req = urllib.request.Request(url, data=body, headers={
    "content-type": "application/json", "x-api-key": "test", "anthropic-version": "2023-06-01"})
urllib.request.urlopen(req, timeout=10).read()
with open(sys.argv[1]) as f:
    sys.stdout.write(f.read())
"#;

#[test]
fn the_summary_line_shows_the_tokens_the_record_holds() {
    // The stream says 79243 in / 881 out; the gateway saw the one call the server answered.
    // The summary line and the record give the same figures: the gateway's.
    let server = ModelServer::start(twelve_rounds()).expect("a model server");
    let sb = Sandbox::new();
    let agent = sb
        .write("one_call.py", ONE_CALL_THEN_STREAM)
        .display()
        .to_string();
    let stream = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let summary = sb.root().join("summary.json");
    let run = sb.run_env(
        &[
            "run",
            "-p",
            "claude",
            "--wrap-up",
            "--max-steps",
            "50",
            "--no-native-limit",
            "--no-record",
            "--summary-file",
            summary.to_str().unwrap(),
            "--",
            "python3",
            &agent,
            &stream,
        ],
        &[("ANTHROPIC_BASE_URL", &server.url())],
    );
    let rec: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(rec["model_calls"], 1, "{rec}\n{}", run.stderr);
    let tokens = &rec["tokens"];
    let (input, output) = (
        tokens["input_tokens"].as_u64().unwrap(),
        tokens["output_tokens"].as_u64().unwrap(),
    );
    assert_ne!(input, 79243, "the record holds the gateway's count: {rec}");
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("Steps: "))
        .unwrap_or_else(|| panic!("no summary line: {}", run.stderr));
    assert!(
        line.contains(&format!("tokens: {input} in / {output} out")),
        "the summary line says what the record holds ({input} in / {output} out): {line}"
    );
    assert!(!line.contains("79243"), "{line}");
}

#[test]
fn side_calls_through_the_gateway_do_not_stop_the_clocks() {
    // Every side call is an event for the engine; its clocks keep time all the same. Nothing
    // recognised within --startup-timeout is a startup hang; silence on stdout past
    // --idle-timeout is a stall, though the model is called twenty times a second.
    let server = ModelServer::start(twelve_rounds()).expect("a model server");
    let sb = Sandbox::new();
    let flood = sb.write("flood.py", SIDE_CALL_FLOOD).display().to_string();
    let first_line = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let cases: [(&str, Vec<&str>, &str); 2] = [
        ("--startup-timeout", vec!["python3", &flood], "startup_hang"),
        (
            "--idle-timeout",
            vec!["python3", &flood, &first_line],
            "stalled",
        ),
    ];
    for (clock, agent, slug) in cases {
        let before = server.requests().len();
        let started = std::time::Instant::now();
        let mut args = vec![
            "run",
            "-p",
            "claude",
            "--wrap-up",
            "--max-steps",
            "50",
            clock,
            "2s",
            "--no-native-limit",
            "--quiet",
            "--no-record",
            "--",
        ];
        args.extend(agent);
        let run = sb.run_env(&args, &[("ANTHROPIC_BASE_URL", &server.url())]);
        let took = started.elapsed();
        assert!(run.stderr.contains(slug), "{clock}: {}", run.stderr);
        assert!(
            took < std::time::Duration::from_secs(11),
            "{clock}: the clock was not kept ({took:?}); {}",
            run.stderr
        );
        let calls = server.requests().len() - before;
        // Twenty a second when the machine is idle; a loaded one still makes a few, which is
        // all this needs: the clock fired while side calls were coming (the flood runs 12 s).
        assert!(calls >= 3, "{clock}: only {calls} side calls went through");
    }
}

#[test]
fn a_gateway_refusal_is_said_once() {
    // A stand-in agent that makes one model call through the gateway with a model that has no
    // price, under a cost budget: the gateway refuses it and stepguard says why, once (it said
    // it twice: logged as an error, then as the run's message).
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: curl is not installed; the stand-in agent needs it");
        return;
    }
    let sb = Sandbox::new();
    let agent = sb.write(
        "agent.sh",
        "#!/bin/sh\ncurl -s -m 5 -X POST \"$ANTHROPIC_BASE_URL/v1/messages\" \
         -H 'content-type: application/json' -H \"x-api-key: $ANTHROPIC_API_KEY\" \
         -d '{\"model\":\"no-such-model-9\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}' \
         >/dev/null\nsleep 20\n",
    );
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = sb.run_env(
        &[
            "run",
            "--no-record",
            "--no-preflight",
            "--no-native-limit",
            "--wrap-up",
            "--max-cost-usd",
            "1",
            "-p",
            "claude",
            "--",
            agent.to_str().unwrap(),
        ],
        &[
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
            ("ANTHROPIC_API_KEY", "sk-test"),
        ],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(
        run.stderr
            .matches("the model `no-such-model-9` has no price")
            .count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("failed: unpriced_model"),
        "{}",
        run.stderr
    );
}

/// `--wrap-up --unit request --max-steps 10` with the default notices: the real CLI's 6th and
/// 9th model calls (after 50% and 80% of the budget) carry the staged notice, in the CLI's own
/// dialect, and no other call does; the 10th is the tool-less last; the record lists the two.
fn notices_at_the_thresholds(cli: Cli) {
    let agent = Agent::start(cli, twelve_rounds());
    let run = agent.run(&["--wrap-up", "--unit", "request", "--max-steps", "10"]);
    run.assert_exit(3);
    let main = main_requests(&agent);
    assert_eq!(main.len(), 10, "{}", run.run.stderr);
    let told: Vec<(usize, bool, bool)> = main
        .iter()
        .enumerate()
        .filter(|(_, r)| r.body.to_string().contains(" steps left."))
        .map(|(i, r)| {
            let text = r.body.to_string();
            (
                i,
                text.contains("system notice: 5 of 10 steps left."),
                text.contains("system notice: 2 of 10 steps left."),
            )
        })
        .collect();
    assert_eq!(told, [(5, true, false), (8, false, true)], "{}", cli.name());
    for (i, r) in main.iter().enumerate() {
        let want = usize::from(matches!(i, 5 | 8 | 9));
        assert_eq!(r.notices, want, "{} call {}", cli.name(), i + 1);
    }
    assert!(main[9].tools_disabled);
    let rec = agent.last_record();
    let listed: Vec<(Value, Value)> = rec["notices"]
        .as_array()
        .unwrap_or_else(|| panic!("{rec}"))
        .iter()
        .map(|n| (n["threshold"].clone(), n["model_call"].clone()))
        .collect();
    assert_eq!(
        listed,
        [
            (serde_json::json!(0.5), serde_json::json!(6)),
            (serde_json::json!(0.8), serde_json::json!(9))
        ],
        "{rec}"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claude_sees_its_budget_coming_at_the_thresholds_only() {
    notices_at_the_thresholds(Cli::Claude);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_sees_its_budget_coming_at_the_thresholds_only() {
    notices_at_the_thresholds(Cli::Codex);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn gemini_sees_its_budget_coming_at_the_thresholds_only() {
    notices_at_the_thresholds(Cli::Gemini);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn opencode_sees_its_budget_coming_at_the_thresholds_only() {
    notices_at_the_thresholds(Cli::OpenCode);
}
