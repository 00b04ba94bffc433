//! The four wire dialects: reading what matters out of a request, and writing a reply in kind.

use serde_json::{Value, json};

use crate::http::{Padding, Request, Response};
use crate::{Api, Call, FaultKind};

/// Input and output tokens reported for every reply.
pub const INPUT_TOKENS: u64 = 100;
/// See [`INPUT_TOKENS`].
pub const OUTPUT_TOKENS: u64 = 20;

/// What the server needs to know about a model request.
#[derive(Debug, Default)]
pub(crate) struct Inspection {
    /// Streaming requested.
    pub(crate) stream: bool,
    /// Names of the tools the client offered.
    pub(crate) tools: Vec<String>,
    /// Tool results the client sent back in the conversation so far.
    pub(crate) tool_results: usize,
    /// The model the client asked for.
    pub(crate) model: String,
    /// Tool use disabled in the dialect's own form (`tool_choice` none, Gemini mode `NONE`).
    pub(crate) tools_disabled: bool,
    /// Texts in the conversation that start with [`NOTICE`].
    pub(crate) notices: usize,
}

/// How the text of a notice a gateway adds to a request starts.
pub(crate) const NOTICE: &str = "system notice: ";

fn is_notice(text: Option<&Value>) -> bool {
    text.and_then(Value::as_str)
        .is_some_and(|t| t.starts_with(NOTICE))
}

/// Notices in a message's `content`: the whole string, or its parts of type `part_type`.
fn notices_in_content(content: Option<&Value>, part_type: &str) -> usize {
    match content {
        Some(Value::String(_)) => usize::from(is_notice(content)),
        Some(Value::Array(parts)) => count_where(parts.iter(), |p| {
            p.get("type").and_then(Value::as_str) == Some(part_type) && is_notice(p.get("text"))
        }),
        _ => 0,
    }
}

/// Whether `v` is the string `none` (any case), the OpenAI and Gemini no-tools value.
fn is_none_choice(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str)
        .is_some_and(|c| c.eq_ignore_ascii_case("none"))
}

/// Which dialect a request speaks, from its method and path.
pub(crate) fn route(request: &Request) -> Option<Api> {
    if request.method != "POST" {
        return None;
    }
    let path = request.path();
    if path.ends_with("/messages") {
        Some(Api::AnthropicMessages)
    } else if path.ends_with("/responses") {
        Some(Api::OpenAiResponses)
    } else if path.ends_with("/chat/completions") {
        Some(Api::ChatCompletions)
    } else if path.contains("/models/")
        && (path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent"))
    {
        Some(Api::Gemini)
    } else {
        None
    }
}

fn names(list: Option<&Value>, name_of: impl Fn(&Value) -> Option<&str>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(&name_of)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn count_where<'a>(items: impl Iterator<Item = &'a Value>, pred: impl Fn(&Value) -> bool) -> usize {
    items.filter(|v| pred(v)).count()
}

fn array(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

/// Reads the request body of dialect `api`.
pub(crate) fn inspect(api: Api, request: &Request, body: &Value) -> Inspection {
    let str_of = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    match api {
        Api::AnthropicMessages => Inspection {
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            tools: names(body.get("tools"), |t| t.get("name")?.as_str()),
            tool_results: count_where(
                array(body.get("messages")).flat_map(|m| array(m.get("content"))),
                |b| b.get("type").and_then(Value::as_str) == Some("tool_result"),
            ),
            model: str_of("model"),
            tools_disabled: is_none_choice(body.get("tool_choice").and_then(|c| c.get("type"))),
            notices: array(body.get("messages"))
                .map(|m| notices_in_content(m.get("content"), "text"))
                .sum(),
        },
        Api::OpenAiResponses => Inspection {
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            tools: names(body.get("tools"), |t| {
                t.get("name").or_else(|| t.get("type"))?.as_str()
            }),
            tool_results: count_where(array(body.get("input")), |item| {
                item.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with("_call_output"))
            }),
            model: str_of("model"),
            tools_disabled: is_none_choice(body.get("tool_choice")),
            notices: usize::from(is_notice(body.get("input")))
                + array(body.get("input"))
                    .filter(|item| match item.get("type").and_then(Value::as_str) {
                        Some(t) => t == "message",
                        None => item.get("role").is_some(),
                    })
                    .map(|item| notices_in_content(item.get("content"), "input_text"))
                    .sum::<usize>(),
        },
        Api::Gemini => {
            let path = request.path();
            let model = path
                .rsplit('/')
                .next()
                .and_then(|m| m.split(':').next())
                .unwrap_or("")
                .to_owned();
            Inspection {
                stream: path.ends_with(":streamGenerateContent"),
                tools: array(body.get("tools"))
                    .flat_map(|t| array(t.get("functionDeclarations")))
                    .filter_map(|f| f.get("name")?.as_str())
                    .map(str::to_owned)
                    .collect(),
                tool_results: count_where(
                    array(body.get("contents")).flat_map(|c| array(c.get("parts"))),
                    |p| p.get("functionResponse").is_some(),
                ),
                model,
                tools_disabled: is_none_choice(
                    body.get("toolConfig")
                        .or_else(|| body.get("tool_config"))
                        .and_then(|c| {
                            c.get("functionCallingConfig")
                                .or_else(|| c.get("function_calling_config"))
                        })
                        .and_then(|c| c.get("mode")),
                ),
                notices: count_where(
                    array(body.get("contents")).flat_map(|c| array(c.get("parts"))),
                    |p| is_notice(p.get("text")),
                ),
            }
        }
        Api::ChatCompletions => Inspection {
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            tools: names(body.get("tools"), |t| {
                t.get("function")?.get("name")?.as_str()
            }),
            tool_results: count_where(array(body.get("messages")), |m| {
                m.get("role").and_then(Value::as_str) == Some("tool")
            }),
            model: str_of("model"),
            tools_disabled: is_none_choice(body.get("tool_choice")),
            notices: array(body.get("messages"))
                .map(|m| notices_in_content(m.get("content"), "text"))
                .sum(),
        },
    }
}

/// Shell tools the server knows how to call, by the name each CLI gives its tool.
const SHELL_TOOLS: &[&str] = &[
    "Bash",              // Claude Code
    "exec_command",      // Codex (unified exec)
    "shell_command",     // Codex (older models)
    "shell",             // Codex (oldest models)
    "run_shell_command", // Gemini CLI
    "bash",              // OpenCode
];

/// The shell tool among `offered`, if any.
pub(crate) fn shell_tool(offered: &[String]) -> Option<&'static str> {
    SHELL_TOOLS
        .iter()
        .copied()
        .find(|name| offered.iter().any(|o| o == name))
}

