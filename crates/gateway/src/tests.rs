//! The gateway against a scripted model server on loopback.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stepguard_modelserver::{ModelServer, Script};

use super::*;

/// Events the gateway reported, in order.
type Seen = Arc<Mutex<Vec<GatewayEvent>>>;

fn config(upstream: &str, limit: Option<u64>, steps: Arc<AtomicU64>) -> (GatewayConfig, Seen) {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let config = GatewayConfig {
        dialect: Dialect::AnthropicMessages,
        upstream: upstream.to_owned(),
        pace: Pace {
            limit,
            steps,
            reply_cost: 1,
            count_requests: true,
            max_tokens: None,
            max_cost_usd: None,
            price: None,
        },
        notices: false,
        staged: Staged::default(),
        record_requests: None,
        on_event: Box::new(move |e| log.lock().unwrap().push(e)),
        connect_timeout: Duration::from_secs(5),
        body_memory: crate::DEFAULT_BODY_MEMORY,
        api_keys: Vec::new(),
        shared_budget: None,
    };
    (config, seen)
}

/// One HTTP/1.1 exchange on a fresh connection: status and body (de-chunked).
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    (status, body)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// An Anthropic request after `results` tool rounds, offering tools or not.
fn anthropic(results: usize, tools: bool) -> String {
    let mut messages = vec![json!({"role": "user", "content": "go"})];
    for r in 1..=results {
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("t{r}"), "name": "Bash", "input": {"command": "x"}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{r}"), "content": "ok"}]}));
    }
    let tools = if tools {
        json!([{"name": "Bash", "input_schema": {"type": "object"}}])
    } else {
        json!([])
    };
    json!({"model": "claude-x", "max_tokens": 100, "stream": true, "tools": tools, "messages": messages}).to_string()
}

fn path(gw: &Gateway, rest: &str) -> String {
    let base = gw.url().split_once("127.0.0.1").unwrap().1;
    let base = &base[base.find('/').unwrap()..];
    format!("{base}{rest}")
}

