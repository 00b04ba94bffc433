//! The four wire dialects: what a model request offers, how its last one is made tool-less, what
//! the gateway answers in its own name, and the text of a reply.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value, json};

/// The wire dialect of a CLI's model requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Anthropic Messages (`POST …/v1/messages`): Claude Code.
    AnthropicMessages,
    /// OpenAI Responses (`POST …/responses`): Codex.
    OpenAiResponses,
    /// Gemini (`POST …/models/M:generateContent` or `:streamGenerateContent`): Gemini CLI.
    Gemini,
    /// OpenAI chat completions (`POST …/chat/completions`): OpenCode and many others.
    OpenAiChat,
}

impl Dialect {
    /// Every dialect, in the order of the docs.
    pub const ALL: [Dialect; 4] = [
        Dialect::AnthropicMessages,
        Dialect::OpenAiResponses,
        Dialect::Gemini,
        Dialect::OpenAiChat,
    ];

    /// The name used in plugin manifests.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dialect::AnthropicMessages => "anthropic-messages",
            Dialect::OpenAiResponses => "openai-responses",
            Dialect::Gemini => "gemini",
            Dialect::OpenAiChat => "openai-chat",
        }
    }

    /// Whether a request to `path` (the part after the gateway's token) is a model call.
    pub fn is_model_path(self, path: &str) -> bool {
        let path = path.split('?').next().unwrap_or("");
        match self {
            Dialect::AnthropicMessages => path.ends_with("/messages"),
            Dialect::OpenAiResponses => path.ends_with("/responses"),
            Dialect::Gemini => {
                path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent")
            }
            Dialect::OpenAiChat => path.ends_with("/chat/completions"),
        }
    }

    /// Whether a model request asks for its reply as a stream (SSE).
    pub fn is_streamed(self, path_and_query: &str, body: &Value) -> bool {
        match self {
            Dialect::Gemini => path_and_query.contains(":streamGenerateContent"),
            _ => body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        }
    }

    /// Whether a request offers the model tools (a main request, one step of the agent, as
    /// opposed to a side request: titles, routing, compaction), and the model it names in its
    /// body (Gemini names it in the path: see [`Dialect::model_in_path`]). Read straight from the
    /// bytes without building a JSON value, since most calls are forwarded as they came; `None`
    /// when the body is not JSON.
    pub fn probe(self, body: &[u8]) -> Option<(bool, Option<String>)> {
        use serde::de::IgnoredAny;
        #[derive(serde::Deserialize)]
        struct Probe {
            #[serde(default)]
            tools: Option<Vec<IgnoredAny>>,
            #[serde(default)]
            model: Option<String>,
            /// Responses: tools offered as an `additional_tools` input item instead.
            #[serde(default)]
            input: InputTools,
        }
        #[derive(serde::Deserialize)]
        struct GeminiTool {
            #[serde(
                default,
                rename = "functionDeclarations",
                alias = "function_declarations"
            )]
            declarations: Option<Vec<IgnoredAny>>,
        }
        #[derive(serde::Deserialize)]
        struct GeminiProbe {
            #[serde(default)]
            tools: Option<Vec<GeminiTool>>,
        }
        match self {
            Dialect::Gemini => serde_json::from_slice::<GeminiProbe>(body).ok().map(|p| {
                let tools = p
                    .tools
                    .unwrap_or_default()
                    .iter()
                    .any(|t| t.declarations.as_ref().is_some_and(|d| !d.is_empty()));
                (tools, None)
            }),
            _ => serde_json::from_slice::<Probe>(body).ok().map(|p| {
                let tools = p.tools.is_some_and(|t| !t.is_empty()) || p.input.0;
                (tools, p.model)
            }),
        }
    }

    /// The model a Gemini request names in its path (`…/models/NAME:generateContent`).
    pub fn model_in_path(path: &str) -> Option<String> {
        let rest = path.split("/models/").nth(1)?;
        let name = rest.split([':', '?']).next()?;
        (!name.is_empty()).then(|| name.to_owned())
    }

    /// Turns tool use off, keeping the tool definitions (the APIs need them beside tool history).
    pub fn disable_tools(self, body: &mut Value) {
        let Some(obj) = body.as_object_mut() else {
            return;
        };
        match self {
            Dialect::AnthropicMessages => {
                obj.insert("tool_choice".into(), json!({"type": "none"}));
            }
            Dialect::OpenAiResponses | Dialect::OpenAiChat => {
                obj.insert("tool_choice".into(), json!("none"));
                // `parallel_tool_calls` is only allowed beside tools that may be called.
                obj.remove("parallel_tool_calls");
            }
            Dialect::Gemini => {
                let config = obj
                    .entry("toolConfig")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(config) = config.as_object_mut() {
                    config.insert("functionCallingConfig".into(), json!({"mode": "NONE"}));
                }
                obj.remove("tool_config");
            }
        }
    }

    /// Adds `text` as one user message at the end of the conversation (one more text part of
    /// the last user turn where the dialect wants turns to alternate). It carries no cache
    /// marker, so it never becomes part of a cached prefix.
    pub fn add_notice(self, body: &mut Value, text: &str) {
        let Some(obj) = body.as_object_mut() else {
            return;
        };
        match self {
            Dialect::AnthropicMessages => {
                let Some(messages) = obj.get_mut("messages").and_then(Value::as_array_mut) else {
                    return;
                };
                let block = json!({"type": "text", "text": text});
                match messages.last_mut() {
                    Some(last) if last.get("role").and_then(Value::as_str) == Some("user") => {
                        match last.get_mut("content") {
                            Some(Value::Array(blocks)) => blocks.push(block),
                            Some(content) => {
                                let first = content.take();
                                *content = json!([{"type": "text", "text": first}, block]);
                            }
                            None => {
                                last["content"] = json!([block]);
                            }
                        }
                    }
                    _ => messages.push(json!({"role": "user", "content": [block]})),
                }
            }
            Dialect::OpenAiResponses => {
                let item = json!({
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                });
                match obj.get_mut("input") {
                    Some(Value::Array(items)) => items.push(item),
                    Some(input) => {
                        let first = input.take();
                        *input = json!([
                            {"type": "message", "role": "user", "content": first},
                            item
                        ]);
                    }
                    None => {
                        obj.insert("input".into(), json!([item]));
                    }
                }
            }
            Dialect::Gemini => {
                let Some(contents) = obj.get_mut("contents").and_then(Value::as_array_mut) else {
                    return;
                };
                let part = json!({"text": text});
                match contents.last_mut() {
                    Some(last) if last.get("role").and_then(Value::as_str) == Some("user") => {
                        match last.get_mut("parts").and_then(Value::as_array_mut) {
                            Some(parts) => parts.push(part),
                            None => last["parts"] = json!([part]),
                        }
                    }
                    _ => contents.push(json!({"role": "user", "parts": [part]})),
                }
            }
            Dialect::OpenAiChat => {
                if let Some(messages) = obj.get_mut("messages").and_then(Value::as_array_mut) {
                    messages.push(json!({"role": "user", "content": text}));
                }
            }
        }
    }

    /// The model name a request asks for, for replies the gateway writes itself.
    fn model_of(self, path: &str, body: &Value) -> String {
        match self {
            Dialect::Gemini => Self::model_in_path(path).unwrap_or_else(|| "gemini".to_owned()),
            _ => body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("model")
                .to_owned(),
        }
    }

    /// A complete reply in this dialect whose only content is `text` and which ends the turn:
    /// what a request past the budget gets instead of reaching the model. Returns the content
    /// type and the body.
    pub fn final_reply(self, path: &str, body: &Value, text: &str) -> (&'static str, String) {
        let model = self.model_of(path, body);
        let streamed = self.is_streamed(path, body);
        match self {
            Dialect::AnthropicMessages => final_anthropic(&model, text, streamed),
            Dialect::OpenAiResponses => final_responses(&model, text, streamed),
            Dialect::Gemini => final_gemini(&model, text, streamed),
            Dialect::OpenAiChat => final_chat(&model, text, streamed),
        }
    }

    /// The text of a reply (whole JSON or SSE), joined; tool calls and reasoning are left out.
    pub fn reply_text(self, reply: &[u8]) -> String {
        let text = String::from_utf8_lossy(reply);
        let trimmed = text.trim_start();
        let mut out = String::new();
        if trimmed.starts_with('{') {
            if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
                self.whole_text(&v, &mut out);
            }
            return out;
        }
        // SSE: one JSON payload per `data:` line.
        let mut completed = None;
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            match self {
                Dialect::AnthropicMessages => {
                    if v["type"] == "content_block_delta" && v["delta"]["type"] == "text_delta" {
                        push_str(&mut out, &v["delta"]["text"]);
                    }
                }
                Dialect::OpenAiResponses => match v["type"].as_str() {
                    Some("response.output_text.delta") => push_str(&mut out, &v["delta"]),
                    Some("response.completed") => completed = Some(v["response"].clone()),
                    _ => {}
                },
                Dialect::Gemini => self.whole_text(&v, &mut out),
                Dialect::OpenAiChat => {
                    push_str(&mut out, &v["choices"][0]["delta"]["content"]);
                }
            }
        }
        // A Responses stream may carry its text only in its completed response.
        if out.is_empty()
            && let Some(response) = completed
        {
            self.whole_text(&response, &mut out);
        }
        out
    }

    fn whole_text(self, v: &Value, out: &mut String) {
        match self {
            Dialect::AnthropicMessages => {
                for block in array(&v["content"]) {
                    if block["type"] == "text" {
                        push_str(out, &block["text"]);
                    }
                }
            }
            Dialect::OpenAiResponses => {
                for item in array(&v["output"]) {
                    if item["type"] == "message" {
                        for part in array(&item["content"]) {
                            if part["type"] == "output_text" {
                                push_str(out, &part["text"]);
                            }
                        }
                    }
                }
            }
            Dialect::Gemini => {
                for part in array(&v["candidates"][0]["content"]["parts"]) {
                    if part.get("thought").and_then(Value::as_bool) != Some(true) {
                        push_str(out, &part["text"]);
                    }
                }
            }
            Dialect::OpenAiChat => push_str(out, &v["choices"][0]["message"]["content"]),
        }
    }
}

