//! A scripted model server on 127.0.0.1 for end-to-end tests of the real agent CLIs.
//!
//! It speaks the four wire dialects the CLIs use (Anthropic Messages, OpenAI Responses, Gemini
//! `generateContent`/`streamGenerateContent`, OpenAI chat completions), streamed or whole, and
//! follows a [`Script`]: some rounds of shell tool calls, then a final answer, or a fault from a
//! given round on. Which round a request is in is read from the request itself (the tool results
//! the client sent back), so client retries and side requests (titles, routing) never shift the
//! script; tool-less requests are side requests and get a short text. Every request is recorded
//! for assertions. Test support only: it is not part of the `stepguard` binary. To watch a CLI's
//! requests by hand: `cargo run -p stepguard-modelserver --example serve -- 3` prints the URL to
//! point the CLI at, then one line per request.
//!
//! ```
//! use stepguard_modelserver::{ModelServer, Script};
//! // Three rounds of `echo round R call 1`; `Script::same_call(30, "ls")` would be a model
//! // stuck calling `ls`.
//! let server = ModelServer::start(Script::tool_rounds(3)).unwrap();
//! assert!(server.url().starts_with("http://127.0.0.1:"));
//! assert!(server.requests().is_empty());
//! ```

mod api;
mod http;

use std::io::{self, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use serde_json::Value;

pub use api::{INPUT_TOKENS, OUTPUT_TOKENS};
use http::{Request, Response};

/// The wire dialect of a model request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Anthropic Messages (`POST …/v1/messages`), used by Claude Code.
    AnthropicMessages,
    /// OpenAI Responses (`POST …/v1/responses`), used by Codex.
    OpenAiResponses,
    /// Gemini (`POST …/models/M:generateContent` or `:streamGenerateContent`), used by Gemini CLI.
    Gemini,
    /// OpenAI chat completions (`POST …/v1/chat/completions`), used by OpenCode.
    ChatCompletions,
}

/// How a scripted fault shows itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// HTTP 429 with a `Retry-After` header.
    RateLimited {
        /// The `Retry-After` value, in seconds.
        retry_after_secs: u64,
    },
    /// HTTP 500.
    ServerError,
    /// A streamed reply that starts, then breaks off mid-event without ending.
    BrokenStream,
}

/// A fault served instead of the scripted reply, from one round on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The first round that gets the fault (1-based; `rounds + 1` is the final answer).
    pub from_round: usize,
    /// What the fault looks like.
    pub kind: FaultKind,
    /// How many requests get it in all; `None` means every one from `from_round` on.
    pub times: Option<usize>,
}

impl Fault {
    /// `kind` on every model request from round `from_round` on.
    pub fn persistent(from_round: usize, kind: FaultKind) -> Self {
        Fault {
            from_round,
            kind,
            times: None,
        }
    }

    /// `kind` on the first `times` model requests from round `from_round` on; then the script.
    pub fn times(from_round: usize, kind: FaultKind, times: usize) -> Self {
        Fault {
            from_round,
            kind,
            times: Some(times),
        }
    }
}

/// What the model does: `rounds` rounds of shell tool calls, then a final answer.
#[derive(Clone, Debug)]
pub struct Script {
    rounds: usize,
    parallel: usize,
    text_beside: Option<String>,
    command: String,
    commands_at: Vec<(usize, String)>,
    final_answer: String,
    fault: Option<Fault>,
}

impl Script {
    /// `rounds` replies with one shell call each (`echo round R call C`), then a final answer.
    pub fn tool_rounds(rounds: usize) -> Self {
        Script {
            rounds,
            parallel: 1,
            text_beside: None,
            command: "echo round {round} call {call}".to_owned(),
            commands_at: Vec::new(),
            final_answer: "All rounds done.".to_owned(),
            fault: None,
        }
    }

    /// `rounds` replies asking for the same shell call, `command`, every time (a model stuck in
    /// a loop), then a final answer. Only the call ids differ from round to round; the tool and
    /// its arguments are identical.
    pub fn same_call(rounds: usize, command: &str) -> Self {
        Script::tool_rounds(rounds).command(command)
    }

    /// `calls` parallel shell calls in every tool reply (at least one).
    pub fn parallel_calls(mut self, calls: usize) -> Self {
        self.parallel = calls.max(1);
        self
    }

    /// Text the model says beside its tool calls.
    pub fn text_beside(mut self, text: &str) -> Self {
        self.text_beside = Some(text.to_owned());
        self
    }