#[test]
fn requests_without_the_runs_token_are_refused_and_never_forwarded() {
    let server = ModelServer::start(Script::tool_rounds(3)).unwrap();
    let (cfg, _) = config(&server.url(), Some(5), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    assert!(gw.url().starts_with("http://127.0.0.1:"));
    let token = gw.url().rsplit('/').next().unwrap().to_owned();
    assert_eq!(token.len(), 32);
    for bad in [
        "/v1/messages",
        "/x/v1/messages",
        &format!("/{}/v1/messages", &token[..31]),
        &format!("/{token}0/v1/messages"),
    ] {
        let (status, body) = send(gw.addr(), "POST", bad, &[], &anthropic(0, true));
        assert_eq!(status, 403, "{bad}");
        assert!(body.contains("not the run's gateway URL"), "{body}");
    }
    assert!(server.requests().is_empty(), "nothing reached the upstream");
    assert_eq!(gw.forwarded(), 0);
    // A second gateway has another token.
    let (cfg, _) = config(&server.url(), Some(5), Arc::default());
    let other = Gateway::start(cfg).unwrap();
    assert_ne!(other.url().rsplit('/').next(), Some(token.as_str()));
}

#[test]
fn the_budgets_last_call_is_tool_less_and_later_calls_never_reach_the_model() {
    let server =
        ModelServer::start(Script::tool_rounds(12).final_answer("Did 2 rounds; 10 left.")).unwrap();
    let (cfg, seen) = config(&server.url(), Some(3), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages?beta=true");
    // A side request (no tools) passes and is not counted.
    let (status, _) = send(
        gw.addr(),
        "POST",
        &p,
        &[("x-api-key", "dummy")],
        &anthropic(0, false),
    );
    assert_eq!(status, 200);
    for round in 0..2 {
        let (status, body) = send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
        assert_eq!(status, 200);
        assert!(
            body.contains("tool_use"),
            "round {round} gets tool calls: {body}"
        );
    }
    assert!(!gw.wrapped_up());
    // The third of three: tool use off, one notice; the model answers in text.
    let (status, body) = send(gw.addr(), "POST", &p, &[], &anthropic(2, true));
    assert_eq!(status, 200);
    assert!(!body.contains("\"tool_use\""), "{body}");
    assert!(gw.wrapped_up());
    assert_eq!(gw.final_text().as_deref(), Some("Did 2 rounds; 10 left."));
    let main: Vec<Value> = server
        .requests()
        .iter()
        .map(|r| r.body.clone())
        .filter(|b| b["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .collect();
    assert_eq!(main.len(), 3);
    assert_eq!(main[2]["tool_choice"], json!({"type": "none"}));
    assert!(main[..2].iter().all(|b| b.get("tool_choice").is_none()));
    let text = main[2].to_string();
    assert_eq!(text.matches("system notice: ").count(), 1, "{text}");
    // Past the budget: answered by the gateway in the dialect, never forwarded.
    for round in 3..5 {
        let (status, body) = send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
        assert_eq!(status, 200);
        assert_eq!(
            Dialect::AnthropicMessages.reply_text(body.as_bytes()),
            REFUSAL_TEXT
        );
    }
    assert_eq!(
        server.requests().len(),
        4,
        "1 side + 3 main requests upstream"
    );
    assert_eq!((gw.forwarded(), gw.refused()), (3, 2));
    let paced: Vec<GatewayEvent> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|e| !matches!(e, GatewayEvent::Usage { .. }))
        .cloned()
        .collect();
    assert_eq!(
        paced,
        vec![
            GatewayEvent::Forwarded {
                number: 1,
                last: false
            },
            GatewayEvent::Forwarded {
                number: 2,
                last: false
            },
            GatewayEvent::Forwarded {
                number: 3,
                last: true
            },
            GatewayEvent::Refused { count: 1 },
            GatewayEvent::Refused { count: 2 },
        ]
    );
}

#[test]
fn stream_units_wrap_up_when_no_more_than_a_tool_less_reply_is_left() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    // Cost 1 (message/item units): 4 of 5 spent leaves exactly a reply.
    let steps = Arc::new(AtomicU64::new(3));
    let (mut cfg, _) = config(&server.url(), Some(5), Arc::clone(&steps));
    cfg.pace.count_requests = false;
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    send(gw.addr(), "POST", &p, &[], &anthropic(0, true));
    assert!(!gw.wrapped_up());
    steps.store(4, std::sync::atomic::Ordering::Relaxed);
    send(gw.addr(), "POST", &p, &[], &anthropic(1, true));
    assert!(gw.wrapped_up());
    // Cost 0 (tool units): a tool-less reply is free, so the last call comes at the budget.
    let steps = Arc::new(AtomicU64::new(4));
    let (mut cfg, _) = config(&server.url(), Some(5), Arc::clone(&steps));
    cfg.pace.count_requests = false;
    cfg.pace.reply_cost = 0;
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    send(gw.addr(), "POST", &p, &[], &anthropic(0, true));
    assert!(!gw.wrapped_up());
    steps.store(5, std::sync::atomic::Ordering::Relaxed);
    send(gw.addr(), "POST", &p, &[], &anthropic(1, true));
    assert!(gw.wrapped_up());
    // A stream that lags the calls: each forwarded call counts at least its reply.
    let (mut cfg, _) = config(&server.url(), Some(2), Arc::default());
    cfg.pace.count_requests = false;
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    send(gw.addr(), "POST", &p, &[], &anthropic(0, true));
    send(gw.addr(), "POST", &p, &[], &anthropic(1, true));
    assert!(
        gw.wrapped_up(),
        "the 2nd of 2 calls is the last though the stream said 0"
    );
}

#[test]
fn step_notices_and_pushed_notices_ride_on_forwarded_calls_once() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, _) = config(&server.url(), Some(9), Arc::default());
    cfg.notices = true;
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    send(gw.addr(), "POST", &p, &[], &anthropic(0, true));
    gw.push_notice("system notice: you have called Bash with the same arguments 3 times");
    send(gw.addr(), "POST", &p, &[], &anthropic(1, true));
    send(gw.addr(), "POST", &p, &[], &anthropic(2, true));
    let bodies: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert!(
        bodies[0].contains("system notice: this is step 1 of 9"),
        "{}",
        bodies[0]
    );
    assert!(bodies[1].contains("same arguments 3 times") && !bodies[1].contains("step 2 of 9"));
    assert!(bodies[2].contains("system notice: this is step 3 of 9"));
    assert!(
        !bodies[2].contains("same arguments"),
        "a pushed notice is sent once"
    );
    // A forced last call ends the run whatever the budget.
    gw.force_last();
    send(gw.addr(), "POST", &p, &[], &anthropic(3, true));
    assert!(gw.wrapped_up());
}

