//! What flows between the loop, the governor and the model: requests, responses, messages.

use serde::{Deserialize, Serialize};

use crate::agent::ToolSpec;

/// A tool call as the model made it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    /// The tool's name (may be empty or unknown: the governor answers those too).
    #[serde(default)]
    pub name: String,
    /// The arguments: a JSON value, or the raw text the model produced when it was not JSON.
    #[serde(default)]
    pub arguments: Arguments,
}

/// Tool call arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Arguments {
    /// Parsed JSON.
    Json(serde_json::Value),
    /// Text that was supposed to be JSON (malformed when it does not parse to an object).
    Raw(String),
}

impl Default for Arguments {
    fn default() -> Self {
        Arguments::Json(serde_json::Value::Object(serde_json::Map::new()))
    }
}

impl Arguments {
    /// Returns the arguments as a JSON object, or `None` when they are malformed.
    pub fn object(&self) -> Option<serde_json::Value> {
        let v = match self {
            Arguments::Json(v) => v.clone(),
            Arguments::Raw(s) => serde_json::from_str(s).ok()?,
        };
        v.is_object().then_some(v)
    }
}

/// One model response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The visible text, if any.
    #[serde(default)]
    pub text: Option<String>,
    /// Reasoning (thinking) text, if any.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// Tool calls, in order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
}

/// What happened when a tool ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", content = "content", rename_all = "snake_case")]
pub enum ToolOutcome {
    /// It succeeded with this output.
    Ok(serde_json::Value),
    /// It was invoked and failed with this message (still progress).
    Failed(String),
}

/// A message in the conversation history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// The model's turn.
    Assistant {
        /// Its text.
        text: Option<String>,
        /// Its calls.
        tool_calls: Vec<ToolCall>,
    },
    /// The answer to one tool call (exactly one per call).
    Tool {
        /// The call answered.
        call_id: String,
        /// Whether it is an error result.
        is_error: bool,
        /// The content.
        content: serde_json::Value,
    },
}

/// A one-off user message that explains a failed attempt. It is sent with the next request only,
/// never stored in the history, and must not be prompt-cached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// Starts with `system notice: `.
    pub text: String,
    /// Always false: tells Anthropic clients to leave `cache_control` off this message.
    pub cacheable: bool,
}

/// What the loop should send to the model next.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// 1-based step number (one step is one model request).
    pub step: u32,
    /// Tools to offer; `None` forces a text-only answer (the last step).
    pub tools: Option<Vec<ToolSpec>>,
    /// The ephemeral notice to append after the history, if any.
    pub notice: Option<Notice>,
}