    /// The shell command of every call; `{round}` and `{call}` are replaced by their numbers (a
    /// command without them is the same call every round: see [`Script::same_call`]).
    pub fn command(mut self, template: &str) -> Self {
        self.command = template.to_owned();
        self
    }

    /// The shell command of every call in round `round` only.
    pub fn command_at(mut self, round: usize, command: &str) -> Self {
        self.commands_at.push((round, command.to_owned()));
        self
    }

    /// The final answer's text.
    pub fn final_answer(mut self, text: &str) -> Self {
        self.final_answer = text.to_owned();
        self
    }

    /// Serve `fault` instead of the script from its round on.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.fault = Some(fault);
        self
    }

    fn command_for(&self, round: usize, call: usize) -> String {
        let template = self
            .commands_at
            .iter()
            .rev()
            .find(|(r, _)| *r == round)
            .map_or(self.command.as_str(), |(_, c)| c.as_str());
        template
            .replace("{round}", &round.to_string())
            .replace("{call}", &call.to_string())
    }
}

/// One tool call the server asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The call id, unique per round and call (`call_r{round}c{call}`).
    pub id: String,
    /// The tool's name as the client offered it.
    pub tool: String,
    /// The shell command it runs.
    pub command: String,
    /// The tool arguments as sent.
    pub args: Value,
}

/// How the server answered a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// Round `round` of the script: these tool calls.
    ToolCalls {
        /// The 1-based round.
        round: usize,
        /// The calls.
        calls: Vec<Call>,
    },
    /// The final answer.
    Final,
    /// A request that offered no tools (a title, routing or other side request): a short text.
    Side,
    /// A scripted fault.
    Fault(FaultKind),
    /// `HEAD` (Claude Code pre-connects with `HEAD /`): `200` and no body.
    Head,
    /// A path no dialect uses: `404`.
    NotFound,
    /// A request the server could not understand: `400`/`415` with this reason.
    Rejected(String),
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Position in arrival order, from 0.
    pub seq: usize,
    /// When its head arrived.
    pub received: Instant,
    /// HTTP method.
    pub method: String,
    /// Request target, query included.
    pub target: String,
    /// Its dialect, for model requests.
    pub api: Option<Api>,
    /// Whether it asked for a streamed reply.
    pub stream: bool,
    /// Tool results the client had sent back so far.
    pub tool_results: usize,
    /// The tools it offered.
    pub tools: Vec<String>,
    /// The parsed JSON body (`Null` when there was none).
    pub body: Value,
    /// The answer.
    pub reply: Reply,
}