/// The arguments that make `tool` run `command`.
pub(crate) fn shell_args(tool: &str, command: &str) -> Value {
    match tool {
        "exec_command" => json!({ "cmd": command }),
        "shell" => json!({ "command": ["bash", "-lc", command] }),
        "shell_command" => json!({ "command": command }),
        _ => json!({ "command": command, "description": "Print round marker" }),
    }
}

/// What the model says in one reply.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Tool calls, with optional text before them.
    Tools {
        text: Option<String>,
        calls: Vec<Call>,
    },
    /// Text only.
    Text(String),
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The reply to a served request, streamed or whole as the client asked; a text reply to a
/// request that asked for a stream carries `padding` more bytes of text in extra text deltas.
pub(crate) fn render(
    api: Api,
    insp: &Inspection,
    turn: &Turn,
    seq: usize,
    cut: bool,
    padding: usize,
) -> Response {
    let padding = if insp.stream { padding } else { 0 };
    let events = match api {
        Api::AnthropicMessages => anthropic(insp, turn, seq),
        Api::OpenAiResponses => responses(turn, seq, padding > 0),
        Api::Gemini => gemini(insp, turn),
        Api::ChatCompletions => chat(insp, turn, seq),
    };
    match events {
        Rendered::Stream { events, pad } => {
            // Every dialect streams at least two events: the first arrives, the second breaks.
            let cut_after = cut.then_some(1);
            let padding = pad
                .filter(|_| padding > 0 && !cut && matches!(turn, Turn::Text(_)))
                .and_then(|pad| pad.padding(padding));
            Response::Sse {
                events,
                padding,
                cut_after,
            }
        }
        Rendered::Whole(value) => {
            if cut {
                // Promise a longer body than is sent.
                Response::Sse {
                    events: vec![value.to_string()],
                    padding: None,
                    cut_after: Some(0),
                }
            } else {
                Response::json(200, &value)
            }
        }
    }
}

enum Rendered {
    Stream {
        events: Vec<String>,
        /// Where and how a text reply's padding goes.
        pad: Option<PadAt>,
    },
    Whole(Value),
}