const JSON: &str = "application/json";
const SSE: &str = "text/event-stream";

fn array(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn push_str(out: &mut String, v: &Value) {
    if let Some(s) = v.as_str() {
        out.push_str(s);
    }
}

fn sse(out: &mut String, event: Option<&str>, data: &Value) {
    if let Some(event) = event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dialect name no gateway speaks.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown model dialect `{0}` (known: anthropic-messages, openai-responses, gemini, openai-chat)"
)]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| UnknownDialect(s.to_owned()))
    }
}

/// The gateway's own final reply in the Anthropic Messages dialect.
fn final_anthropic(model: &str, text: &str, streamed: bool) -> (&'static str, String) {
    let usage0 = json!({"input_tokens": 0, "output_tokens": 0});
    if !streamed {
        return (
            JSON,
            json!({
                "id": "msg_stepguard", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": null, "usage": usage0,
            })
            .to_string(),
        );
    }
    let mut out = String::new();
    sse(
        &mut out,
        Some("message_start"),
        &json!({"type": "message_start", "message": {
        "id": "msg_stepguard", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage0}}),
    );
    sse(
        &mut out,
        Some("content_block_start"),
        &json!({"type": "content_block_start",
        "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    sse(
        &mut out,
        Some("content_block_delta"),
        &json!({"type": "content_block_delta",
        "index": 0, "delta": {"type": "text_delta", "text": text}}),
    );
    sse(
        &mut out,
        Some("content_block_stop"),
        &json!({"type": "content_block_stop", "index": 0}),
    );
    sse(
        &mut out,
        Some("message_delta"),
        &json!({"type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
        "usage": {"output_tokens": 0}}),
    );
    sse(
        &mut out,
        Some("message_stop"),
        &json!({"type": "message_stop"}),
    );
    (SSE, out)
}

/// The gateway's own final reply in the OpenAI Responses dialect.
fn final_responses(model: &str, text: &str, streamed: bool) -> (&'static str, String) {
    let item = json!({"type": "message", "id": "msg_stepguard", "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]});
    let response = json!({"id": "resp_stepguard", "object": "response",
        "status": "completed", "model": model, "output": [item.clone()],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}});
    if !streamed {
        return (JSON, response.to_string());
    }
    let mut out = String::new();
    let created = json!({"id": "resp_stepguard", "object": "response",
        "status": "in_progress", "model": model, "output": []});
    sse(
        &mut out,
        Some("response.created"),
        &json!({"type": "response.created",
        "sequence_number": 0, "response": created}),
    );
    sse(
        &mut out,
        Some("response.output_item.added"),
        &json!({
        "type": "response.output_item.added", "sequence_number": 1,
        "output_index": 0, "item": {"type": "message", "id": "msg_stepguard",
        "status": "in_progress", "role": "assistant", "content": []}}),
    );
    sse(
        &mut out,
        Some("response.output_text.delta"),
        &json!({
        "type": "response.output_text.delta", "sequence_number": 2,
        "item_id": "msg_stepguard", "output_index": 0, "content_index": 0,
        "delta": text}),
    );
    sse(
        &mut out,
        Some("response.output_item.done"),
        &json!({
        "type": "response.output_item.done", "sequence_number": 3,
        "output_index": 0, "item": item}),
    );
    sse(
        &mut out,
        Some("response.completed"),
        &json!({"type": "response.completed",
        "sequence_number": 4, "response": response}),
    );
    (SSE, out)
}

/// The gateway's own final reply in the Gemini dialect.
fn final_gemini(model: &str, text: &str, streamed: bool) -> (&'static str, String) {
    let chunk = json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0,
            "totalTokenCount": 0},
        "modelVersion": model,
    });
    if !streamed {
        return (JSON, chunk.to_string());
    }
    let mut out = String::new();
    sse(&mut out, None, &chunk);
    (SSE, out)
}

