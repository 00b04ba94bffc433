//! Pools kept per model call (#28): with `--wrap-up`, every main model call of a run reserves
//! its estimate in the run's pools before it is forwarded and settles to its real usage after,
//! so concurrent runs cannot each spend the share they started with.

use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;
use stepguard_modelserver::{INPUT_TOKENS, ModelServer, OUTPUT_TOKENS, Script};

use crate::harness::{Sandbox, fixture};

/// Tokens of one model call as the server reports them.
const PER_CALL: u64 = INPUT_TOKENS + OUTPUT_TOKENS;

/// A stand-in agent that calls the model through the gateway with tools, one call after the
/// other, until a reply has no tool call (the last, tool-less call, or the gateway's own
/// answer) or 40 calls are made, then prints a Claude stream as a finished run would.
const CALL_LOOP: &str = r#"
import json, os, sys, urllib.request
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 8,
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}).encode()
for _ in range(40):
    req = urllib.request.Request(url, data=body, headers={
        "content-type": "application/json", "x-api-key": "test", "anthropic-version": "2023-06-01"})
    try:
        reply = json.loads(urllib.request.urlopen(req, timeout=30).read())
    except Exception as e:
        print(e, file=sys.stderr)
        break
    if not any(b.get("type") == "tool_use" for b in reply.get("content", [])):
        break
with open(sys.argv[1]) as f:
    sys.stdout.write(f.read())
"#;

/// A real Claude stream with its usage and cost taken out: the run's spend is what went
/// through the gateway.
fn stream_without_usage(sb: &Sandbox) -> String {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for key in ["usage", "modelUsage", "total_cost_usd"] {
                    m.remove(key);
                }
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(fixture("streams/claude/success_multi_tool.jsonl")).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            strip(&mut v);
            v.to_string()
        })
        .collect();
    let path = sb.write("stream.jsonl", lines.join("\n") + "\n");
    path.display().to_string()
}

fn spawn(sb: &Sandbox, agent: &str, stream: &str, server: &ModelServer) -> Child {
    sb.cmd(&[
        "run",
        "-q",
        "-p",
        "claude",
        "--wrap-up",
        "--max-steps",
        "100",
        "--no-native-limit",
        "--",
        "python3",
        agent,
        stream,
    ])
    .env("ANTHROPIC_BASE_URL", server.url())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

/// Twelve runs at once in a pool of 20 calls' tokens: each starts with the whole pool as its
/// share, but every call reserves in the pool, so together they spend the cap and at most one
/// first call per run beyond it (a run's first call is reserved at one token: there is no
/// estimate before a call has settled). Every run ends wrapped up or answered by the gateway,
/// as `max_tokens` (the pool's measure), exit 3, with its record. On a stepguard without
/// per-call reservations each run spends its whole starting share: about twelve times the cap.
#[test]
fn concurrent_runs_reserve_each_call_in_a_token_pool() {
    const RUNS: u64 = 12;
    let cap = 20 * PER_CALL;
    let server =
        ModelServer::start(Script::tool_rounds(10_000).reply_delay(Duration::from_millis(20)))
            .expect("a model server");
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        format!(
            "[pools.calls]\nmax_tokens = {cap}\nwindow = \"none\"\nmatch = {{ provider = \"claude\" }}\n"
        ),
    );
    let agent = sb.write("calls.py", CALL_LOOP).display().to_string();
    let stream = stream_without_usage(&sb);
    let children: Vec<Child> = (0..RUNS)
        .map(|_| spawn(&sb, &agent, &stream, &server))
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for out in &outs {
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let reached = server.main_requests().len() as u64;
    let bound = cap + RUNS * (PER_CALL - 1);
    assert!(
        reached * PER_CALL <= bound,
        "{reached} calls of {PER_CALL} tokens reached the model, pool {cap}, bound {bound}"
    );
    let status = sb.run(&["pools", "--json"]);
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    let spent = status.json()[0]["limits"][0]["spent"].as_f64().unwrap() as u64;
    assert!(
        (cap..=bound).contains(&spent),
        "the pool recorded {spent} tokens; cap {cap}, bound {bound}"
    );
    assert_eq!(
        spent,
        reached * PER_CALL,
        "every call charged once, none twice"
    );
    eprintln!("{reached} calls reached the model; the pool recorded {spent} of {cap} tokens");
    let runs = sb.run(&["history", "--json"]).json();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len() as u64, RUNS, "every run has its record");
    for r in runs {
        assert_eq!(r["error_type"], "max_tokens", "{r}");
        assert!(
            r["terminated_by"] == "wrap_up" || r["terminated_by"] == "tokens",
            "{r}"
        );
        assert_eq!(r["pools"], Value::from(vec!["calls"]), "{r}");
    }
}