/// A text delta event with [`PAD_MARK`] as its text, to go after `after` events.
struct PadAt {
    after: usize,
    event: String,
}

/// The stand-in for the filler text in [`PadAt::event`] (a JSON string, quotes included).
const PAD_MARK: &str = "\u{1}padding\u{1}";

impl PadAt {
    fn new(after: usize, event: String) -> Self {
        PadAt { after, event }
    }

    /// `bytes` of filler in events shaped like this one.
    fn padding(self, bytes: usize) -> Option<Padding> {
        let mark = Value::from(PAD_MARK).to_string();
        let (prefix, suffix) = self.event.split_once(&mark)?;
        Some(Padding {
            after: self.after,
            bytes,
            prefix: prefix.to_owned(),
            suffix: suffix.to_owned(),
        })
    }
}

fn anthropic(insp: &Inspection, turn: &Turn, seq: usize) -> Rendered {
    let mut blocks = Vec::new();
    let stop_reason = match turn {
        Turn::Tools { text, calls } => {
            if let Some(text) = text {
                blocks.push(json!({"type": "text", "text": text}));
            }
            for call in calls {
                blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.tool, "input": call.args}));
            }
            "tool_use"
        }
        Turn::Text(text) => {
            blocks.push(json!({"type": "text", "text": text}));
            "end_turn"
        }
    };
    let id = format!("msg_scripted_{seq}");
    let usage = json!({
        "input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
    });
    if !insp.stream {
        return Rendered::Whole(json!({
            "id": id, "type": "message", "role": "assistant", "model": insp.model,
            "content": blocks, "stop_reason": stop_reason, "stop_sequence": null, "usage": usage,
        }));
    }
    let mut events = vec![sse(
        Some("message_start"),
        &json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": insp.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        let (start, delta) = if block["type"] == "text" {
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            )
        } else {
            (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            )
        };
        events.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        events.push(sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        events.push(sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(sse(
        Some("message_delta"),
        &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": OUTPUT_TOKENS}}),
    ));
    events.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
    // A text reply's one block: start, delta, then the filler deltas before its stop.
    let pad = PadAt::new(
        3,
        sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": PAD_MARK}}),
        ),
    );
    Rendered::Stream {
        events,
        pad: Some(pad),
    }
}

/// An OpenAI Responses stream; `deltas` also streams a text reply's message as an added item
/// and text deltas (the answer, then any filler) before the completed item, which holds the
/// answer only.
fn responses(turn: &Turn, seq: usize, deltas: bool) -> Rendered {
    let id = format!("resp_scripted_{seq}");
    let message = |text: &str, n: usize| {
        json!({"type": "message", "id": format!("msg_scripted_{seq}_{n}"), "role": "assistant",
               "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    let mut items = Vec::new();
    match turn {
        Turn::Tools { text, calls } => {
            if let Some(text) = text {
                items.push(message(text, 0));
            }
            for call in calls {
                items.push(
                    json!({"type": "function_call", "id": format!("fc_{}", call.id),
                                  "call_id": call.id, "name": call.tool,
                                  "arguments": call.args.to_string(), "status": "completed"}),
                );
            }
        }
        Turn::Text(text) => items.push(message(text, 0)),
    }
    let mut events = vec![sse(
        Some("response.created"),
        &json!({"type": "response.created",
                "response": {"id": id, "object": "response", "status": "in_progress", "output": []}}),
    )];
    let item_id = format!("msg_scripted_{seq}_0");
    let delta = |text: &str| {
        sse(
            Some("response.output_text.delta"),
            &json!({"type": "response.output_text.delta", "item_id": item_id, "output_index": 0,
                    "content_index": 0, "delta": text}),
        )
    };
    let mut pad = None;
    if let (true, Turn::Text(text)) = (deltas, turn) {
        events.push(sse(
            Some("response.output_item.added"),
            &json!({"type": "response.output_item.added", "output_index": 0, "item":
                    {"type": "message", "id": item_id, "role": "assistant",
                     "status": "in_progress", "content": []}}),
        ));
        events.push(delta(text));
        pad = Some(PadAt::new(events.len(), delta(PAD_MARK)));
    }
    for (index, item) in items.iter().enumerate() {
        events.push(sse(
            Some("response.output_item.done"),
            &json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        ));
    }
    events.push(sse(
        Some("response.completed"),
        &json!({"type": "response.completed", "response": {
            "id": id, "object": "response", "status": "completed", "output": items,
            "usage": {"input_tokens": INPUT_TOKENS, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": OUTPUT_TOKENS, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}}}),
    ));
    Rendered::Stream { events, pad }
}

fn gemini(insp: &Inspection, turn: &Turn) -> Rendered {
    let mut parts = Vec::new();
    match turn {
        Turn::Tools { text, calls } => {
            if let Some(text) = text {
                parts.push(json!({"text": text}));
            }
            for call in calls {
                parts.push(
                    json!({"functionCall": {"id": call.id, "name": call.tool, "args": call.args}}),
                );
            }
        }
        Turn::Text(text) => parts.push(json!({"text": text})),
    }
    let chunk = json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": INPUT_TOKENS, "candidatesTokenCount": OUTPUT_TOKENS,
                          "totalTokenCount": INPUT_TOKENS + OUTPUT_TOKENS},
        "modelVersion": insp.model,
    });
    if insp.stream {
        // A first chunk with no content yet, so that a cut stream has begun before it breaks.
        let opening = json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "index": 0}],
            "modelVersion": insp.model,
        });
        // Filler chunks go between the opening and the last chunk, which ends the turn.
        let filler = json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": PAD_MARK}]}, "index": 0}],
            "modelVersion": insp.model,
        });
        Rendered::Stream {
            events: vec![
                format!("data: {opening}\r\n\r\n"),
                format!("data: {chunk}\r\n\r\n"),
            ],
            pad: Some(PadAt::new(1, format!("data: {filler}\r\n\r\n"))),
        }
    } else {
        Rendered::Whole(chunk)
    }
}