#[test]
fn an_unreachable_upstream_is_a_prompt_502_and_an_event() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (cfg, seen) = config(&format!("http://127.0.0.1:{port}"), Some(5), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let started = Instant::now();
    let (status, body) = send(
        gw.addr(),
        "POST",
        &path(&gw, "/v1/messages"),
        &[],
        &anthropic(0, true),
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(status, 502);
    assert!(
        body.contains("cannot reach the model upstream http://127.0.0.1:"),
        "{body}"
    );
    let seen = seen.lock().unwrap();
    assert!(
        matches!(&seen[1], GatewayEvent::UpstreamFailed { error } if error.contains("refused")),
        "{seen:?}"
    );
}

#[test]
fn bad_upstreams_and_record_dirs_are_refused_at_start() {
    for bad in ["ftp://x", "not a url", "/relative"] {
        let (cfg, _) = config(bad, None, Arc::default());
        let err = Gateway::start(cfg).err().unwrap().to_string();
        assert!(err.contains(bad), "{err}");
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    let (mut cfg, _) = config("http://127.0.0.1:1", None, Arc::default());
    cfg.record_requests = Some(file.path().join("sub"));
    let err = Gateway::start(cfg).err().unwrap().to_string();
    assert!(err.contains("recording directory"), "{err}");
}

#[test]
fn recorded_requests_keep_bodies_and_lose_credentials() {
    // An upstream that hands the test the request head it got.
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = upstream.local_addr().unwrap();
    let (tx, heads) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            raw.extend_from_slice(&buf[..n]);
        }
        tx.send(String::from_utf8_lossy(&raw).into_owned()).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let (mut cfg, _) = config(&format!("http://{addr}"), Some(5), Arc::default());
    cfg.record_requests = Some(dir.path().to_owned());
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages?key=SECRET&beta=true");
    let (status, _) = send(
        gw.addr(),
        "POST",
        &p,
        &[
            ("authorization", "Bearer SECRET"),
            ("x-api-key", "SECRET"),
            ("anthropic-version", "2023-06-01"),
        ],
        &anthropic(0, true),
    );
    assert_eq!(status, 200);
    // The upstream got the credentials as they were, under its own host name.
    let head = heads.recv().unwrap().to_ascii_lowercase();
    assert!(
        head.contains("x-api-key: secret") && head.contains("authorization: bearer secret"),
        "{head}"
    );
    assert!(head.contains(&format!("host: {addr}")), "{head}");
    assert!(
        head.starts_with("post /v1/messages?key=secret&beta=true "),
        "{head}"
    );
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(!text.contains("SECRET"), "{text}");
    let entry: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(entry["plan"], "forward");
    assert_eq!(entry["path"], "/v1/messages?beta=true");
    assert_eq!(entry["headers"]["anthropic-version"], "2023-06-01");
    assert_eq!(entry["body"]["model"], "claude-x");
}

/// Peak resident memory of this process (tests run one per process under nextest).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_100_mb_streamed_reply_passes_with_constant_memory() {
    const TOTAL: usize = 100 * 1024 * 1024;
    // An upstream that streams 100 MiB of SSE in 64 KiB chunks, never holding more.
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = upstream.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let len: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        let chunk = format!("data: {}\n\n", "x".repeat(64 * 1024 - 8));
        let mut sent = 0;
        while sent < TOTAL {
            s.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
                .unwrap();
            sent += chunk.len();
        }
        s.write_all(b"0\r\n\r\n").unwrap();
    });
    let (cfg, _) = config(&format!("http://{addr}"), Some(5), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let before = peak_rss_kib();
    let mut s = TcpStream::connect(gw.addr()).unwrap();
    let body = anthropic(0, true);
    let p = path(&gw, "/v1/messages");
    write!(
        s,
        "POST {p} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0usize;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert!(got > TOTAL, "all of it came through: {got}");
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(
        grown < 32 * 1024,
        "peak memory grew by {grown} KiB for a 100 MiB reply"
    );
}

#[test]
fn a_token_budget_makes_the_call_after_which_none_would_fit_the_last() {
    // The server reports 100 input + 20 output tokens per call: three calls fit in 360.
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, seen) = config(&server.url(), None, Arc::default());
    cfg.pace.max_tokens = Some(360);
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for round in 0..5 {
        let (status, _) = send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
        assert_eq!(status, 200);
    }
    let main: Vec<Value> = server.main_requests().into_iter().map(|r| r.body).collect();
    assert_eq!(main.len(), 3, "the upstream saw three calls");
    assert_eq!(main[2]["tool_choice"], json!({"type": "none"}));
    assert!(main[..2].iter().all(|b| b.get("tool_choice").is_none()));
    assert_eq!(gw.usage().total(), 360);
    assert_eq!(gw.reason(), Some(Budget::Tokens));
    assert_eq!((gw.forwarded(), gw.refused()), (3, 2));
    let seen = seen.lock().unwrap();
    assert!(
        seen.contains(&GatewayEvent::Usage {
            tokens: 240,
            cost_usd: None
        }),
        "{seen:?}"
    );
}

