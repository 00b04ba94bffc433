//! `gateway`: the model gateway's added latency to first byte on loopback.
//!
//! An upstream of our own (std threads, one per connection, keep-alive, `TCP_NODELAY`) answers
//! every POST with an Anthropic-style SSE reply whose head and first event go out in one write
//! as soon as the request body is in. One keep-alive client connection talks to it directly and
//! another through a [`Gateway`] in front of it (Anthropic Messages, no budget, no notices, so
//! nothing is rewritten). Each exchange is timed from the start of the request's write to the
//! first byte of the reply; the whole reply is read before the next request. Direct and gateway
//! exchanges alternate (in either order, pair by pair), so machine noise falls on both alike.
//!
//! The gateway path has two more thread wake-ups each way (client → gateway → upstream and
//! back); on a small VM a wake-up on the other vCPU can cost 0.1 ms or more and makes most of
//! the tail. `taskset -c 0 target/release/stepguard-bench gateway` keeps every thread on one CPU
//! and leaves the gateway's own work.

use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use stepguard_gateway::{Dialect, Gateway, GatewayConfig, Pace, Staged};

/// Exchanges per path before measuring (connections, pools, caches and the CPU warm up).
const WARMUP: usize = 200;
/// The size the main request's body is built up to: a conversation some rounds in.
const BODY_TARGET: usize = 20 * 1024;

/// The head of a request or a reply, as far as framing goes.
struct Head {
    first_line: String,
    content_length: Option<u64>,
    chunked: bool,
    content_type: String,
}

/// Reads a message head; `Ok(None)` when the peer closed before sending anything.
fn read_head(r: &mut BufReader<TcpStream>) -> io::Result<Option<Head>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut head = Head {
        first_line: line.trim_end().to_owned(),
        content_length: None,
        chunked: false,
        content_type: String::new(),
    };
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok(Some(head));
        }
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                head.content_length = Some(value.parse().map_err(io::Error::other)?);
            }
            "transfer-encoding" => head.chunked = value.eq_ignore_ascii_case("chunked"),
            "content-type" => head.content_type = value.to_owned(),
            _ => {}
        }
    }
}

/// Reads exactly `n` bytes and drops them.
fn skip(r: &mut BufReader<TcpStream>, n: u64) -> io::Result<()> {
    if io::copy(&mut r.by_ref().take(n), &mut io::sink())? != n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Reads a message body as its head frames it; returns its length (de-chunked).
fn read_body(r: &mut BufReader<TcpStream>, head: &Head) -> io::Result<u64> {
    if head.chunked {
        let mut total = 0;
        let mut line = String::new();
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = line.trim_end().split(';').next().unwrap_or("");
            let size = u64::from_str_radix(size.trim(), 16).map_err(io::Error::other)?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    line.clear();
                    if r.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                        return Ok(total);
                    }
                }
            }
            skip(r, size + 2)?;
            total += size;
        }
    }
    let n = head.content_length.unwrap_or(0);
    skip(r, n)?;
    Ok(n)
}

/// An Anthropic Messages SSE reply (a short text, then a tool call), as HTTP/1.1 chunks: the
/// head and first event, then the rest.
fn sse_reply() -> (Vec<u8>, Vec<u8>, u64) {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_bench", "type": "message",
                "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 5200, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", json!({"type": "ping"})),
    ];
    for text in ["Let me run", " the tests", " to see what", " fails."] {
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}}),
        ));
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use",
            "id": "toolu_bench", "name": "Bash", "input": {}}}),
    ));
    for part in ["{\"command\": ", "\"cargo test", " --workspace\"}"] {
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": part}}),
        ));
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 1}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use",
            "stop_sequence": null}, "usage": {"output_tokens": 42}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    let chunk = |e: &str| format!("{:x}\r\n{e}\r\n", e.len());
    let mut first =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
transfer-encoding: chunked\r\nconnection: keep-alive\r\nrequest-id: req_bench\r\n\r\n"
            .to_vec();
    first.extend_from_slice(chunk(&events[0]).as_bytes());
    let mut rest: Vec<u8> = events[1..]
        .iter()
        .flat_map(|e| chunk(e).into_bytes())
        .collect();
    rest.extend_from_slice(b"0\r\n\r\n");
    let body_len = events.iter().map(|e| e.len() as u64).sum();
    (first, rest, body_len)
}

/// What the upstream has seen.
#[derive(Default)]
struct Seen {
    connections: AtomicU64,
    requests: AtomicU64,
}

