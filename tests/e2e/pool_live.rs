//! Pools kept live while runs go on (#28): without the gateway the stream's usage is charged
//! as it comes, so other runs in the pool see it, and a run whose pool other runs spent is
//! stopped; with `--wrap-up` it wraps up, its last model call tool-less, instead of being
//! answered by the gateway. A watch interval out of its range refuses the run.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stepguard_modelserver::{INPUT_TOKENS, ModelServer, OUTPUT_TOKENS, Script};

use crate::harness::{Sandbox, fixture};
use crate::pool_calls::{CALL_LOOP, stream_without_usage};

/// How often the runs of these tests read their pools.
const WATCH: (&str, &str) = ("STEPGUARD_POOL_WATCH", "200ms");

/// A stand-in for Claude: the real recording's start, then `ROUNDS` tool calls of 101 tokens
/// each (100 input, 1 output, each in a message of its own), `PAUSE` seconds apart.
const CLAUDE_ROUNDS: &str = r#"
import json, sys, time
lines = open(sys.argv[1]).read().splitlines()
rounds, pause = int(sys.argv[2]), float(sys.argv[3])
print(lines[0], flush=True)
call, result = json.loads(lines[1]), json.loads(lines[2])
for i in range(rounds):
    call["message"]["id"] = "msg_live_%d" % i
    call["uuid"] = "call-%d" % i
    tool = "toolu_live_%d" % i
    call["message"]["content"][0]["id"] = tool
    call["message"]["content"][0]["input"]["command"] = "echo round %d" % i
    result["message"]["content"][0]["tool_use_id"] = tool
    result["uuid"] = "result-%d" % i
    print(json.dumps(call), flush=True)
    print(json.dumps(result), flush=True)
    time.sleep(pause)
"#;

/// Tokens of one round of [`CLAUDE_ROUNDS`].
const PER_ROUND: u64 = 101;