#[test]
fn a_cost_budget_is_kept_with_prices_and_an_unpriced_model_is_never_called() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    // One cent per token: 1.20 dollars a call.
    let (mut cfg, _) = config(&server.url(), None, Arc::default());
    cfg.pace.max_cost_usd = Some(3.6);
    cfg.pace.price = Some(Pricing(Arc::new(|model: &str, u: &CallUsage| {
        (model == "claude-x").then(|| u.total() as f64 * 0.01)
    })));
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for round in 0..4 {
        send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
    }
    assert_eq!(server.main_requests().len(), 3);
    assert!(server.main_requests()[2].tools_disabled);
    assert_eq!(gw.reason(), Some(Budget::Cost));
    assert!(
        (gw.cost_usd().unwrap() - 3.6).abs() < 1e-9,
        "{:?}",
        gw.cost_usd()
    );

    // A model the table does not know: refused with an error, not forwarded, reported.
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, seen) = config(&server.url(), None, Arc::default());
    cfg.pace.max_cost_usd = Some(1.0);
    cfg.pace.price = Some(Pricing(Arc::new(|_: &str, _: &CallUsage| None)));
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for tools in [true, false] {
        let (status, body) = send(gw.addr(), "POST", &p, &[], &anthropic(0, tools));
        assert_eq!(status, 400);
        assert!(body.contains("the model `claude-x` has no price"), "{body}");
    }
    assert!(server.requests().is_empty());
    assert!(seen.lock().unwrap().contains(&GatewayEvent::Unpriced {
        model: "claude-x".into()
    }));
}

fn pace(max_tokens: Option<u64>) -> Pace {
    Pace {
        limit: None,
        steps: Arc::default(),
        reply_cost: 1,
        count_requests: true,
        max_tokens,
        max_cost_usd: None,
        price: None,
    }
}

#[test]
fn the_estimate_grows_with_the_conversation_so_the_wrap_up_is_not_skipped() {
    // Calls of 200 then 300 tokens: the next is likely 400 and the one after 500. With 500 of
    // 1300 spent, 500 + 400 + 500 > 1300, so the next call is the last (not refused later).
    let t = Tally {
        usage: CallUsage {
            input: 500,
            cached_input: 0,
            output: 0,
        },
        recent: vec![(200, 0.0), (300, 0.0)],
        ..Tally::default()
    };
    assert_eq!(
        t.spend_plan(&pace(Some(1300))),
        Some((false, Budget::Tokens))
    );
    assert_eq!(t.spend_plan(&pace(Some(1400))), None);
    // A sub-agent's small call does not hide its parent's big one.
    let t = Tally {
        usage: CallUsage {
            input: 900,
            cached_input: 0,
            output: 0,
        },
        recent: vec![(800, 0.0), (50, 0.0)],
        ..Tally::default()
    };
    assert_eq!(
        t.spend_plan(&pace(Some(1600))),
        Some((true, Budget::Tokens))
    );
    // Calls under way count at the estimate: two in flight of 100 each fill 800 + 200 = 1000.
    let t = Tally {
        usage: CallUsage {
            input: 800,
            cached_input: 0,
            output: 0,
        },
        recent: vec![(100, 0.0)],
        // Two others under way, besides the call being planned.
        metered: 3,
        ..Tally::default()
    };
    assert_eq!(
        t.spend_plan(&pace(Some(1000))),
        Some((true, Budget::Tokens))
    );
    // Nothing under way: room for this call and one more.
    assert_eq!(
        Tally { metered: 1, ..t }.spend_plan(&pace(Some(1000))),
        None
    );
}

#[test]
fn once_a_budget_is_spent_side_calls_are_answered_too() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, _) = config(&server.url(), None, Arc::default());
    cfg.pace.max_tokens = Some(240);
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for round in 0..2 {
        send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
    }
    assert_eq!(gw.usage().total(), 240);
    let before = server.requests().len();
    let (status, body) = send(gw.addr(), "POST", &p, &[], &anthropic(0, false));
    assert_eq!(status, 200);
    assert_eq!(
        Dialect::AnthropicMessages.reply_text(body.as_bytes()),
        REFUSAL_TEXT
    );
    assert_eq!(
        server.requests().len(),
        before,
        "the side call was not made"
    );
    assert!(gw.refused_any());
}

#[test]
fn calls_that_cannot_be_read_or_could_reach_other_paths_are_not_forwarded() {
    let server = ModelServer::start(Script::tool_rounds(3)).unwrap();
    let (cfg, seen) = config(&server.url(), Some(5), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    let (status, body) = send(
        gw.addr(),
        "POST",
        &p,
        &[("content-encoding", "gzip")],
        "\u{1f}\u{8b}",
    );
    assert_eq!(status, 415, "{body}");
    assert!(body.contains("compressed (gzip)"), "{body}");
    let (status, _) = send(gw.addr(), "POST", &p, &[], "{\"tools\": [1, 2");
    assert_eq!(status, 415);
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, GatewayEvent::Unreadable { .. }))
    );
    for sneaky in [
        "/v1/messages/../complete",
        "/v1/./messages",
        "/v1/%2e%2e/x",
        "/v1%2Fmessages",
    ] {
        let (status, _) = send(
            gw.addr(),
            "POST",
            &path(&gw, sneaky),
            &[],
            &anthropic(0, true),
        );
        assert_eq!(status, 400, "{sneaky}");
    }
    assert!(server.requests().is_empty());
    assert_eq!(gw.forwarded(), 0);
}

