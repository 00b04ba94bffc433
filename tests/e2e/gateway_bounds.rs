//! The gateway's bounds against a hostile agent (#26): concurrent first calls cannot slip past a
//! token budget together, side calls refused for a budget end the run with that budget's slug.

use std::time::Duration;

use stepguard_modelserver::{ModelServer, Script};

use crate::harness::Sandbox;

/// A stand-in agent that makes `calls` model calls through the gateway at once (with tools
/// unless `side` is given), then prints a Claude stream as a finished run would.
const CONCURRENT_CALLS: &str = r#"
import json, os, sys, threading, urllib.request
kind, calls, stream = sys.argv[1], int(sys.argv[2]), sys.argv[3]
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
body = {"model": "claude-sonnet-4-5", "max_tokens": 8,
        "messages": [{"role": "user", "content": "go"}]}
if kind == "main":
    body["tools"] = [{"name": "Bash", "input_schema": {"type": "object"}}]
data = json.dumps(body).encode()
gate = threading.Barrier(calls)
def call():
    gate.wait()
    req = urllib.request.Request(url, data=data, headers={
        "content-type": "application/json", "x-api-key": "test", "anthropic-version": "2023-06-01"})
    try:
        urllib.request.urlopen(req, timeout=30).read()
    except Exception as e:
        print(e, file=sys.stderr)
threads = [threading.Thread(target=call) for _ in range(calls)]
for t in threads: t.start()
for t in threads: t.join()
with open(stream) as f:
    sys.stdout.write(f.read())
"#;

/// 50 calls at once at the start under `--max-tokens 500` (each call is 120 tokens): the first
/// goes alone, the rest are reserved at its size, so at most four reach the model.
fn fifty_at_once(kind: &str) {
    let server =
        ModelServer::start(Script::tool_rounds(12).reply_delay(Duration::from_millis(300)))
            .expect("a model server");
    let sb = Sandbox::new();
    let agent = sb.write("calls.py", CONCURRENT_CALLS).display().to_string();
    let stream = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let run = sb.run_env(
        &[
            "run",
            "-p",
            "claude",
            "--wrap-up",
            "--max-tokens",
            "500",
            "--max-steps",
            "100",
            "--no-native-limit",
            "--no-record",
            "--",
            "python3",
            &agent,
            kind,
            "50",
            &stream,
        ],
        &[("ANTHROPIC_BASE_URL", &server.url())],
    );
    let reached = server.model_requests().len();
    assert!(
        (1..=4).contains(&reached),
        "{kind}: {reached} calls of 120 tokens reached the model under 500; {}",
        run.stderr
    );
    assert_eq!(run.code, Some(3), "{kind}: {}", run.stderr);
    assert!(run.stderr.contains("max_tokens"), "{kind}: {}", run.stderr);
    // The summary counts the calls whose replies ended before the stop: within the budget.
    let spent: u64 = run
        .stderr
        .split("| tokens ")
        .nth(1)
        .and_then(|s| s.split(" of 500").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{kind}: no token count: {}", run.stderr));
    assert!((120..=500).contains(&spent), "{kind}: {}", run.stderr);
}

#[test]
fn fifty_concurrent_first_calls_stay_within_a_token_budget() {
    fifty_at_once("main");
}

#[test]
fn fifty_concurrent_side_calls_stay_within_a_token_budget_and_end_it_as_max_tokens() {
    fifty_at_once("side");
}
