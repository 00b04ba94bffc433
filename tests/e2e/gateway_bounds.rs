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

/// A stand-in agent that writes the gateway URL it was given to `url`, waits for `done`, then
/// prints a Claude stream.
const WAITING_AGENT: &str = r#"echo "$ANTHROPIC_BASE_URL" > url
while [ ! -e done ]; do sleep 0.05; done
cat "$1""#;

/// Sends a model request of `size` body bytes to `url` (`http://127.0.0.1:PORT/TOKEN`), made as
/// it is written (a 1 MiB block repeated, so the test holds no body); returns the reply's status
/// line, or what went wrong.
fn post_streamed(url: &str, size: usize, tools: bool) -> String {
    use std::io::{BufRead, BufReader, Write};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (addr, token) = rest.split_once('/').expect("a token");
    let head_json = if tools {
        r#"{"model":"claude-haiku-4-5","max_tokens":8,"tools":[{"name":"Bash","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":""#
    } else {
        r#"{"model":"claude-haiku-4-5","max_tokens":8,"messages":[{"role":"user","content":""#
    };
    let tail_json = r#""}]}"#;
    let fill = size - head_json.len() - tail_json.len();
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the gateway");
    let reader = conn.try_clone().expect("clone");
    // The reply is read while the body is still being written: a refusal comes early.
    let status = std::thread::spawn(move || {
        let mut line = String::new();
        match BufReader::new(reader).read_line(&mut line) {
            Ok(_) if !line.is_empty() => line.trim().to_owned(),
            Ok(_) => "closed without a reply".to_owned(),
            Err(e) => format!("read failed: {e}"),
        }
    });
    let head = format!(
        "POST /{token}/v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-api-key: test\r\nanthropic-version: 2023-06-01\r\ncontent-length: {size}\r\n\r\n{head_json}"
    );
    let block = vec![b'a'; 1 << 20];
    let mut left = fill;
    let mut written = conn.write_all(head.as_bytes());
    while written.is_ok() && left > 0 {
        let n = left.min(block.len());
        written = conn.write_all(&block[..n]);
        left -= n;
    }
    if written.is_ok() {
        let _ = conn.write_all(tail_json.as_bytes());
    }
    status.join().expect("the reader")
}

/// Peak resident memory of a process, in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024
}

#[test]
fn sixteen_concurrent_huge_bodies_are_capped_and_stepguard_survives() {
    // 16 requests of 250 MiB at once: past the 512 MiB held for bodies they are answered 503
    // (Retry-After) before their bodies are read; stepguard's memory stays near the cap and the
    // run goes on.
    let server = ModelServer::start(Script::tool_rounds(12)).expect("a model server");
    let sb = Sandbox::new();
    let agent = sb.write("agent.sh", WAITING_AGENT).display().to_string();
    let stream = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let child = sb
        .cmd(&[
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
            &agent,
            &stream,
        ])
        .env("ANTHROPIC_BASE_URL", server.url())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn stepguard");
    let url_file = sb.project().join("url");
    let started = std::time::Instant::now();
    let url = loop {
        let url = std::fs::read_to_string(&url_file).unwrap_or_default();
        if url.ends_with('\n') {
            break url.trim().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no gateway URL"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let statuses: Vec<String> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..16)
            .map(|_| s.spawn(|| post_streamed(&url, 250 << 20, false)))
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let busy = statuses.iter().filter(|s| s.contains(" 503 ")).count();
    let peak = peak_rss_mib(child.id());
    eprintln!("stepguard's peak RSS: {peak} MiB; replies: {statuses:?}");
    assert!(busy >= 8, "{busy} refused: {statuses:?}");
    assert!(peak < 1200, "stepguard held {peak} MiB");
    // Still serving: a small model call goes through.
    let small = post_streamed(&url, 4096, true);
    assert!(small.contains(" 200 "), "{small}");
    std::fs::write(sb.project().join("done"), "").unwrap();
    let out = child.wait_with_output().expect("stepguard ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