#[test]
fn a_last_call_that_fails_is_retried_as_the_last_and_is_not_a_step() {
    use stepguard_modelserver::{Fault, FaultKind};
    // Round 3's first answer is an HTTP 500; the CLI's retry gets the real reply.
    let script = Script::tool_rounds(12).fault(Fault::times(3, FaultKind::ServerError, 1));
    let server = ModelServer::start(script).unwrap();
    let (cfg, _) = config(&server.url(), Some(3), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for round in 0..2 {
        send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
    }
    let (status, _) = send(gw.addr(), "POST", &p, &[], &anthropic(2, true));
    assert_eq!(status, 500);
    assert!(!gw.wrapped_up());
    assert_eq!(gw.forwarded(), 2, "a failed call is not a step");
    let (status, body) = send(gw.addr(), "POST", &p, &[], &anthropic(2, true));
    assert_eq!(status, 200, "{body}");
    assert!(gw.wrapped_up(), "the retry went out as the last call");
    let main = server.main_requests();
    assert_eq!(main.len(), 4);
    assert!(main[2].tools_disabled && main[3].tools_disabled);
}

#[test]
fn websocket_upgrades_are_answered_426_and_never_forwarded() {
    let server = ModelServer::start(Script::tool_rounds(3)).unwrap();
    let (mut cfg, _) = config(&server.url(), Some(5), Arc::default());
    cfg.dialect = Dialect::OpenAiResponses;
    let gw = Gateway::start(cfg).unwrap();
    let (status, body) = send(
        gw.addr(),
        "GET",
        &path(&gw, "/responses"),
        &[
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
        "",
    );
    assert_eq!(status, 426, "{body}");
    assert!(body.contains("WebSocket"), "{body}");
    // A plain GET of the same path is forwarded as before.
    let (status, _) = send(gw.addr(), "GET", &path(&gw, "/responses"), &[], "");
    assert_eq!(status, 404);
    let targets: Vec<String> = server.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        ["/responses"],
        "only the plain GET reached the upstream"
    );
    assert_eq!(gw.forwarded(), 0);
}

#[test]
fn path_variants_of_a_model_call_are_counted_or_refused_never_passed_as_other() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (cfg, _) = config(&server.url(), Some(10), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let body = anthropic(0, true);
    let json = [("content-type", "application/json")];
    for variant in ["/v1/messages/", "/v1/%6Dessages", "/v1//messages"] {
        let (status, _) = send(gw.addr(), "POST", &path(&gw, variant), &json, &body);
        assert_eq!(status, 200, "{variant}");
    }
    assert_eq!(gw.forwarded(), 3, "each variant is a counted model call");
    let targets: Vec<String> = server.requests().iter().map(|r| r.target.clone()).collect();
    assert!(
        targets.iter().all(|t| t == "/v1/messages"),
        "the upstream saw the canonical path: {targets:?}"
    );
    for bad in ["/v1/messages;x", "/v1/messages%3B", "/v1/%2e%2e/messages"] {
        let (status, text) = send(gw.addr(), "POST", &path(&gw, bad), &json, &body);
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains("not forwarded"), "{bad}: {text}");
    }
    assert_eq!(
        server.requests().len(),
        3,
        "refused variants never went out"
    );
    assert_eq!(gw.forwarded(), 3);
}

#[test]
fn a_last_call_too_deep_to_rewrite_is_refused_not_sent_with_its_tools() {
    // 200 levels of nesting: the probe reads it, serde_json's value parser (128 levels) cannot,
    // so the tool-less last call cannot be made of it.
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (cfg, seen) = config(&server.url(), Some(1), Arc::default());
    let gw = Gateway::start(cfg).unwrap();
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let body = anthropic(0, true).replacen(
        "\"max_tokens\":100",
        &format!("\"max_tokens\":100,\"metadata\":{{\"x\":{deep}}}"),
        1,
    );
    assert!(body.contains(&deep));
    let json = [("content-type", "application/json")];
    let (status, text) = send(gw.addr(), "POST", &path(&gw, "/v1/messages"), &json, &body);
    assert_eq!(status, 415, "{text}");
    assert!(text.contains("cannot be rewritten"), "{text}");
    assert!(server.requests().is_empty(), "nothing reached the model");
    assert_eq!(gw.forwarded(), 0, "not counted as made");
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, GatewayEvent::Unreadable { .. })),
        "the run is told"
    );
}