/// The gateway's own final reply in the OpenAI Chat Completions dialect.
fn final_chat(model: &str, text: &str, streamed: bool) -> (&'static str, String) {
    if !streamed {
        return (
            JSON,
            json!({"id": "chatcmpl-stepguard", "object": "chat.completion", "created": 0,
            "model": model, "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
            .to_string(),
        );
    }
    let mut out = String::new();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-stepguard", "object": "chat.completion.chunk",
            "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    sse(
        &mut out,
        None,
        &chunk(json!({"role": "assistant", "content": text}), Value::Null),
    );
    sse(&mut out, None, &chunk(json!({}), json!("stop")));
    out.push_str("data: [DONE]\n\n");
    (SSE, out)
}

/// Whether a Responses `input` offers tools in an item of its own: Codex 0.169's default model
/// (`gpt-6.1-sol`, code mode) sends no `tools` field but an `additional_tools` item holding
/// them. Read without building the conversation: every other item and field is skipped.
#[derive(Default)]
struct InputTools(bool);

/// One `input` item, as far as [`InputTools`] cares: whether it is a non-empty
/// `additional_tools` item (anything that is not an object is not).
struct ToolsItem(bool);

impl<'de> serde::Deserialize<'de> for InputTools {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{SeqAccess, Visitor};
        struct Items;
        impl<'de> Visitor<'de> for Items {
            type Value = InputTools;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Responses input")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<InputTools, A::Error> {
                let mut offers = false;
                while let Some(ToolsItem(item)) = seq.next_element()? {
                    offers |= item;
                }
                Ok(InputTools(offers))
            }
            // A bare string (or null) is a plain prompt.
            fn visit_str<E>(self, _: &str) -> Result<InputTools, E> {
                Ok(InputTools(false))
            }
            fn visit_unit<E>(self) -> Result<InputTools, E> {
                Ok(InputTools(false))
            }
        }
        d.deserialize_any(Items)
    }
}

