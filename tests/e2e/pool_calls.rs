//! Pools kept per model call (#28): with `--wrap-up`, every main model call of a run reserves
//! its estimate in the run's pools before it is forwarded and settles to its real usage after,
//! so concurrent runs cannot each spend the share they started with: a stand-in agent, and three
//! real CLIs in one pool.

use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;
use stepguard_modelserver::{INPUT_TOKENS, ModelServer, OUTPUT_TOKENS, Reply, Script};

use crate::agents::{Agent, AgentRun, Cli};
use crate::harness::{Sandbox, fixture};

/// Tokens of one model call as the server reports them.
const PER_CALL: u64 = INPUT_TOKENS + OUTPUT_TOKENS;

/// A stand-in agent calling the model through the gateway with tools, one call after the other,
/// until a reply has no tool call (the last, tool-less call, or the gateway's own answer) or 40
/// calls are made, then printing the Claude stream `argv[1]` as a finished run would. Its
/// messages say `argv[2]` (`go` when not given); before each call after the first it waits for
/// the file `argv[3]` when one is named. Shared by the gateway tests (pools, notices).
pub(crate) const CALL_LOOP: &str = r#"
import json, os, sys, time, urllib.request
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
content = sys.argv[2] if len(sys.argv) > 2 else "go"
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 8,
        "messages": [{"role": "user", "content": content}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}).encode()
for i in range(40):
    if i > 0 and len(sys.argv) > 3:
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.05)
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
pub(crate) fn stream_without_usage(sb: &Sandbox) -> String {
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

/// A token pool spent while three real CLIs (Claude Code, Codex, Gemini CLI) run in it at once,
/// each through its own gateway to its own scripted model server, all recording in one history
/// database (the local ledger): every run ends by itself as `max_tokens`, exit 3, with the pool
/// in its record; none is killed mid-call (the CLI exits with a code, no signal, and no request
/// reaches a server after its run ended). A run the pool wrapped up made its last call
/// tool-less, with the notice naming the pool, and the model server answered it; a run whose
/// next call the pool could no longer pay (another run took what was left between its calls)
/// got the gateway's own answer, so every call its server saw was an ordinary one. The pool
/// records at least what its last call left and at most its cap plus, per run, one first call
/// (reserved at one token) and the calls without tools (charged at the end), as
/// docs/pools.md bounds it.
#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn three_real_clis_wrap_up_when_their_shared_pool_is_spent() {
    const RUNS: u64 = 3;
    // Room for about eight calls each; each call takes 1.5 s, so the three CLIs (which start at
    // different speeds: Gemini CLI's start takes seconds) are all calling when the pool runs out.
    let cap = 24 * PER_CALL;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let agents: Vec<Agent> = [Cli::Claude, Cli::Codex, Cli::Gemini]
        .into_iter()
        .map(|cli| {
            let script = Script::tool_rounds(60)
                .final_answer("Summary: stopped by the pool.")
                .reply_delay(Duration::from_millis(1_500));
            let agent = Agent::start(cli, script).share_db(db.clone());
            std::fs::write(
                agent.work().join("stepguard.toml"),
                format!("[pools.shared]\nmax_tokens = {cap}\nwindow = \"none\"\nmatch = \"all\"\n"),
            )
            .unwrap();
            agent
        })
        .collect();
    let runs: Vec<AgentRun> = std::thread::scope(|s| {
        let running: Vec<_> = agents
            .iter()
            .map(|a| s.spawn(move || a.run(&["--wrap-up", "--max-steps", "100"])))
            .collect();
        running.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let rows = agents[0].history_rows();
    assert_eq!(
        rows.len() as u64,
        RUNS,
        "every run has its record: {rows:?}"
    );
    let (mut wrapped, mut side) = (0, 0u64);
    for (agent, run) in agents.iter().zip(&runs) {
        run.assert_exit(3);
        let rec = rows
            .iter()
            .find(|r| r["provider"] == agent.cli.name())
            .unwrap_or_else(|| panic!("no record of {}: {rows:?}", agent.cli.name()));
        assert_eq!(rec["error_type"], "max_tokens", "{rec}");
        assert_eq!(rec["pools"], Value::from(vec!["shared"]), "{rec}");
        assert!(
            rec["child_exit_code"].is_i64(),
            "the CLI exited by itself: {rec}"
        );
        assert_eq!(rec["child_signal"], Value::Null, "killed: {rec}");
        let late: Vec<_> = agent
            .server
            .requests()
            .into_iter()
            .filter(|r| r.received > run.ended)
            .map(|r| (r.seq, r.target))
            .collect();
        assert!(late.is_empty(), "requests after the run ended: {late:?}");
        let main = agent.server.main_requests();
        assert!(
            !main.is_empty(),
            "{} made no model call before the pool was spent: it never ran in the pool",
            agent.cli.name()
        );
        match rec["terminated_by"].as_str() {
            Some("wrap_up") => {
                wrapped += 1;
                let last = main.last().expect("a main request reached the server");
                assert!(
                    last.tools_disabled,
                    "{}: the last call kept its tools",
                    agent.cli.name()
                );
                assert_eq!(last.notices, 1, "one notice on the last call");
                assert!(
                    matches!(last.reply, Reply::ToolsDisabled { .. } | Reply::Final),
                    "the server answered the wrap-up in text: {:?}",
                    last.reply
                );
            }
            Some("tokens") => assert!(
                main.iter().all(|r| !r.tools_disabled),
                "answered by the gateway, yet a call went out tool-less: {rec}"
            ),
            other => panic!("{}: terminated_by {other:?}: {rec}", agent.cli.name()),
        }
        side += agent
            .server
            .requests()
            .iter()
            .filter(|r| r.api.is_some() && !r.offers_tools())
            .count() as u64;
        eprintln!(
            "{}: {} main calls, ended by {}",
            agent.cli.name(),
            main.len(),
            rec["terminated_by"]
        );
    }
    assert!(wrapped >= 1, "no run was wrapped up by the pool");
    let status = agents[0].stepguard(&["pools", "--json"]);
    let spent = status[0]["limits"][0]["spent"].as_f64().unwrap() as u64;
    let bound = cap + RUNS * (PER_CALL - 1) + side * PER_CALL;
    eprintln!(
        "the pool recorded {spent} of {cap} tokens (bound {bound}, {side} calls without tools)"
    );
    assert!(
        (cap - PER_CALL..=bound).contains(&spent),
        "the pool recorded {spent} tokens; cap {cap}, bound {bound}"
    );
}