#[test]
fn the_upstream_gets_the_real_key_only_for_the_runs_own_per_run_key() {
    let server = ModelServer::start(Script::tool_rounds(3)).unwrap();
    let (mut cfg, _) = config(&server.url(), Some(5), Arc::default());
    cfg.api_keys = vec!["sk-real-1".into(), "sk-real-2".into()];
    let gw = Gateway::start(cfg).unwrap();
    let run_keys = gw.run_keys();
    assert_eq!(run_keys.len(), 2);
    assert!(run_keys.iter().all(|k| !k.contains("sk-real")));
    let (cfg, _) = config(&server.url(), Some(5), Arc::default());
    let mut other_cfg = cfg;
    other_cfg.api_keys = vec!["sk-real-1".into()];
    let other = Gateway::start(other_cfg).unwrap();
    let other_key = other.run_keys().remove(0);
    let messages = path(&gw, "/v1/messages");
    let refused = [
        vec![("x-api-key", other_key.as_str())],
        vec![("x-api-key", "sk-real-1")],
        vec![("authorization", "Bearer sk-real-2")],
        vec![
            ("x-api-key", run_keys[0].as_str()),
            ("x-goog-api-key", "sk-real-1"),
        ],
    ];
    for headers in &refused {
        let (status, body) = send(gw.addr(), "POST", &messages, headers, &anthropic(0, true));
        assert_eq!(status, 401, "{headers:?}: {body}");
        assert!(!body.contains("sk-real"), "{body}");
    }
    assert!(
        server.requests().is_empty(),
        "nothing refused reached the upstream"
    );
    assert_eq!(gw.forwarded(), 0);
    // The run's keys, in either place the dialect takes them, go out as the real ones.
    let (status, _) = send(
        gw.addr(),
        "POST",
        &messages,
        &[("x-api-key", &run_keys[0])],
        &anthropic(0, true),
    );
    assert_eq!(status, 200);
    let bearer = format!("Bearer {}", run_keys[1]);
    let (status, _) = send(
        gw.addr(),
        "POST",
        &messages,
        &[("authorization", &bearer)],
        &anthropic(1, true),
    );
    assert_eq!(status, 200);
    // No key at all (a CLI that authenticates otherwise) passes as it came.
    let (status, _) = send(gw.addr(), "POST", &messages, &[], &anthropic(2, true));
    assert_eq!(status, 200);
    let seen = server.requests();
    assert_eq!(seen.len(), 3);
    let header = |i: usize, name: &str| {
        seen[i]
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header(0, "x-api-key").as_deref(), Some("sk-real-1"));
    assert_eq!(
        header(1, "authorization").as_deref(),
        Some("Bearer sk-real-2")
    );
    assert_eq!(header(2, "x-api-key"), None);
    assert_eq!(header(2, "authorization"), None);
    assert!(
        seen.iter()
            .flat_map(|r| &r.headers)
            .all(|(_, v)| !v.contains("sg-run-")),
        "no per-run key reaches the upstream"
    );
}

/// A token pool shared with other runs, kept in memory: what the gateway reserved and settled.
#[derive(Default)]
struct FakePool {
    cap: u64,
    state: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    charged: u64,
    open: std::collections::HashMap<u64, u64>,
    reserves: Vec<u64>,
    settles: Vec<(u64, u64)>,
}

impl SharedBudget for FakePool {
    fn reserve(&self, seq: u64, next: CallSpend, after: CallSpend) -> Reservation {
        let mut s = self.state.lock().unwrap();
        s.reserves.push(seq);
        let held = s.charged + s.open.values().sum::<u64>();
        if held + next.tokens > self.cap {
            return Reservation::Refused {
                pool: "p".into(),
                budget: Budget::Tokens,
            };
        }
        s.open.insert(seq, next.tokens);
        if held + next.tokens + after.tokens > self.cap {
            return Reservation::Last {
                pool: "p".into(),
                budget: Budget::Tokens,
            };
        }
        Reservation::Go
    }

    fn settle(&self, seq: u64, actual: CallSpend) {
        let mut s = self.state.lock().unwrap();
        s.open.remove(&seq);
        s.charged += actual.tokens;
        s.settles.push((seq, actual.tokens));
    }
}

/// Five calls in a row with a shared pool of `cap` tokens and no budget of the run's own.
fn five_calls_in_a_pool(cap: u64) -> (Arc<FakePool>, ModelServer, Gateway) {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, _) = config(&server.url(), None, Arc::default());
    let pool = Arc::new(FakePool {
        cap,
        ..FakePool::default()
    });
    cfg.shared_budget = Some(Arc::clone(&pool) as Arc<dyn SharedBudget>);
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for round in 0..5 {
        let (status, _) = send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
        assert_eq!(status, 200);
    }
    (pool, server, gw)
}