/// Starts the upstream: a thread per connection, requests answered in turn until the peer
/// closes. Its threads are detached and end with the process.
fn upstream() -> anyhow::Result<(SocketAddr, Arc<Seen>, u64)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    let (first, rest, body_len) = sse_reply();
    let reply = Arc::new((first, rest));
    let seen = Arc::new(Seen::default());
    let counts = Arc::clone(&seen);
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                counts.connections.fetch_add(1, Ordering::Relaxed);
                let reply = Arc::clone(&reply);
                let counts = Arc::clone(&counts);
                let _ = std::thread::Builder::new()
                    .name("bench-upstream-conn".into())
                    .spawn(move || {
                        let _ = serve(stream, &reply.0, &reply.1, &counts);
                    });
            }
        })?;
    Ok((addr, seen, body_len))
}

fn serve(stream: TcpStream, first: &[u8], rest: &[u8], seen: &Seen) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut r = BufReader::with_capacity(64 << 10, stream);
    while let Some(head) = read_head(&mut r)? {
        read_body(&mut r, &head)?;
        seen.requests.fetch_add(1, Ordering::Relaxed);
        let w = r.get_mut();
        w.write_all(first)?;
        w.write_all(rest)?;
    }
    Ok(())
}

/// A main request of Claude Code some rounds into a task: a system prompt, six tools offered,
/// and tool rounds until the body reaches `target` bytes.
fn main_request(target: usize) -> String {
    let schema = |props: Value, required: &[&str]| {
        json!({"type": "object", "properties": props, "required": required,
            "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"})
    };
    let s = |d: &str| json!({"type": "string", "description": d});
    let tools = json!([
        {"name": "Bash", "description": "Executes a given bash command in a persistent shell \
            session with optional timeout, ensuring proper handling and security measures.",
         "input_schema": schema(json!({"command": s("The command to execute"),
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            "description": s("Clear, concise description of what this command does")}),
            &["command"])},
        {"name": "Read", "description": "Reads a file from the local filesystem.",
         "input_schema": schema(json!({"file_path": s("The absolute path to the file to read"),
            "offset": {"type": "number"}, "limit": {"type": "number"}}), &["file_path"])},
        {"name": "Edit", "description": "Performs exact string replacements in files.",
         "input_schema": schema(json!({"file_path": s("The absolute path to the file to modify"),
            "old_string": s("The text to replace"), "new_string": s("The text to replace it with"),
            "replace_all": {"type": "boolean", "default": false}}),
            &["file_path", "old_string", "new_string"])},
        {"name": "Write", "description": "Writes a file to the local filesystem.",
         "input_schema": schema(json!({"file_path": s("The absolute path to the file to write"),
            "content": s("The content to write to the file")}), &["file_path", "content"])},
        {"name": "Glob", "description": "Fast file pattern matching tool.",
         "input_schema": schema(json!({"pattern": s("The glob pattern to match files against"),
            "path": s("The directory to search in")}), &["pattern"])},
        {"name": "Grep", "description": "A powerful search tool built on ripgrep.",
         "input_schema": schema(json!({"pattern": s("The regular expression pattern"),
            "path": s("File or directory to search in"), "glob": s("Glob pattern to filter files"),
            "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]}}),
            &["pattern"])},
    ]);
    let system = json!([
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": "You are an interactive CLI tool that helps users with software \
            engineering tasks. Use the instructions below and the tools available to you to \
            assist the user. ".repeat(12), "cache_control": {"type": "ephemeral"}},
    ]);
    let mut messages = vec![json!({"role": "user", "content": [{"type": "text",
        "text": "The tests in crates/store fail after the schema change; find out why and fix \
            them. Run the whole workspace's tests when done."}]})];
    let output: String = (0..12)
        .map(|i| {
            format!(
                "test store::tests::migration_{i:02}_keeps_rows ... ok\n\
                 src/store.rs:{}: warning: unused variable `row_{i}`\n",
                100 + i * 7
            )
        })
        .collect();
    let mut body = String::new();
    for round in 1.. {
        let id = format!("toolu_{round:04}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Round {round}: let me look at the test output.")},
            {"type": "tool_use", "id": id, "name": "Bash",
             "input": {"command": "cargo test -p stepguard-store 2>&1 | tail -40",
                       "description": "Run the store tests"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}));
        body = json!({"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": true,
            "system": system, "tools": tools, "messages": messages,
            "metadata": {"user_id": "user_bench_session_0000"}})
        .to_string();
        if body.len() >= target {
            break;
        }
    }
    body
}

/// A keep-alive client connection.
struct Client {
    r: BufReader<TcpStream>,
    request: Vec<u8>,
    label: &'static str,
}