impl<'de> serde::Deserialize<'de> for ToolsItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct Item;
        impl<'de> Visitor<'de> for Item {
            type Value = ToolsItem;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Responses input item")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ToolsItem, A::Error> {
                let (mut additional, mut tools) = (false, false);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "type" => {
                            let kind = map.next_value::<std::borrow::Cow<'de, str>>()?;
                            additional = kind == "additional_tools";
                        }
                        "tools" => {
                            let list = map.next_value::<Option<Vec<IgnoredAny>>>()?;
                            tools = list.is_some_and(|l| !l.is_empty());
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ToolsItem(additional && tools))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ToolsItem, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ToolsItem(false))
            }
            fn visit_str<E>(self, _: &str) -> Result<ToolsItem, E> {
                Ok(ToolsItem(false))
            }
            fn visit_bool<E>(self, _: bool) -> Result<ToolsItem, E> {
                Ok(ToolsItem(false))
            }
            fn visit_i64<E>(self, _: i64) -> Result<ToolsItem, E> {
                Ok(ToolsItem(false))
            }
            fn visit_u64<E>(self, _: u64) -> Result<ToolsItem, E> {
                Ok(ToolsItem(false))
            }
            fn visit_f64<E>(self, _: f64) -> Result<ToolsItem, E> {
                Ok(ToolsItem(false))
            }
            fn visit_unit<E>(self) -> Result<ToolsItem, E> {
                Ok(ToolsItem(false))
            }
        }
        d.deserialize_any(Item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `body` offers tools, as the gateway reads it.
    fn offers_tools(d: Dialect, body: &Value) -> bool {
        d.probe(body.to_string().as_bytes())
            .is_some_and(|(tools, _)| tools)
    }

    fn bodies() -> Vec<(Dialect, &'static str, Value)> {
        vec![
            (
                Dialect::AnthropicMessages,
                "/v1/messages",
                json!({"model": "claude", "stream": true, "tools": [{"name": "Bash"}],
                    "messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                            "cache_control": {"type": "ephemeral"}}]}]}),
            ),
            (
                Dialect::OpenAiResponses,
                "/v1/responses",
                json!({"model": "gpt", "stream": true, "parallel_tool_calls": true,
                    "tools": [{"type": "function", "name": "exec_command"}],
                    "input": [{"type": "message", "role": "user", "content": "hi"}]}),
            ),
            (
                Dialect::Gemini,
                "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
                json!({"tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}],
                    "contents": [{"role": "user", "parts": [{"text": "hi"}]},
                        {"role": "model", "parts": [{"functionCall": {"name": "x"}}]},
                        {"role": "user", "parts": [{"functionResponse": {"name": "x"}}]}]}),
            ),
            (
                Dialect::OpenAiChat,
                "/v1/chat/completions",
                json!({"model": "m", "stream": true, "tools": [{"type": "function"}],
                    "messages": [{"role": "user", "content": "hi"},
                        {"role": "tool", "content": "ok"}]}),
            ),
        ]
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for d in Dialect::ALL {
            assert_eq!(d.as_str().parse::<Dialect>().ok(), Some(d));
        }
        let err = "openai".parse::<Dialect>().unwrap_err().to_string();
        assert!(
            err.contains("`openai`") && err.contains("openai-chat"),
            "{err}"
        );
    }

    #[test]
    fn main_requests_offer_tools_and_side_requests_do_not() {
        for (d, path, body) in bodies() {
            assert!(d.is_model_path(path), "{d}");
            assert!(offers_tools(d, &body), "{d}");
            let mut side = body.clone();
            side["tools"] = json!([]);
            assert!(!offers_tools(d, &side), "{d}");
            side.as_object_mut().unwrap().remove("tools");
            assert!(!offers_tools(d, &side), "{d}");
        }
        assert!(!offers_tools(
            Dialect::Gemini,
            &json!({"tools": [{"googleSearch": {}}]})
        ));
        // A null list offers nothing; a body that is not JSON says so; the model is read.
        for (d, path, body) in bodies() {
            let model = d.probe(body.to_string().as_bytes()).and_then(|(_, m)| m);
            let model = model.or_else(|| Dialect::model_in_path(path));
            let expected = match d {
                Dialect::AnthropicMessages => "claude",
                Dialect::OpenAiResponses => "gpt",
                Dialect::Gemini => "gemini-x",
                Dialect::OpenAiChat => "m",
            };
            assert_eq!(model.as_deref(), Some(expected), "{d}");
            let mut side = body.clone();
            side["tools"] = json!(null);
            assert!(!offers_tools(d, &side), "{d}");
            assert_eq!(d.probe(b"{\"tools\": [1"), None, "{d}");
        }
        let search = json!({"tools": [{"googleSearch": {}}, {"function_declarations": []}]});
        assert!(!offers_tools(Dialect::Gemini, &search));
        assert!(!Dialect::AnthropicMessages.is_model_path("/v1/models"));
    }

    #[test]
    fn codex_default_model_offers_its_tools_in_an_input_item() {
        // The shape Codex 0.169 sends for its default model on the built-in OpenAI provider
        // (recorded from the real CLI): no `tools` field, an `additional_tools` input item.
        let body = json!({"model": "gpt-6.1-sol", "stream": true, "tool_choice": "auto",
            "parallel_tool_calls": false,
            "input": [
                {"type": "additional_tools", "id": "at_1", "role": "developer",
                    "tools": [{"type": "namespace", "name": "functions", "description": "",
                        "tools": [{"type": "custom", "name": "exec"}]}]},
                {"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "configuration_update", "reasoning": {"effort": "low"}}]});
        let d = Dialect::OpenAiResponses;
        assert!(offers_tools(d, &body));
        assert_eq!(
            d.probe(body.to_string().as_bytes()).and_then(|(_, m)| m),
            Some("gpt-6.1-sol".to_owned())
        );
        let mut last = body.clone();
        d.disable_tools(&mut last);
        assert_eq!(last["tool_choice"], "none");
        assert!(offers_tools(d, &last), "the tools stay, unusable");
        // An empty item, tools under another item type, a prompt string, odd items: none.
        for input in [
            json!([{"type": "additional_tools", "tools": []}]),
            json!([{"type": "message", "tools": [{"name": "x"}]}]),
            json!("just a prompt"),
            json!(["text", 1, null, [], {"tools": [{"name": "x"}]}]),
            json!(null),
        ] {
            let side = json!({"model": "m", "input": input});
            assert!(!offers_tools(d, &side), "{side}");
        }
    }

    #[test]
    fn the_last_request_keeps_its_tools_but_may_not_use_them() {
        for (d, _, mut body) in bodies() {
            d.disable_tools(&mut body);
            assert!(offers_tools(d, &body), "{d}: tool definitions kept");
            match d {
                Dialect::AnthropicMessages => {
                    assert_eq!(body["tool_choice"], json!({"type": "none"}))
                }
                Dialect::OpenAiResponses | Dialect::OpenAiChat => {
                    assert_eq!(body["tool_choice"], "none");
                    assert!(body.get("parallel_tool_calls").is_none());
                }
                Dialect::Gemini => {
                    assert_eq!(body["toolConfig"]["functionCallingConfig"]["mode"], "NONE")
                }
            }
        }
    }

    #[test]
    fn the_notice_is_one_user_text_at_the_end_without_a_cache_marker() {
        let notice = "system notice: stop";
        for (d, _, mut body) in bodies() {
            let before = body.to_string();
            d.add_notice(&mut body, notice);
            let after = body.to_string();
            assert_eq!(after.matches(notice).count(), 1, "{d}: {after}");
            assert_eq!(
                before.matches("cache_control").count(),
                after.matches("cache_control").count()
            );
            match d {
                Dialect::AnthropicMessages => {
                    // Appended to the user turn that carries the tool results.
                    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
                    assert_eq!(last["role"], "user");
                    assert_eq!(last["content"][1], json!({"type": "text", "text": notice}));
                    assert_eq!(body["messages"].as_array().unwrap().len(), 3);
                }
                Dialect::OpenAiResponses => {
                    let last = body["input"].as_array().unwrap().last().unwrap().clone();
                    assert_eq!(last["content"][0]["text"], notice);
                    assert_eq!(last["role"], "user");
                }
                Dialect::Gemini => {
                    let last = body["contents"].as_array().unwrap().last().unwrap().clone();
                    assert_eq!(last["parts"][1]["text"], notice);
                }
                Dialect::OpenAiChat => {
                    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
                    assert_eq!(last, json!({"role": "user", "content": notice}));
                }
            }
        }
        // A string prompt becomes a list with the notice after it.
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        Dialect::AnthropicMessages.add_notice(&mut body, notice);
        assert_eq!(body["messages"][0]["content"][0]["text"], "hi");
        assert_eq!(body["messages"][0]["content"][1]["text"], notice);
        let mut body = json!({"input": "hi"});
        Dialect::OpenAiResponses.add_notice(&mut body, notice);
        assert_eq!(body["input"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn the_gateways_own_replies_read_back_as_their_text_streamed_and_whole() {
        for (d, path, body) in bodies() {
            for streamed in [true, false] {
                let mut body = body.clone();
                let path = if d == Dialect::Gemini && !streamed {
                    "/v1beta/models/gemini-x:generateContent"
                } else {
                    body["stream"] = json!(streamed);
                    path
                };
                let (ctype, reply) = d.final_reply(path, &body, "Budget spent: done.");
                assert_eq!(ctype == SSE, streamed, "{d}");
                assert_eq!(
                    d.reply_text(reply.as_bytes()),
                    "Budget spent: done.",
                    "{d} {streamed}"
                );
            }
        }
    }

    #[test]
    fn reply_text_skips_tool_calls_and_thoughts_and_survives_garbage() {
        let anthropic = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\ndata: not json\n\n";
        assert_eq!(
            Dialect::AnthropicMessages.reply_text(anthropic.as_bytes()),
            "a"
        );
        let gemini = r#"data: {"candidates":[{"content":{"parts":[{"text":"think","thought":true},{"text":"b"},{"functionCall":{"name":"x"}}]}}]}"#;
        assert_eq!(Dialect::Gemini.reply_text(gemini.as_bytes()), "b");
        let responses = r#"data: {"type":"response.completed","response":{"output":[{"type":"function_call"},{"type":"message","content":[{"type":"output_text","text":"c"}]}]}}"#;
        assert_eq!(
            Dialect::OpenAiResponses.reply_text(responses.as_bytes()),
            "c"
        );
        assert_eq!(Dialect::OpenAiChat.reply_text(b"\xff\xfe{"), "");
    }
}
