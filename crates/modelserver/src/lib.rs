//! A scripted model server on 127.0.0.1 for end-to-end tests of the real agent CLIs.
//!
//! It speaks the four wire dialects the CLIs use (Anthropic Messages, OpenAI Responses, Gemini
//! `generateContent`/`streamGenerateContent`, OpenAI chat completions), streamed or whole, and
//! follows a [`Script`]: some rounds of shell tool calls, then a final answer, or a fault from a
//! given round on. Which round a request is in is read from the request itself (the tool results
//! the client sent back), so client retries and side requests (titles, routing) never shift the
//! script; tool-less requests are side requests and get a short text. A request that offers tools
//! but disables them in its dialect's form (`tool_choice` none, Gemini mode `NONE`, as a gateway
//! sends on a last allowed step) is still a main request of its round, answered with the final
//! answer's text unless the script [ignores tool choice](Script::ignore_tool_choice). Every
//! request is recorded for assertions, with the `system notice: ` texts it carries counted.
//!
//! A final answer can be [padded](Script::final_padding) to a huge streamed reply made on the fly.
//! Connections are kept alive (several sequential requests each) unless the client asks to close;
//! [`ModelServer::start_tls`] serves HTTPS with a throwaway CA. Test support only: it is not part
//! of the `stepguard` binary. To watch a CLI's requests by hand: `cargo run -p
//! stepguard-modelserver --example serve -- 3` prints the URL to point the CLI at, then one line
//! per request.
//!
//! ```
//! use stepguard_modelserver::{ModelServer, Script};
//! // Three rounds of `echo round R call 1`; `Script::same_call(30, "ls")` would be a model
//! // stuck calling `ls`.
//! let server = ModelServer::start(Script::tool_rounds(3)).unwrap();
//! assert!(server.url().starts_with("http://127.0.0.1:"));
//! assert!(server.requests().is_empty());
//! assert!(server.ca_pem().is_none());
//!
//! // Over HTTPS: trust `ca_pem()` (for instance through `SSL_CERT_FILE`).
//! let server = ModelServer::start_tls(Script::tool_rounds(1).final_padding(1 << 20)).unwrap();
//! assert!(server.url().starts_with("https://127.0.0.1:"));
//! assert!(server.ca_pem().unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
//! ```

mod api;
mod http;
mod tls;