#[test]
fn each_call_reserves_in_the_shared_pool_and_the_last_that_fits_names_it() {
    // 120 tokens a call: three fit in 360; the third goes out tool-less naming the pool.
    let (pool, server, gw) = five_calls_in_a_pool(360);
    let main: Vec<Value> = server.main_requests().into_iter().map(|r| r.body).collect();
    assert_eq!(main.len(), 3, "the upstream saw three calls");
    assert_eq!(main[2]["tool_choice"], json!({"type": "none"}));
    assert!(
        main[2]
            .to_string()
            .contains("the shared budget `p` is spent")
    );
    assert_eq!(gw.reason(), Some(Budget::Tokens));
    assert_eq!(gw.pool().as_deref(), Some("p"));
    assert_eq!((gw.forwarded(), gw.refused()), (3, 2));
    gw.stop();
    let s = pool.state.lock().unwrap();
    assert_eq!(
        s.reserves,
        [1, 2, 3],
        "nothing reserved after the last call"
    );
    let mut settles = s.settles.clone();
    settles.sort_unstable();
    assert_eq!(
        settles,
        [(1, 120), (2, 120), (3, 120)],
        "each call settled once, to its usage"
    );
    assert!(s.open.is_empty());
    assert_eq!(s.charged, 360);
}

#[test]
fn a_call_the_shared_pool_cannot_pay_is_answered_by_the_gateway() {
    // After one call of 120, a second (estimated at 120) does not fit in 200.
    let (pool, server, gw) = five_calls_in_a_pool(200);
    assert_eq!(
        server.main_requests().len(),
        1,
        "only the first call reached the model"
    );
    assert_eq!(gw.reason(), Some(Budget::Tokens));
    assert_eq!(gw.pool().as_deref(), Some("p"));
    assert!(!gw.wrapped_up());
    assert_eq!((gw.forwarded(), gw.refused()), (1, 4));
    gw.stop();
    let s = pool.state.lock().unwrap();
    assert_eq!(s.reserves, [1, 2]);
    assert_eq!(s.settles, [(1, 120)], "the refused call reserved nothing");
    assert_eq!(s.charged, 120);
}