impl Client {
    fn connect(
        addr: SocketAddr,
        path: &str,
        body: &str,
        label: &'static str,
    ) -> anyhow::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             accept: application/json\r\nanthropic-version: 2023-06-01\r\n\
             anthropic-beta: claude-code-20250219,interleaved-thinking-2025-05-14\r\n\
             x-api-key: sk-ant-bench-not-a-key\r\nuser-agent: claude-cli/2.0.0 (external, cli)\r\n\
             x-stainless-lang: js\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body.as_bytes());
        Ok(Client {
            r: BufReader::with_capacity(64 << 10, stream),
            request,
            label,
        })
    }

    /// One exchange: the time from the start of the write to the reply's first byte; the whole
    /// reply is read and checked (200, SSE, `body_len` bytes).
    fn exchange(&mut self, body_len: u64) -> anyhow::Result<Duration> {
        if !self.r.buffer().is_empty() {
            bail!("{}: bytes left over from the previous reply", self.label);
        }
        let start = Instant::now();
        self.r.get_mut().write_all(&self.request)?;
        if self.r.fill_buf()?.is_empty() {
            bail!("{}: the connection closed", self.label);
        }
        let first_byte = start.elapsed();
        let head = read_head(&mut self.r)?.context("no reply")?;
        let got = read_body(&mut self.r, &head)?;
        if !head.first_line.starts_with("HTTP/1.1 200 ")
            || !head.content_type.starts_with("text/event-stream")
            || got != body_len
        {
            bail!(
                "{}: unexpected reply `{}` ({}, {got} of {body_len} bytes)",
                self.label,
                head.first_line,
                head.content_type
            );
        }
        Ok(first_byte)
    }
}

pub(crate) fn run(requests: usize) -> anyhow::Result<()> {
    if requests == 0 {
        bail!("--requests must be at least 1");
    }
    let (up, seen, reply_len) = upstream()?;
    let gateway = Gateway::start(GatewayConfig {
        dialect: Dialect::AnthropicMessages,
        upstream: format!("http://{up}"),
        pace: Pace {
            limit: None,
            steps: Arc::default(),
            reply_cost: 1,
            count_requests: true,
            max_tokens: None,
            max_cost_usd: None,
            price: None,
        },
        notices: false,
        staged: Staged::default(),
        record_requests: None,
        on_event: Box::new(|_| {}),
        connect_timeout: Duration::from_secs(5),
        body_memory: stepguard_gateway::DEFAULT_BODY_MEMORY,
        api_keys: Vec::new(),
        shared_budget: None,
    })?;
    // The URL's path is the run's token.
    let token = gateway
        .url()
        .rsplit_once('/')
        .context("a gateway URL with a token")?
        .1;
    let body = main_request(BODY_TARGET);
    let path = "/v1/messages?beta=true";
    let mut clients = [
        Client::connect(up, path, &body, "direct")?,
        Client::connect(gateway.addr(), &format!("/{token}{path}"), &body, "gateway")?,
    ];
    let mut samples = [Vec::with_capacity(requests), Vec::with_capacity(requests)];
    for i in 0..WARMUP + requests {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for c in order {
            let t = clients[c].exchange(reply_len)?;
            if i >= WARMUP {
                samples[c].push(t);
            }
        }
    }
    let total = (WARMUP + requests) as u64;
    if gateway.forwarded() != total || seen.requests.load(Ordering::Relaxed) != 2 * total {
        bail!(
            "miscounted: the gateway forwarded {} main requests and the upstream got {}, for {total} a path",
            gateway.forwarded(),
            seen.requests.load(Ordering::Relaxed)
        );
    }
    drop(clients);
    gateway.stop();

    // Paired differences: each gateway exchange against the direct one next to it.
    let mut paired: Vec<f64> = samples[1]
        .iter()
        .zip(&samples[0])
        .map(|(via, direct)| via.as_secs_f64() - direct.as_secs_f64())
        .collect();
    paired.sort_by(f64::total_cmp);
    for s in &mut samples {
        s.sort();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let [direct, via] = &samples;
    println!(
        "time to first byte on loopback, request written -> first reply byte read; {requests} \
         requests a path after {WARMUP} warm-up, alternating, keep-alive, TCP_NODELAY"
    );
    println!(
        "main request: Anthropic Messages, stream, 6 tools, {} B body; reply: SSE, {reply_len} B \
         chunked, head and first event in one write; upstream connections {}",
        body.len(),
        seen.connections.load(Ordering::Relaxed)
    );
    for (label, s) in [("direct", direct), ("via gateway", via)] {
        println!(
            "{label:<12} median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            ms(crate::quantile(s, 0.5)),
            ms(crate::quantile(s, 0.9)),
            ms(crate::quantile(s, 0.99)),
            ms(crate::quantile(s, 1.0)),
        );
    }
    let added = |q: f64| ms(crate::quantile(via, q)) - ms(crate::quantile(direct, q));
    let pair = |q: f64| paired[((paired.len() as f64 - 1.0) * q).round() as usize] * 1000.0;
    println!(
        "added        p50 {:+.3} ms, p99 {:+.3} ms (via - direct); paired differences: median \
         {:+.3} ms, p99 {:+.3} ms; goal: p99 added < 1 ms",
        added(0.5),
        added(0.99),
        pair(0.5),
        pair(0.99),
    );
    Ok(())
}