fn chat(insp: &Inspection, turn: &Turn, seq: usize) -> Rendered {
    let id = format!("chatcmpl-scripted-{seq}");
    let (text, calls, finish) = match turn {
        Turn::Tools { text, calls } => (text.clone(), calls.as_slice(), "tool_calls"),
        Turn::Text(text) => (Some(text.clone()), &[][..], "stop"),
    };
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            json!({"index": index, "id": call.id, "type": "function",
                   "function": {"name": call.tool, "arguments": call.args.to_string()}})
        })
        .collect();
    let usage = json!({"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                       "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS});
    if !insp.stream {
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(tool_calls);
        }
        return Rendered::Whole(json!({
            "id": id, "object": "chat.completion", "created": 0, "model": insp.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }));
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": insp.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![sse(
        None,
        &chunk(json!({"role": "assistant", "content": ""}), None),
    )];
    if let Some(text) = text {
        events.push(sse(None, &chunk(json!({"content": text}), None)));
    }
    let pad = PadAt::new(
        events.len(),
        sse(None, &chunk(json!({"content": PAD_MARK}), None)),
    );
    for call in tool_calls {
        events.push(sse(None, &chunk(json!({"tool_calls": [call]}), None)));
    }
    events.push(sse(None, &chunk(json!({}), Some(finish))));
    events.push(sse(
        None,
        &json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": insp.model,
                "choices": [], "usage": usage}),
    ));
    events.push("data: [DONE]\n\n".to_owned());
    Rendered::Stream {
        events,
        pad: Some(pad),
    }
}

/// An HTTP error in the dialect's own error shape.
pub(crate) fn error(api: Api, kind: FaultKind) -> Response {
    let (status, message) = match kind {
        FaultKind::RateLimited { .. } => (429, "Rate limit reached (scripted)"),
        _ => (500, "Internal server error (scripted)"),
    };
    let body = match api {
        Api::AnthropicMessages => json!({"type": "error", "error": {
            "type": if status == 429 { "rate_limit_error" } else { "api_error" }, "message": message}}),
        Api::OpenAiResponses | Api::ChatCompletions => json!({"error": {
            "type": if status == 429 { "rate_limit_exceeded" } else { "server_error" },
            "code": if status == 429 { "rate_limit_exceeded" } else { "server_error" },
            "message": message}}),
        Api::Gemini => json!({"error": {"code": status, "message": message,
            "status": if status == 429 { "RESOURCE_EXHAUSTED" } else { "INTERNAL" }}}),
    };
    let response = Response::json(status, &body);
    match kind {
        FaultKind::RateLimited { retry_after_secs } => {
            response.with_header("retry-after", retry_after_secs.to_string())
        }
        _ => response,
    }
}