impl RecordedRequest {
    /// The round this request was served, for tool-call replies.
    pub fn round(&self) -> Option<usize> {
        match self.reply {
            Reply::ToolCalls { round, .. } => Some(round),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    requests: Vec<RecordedRequest>,
    faults_served: usize,
}

#[derive(Debug)]
struct Shared {
    script: Script,
    state: Mutex<State>,
    stopping: AtomicBool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread must not hide what was recorded.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running scripted model server; stops when dropped.
#[derive(Debug)]
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl ModelServer {
    /// Starts a server on 127.0.0.1 at a port the OS chooses.
    pub fn start(script: Script) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            script,
            state: Mutex::default(),
            stopping: AtomicBool::new(false),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("modelserver-accept".into())
                .spawn(move || accept_loop(&listener, &shared))?
        };
        Ok(ModelServer {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.state().requests.clone()
    }

    /// Model requests only (no `HEAD`, no unknown paths).
    pub fn model_requests(&self) -> Vec<RecordedRequest> {
        let mut requests = self.requests();
        requests.retain(|r| r.api.is_some());
        requests
    }

    /// The highest round served with tool calls (0 when none was).
    pub fn last_round_served(&self) -> usize {
        self.shared
            .state()
            .requests
            .iter()
            .filter_map(RecordedRequest::round)
            .max()
            .unwrap_or(0)
    }

    /// The most tool results any request carried back.
    pub fn max_tool_results_seen(&self) -> usize {
        let state = self.shared.state();
        state
            .requests
            .iter()
            .map(|r| r.tool_results)
            .max()
            .unwrap_or(0)
    }

    /// How many times the final answer was served.
    pub fn finals_served(&self) -> usize {
        self.count(|r| r.reply == Reply::Final)
    }

    /// How many requests match `pred`.
    pub fn count(&self, pred: impl Fn(&RecordedRequest) -> bool) -> usize {
        self.shared
            .state()
            .requests
            .iter()
            .filter(|r| pred(r))
            .count()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the acceptor so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let shared = Arc::clone(shared);
        // Connection threads are detached: a client that keeps a connection open must not keep
        // the server (or a test) from finishing.
        let _ = std::thread::Builder::new()
            .name("modelserver-conn".into())
            .spawn(move || {
                let _ = serve_connection(stream, &shared);
            });
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let Some(request) = http::read_request(&mut reader)? else {
        return Ok(());
    };
    let received = Instant::now();
    let (record, response) = answer(&request, shared);
    let head_only = request.method == "HEAD";
    {
        let mut state = shared.state();
        let seq = state.requests.len();
        state.requests.push(RecordedRequest {
            seq,
            received,
            ..record
        });
    }
    http::write_response(&mut writer, &response, head_only)
}

/// Decides the reply to `request` and renders it.
fn answer(request: &Request, shared: &Shared) -> (RecordedRequest, Response) {
    let mut record = RecordedRequest {
        seq: 0,
        received: Instant::now(),
        method: request.method.clone(),
        target: request.target.clone(),
        api: None,
        stream: false,
        tool_results: 0,
        tools: Vec::new(),
        body: Value::Null,
        reply: Reply::NotFound,
    };
    if request.method == "HEAD" {
        record.reply = Reply::Head;
        return (record, Response::json(200, &Value::Null));
    }
    let Some(api) = api::route(request) else {
        let body = serde_json::json!({"error": {"message": format!("no such endpoint: {} {}", request.method, request.path())}});
        return (record, Response::json(404, &body));
    };
    record.api = Some(api);
    if let Some(encoding) = request.header("content-encoding") {
        let reason = format!("compressed request bodies ({encoding}) are not supported");
        record.reply = Reply::Rejected(reason.clone());
        let body = serde_json::json!({"error": {"message": reason}});
        return (record, Response::json(415, &body));
    }
    let body: Value = match serde_json::from_slice(&request.body) {
        Ok(body) => body,
        Err(e) => {
            let reason = format!("request body is not JSON: {e}");
            record.reply = Reply::Rejected(reason.clone());
            return (
                record,
                Response::json(400, &serde_json::json!({"error": {"message": reason}})),
            );
        }
    };
    let insp = api::inspect(api, request, &body);
    record.stream = insp.stream;
    record.tool_results = insp.tool_results;
    record.tools = insp.tools.clone();
    record.body = body;

    let script = &shared.script;
    // Counted under the lock, so that concurrent retries see a consistent fault budget.
    let mut state = shared.state();
    let seq = state.requests.len();
    if insp.tools.is_empty() {
        drop(state);
        record.reply = Reply::Side;
        let text = side_text(api, &record.body);
        let response = api::render(api, &insp, &api::Turn::Text(text), seq, false);
        return (record, response);
    }
    let round = insp.tool_results / script.parallel + 1;
    if let Some(fault) = script.fault
        && round >= fault.from_round
        && fault.times.is_none_or(|t| state.faults_served < t)
    {
        state.faults_served += 1;
        drop(state);
        record.reply = Reply::Fault(fault.kind);
        let response = match fault.kind {
            FaultKind::BrokenStream => {
                let turn = api::Turn::Text(script.final_answer.clone());
                api::render(api, &insp, &turn, seq, true)
            }
            kind => api::error(api, kind),
        };
        return (record, response);
    }
    drop(state);
    if round > script.rounds {
        record.reply = Reply::Final;
        let turn = api::Turn::Text(script.final_answer.clone());
        return (record, api::render(api, &insp, &turn, seq, false));
    }
    let Some(tool) = api::shell_tool(&insp.tools) else {
        let reason = format!("no shell tool among the offered tools {:?}", insp.tools);
        record.reply = Reply::Rejected(reason.clone());
        return (
            record,
            Response::json(400, &serde_json::json!({"error": {"message": reason}})),
        );
    };
    let calls: Vec<Call> = (1..=script.parallel)
        .map(|call| {
            let command = script.command_for(round, call);
            Call {
                id: format!("call_r{round}c{call}"),
                tool: tool.to_owned(),
                args: api::shell_args(tool, &command),
                command,
            }
        })
        .collect();
    let turn = api::Turn::Tools {
        text: script.text_beside.clone(),
        calls: calls.clone(),
    };
    record.reply = Reply::ToolCalls { round, calls };
    (record, api::render(api, &insp, &turn, seq, false))
}

/// The text of a side request's reply: when a Gemini request asks for JSON (its model router),
/// a value of the schema it gives; else a short title-like line.
fn side_text(api: Api, body: &Value) -> String {
    let config = body.get("generationConfig");
    let schema = config.and_then(|c| {
        c.get("responseJsonSchema")
            .or_else(|| c.get("responseSchema"))
    });
    match schema {
        Some(schema) if api == Api::Gemini => value_of_schema(schema).to_string(),
        _ => "Scripted side reply".to_owned(),
    }
}

/// A small value that satisfies a JSON schema's types, required properties and enums.
fn value_of_schema(schema: &Value) -> Value {
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("object");
    match ty.to_ascii_lowercase().as_str() {
        "string" => Value::from("scripted"),
        "number" | "integer" => Value::from(1),
        "boolean" => Value::from(false),
        "array" => Value::Array(Vec::new()),
        "null" => Value::Null,
        _ => {
            let mut object = serde_json::Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    object.insert(name.clone(), value_of_schema(prop));
                }
            }
            Value::Object(object)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::{Read, Write};

    use serde_json::json;

    use super::*;

    /// Sends one raw request; returns the status and the (de-chunked) body, and whether the body
    /// ended properly.
    fn send(server: &ModelServer, method: &str, path: &str, body: &str) -> (u16, String, bool) {
        let mut stream = TcpStream::connect(server.addr()).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        if !head.contains("transfer-encoding: chunked") {
            return (status, rest.to_owned(), true);
        }
        let (mut body, mut rest, mut complete) = (String::new(), rest, false);
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 {
                complete = true;
                break;
            }
            if after.len() < size {
                body.push_str(after);
                break;
            }
            body.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        (status, body, complete)
    }

    fn anthropic_body(results: usize, tools: bool, stream: bool) -> String {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for i in 0..results {
            messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "Bash", "input": {}}]}));
            messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": "ok"}]}));
        }
        let tools = if tools {
            json!([{"name": "Read"}, {"name": "Bash"}])
        } else {
            json!([])
        };
        json!({"model": "m", "stream": stream, "messages": messages, "tools": tools}).to_string()
    }

    /// The `data:` payloads of an event stream.
    fn events(body: &str) -> Vec<Value> {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn the_round_follows_the_tool_results_in_the_request() {
        let server = ModelServer::start(Script::tool_rounds(2)).unwrap();
        // Asking twice for the same point of the conversation (a retry) gets the same round.
        for results in [0, 0, 1, 2, 1] {
            let (status, body, _) = send(
                &server,
                "POST",
                "/v1/messages",
                &anthropic_body(results, true, false),
            );
            assert_eq!(status, 200);
            let reply: Value = serde_json::from_str(&body).unwrap();
            if results < 2 {
                assert_eq!(reply["stop_reason"], "tool_use");
                let call = &reply["content"][0];
                assert_eq!(call["name"], "Bash");
                let command = format!("echo round {} call 1", results + 1);
                assert_eq!(call["input"]["command"], command.as_str());
            } else {
                assert_eq!(reply["stop_reason"], "end_turn");
                assert_eq!(reply["content"][0]["text"], "All rounds done.");
            }
        }
        let rounds: Vec<Option<usize>> = server.requests().iter().map(|r| r.round()).collect();
        assert_eq!(rounds, [Some(1), Some(1), Some(2), None, Some(2)]);
        assert_eq!(server.finals_served(), 1);
        assert_eq!(server.last_round_served(), 2);
        assert_eq!(server.max_tool_results_seen(), 2);
    }

    #[test]
    fn a_request_without_tools_is_a_side_request_and_does_not_move_the_script() {
        let server = ModelServer::start(Script::tool_rounds(1)).unwrap();
        let (_, body, _) = send(
            &server,
            "POST",
            "/v1/messages",
            &anthropic_body(0, false, false),
        );
        let reply: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(reply["content"][0]["text"], "Scripted side reply");
        let (_, body, _) = send(
            &server,
            "POST",
            "/v1/messages",
            &anthropic_body(0, true, false),
        );
        assert!(body.contains("tool_use"));
        let replies: Vec<Reply> = server.requests().into_iter().map(|r| r.reply).collect();
        assert!(matches!(
            replies[..],
            [Reply::Side, Reply::ToolCalls { round: 1, .. }]
        ));
    }

    #[test]
    fn parallel_calls_and_text_stream_in_every_dialect() {
        let script = Script::tool_rounds(3)
            .parallel_calls(2)
            .text_beside("Working on it.");
        let server = ModelServer::start(script).unwrap();
        // Two results back with two calls per reply: round 2.
        let (status, body, complete) = send(
            &server,
            "POST",
            "/v1/messages",
            &anthropic_body(2, true, true),
        );
        assert_eq!((status, complete), (200, true));
        let ev = events(&body);
        assert_eq!(ev[0]["type"], "message_start");
        assert_eq!(ev.last().unwrap()["type"], "message_stop");
        let starts: Vec<&Value> = ev
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| &e["content_block"])
            .collect();
        assert_eq!(starts[0]["type"], "text");
        let ids: Vec<&str> = starts[1..]
            .iter()
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["call_r2c1", "call_r2c2"]);

        let responses = json!({"model": "gpt", "stream": true, "tools": [{"type": "function", "name": "exec_command"}],
            "input": [{"type": "message"}, {"type": "function_call_output"}, {"type": "function_call_output"}]});
        let (_, body, complete) = send(&server, "POST", "/v1/responses", &responses.to_string());
        assert!(complete);
        let ev = events(&body);
        let items: Vec<&Value> = ev
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| &e["item"])
            .collect();
        assert_eq!(items[0]["type"], "message");
        assert_eq!(items[1]["name"], "exec_command");
        let args: Value = serde_json::from_str(items[2]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"cmd": "echo round 2 call 2"}));
        assert_eq!(ev.last().unwrap()["type"], "response.completed");

        let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "go"}]}],
            "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}]});
        let path = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse";
        let (_, body, _) = send(&server, "POST", path, &gemini.to_string());
        let ev = events(&body);
        let parts = &ev.last().unwrap()["candidates"][0]["content"]["parts"];
        assert_eq!(parts[0]["text"], "Working on it.");
        assert_eq!(parts[2]["functionCall"]["name"], "run_shell_command");
        assert_eq!(ev.last().unwrap()["modelVersion"], "gemini-x");

        let chat = json!({"model": "m", "stream": true, "tools": [{"type": "function", "function": {"name": "bash"}}],
            "messages": [{"role": "user", "content": "go"}, {"role": "tool"}, {"role": "tool"}, {"role": "tool"}, {"role": "tool"}]});
        let (_, body, _) = send(&server, "POST", "/v1/chat/completions", &chat.to_string());
        assert!(body.trim_end().ends_with("data: [DONE]"));
        let ev = events(&body);
        let calls: Vec<&Value> = ev
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
            .collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["id"], "call_r3c2");
        let finish: Vec<&Value> = ev
            .iter()
            .map(|e| &e["choices"][0]["finish_reason"])
            .collect();
        assert!(finish.contains(&&json!("tool_calls")));

        let apis: Vec<Option<Api>> = server.requests().iter().map(|r| r.api).collect();
        use Api::*;
        assert_eq!(
            apis,
            [
                Some(AnthropicMessages),
                Some(OpenAiResponses),
                Some(Gemini),
                Some(ChatCompletions)
            ]
        );
        let rounds: Vec<Option<usize>> = server.requests().iter().map(|r| r.round()).collect();
        assert_eq!(rounds, [Some(2), Some(2), Some(1), Some(3)]);
    }

    #[test]
    fn the_same_call_every_round_differs_only_in_its_id() {
        let server = ModelServer::start(Script::same_call(30, "cat status.txt")).unwrap();
        let mut inputs = Vec::new();
        for results in [0, 1, 2, 5] {
            let (_, body, _) = send(
                &server,
                "POST",
                "/v1/messages",
                &anthropic_body(results, true, false),
            );
            let reply: Value = serde_json::from_str(&body).unwrap();
            let call = &reply["content"][0];
            assert_eq!(call["id"], format!("call_r{}c1", results + 1).as_str());
            inputs.push((call["name"].clone(), call["input"].clone()));
        }
        assert!(inputs.iter().all(|i| *i == inputs[0]), "{inputs:?}");
        assert_eq!(inputs[0].1["command"], "cat status.txt");
        let calls: Vec<Call> = server
            .requests()
            .into_iter()
            .flat_map(|r| match r.reply {
                Reply::ToolCalls { calls, .. } => calls,
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(calls.len(), 4);
        assert!(
            calls
                .iter()
                .all(|c| c.args == calls[0].args && c.command == "cat status.txt")
        );
        assert_eq!(server.last_round_served(), 6);
    }

    #[test]
    fn faults_start_at_their_round_and_stop_after_their_count() {
        let kind = FaultKind::RateLimited {
            retry_after_secs: 7,
        };
        let server =
            ModelServer::start(Script::tool_rounds(3).fault(Fault::times(2, kind, 2))).unwrap();
        let mut seen = Vec::new();
        for results in [0, 1, 1, 1, 2] {
            let (status, body, _) = send(
                &server,
                "POST",
                "/v1/messages",
                &anthropic_body(results, true, false),
            );
            seen.push(status);
            if status == 429 {
                let error: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(error["error"]["type"], "rate_limit_error");
            }
        }
        assert_eq!(seen, [200, 429, 429, 200, 200]);
        assert_eq!(server.count(|r| r.reply == Reply::Fault(kind)), 2);

        let server = ModelServer::start(
            Script::tool_rounds(1).fault(Fault::persistent(1, FaultKind::ServerError)),
        )
        .unwrap();
        let gemini = json!({"contents": [], "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}]});
        for _ in 0..3 {
            let (status, body, _) = send(
                &server,
                "POST",
                "/v1beta/models/g:generateContent",
                &gemini.to_string(),
            );
            assert_eq!(status, 500);
            assert!(body.contains("INTERNAL"));
        }
    }

    #[test]
    fn a_broken_stream_starts_then_ends_without_its_last_chunk() {
        let server = ModelServer::start(
            Script::tool_rounds(1).fault(Fault::persistent(1, FaultKind::BrokenStream)),
        )
        .unwrap();
        let (status, body, complete) = send(
            &server,
            "POST",
            "/v1/messages",
            &anthropic_body(0, true, true),
        );
        assert_eq!(status, 200);
        assert!(!complete, "the chunked body must not end properly");
        assert!(body.starts_with("event: message_start"));
        assert!(!body.contains("message_stop"));
    }

    #[test]
    fn other_requests_are_answered_and_recorded() {
        let server = ModelServer::start(Script::tool_rounds(1)).unwrap();
        assert_eq!(send(&server, "HEAD", "/", "").0, 200);
        assert_eq!(send(&server, "GET", "/v1/models", "").0, 404);
        let (status, body, _) = send(&server, "POST", "/v1/messages", "{not json");
        assert_eq!(status, 400);
        assert!(body.contains("not JSON"));
        let (status, body, _) = send(
            &server,
            "POST",
            "/v1/chat/completions",
            &json!({"tools": [{"function": {"name": "python"}}], "messages": []}).to_string(),
        );
        assert_eq!(status, 400);
        assert!(body.contains("no shell tool"), "{body}");
        let replies: Vec<Reply> = server.requests().into_iter().map(|r| r.reply).collect();
        assert!(matches!(
            &replies[..],
            [
                Reply::Head,
                Reply::NotFound,
                Reply::Rejected(_),
                Reply::Rejected(_)
            ]
        ));
        assert!(server.model_requests().len() == 2);
    }

    #[test]
    fn chunked_request_bodies_are_read() {
        let server = ModelServer::start(Script::tool_rounds(1)).unwrap();
        let body = anthropic_body(0, true, false);
        let (a, b) = body.split_at(10);
        let mut stream = TcpStream::connect(server.addr()).unwrap();
        write!(
            stream,
            "POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        )
        .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        assert_eq!(server.requests()[0].round(), Some(1));
    }

    #[test]
    fn the_gemini_router_gets_json_of_its_schema() {
        let schema = json!({"type": "OBJECT", "properties": {
            "complexity_reasoning": {"type": "STRING"}, "complexity_score": {"type": "INTEGER"},
            "choice": {"type": "string", "enum": ["flash", "pro"]}}});
        let body = json!({"contents": [], "generationConfig": {"responseJsonSchema": schema}});
        let server = ModelServer::start(Script::tool_rounds(1)).unwrap();
        let (_, reply, _) = send(
            &server,
            "POST",
            "/v1beta/models/lite:generateContent",
            &body.to_string(),
        );
        let reply: Value = serde_json::from_str(&reply).unwrap();
        let text = reply["candidates"][0]["content"]["parts"][0]["text"]
            .as_str()
            .unwrap();
        let routed: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            routed,
            json!({"complexity_reasoning": "scripted", "complexity_score": 1, "choice": "flash"})
        );
    }
}