fn spawn(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Child {
    sb.cmd(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What `pools --json` says the first pool has spent of its first cap.
fn pool_spent(sb: &Sandbox) -> u64 {
    let out = sb.run(&["pools", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.json()[0]["limits"][0]["spent"].as_f64().unwrap() as u64
}

fn record(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tokens(rec: &Value) -> u64 {
    let t = &rec["tokens"];
    t["input_tokens"].as_u64().unwrap() + t["output_tokens"].as_u64().unwrap()
}

/// Two runs in a token pool of 3000, without the gateway. The first, slow (a round of 101
/// tokens every half second), is charged as its stream reports usage: the pool shows its spend
/// while it runs. The second, fast, starts with what is left as its budget and spends it; the
/// first then finds its pool spent by the runs in it and is stopped within a bounded time,
/// long before its own share would have run out, with the measure's slug. The pool records
/// each run's tokens once: live charges and end charges add up to the records' usage.
#[test]
fn a_run_whose_pool_another_run_spent_is_stopped_and_every_token_is_charged_once() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.shared]\nmax_tokens = 3000\nwindow = \"none\"\nmatch = { provider = \"claude\" }\n",
    );
    let agent = sb.write("rounds.py", CLAUDE_ROUNDS).display().to_string();
    let stream = fixture("real/claude/tools12.jsonl");
    let (slow_rec, fast_rec) = (sb.root().join("slow.json"), sb.root().join("fast.json"));
    let args = |summary: &std::path::Path, rounds: &'static str, pause: &'static str| {
        let summary = summary.display().to_string();
        let strings = [
            "run",
            "-q",
            "-p",
            "claude",
            "--max-steps",
            "1000",
            "--summary-file",
            &summary,
            "--",
            "python3",
            &agent,
            &stream,
            rounds,
            pause,
        ];
        strings
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<Vec<String>>()
    };
    let slow_args = args(&slow_rec, "200", "0.5");
    let slow_args: Vec<&str> = slow_args.iter().map(String::as_str).collect();
    let slow = spawn(&sb, &slow_args, &[WATCH]);

    // The slow run's usage reaches the pool while it runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool_spent(&sb) < 2 * PER_ROUND {
        assert!(
            Instant::now() < deadline,
            "the pool never saw the run's usage live"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let fast_args = args(&fast_rec, "60", "0.01");
    let fast_args: Vec<&str> = fast_args.iter().map(String::as_str).collect();
    let fast = sb.run_env(&fast_args, &[WATCH]);
    let fast_ended = Instant::now();
    assert_eq!(fast.code, Some(3), "{}", fast.stderr);

    let slow = slow.wait_with_output().unwrap();
    let after = fast_ended.elapsed();
    let stderr = String::from_utf8_lossy(&slow.stderr);
    assert_eq!(slow.status.code(), Some(3), "{stderr}");
    // The watch (200 ms), the stop and the end charge; its own share lasted 15 s more.
    assert!(
        after < Duration::from_secs(8),
        "stopped {after:?} after the pool was spent"
    );

    let (slow_rec, fast_rec) = (record(&slow_rec), record(&fast_rec));
    assert_eq!(fast_rec["error_type"], "max_tokens", "{fast_rec}");
    assert_eq!(fast_rec["max_tokens_source"], "pool shared", "{fast_rec}");
    assert_eq!(slow_rec["error_type"], "max_tokens", "{slow_rec}");
    assert_eq!(slow_rec["terminated_by"], "tokens", "{slow_rec}");
    assert_eq!(
        slow_rec["pools"],
        serde_json::json!(["shared"]),
        "{slow_rec}"
    );
    let message = slow_rec["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("pool `shared` is spent: nothing is left of its max_tokens"),
        "{slow_rec}"
    );
    assert!(
        tokens(&slow_rec) < 3000,
        "stopped by the pool, not its own share: {slow_rec}"
    );

    // Charged once: what the pool recorded is what the two records used.
    let spent = pool_spent(&sb);
    assert_eq!(
        spent,
        tokens(&slow_rec) + tokens(&fast_rec),
        "{slow_rec}\n{fast_rec}"
    );
    assert!(spent >= 3000, "the pool is spent: {spent}");

    let id = sb.recorded_id(&slow_rec, &stderr);
    let show = sb.run(&["show", &id]);
    assert!(
        show.stdout
            .contains("Pools: shared; ended by pool shared (spent by the runs in it)"),
        "{}",
        show.stdout
    );
}

/// Tokens of one model call as the server reports them.
const PER_CALL: u64 = INPUT_TOKENS + OUTPUT_TOKENS;

/// With `--wrap-up`: a long run in a pool of three calls makes its first call, then another
/// run spends the rest of the pool. The first is told by its watch; its next call goes out as
/// its last, tool-less, with a notice naming the pool (rather than being answered by the
/// gateway because the pool cannot pay it), and it ends by itself: wrapped up, not killed,
/// with the measure's slug and the pool named.
#[test]
fn a_run_with_the_gateway_wraps_up_when_another_run_spends_its_pool() {
    let server = ModelServer::start(Script::tool_rounds(100)).expect("a model server");
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        format!(
            "[pools.calls]\nmax_tokens = {}\nwindow = \"none\"\nmatch = {{ provider = \"claude\" }}\n",
            3 * PER_CALL
        ),
    );
    let agent = sb.write("calls.py", CALL_LOOP).display().to_string();
    let stream = stream_without_usage(&sb);
    let go = sb.root().join("go");
    let (long_rec, spender_rec) = (sb.root().join("long.json"), sb.root().join("spender.json"));
    let run_args = |summary: &std::path::Path, marker: &str, wait: Option<&std::path::Path>| {
        let mut v: Vec<String> = [
            "run",
            "-q",
            "-p",
            "claude",
            "--wrap-up",
            "--max-steps",
            "100",
            "--no-native-limit",
            "--summary-file",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.push(summary.display().to_string());
        v.extend([
            "--".into(),
            "python3".into(),
            agent.clone(),
            stream.clone(),
            marker.into(),
        ]);
        if let Some(w) = wait {
            v.push(w.display().to_string());
        }
        v
    };
    let long_args = run_args(&long_rec, "long-run", Some(&go));
    let long_args: Vec<&str> = long_args.iter().map(String::as_str).collect();
    let long = sb
        .cmd(&long_args)
        .env(WATCH.0, WATCH.1)
        .env("ANTHROPIC_BASE_URL", server.url())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.main_requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the long run never called its model"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its first call settles in the pool before the other run starts.
    while pool_spent(&sb) < PER_CALL {
        assert!(
            Instant::now() < deadline,
            "the first call was never settled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let spender_args = run_args(&spender_rec, "spender", None);
    let spender_args: Vec<&str> = spender_args.iter().map(String::as_str).collect();
    let spender = sb
        .cmd(&spender_args)
        .env(WATCH.0, WATCH.1)
        .env("ANTHROPIC_BASE_URL", server.url())
        .output()
        .unwrap();
    assert_eq!(
        spender.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&spender.stderr)
    );
    assert!(
        pool_spent(&sb) >= 3 * PER_CALL,
        "the other run spent the pool"
    );
    // The long run's watch (200 ms) sees it; then it may call again.
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, "").unwrap();
    let long = long.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&long.stderr);
    assert_eq!(long.status.code(), Some(3), "{stderr}");

    let marked = |m: &str| {
        server
            .main_requests()
            .into_iter()
            .filter(|r| r.body.to_string().contains(m))
            .collect::<Vec<_>>()
    };
    let calls = marked("long-run");
    assert_eq!(
        calls.len(),
        2,
        "its first call and its wrap-up reached the model"
    );
    assert!(!calls[0].tools_disabled);
    let last = &calls[1];
    assert!(last.tools_disabled, "the last call is tool-less");
    assert!(
        last.body
            .to_string()
            .contains("the shared budget `calls` is spent"),
        "{}",
        last.body
    );

    let rec = record(&long_rec);
    assert_eq!(rec["terminated_by"], "wrap_up", "not killed: {rec}");
    assert_eq!(rec["error_type"], "max_tokens", "{rec}");
    assert_eq!(rec["pools"], serde_json::json!(["calls"]), "{rec}");
    assert!(
        rec["message"]
            .as_str()
            .unwrap_or_default()
            .contains("pool `calls` is spent"),
        "{rec}"
    );
    // Every call charged once: the pool holds what reached the model, the wrap-up (which
    // the pool could not pay, so it was not reserved) by the end charge.
    let reached = server.main_requests().len() as u64;
    assert_eq!(reached, 4, "two calls of each run");
    assert_eq!(pool_spent(&sb), reached * PER_CALL);
}

/// A watch interval out of its range refuses the run before the agent starts, naming the fix.
#[test]
fn a_bad_watch_interval_is_refused_before_the_agent_starts() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.shared]\nmax_tokens = 3000\nwindow = \"none\"\nmatch = \"all\"\n",
    );
    let marker = sb.root().join("started");
    let agent = sb.write(
        "agent.sh",
        format!("#!/bin/sh\ntouch {}\n", marker.display()),
    );
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for bad in ["10ms", "2m", "soon"] {
        let run = sb.run_env(
            &["run", "-p", "codex", "--", &agent.display().to_string()],
            &[("STEPGUARD_POOL_WATCH", bad)],
        );
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "STEPGUARD_POOL_WATCH={bad}: expected a duration from 50ms to 1m, e.g. 1s"
            )),
            "{}",
            run.stderr
        );
    }
    assert!(!marker.exists(), "the agent never started");
}