/// A main request of each dialect, its path, and where its notice must be found.
fn dialect_bodies() -> Vec<(Dialect, &'static str, Value)> {
    vec![
        (
            Dialect::AnthropicMessages,
            "/v1/messages",
            json!({"model": "claude-x", "max_tokens": 100, "stream": true, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok",
                        "cache_control": {"type": "ephemeral"}}]}]}),
        ),
        (
            Dialect::OpenAiResponses,
            "/v1/responses",
            json!({"model": "gpt-x", "stream": true,
                "tools": [{"type": "function", "name": "exec_command"}],
                "input": [{"type": "message", "role": "user", "content": "hi"}]}),
        ),
        (
            Dialect::Gemini,
            "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
            json!({"tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}],
                "contents": [{"role": "user", "parts": [{"text": "hi"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "x", "args": {}}}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": "x", "response": {}}}]}]}),
        ),
        (
            Dialect::OpenAiChat,
            "/v1/chat/completions",
            json!({"model": "m", "stream": true, "tools": [{"type": "function", "function": {"name": "bash"}}],
                "messages": [{"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "c", "content": "ok"}]}),
        ),
    ]
}

#[test]
fn staged_notices_reach_the_upstream_once_at_each_threshold_in_every_dialect() {
    for (dialect, rest, body) in dialect_bodies() {
        let server = ModelServer::start(Script::tool_rounds(20)).unwrap();
        let (mut cfg, _) = config(&server.url(), Some(10), Arc::default());
        cfg.dialect = dialect;
        cfg.staged = Staged {
            thresholds: vec![0.5, 0.8],
            deadline: None,
        };
        let gw = Gateway::start(cfg).unwrap();
        let p = path(&gw, rest);
        for _ in 0..9 {
            let (status, _) = send(gw.addr(), "POST", &p, &[], &body.to_string());
            assert_eq!(status, 200, "{dialect}");
        }
        let main = server.main_requests();
        let counts: Vec<usize> = main.iter().map(|r| r.notices).collect();
        assert_eq!(counts, [0, 0, 0, 0, 0, 1, 0, 0, 1], "{dialect}");
        let texts: Vec<String> = main.iter().map(|r| r.body.to_string()).collect();
        assert!(
            texts[5].contains("system notice: 5 of 10 steps left."),
            "{dialect}: {}",
            texts[5]
        );
        assert!(texts[8].contains("system notice: 2 of 10 steps left."));
        assert!(
            main.iter().all(|r| !r.tools_disabled),
            "{dialect}: a notice leaves the tools on"
        );
        if dialect == Dialect::AnthropicMessages {
            // The notice is its own text after the conversation, outside any cached prefix.
            let last = main[5].body["messages"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .clone();
            let block = last["content"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(block["type"], "text");
            assert!(block.get("cache_control").is_none(), "{block}");
        }
        let sent = gw.notices();
        let seen: Vec<(NoticeLimit, f64, u64, u64)> = sent
            .iter()
            .map(|n| (n.limit, n.threshold, n.at_step, n.model_call))
            .collect();
        assert_eq!(
            seen,
            [
                (NoticeLimit::Steps, 0.5, 5, 6),
                (NoticeLimit::Steps, 0.8, 8, 9)
            ],
            "{dialect}"
        );
        // The budget's last call carries the wrap-up notice alone.
        send(gw.addr(), "POST", &p, &[], &body.to_string());
        let main = server.main_requests();
        assert!(main[9].tools_disabled && main[9].notices == 1, "{dialect}");
        assert!(
            !main[9].body.to_string().contains("steps left"),
            "{dialect}"
        );
        assert_eq!(gw.notices().len(), 2);
    }
}

#[test]
fn a_staged_notice_and_a_pushed_one_share_the_call_as_one_text() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, _) = config(&server.url(), Some(4), Arc::default());
    cfg.staged = Staged {
        thresholds: vec![0.5],
        deadline: None,
    };
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    send(gw.addr(), "POST", &p, &[], &anthropic(0, true));
    send(gw.addr(), "POST", &p, &[], &anthropic(1, true));
    gw.push_notice("system notice: you have called Bash with the same arguments 3 times");
    send(gw.addr(), "POST", &p, &[], &anthropic(2, true));
    let main = server.main_requests();
    assert_eq!(main[2].notices, 1, "one text");
    let body = main[2].body.to_string();
    assert!(
        body.contains("same arguments 3 times\\nsystem notice: 2 of 4 steps left."),
        "{body}"
    );
}

#[test]
fn a_time_notice_goes_out_once_the_deadline_is_half_spent() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, _) = config(&server.url(), None, Arc::default());
    cfg.staged = Staged {
        thresholds: vec![0.5],
        deadline: Some(Deadline {
            started: Instant::now() - Duration::from_secs(400),
            timeout: Duration::from_secs(600),
        }),
    };
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    send(gw.addr(), "POST", &p, &[], &anthropic(0, true));
    send(gw.addr(), "POST", &p, &[], &anthropic(1, true));
    let main = server.main_requests();
    assert!(
        main[0]
            .body
            .to_string()
            .contains("system notice: about 3 minutes left."),
        "{}",
        main[0].body
    );
    assert_eq!(main[1].notices, 0, "never repeated");
    assert_eq!(gw.notices()[0].limit, NoticeLimit::Time);
}

/// A pool that says how much of it is left, counting each reservation as 100 tokens of 1000.
#[derive(Default)]
struct TellingPool {
    reserved: std::sync::atomic::AtomicU64,
}

impl SharedBudget for TellingPool {
    fn reserve(&self, _: u64, _: CallSpend, _: CallSpend) -> Reservation {
        self.reserved
            .fetch_add(100, std::sync::atomic::Ordering::SeqCst);
        Reservation::Go
    }

    fn settle(&self, _: u64, _: CallSpend) {}

    fn left(&self) -> Option<PoolLeft> {
        let spent = self.reserved.load(std::sync::atomic::Ordering::SeqCst);
        Some(PoolLeft {
            pool: "team".into(),
            budget: Budget::Tokens,
            left: 1000.0 - spent as f64,
            cap: 1000.0,
        })
    }
}

#[test]
fn a_pool_share_is_told_as_the_pool_answers_the_reservation() {
    let server = ModelServer::start(Script::tool_rounds(12)).unwrap();
    let (mut cfg, _) = config(&server.url(), None, Arc::default());
    cfg.staged = Staged {
        thresholds: vec![0.5],
        deadline: None,
    };
    cfg.shared_budget = Some(Arc::new(TellingPool::default()));
    let gw = Gateway::start(cfg).unwrap();
    let p = path(&gw, "/v1/messages");
    for round in 0..6 {
        send(gw.addr(), "POST", &p, &[], &anthropic(round, true));
    }
    let counts: Vec<usize> = server.main_requests().iter().map(|r| r.notices).collect();
    assert_eq!(
        counts,
        [0, 0, 0, 0, 1, 0],
        "the 5th reservation spends half"
    );
    let body = server.main_requests()[4].body.to_string();
    assert!(
        body.contains("500 of 1000 tokens left in the shared budget `team`"),
        "{body}"
    );
    assert_eq!(gw.notices()[0].limit, NoticeLimit::Pool);
}