use std::io::{self, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use api::{INPUT_TOKENS, OUTPUT_TOKENS};
use http::{Conn, Request, Response};

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
    ignore_tool_choice: bool,
    padding: usize,
    reply_delay: Duration,
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
            ignore_tool_choice: false,
            padding: 0,
            reply_delay: Duration::ZERO,
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

    /// Answer requests that disable tool use like any other main request (with their round's
    /// tool calls): a model that calls a tool anyway.
    pub fn ignore_tool_choice(mut self) -> Self {
        self.ignore_tool_choice = true;
        self
    }

    /// Stream `bytes` more bytes of text after the final answer (and any text answer to a
    /// request that disables tools), in text deltas of about 16 KiB made while writing, so a
    /// reply of any size takes constant memory; whole (unstreamed) replies ignore it.
    pub fn final_padding(mut self, bytes: usize) -> Self {
        self.padding = bytes;
        self
    }

    /// Wait `delay` after reading each request before answering it (requests are recorded at
    /// once), so concurrent calls are truly under way together.
    pub fn reply_delay(mut self, delay: Duration) -> Self {
        self.reply_delay = delay;
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
    /// A main request that disabled tool use before the script's last round was done: the
    /// final answer's text instead of round `round`'s tool calls.
    ToolsDisabled {
        /// The 1-based round the request was in.
        round: usize,
    },
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
    /// Its headers as sent, names lowercase (for what credentials reached the server).
    pub headers: Vec<(String, String)>,
    /// Its dialect, for model requests.
    pub api: Option<Api>,
    /// Whether it asked for a streamed reply.
    pub stream: bool,
    /// Tool results the client had sent back so far.
    pub tool_results: usize,
    /// The tools it offered.
    pub tools: Vec<String>,
    /// Whether it disabled tool use in its dialect's form: Anthropic `tool_choice` of type
    /// `none`, OpenAI `tool_choice` `"none"`, Gemini `toolConfig.functionCallingConfig.mode`
    /// `NONE`.
    pub tools_disabled: bool,
    /// How many texts in its conversation (messages, input items, contents; a whole string
    /// content or one text block or part each) start with `system notice: `.
    pub notices: usize,
    /// The parsed JSON body (`Null` when there was none).
    pub body: Value,
    /// The answer.
    pub reply: Reply,
}

impl RecordedRequest {
    /// Whether it offered tools: a main request, not a side one (title, routing).
    pub fn offers_tools(&self) -> bool {
        !self.tools.is_empty()
    }

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
    /// Connections accepted.
    connections: usize,
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
    ca_pem: Option<String>,
}

impl ModelServer {
    /// Starts a server on 127.0.0.1 at a port the OS chooses.
    pub fn start(script: Script) -> io::Result<Self> {
        Self::start_with(script, None)
    }

    /// Starts the same server over HTTPS, with a certificate for `127.0.0.1` and `localhost`
    /// signed by a CA made for it alone (see [`ModelServer::ca_pem`]).
    pub fn start_tls(script: Script) -> io::Result<Self> {
        Self::start_with(script, Some(tls::make()?))
    }

    fn start_with(script: Script, tls: Option<tls::Tls>) -> io::Result<Self> {
        let (config, ca_pem) = match tls {
            Some(tls) => (Some(tls.config), Some(tls.ca_pem)),
            None => (None, None),
        };
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
                .spawn(move || accept_loop(&listener, &shared, config.as_ref()))?
        };
        Ok(ModelServer {
            addr,
            shared,
            acceptor: Some(acceptor),
            ca_pem,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` for [`ModelServer::start_tls`]), no trailing slash.
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The CA certificate (PEM) that the HTTPS server's certificate chains to, for clients to
    /// trust; `None` for a plain HTTP server.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca_pem.clone()
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

    /// Model requests that offered tools, in arrival order: the agent's own steps, without side
    /// requests (titles, routing), whether or not they disabled tool use.
    pub fn main_requests(&self) -> Vec<RecordedRequest> {
        let mut requests = self.requests();
        requests.retain(|r| r.api.is_some() && r.offers_tools());
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

    /// How many times the final answer was served at the script's end ([`Reply::Final`]; text
    /// served early to a request that disabled tools is [`Reply::ToolsDisabled`]).
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

fn accept_loop(
    listener: &TcpListener,
    shared: &Arc<Shared>,
    tls: Option<&Arc<rustls::ServerConfig>>,
) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        shared.state().connections += 1;
        let shared = Arc::clone(shared);
        let tls = tls.map(Arc::clone);
        // Connection threads are detached: a client that keeps a connection open must not keep
        // the server (or a test) from finishing.
        let _ = std::thread::Builder::new()
            .name("modelserver-conn".into())
            .spawn(move || {
                let _ = match tls {
                    Some(config) => tls::accept(&config, stream)
                        .and_then(|stream| serve_connection(stream, &shared)),
                    None => serve_connection(stream, &shared),
                };
            });
    }
}

/// Answers requests on one connection until the client closes it or asks to.
fn serve_connection(stream: impl Conn, shared: &Shared) -> io::Result<()> {
    let mut conn = BufReader::new(stream);
    loop {
        let Some(request) = http::read_request(&mut conn)? else {
            return Ok(());
        };
        // A kept-alive connection outlives its server: answer nothing once it is dropped.
        if shared.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
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
        std::thread::sleep(shared.script.reply_delay);
        let keep_alive = request.keep_alive();
        let open = http::write_response(conn.get_mut(), &response, head_only, keep_alive)?;
        if !open {
            // A stream cut on purpose ends abruptly; a requested close ends cleanly.
            let cut = matches!(
                response,
                Response::Sse {
                    cut_after: Some(_),
                    ..
                }
            );
            conn.get_mut().end(!cut);
            return Ok(());
        }
    }
}

/// Decides the reply to `request` and renders it.
fn answer(request: &Request, shared: &Shared) -> (RecordedRequest, Response) {
    let mut record = RecordedRequest {
        seq: 0,
        received: Instant::now(),
        method: request.method.clone(),
        target: request.target.clone(),
        headers: request
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect(),
        api: None,
        stream: false,
        tool_results: 0,
        tools: Vec::new(),
        tools_disabled: false,
        notices: 0,
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
    record.tools_disabled = insp.tools_disabled;
    record.notices = insp.notices;
    record.body = body;

    let script = &shared.script;
    // Counted under the lock, so that concurrent retries see a consistent fault budget.
    let mut state = shared.state();
    let seq = state.requests.len();
    if insp.tools.is_empty() {
        drop(state);
        record.reply = Reply::Side;
        let text = side_text(api, &record.body);
        let response = api::render(api, &insp, &api::Turn::Text(text), seq, false, 0);
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
                api::render(api, &insp, &turn, seq, true, 0)
            }
            kind => api::error(api, kind),
        };
        return (record, response);
    }
    drop(state);
    let text_only = insp.tools_disabled && !script.ignore_tool_choice;
    if round > script.rounds || text_only {
        record.reply = if round > script.rounds {
            Reply::Final
        } else {
            Reply::ToolsDisabled { round }
        };
        let turn = api::Turn::Text(script.final_answer.clone());
        let response = api::render(api, &insp, &turn, seq, false, script.padding);
        return (record, response);
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
    (record, api::render(api, &insp, &turn, seq, false, 0))
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

    use std::io::{BufRead, Read, Write};

    use serde_json::json;

    use super::*;

    /// Sends one raw request; returns the status and the (de-chunked) body, and whether the body
    /// ended properly.
    fn send(server: &ModelServer, method: &str, path: &str, body: &str) -> (u16, String, bool) {
        send_on(
            TcpStream::connect(server.addr()).unwrap(),
            method,
            path,
            body,
        )
    }

    /// [`send`] on a connection of any kind, asking the server to close it after the reply.
    fn send_on(
        mut stream: impl Read + Write,
        method: &str,
        path: &str,
        body: &str,
    ) -> (u16, String, bool) {
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        stream.flush().unwrap();
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
            "POST /v1/messages HTTP/1.1\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
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

    /// The text of a streamed (`stream`) or whole reply in dialect `api`, deltas concatenated
    /// (the server streams every Responses reply).
    fn reply_text(api: Api, body: &str, stream: bool) -> String {
        if !stream && api != Api::OpenAiResponses {
            let v: Value = serde_json::from_str(body).unwrap();
            let text = match api {
                Api::AnthropicMessages => &v["content"][0]["text"],
                Api::OpenAiResponses => &v["output"][0]["content"][0]["text"],
                Api::Gemini => &v["candidates"][0]["content"]["parts"][0]["text"],
                Api::ChatCompletions => &v["choices"][0]["message"]["content"],
            };
            return text.as_str().unwrap().to_owned();
        }
        let ev = events(body);
        let deltas = ev.iter().flat_map(|e| match api {
            Api::AnthropicMessages if e["delta"]["type"] == "text_delta" => {
                vec![&e["delta"]["text"]]
            }
            Api::OpenAiResponses if e["type"] == "response.output_text.delta" => vec![&e["delta"]],
            Api::Gemini => e["candidates"][0]["content"]["parts"]
                .as_array()
                .map(|p| p.iter().map(|p| &p["text"]).collect())
                .unwrap_or_default(),
            Api::ChatCompletions => vec![&e["choices"][0]["delta"]["content"]],
            _ => Vec::new(),
        });
        let mut text: String = deltas.filter_map(Value::as_str).collect();
        if api == Api::OpenAiResponses && text.is_empty() {
            // Unpadded Responses streams carry their text in the completed item only.
            let done = ev
                .iter()
                .find(|e| e["type"] == "response.output_item.done")
                .unwrap();
            text = done["item"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        text
    }

    /// A request in each dialect after one tool round trip, offering the shell tool, with tool
    /// use disabled in the dialect's form when `disabled`, and the number of notices it carries.
    fn main_request(api: Api, stream: bool, disabled: bool) -> (String, Value, usize) {
        match api {
            Api::AnthropicMessages => {
                let mut body = json!({"model": "m", "stream": stream,
                "tools": [{"name": "Read"}, {"name": "Bash"}],
                "messages": [
                    {"role": "user", "content": "go; system notice: is not at the start"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "system notice: tool output, not a notice"},
                        {"type": "text", "text": "system notice: last step, answer now"}]},
                ]});
                if disabled {
                    body["tool_choice"] = json!({"type": "none"});
                }
                ("/v1/messages?beta=true".to_owned(), body, 1)
            }
            Api::OpenAiResponses => {
                let mut body = json!({"model": "gpt", "stream": stream,
                "tools": [{"type": "function", "name": "exec_command"}],
                "input": [
                    {"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "go"},
                        {"type": "input_text", "text": "system notice: an earlier one"}]},
                    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                    {"role": "user", "content": "system notice: last step, answer now"},
                ]});
                if disabled {
                    body["tool_choice"] = json!("none");
                }
                ("/v1/responses".to_owned(), body, 2)
            }
            Api::Gemini => {
                let mut body = json!({
                "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}],
                "contents": [
                    {"role": "user", "parts": [{"text": "go"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}]},
                    {"role": "user", "parts": [
                        {"functionResponse": {"name": "run_shell_command", "response": {}}},
                        {"text": "system notice: last step, answer now"}]},
                ]});
                if disabled {
                    body["toolConfig"] = json!({"functionCallingConfig": {"mode": "NONE"}});
                }
                let method = if stream {
                    "streamGenerateContent?alt=sse"
                } else {
                    "generateContent"
                };
                (format!("/v1beta/models/gemini-x:{method}"), body, 1)
            }
            Api::ChatCompletions => {
                let mut body = json!({"model": "m", "stream": stream,
                "tools": [{"type": "function", "function": {"name": "bash"}}],
                "messages": [
                    {"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                    {"role": "user", "content": [{"type": "text", "text": "system notice: last step, answer now"}]},
                ]});
                if disabled {
                    body["tool_choice"] = json!("none");
                }
                ("/v1/chat/completions".to_owned(), body, 1)
            }
        }
    }

    const APIS: [Api; 4] = [
        Api::AnthropicMessages,
        Api::OpenAiResponses,
        Api::Gemini,
        Api::ChatCompletions,
    ];

    /// Whether a reply body asks for a tool call, in any dialect.
    fn has_tool_call(body: &str) -> bool {
        [
            "tool_use\"",
            "function_call\"",
            "functionCall",
            "tool_calls",
        ]
        .iter()
        .any(|k| body.contains(k))
    }

    #[test]
    fn a_request_that_disables_tools_is_a_main_request_answered_with_text() {
        let script = Script::tool_rounds(3).final_answer("Stopping here.");
        let server = ModelServer::start(script).unwrap();
        // A side request first: it must not count among the main requests.
        send(
            &server,
            "POST",
            "/v1/messages",
            &anthropic_body(0, false, false),
        );
        let mut expected_notices = Vec::new();
        for api in APIS {
            for stream in [false, true] {
                let (path, body, notices) = main_request(api, stream, true);
                let (status, reply, complete) = send(&server, "POST", &path, &body.to_string());
                assert_eq!((status, complete), (200, true), "{api:?} {reply}");
                assert!(!has_tool_call(&reply), "{api:?} {reply}");
                assert_eq!(reply_text(api, &reply, stream), "Stopping here.", "{api:?}");
                expected_notices.push(notices);
            }
        }
        let main = server.main_requests();
        assert_eq!(main.len(), 8);
        assert!(main.iter().all(|r| r.tools_disabled && r.offers_tools()));
        let notices: Vec<usize> = main.iter().map(|r| r.notices).collect();
        assert_eq!(notices, expected_notices);
        // One tool result back: round 2, as for any main request.
        assert!(
            main.iter()
                .all(|r| r.reply == Reply::ToolsDisabled { round: 2 }),
            "{:?}",
            main.iter().map(|r| &r.reply).collect::<Vec<_>>()
        );
        assert_eq!(server.requests()[0].reply, Reply::Side);
        assert_eq!(server.finals_served(), 0);
        assert_eq!(server.last_round_served(), 0);

        // The same requests with tools enabled get their round's calls, and no notice form is
        // mistaken for a disabled tool choice.
        for api in APIS {
            let (path, body, _) = main_request(api, false, false);
            let (_, reply, _) = send(&server, "POST", &path, &body.to_string());
            assert!(has_tool_call(&reply), "{api:?} {reply}");
        }
        let last = server.main_requests();
        assert!(
            last[8..]
                .iter()
                .all(|r| !r.tools_disabled && r.round() == Some(2))
        );
    }

    #[test]
    fn past_the_last_round_a_request_that_disables_tools_is_the_final_answer() {
        let server = ModelServer::start(Script::tool_rounds(1)).unwrap();
        let (path, body, _) = main_request(Api::ChatCompletions, true, true);
        let (_, reply, _) = send(&server, "POST", &path, &body.to_string());
        assert_eq!(
            reply_text(Api::ChatCompletions, &reply, true),
            "All rounds done."
        );
        assert_eq!(server.finals_served(), 1);
        assert!(server.main_requests()[0].tools_disabled);
    }

    #[test]
    fn a_model_that_ignores_tool_choice_calls_tools_anyway() {
        let server = ModelServer::start(Script::tool_rounds(3).ignore_tool_choice()).unwrap();
        for api in APIS {
            let (path, body, _) = main_request(api, true, true);
            let (status, reply, _) = send(&server, "POST", &path, &body.to_string());
            assert_eq!(status, 200);
            assert!(has_tool_call(&reply), "{api:?} {reply}");
        }
        let main = server.main_requests();
        assert!(
            main.iter()
                .all(|r| r.tools_disabled && r.round() == Some(2))
        );
        assert_eq!(server.last_round_served(), 2);
    }

    #[test]
    fn a_padded_final_answer_streams_its_padding_in_every_dialect() {
        const PAD: usize = 5 << 20;
        let server = ModelServer::start(
            Script::tool_rounds(1)
                .final_answer("Done.")
                .final_padding(PAD),
        )
        .unwrap();
        for api in APIS {
            // The final answer (one result back), and a text answer to a request that disables
            // tools (round 1, no result back yet).
            let (path, body, _) = main_request(api, true, false);
            let (_, reply, complete) = send(&server, "POST", &path, &body.to_string());
            assert!(complete);
            let text = reply_text(api, &reply, true);
            assert_eq!(text.len(), "Done.".len() + PAD, "{api:?}");
            assert!(text.contains("Done."));
            let deltas = events(&reply).len();
            assert!(deltas > PAD / (16 * 1024), "{api:?}: {deltas} events");

            let (path, whole, _) = main_request(api, false, false);
            let (_, reply, _) = send(&server, "POST", &path, &whole.to_string());
            assert_eq!(reply_text(api, &reply, false), "Done.", "{api:?}");

            let (path, mut disabled, _) = main_request(api, true, true);
            // Only the first user turn: round 1.
            for key in ["messages", "input", "contents"] {
                if let Some(items) = disabled.get_mut(key).and_then(Value::as_array_mut) {
                    items.truncate(if api == Api::ChatCompletions { 2 } else { 1 });
                }
            }
            let (_, reply, _) = send(&server, "POST", &path, &disabled.to_string());
            assert_eq!(reply_text(api, &reply, true).len(), 5 + PAD, "{api:?}");
        }
        let replies: Vec<Reply> = server
            .main_requests()
            .into_iter()
            .map(|r| r.reply)
            .collect();
        assert_eq!(
            replies.iter().filter(|r| **r == Reply::Final).count(),
            8,
            "{replies:?}"
        );
        assert_eq!(
            replies
                .iter()
                .filter(|r| **r == Reply::ToolsDisabled { round: 1 })
                .count(),
            4
        );
    }

    #[test]
    fn connections_are_kept_alive_until_the_client_closes() {
        /// Reads one response off `reader`: its head and its (de-chunked) body.
        fn response(reader: &mut impl BufRead) -> (String, String) {
            let mut head = String::new();
            loop {
                let mut line = String::new();
                let n = reader.read_line(&mut line).unwrap();
                assert!(
                    n > 0,
                    "the connection closed inside a response head: {head:?}"
                );
                if line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut body = Vec::new();
            if let Some(len) = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
            {
                body.resize(len.parse().unwrap(), 0);
                reader.read_exact(&mut body).unwrap();
            } else {
                loop {
                    let mut size = String::new();
                    reader.read_line(&mut size).unwrap();
                    let size = usize::from_str_radix(size.trim(), 16).unwrap();
                    let mut chunk = vec![0; size + 2];
                    reader.read_exact(&mut chunk).unwrap();
                    if size == 0 {
                        break;
                    }
                    body.extend_from_slice(&chunk[..size]);
                }
            }
            (head, String::from_utf8(body).unwrap())
        }
        let server = ModelServer::start(Script::tool_rounds(2)).unwrap();
        let stream = TcpStream::connect(server.addr()).unwrap();
        // A reply that never comes fails the test instead of hanging it.
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut post = |body: &str, close: bool| {
            let connection = if close { "connection: close\r\n" } else { "" };
            write!(
                writer,
                "POST /v1/messages HTTP/1.1\r\nhost: x\r\n{connection}content-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        };
        post(&anthropic_body(0, true, false), false);
        let (head, body) = response(&mut reader);
        assert!(head.contains("connection: keep-alive"), "{head}");
        assert!(body.contains("call_r1c1"));
        post(&anthropic_body(1, true, true), false);
        let (head, body) = response(&mut reader);
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert!(body.contains("call_r2c1") && body.contains("message_stop"));
        post(&anthropic_body(2, true, false), true);
        let (head, body) = response(&mut reader);
        assert!(head.contains("connection: close"), "{head}");
        assert!(body.contains("All rounds done."));
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert_eq!(server.requests().len(), 3);
        assert_eq!(server.shared.state().connections, 1);

        // A connection kept alive past its server's end is closed, not answered.
        let mut stream = TcpStream::connect(server.addr()).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        write!(stream, "GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        assert!(response(&mut reader).0.starts_with("HTTP/1.1 404"));
        drop(server);
        write!(stream, "GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        assert!(rest.is_empty());
    }

    #[test]
    fn a_pooling_hyper_client_reuses_one_connection_over_http_and_https() {
        for tls in [false, true] {
            let script = Script::tool_rounds(2);
            let server = if tls {
                ModelServer::start_tls(script).unwrap()
            } else {
                ModelServer::start(script).unwrap()
            };
            let mut client = reqwest::blocking::Client::builder();
            if let Some(pem) = server.ca_pem() {
                let ca = reqwest::Certificate::from_pem(pem.as_bytes()).unwrap();
                client = client.tls_certs_only([ca]);
            }
            let client = client.build().unwrap();
            for results in 0..3 {
                let reply = client
                    .post(format!("{}/v1/messages", server.url()))
                    .header("content-type", "application/json")
                    .body(anthropic_body(results, true, results == 1))
                    .send()
                    .unwrap();
                assert_eq!(reply.status(), 200);
                let body = reply.text().unwrap();
                assert!(body.contains("_r") || body.contains("All rounds done."));
            }
            assert_eq!(server.model_requests().len(), 3);
            assert_eq!(server.finals_served(), 1);
            assert_eq!(server.shared.state().connections, 1, "tls: {tls}");
        }
    }

    #[test]
    fn https_with_a_client_that_trusts_only_the_ca() {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName};

        let server = ModelServer::start_tls(Script::tool_rounds(1)).unwrap();
        let pem = server.ca_pem().unwrap();
        let client = |trust: bool, name: &'static str| {
            let mut roots = rustls::RootCertStore::empty();
            if trust {
                roots
                    .add(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
                    .unwrap();
            }
            let config = rustls::ClientConfig::builder_with_provider(tls::provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = ServerName::try_from(name).unwrap();
            let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
            rustls::StreamOwned::new(conn, TcpStream::connect(server.addr()).unwrap())
        };
        for name in ["127.0.0.1", "localhost"] {
            let (status, body, complete) = send_on(
                client(true, name),
                "POST",
                "/v1/messages",
                &anthropic_body(0, true, true),
            );
            assert_eq!((status, complete), (200, true));
            assert!(body.contains("call_r1c1"));
        }

        // A client that does not trust the CA fails the handshake.
        let mut untrusting = client(false, "127.0.0.1");
        let err = untrusting
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .and_then(|()| untrusting.flush())
            .and_then(|()| untrusting.read(&mut [0; 16]))
            .unwrap_err();
        assert!(err.to_string().contains("certificate"), "{err}");

        // Plain HTTP gets no HTTP answer.
        let mut plain = TcpStream::connect(server.addr()).unwrap();
        let body = anthropic_body(0, true, false);
        // The server may hang up before the whole request is written (a broken pipe): fine.
        let _ = write!(
            plain,
            "POST /v1/messages HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut raw = Vec::new();
        let _ = plain.read_to_end(&mut raw);
        assert!(!raw.starts_with(b"HTTP/"), "{raw:?}");
        assert_eq!(server.requests().len(), 2);
    }
}
