//! stepguard's step mapping for Claude Code (`claude -p --output-format stream-json --verbose`).
//!
//! Units (public interface):
//!
//! * `message` (default): distinct `message.id` of top-level `assistant` lines
//!   (`parent_tool_use_id` null, model not `<synthetic>`). One API round is one message, which the
//!   CLI splits over several lines sharing the id; this is the unit of Claude's own `--max-turns`.
//! * `tool_use`: distinct `tool_use` block ids of top-level assistant messages.
//!
//! Sub-agent lines (non-null `parent_tool_use_id`) are counted per sub-agent and reported
//! separately, never against the parent's budget. Reported turns are `result.num_turns`; computed
//! turns are 1 + the top-level tool-result lines (what `num_turns` is in practice).
//!
//! The `result` line decides the outcome from `is_error`, never from `subtype`:
//! `error_max_turns` → `max_steps`; `error_max_budget_usd` → `max_cost`; HTTP 429 or a rejected
//! rate-limit event → `rate_limited`; other errors → `provider_error`. The native budget adapter
//! adds `--max-turns N` unless the command already carries `--max-turns`, and the native cost
//! limit `--max-budget-usd X` unless it carries `--max-budget-usd` (protocol 1.5).
//!
//! Token usage (protocol 1.5) is reported live, per assistant message: each message once, by
//! `message.id`, with the largest of each count its lines have shown (the CLI repeats a
//! message's usage on every line of it, and the counts only grow). Input tokens are
//! `input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens`, cached ones
//! `cache_read_input_tokens`. Sub-agent messages count toward their sub-agent
//! (`CounterStats::sub_agent_tokens`, keyed like `sub_agent_steps`) and the total. The
//! per-line usage of a message is the one its API response started with, so its
//! `output_tokens` are mostly 1 to 3: with `--include-partial-messages` the `stream_event`
//! lines (`message_start`, `message_delta`) give the final counts as they stream; without it
//! the output is known only from the `result`. Every source is a lower bound, so the `result`
//! line tops the reported usage up: the top-level messages to `result.usage` (the main loop's
//! own total), and the whole to the sum of `result.modelUsage` (every model call of the
//! session, side calls and sub-agents included), each count to the larger. The reported deltas
//! add up to `CounterStats::tokens`.
//!
//! Tool calls (for loop detection, protocol 1.3) are the top-level `tool_use` blocks, each
//! reported once by block id, on the line that first carries it, as its `name` and `input`
//! (`Bash`'s `description` left out: it annotates the command and does not change what runs;
//! its `command` normalised, with its program, by `ToolCall::shell`), with the block id.
//! Their results (protocol 1.6) are the `tool_result` blocks of top-level `user` lines that
//! answer a reported call: `content` (a string or text blocks) and `is_error`.
//! Sub-agents' calls are not reported: the loop the host can act on is the parent's, whose
//! steps the budget counts, and parallel sub-agents making the same exploratory calls (`ls`,
//! the same `Grep`) would look like one agent repeating itself.
//!
//! ```
//! use stepguard_plugin_api::{CounterRequest, ProviderPlugin};
//! let plugin = stepguard_provider_claude::ClaudePlugin;
//! let mut counter = plugin.open_counter(&CounterRequest::new("message")).unwrap();
//! let line = br#"{"type":"assistant","message":{"id":"msg_1","model":"claude","content":[]},"parent_tool_use_id":null}"#;
//! assert_eq!(counter.feed(line).unwrap().steps_begun, 1);
//! assert_eq!(counter.feed(line).unwrap().steps_begun, 0); // same message, next content block
//! ```
#![deny(unsafe_code)] // not `forbid`: export_plugin! allows it on its own generated items

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use stepguard_jsonl::{IdMap, IdSet, RawValue, scan};
use stepguard_plugin_api::{
    BaseUrlRule, CounterRequest, CounterStats, LineReport, Manifest, ModelEndpoint, NativeLimit,
    PreflightRule, ProviderBox, ProviderPlugin, ResumeTemplate, StepCounter, Terminal, Tokens,
    ToolCall, ToolResult, fingerprint::output_text, slug_for_error_text,
};

/// The Claude Code provider plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClaudePlugin;

/// Returns the built-in Claude provider, behind the plugin interface.
pub fn provider() -> ProviderBox {
    stepguard_plugin_api::provider_box(ClaudePlugin)
}

#[cfg(feature = "plugin")]
stepguard_plugin_api::export_plugin!(ClaudePlugin);

impl ProviderPlugin for ClaudePlugin {
    fn manifest(&self) -> Manifest {
        Manifest::new("claude", env!("CARGO_PKG_VERSION"))
            .description("Claude Code (`claude -p --output-format stream-json --verbose`)")
            .unit_costing(
                "message",
                "top-level assistant messages (API rounds), deduplicated by message.id",
                true,
                1,
            )
            .unit_costing(
                "tool_use",
                "top-level tool_use blocks, deduplicated by id",
                false,
                0,
            )
            .model_endpoint(
                ModelEndpoint::new("anthropic-messages", "https://api.anthropic.com")
                    .base_url(BaseUrlRule::Env {
                        name: "ANTHROPIC_BASE_URL".into(),
                    })
                    // `x-api-key` and `Authorization: Bearer`, in that order.
                    .api_key_env("ANTHROPIC_API_KEY")
                    .api_key_env("ANTHROPIC_AUTH_TOKEN"),
            )
            .expects("JSONL events of `claude -p --output-format stream-json --verbose` (`system`, `assistant`, `user`, `result`)")
            .preflight(PreflightRule::new(
                "claude",
                &["-p", "--print"],
                "stepguard counts Claude Code's print mode: add `-p \"PROMPT\" --output-format stream-json --verbose`",
            ))
            .preflight(
                PreflightRule::new(
                    "claude",
                    &["--output-format=stream-json"],
                    "add `--output-format stream-json --verbose`: stepguard counts its JSONL events",
                )
                .when_any(&["-p", "--print"]),
            )
            // Without `--verbose` print mode refuses stream-json and exits 1 before anything.
            .preflight(
                PreflightRule::new(
                    "claude",
                    &["--verbose"],
                    "add `--verbose`: Claude Code prints stream-json only with it",
                )
                .when_any(&["--output-format=stream-json"]),
            )
            .native_limit(NativeLimit::new(
                &["--max-turns", "{max_steps}"],
                &["--max-turns"],
            ))
            // Print mode's own cost budget: checked after each model call, it ends the run
            // with `result/error_max_budget_usd` once the session's cost exceeds it.
            .native_cost_limit(NativeLimit::new(
                &["--max-budget-usd", "{max_cost_usd}"],
                &["--max-budget-usd"],
            ))
            .reports_tool_results()
            .reports_usage()
            // `claude --resume ID` in print mode; `--max-turns` is left behind (the host adds
            // the new budget's).
            .resume(
                ResumeTemplate::new(&["claude", "-p", "{prompt}", "--resume", "{session}", "{flags}"])
                    .keep_flags(&[
                        "--verbose",
                        "--dangerously-skip-permissions",
                        "--include-partial-messages",
                    ])
                    .keep_options(&[
                        "--output-format",
                        "--model",
                        "--fallback-model",
                        "--permission-mode",
                        "--allowedTools",
                        "--allowed-tools",
                        "--disallowedTools",
                        "--disallowed-tools",
                        "--settings",
                        "--mcp-config",
                        "--append-system-prompt",
                        "--add-dir",
                    ]),
            )
            // Its counters fill `CounterStats::sub_agent_steps` (protocol 1.1); its other
            // fields already need more, so this only says so.
            .requires_protocol("1.1")
    }

    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        let by_message = match request.unit.as_str() {
            "message" => true,
            "tool_use" => false,
            other => return Err(format!("unknown unit `{other}`")),
        };
        Ok(Box::new(ClaudeCounter {
            by_message,
            calls: !request.tool_calls_unused,
            ..ClaudeCounter::default()
        }))
    }
}

/// Counts one Claude Code stream.
#[derive(Debug, Default)]
pub struct ClaudeCounter {
    by_message: bool,
    /// Whether the host takes tool calls and results: when not, they are not looked for.
    calls: bool,
    steps: IdSet,
    completed: u64,
    /// A top-level message is under way (message unit), completed when the next one begins.
    message_open: bool,
    sub_agent_steps: BTreeMap<String, u64>,
    /// Each sub-agent's steps: keys of [`sub_agent_key`].
    sub_agent_seen: IdSet,
    /// Where a sub-agent step's key is built, reused from line to line.
    key: Vec<u8>,
    /// Ids of the top-level `tool_use` blocks already reported as tool calls.
    calls_seen: IdSet,
    /// Tool calls not yet taken by the host.
    tool_calls: Vec<ToolCall>,
    /// Tool results not yet taken by the host.
    tool_results: Vec<ToolResult>,
    tool_result_lines: u64,
    saw_events: bool,
    rate_limit_rejected: bool,
    terminal: Option<Terminal>,
    turns_reported: Option<u64>,
    cost: Option<f64>,
    noise: u64,
    unknown: u64,
    /// Usage per message id: the largest of each count seen so far.
    message_usage: IdMap<Tokens>,
    /// The message each stream is sending in `stream_event` lines (`--include-partial-messages`),
    /// by parent tool use id ("" for the top level).
    streaming: HashMap<String, Vec<u8>>,
    /// Usage of the top-level messages, topped up to `result.usage`.
    main_tokens: Tokens,
    /// Usage per sub-agent.
    sub_agent_tokens: BTreeMap<String, Tokens>,
    /// What only `result.modelUsage` shows (side calls, sub-agents' final output).
    other_tokens: Tokens,
    /// Whether the stream carried any usage.
    usage_seen: bool,
    /// Usage not yet taken by the host.
    pending_usage: Option<Tokens>,
    /// The session id of the `system/init` line (`claude --resume` takes it).
    session_id: Option<String>,
}

/// Token counts from an Anthropic `usage` object: input is uncached + cache read + cache
/// creation, cached is cache read. `None` when it has none of the counts.
fn usage_tokens(usage: RawValue<'_>) -> Option<Tokens> {
    let [input, created, read, output] = usage.fields([
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    ])?;
    if [input, created, read, output].iter().all(Option::is_none) {
        return None;
    }
    let n = |v: Option<RawValue<'_>>| v.and_then(|v| v.as_u64()).unwrap_or(0);
    let read_count = read.and_then(|v| v.as_u64());
    Some(Tokens::new(n(input) + n(created) + n(read), n(output)).cached_input_tokens(read_count))
}

/// The same from a parsed `usage` object (`result.usage`), or `None` when it is not one.
fn json_usage_tokens(usage: &serde_json::Value) -> Option<Tokens> {
    let usage = usage.as_object()?;
    let n = |k: &str| usage.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let input = n("input_tokens") + n("cache_creation_input_tokens") + n("cache_read_input_tokens");
    Some(
        Tokens::new(input, n("output_tokens")).cached_input_tokens(
            usage
                .get("cache_read_input_tokens")
                .and_then(|v| v.as_u64()),
        ),
    )
}

/// The sum over `result.modelUsage` (`{model: {inputTokens, outputTokens, cacheReadInputTokens,
/// cacheCreationInputTokens, …}}`), or `None` when it is missing or empty.
fn model_usage_tokens(model_usage: &serde_json::Value) -> Option<Tokens> {
    let models = model_usage.as_object().filter(|m| !m.is_empty())?;
    Some(models.values().fold(Tokens::default(), |sum, m| {
        let n = |k: &str| m[k].as_u64().unwrap_or(0);
        let input = n("inputTokens") + n("cacheReadInputTokens") + n("cacheCreationInputTokens");
        sum.saturating_add(
            Tokens::new(input, n("outputTokens")).cached_input_tokens(n("cacheReadInputTokens")),
        )
    }))
}

/// The key of a sub-agent's step in `key`: the parent's id, its length, then the step's id, so
/// that no two (parent, step) pairs share a key.
fn sub_agent_key(key: &mut Vec<u8>, parent: &[u8], step: &[u8]) {
    key.clear();
    key.extend_from_slice(parent);
    key.extend_from_slice(&(parent.len() as u64).to_le_bytes());
    key.extend_from_slice(step);
}

impl ClaudeCounter {
    fn assistant(
        &mut self,
        message: Option<RawValue<'_>>,
        parent: Option<RawValue<'_>>,
        report: &mut LineReport,
    ) {
        let Some([Some(id), model, content, usage]) =
            message.and_then(|m| m.fields(["id", "model", "content", "usage"]))
        else {
            self.unknown += 1;
            report.flags |= LineReport::UNKNOWN_EVENT;
            return;
        };
        if model.is_some_and(|m| m.is_str("<synthetic>")) {
            return;
        }
        let parent = parent.filter(|p| !p.is_null());
        if let Some(tokens) = usage.and_then(usage_tokens) {
            self.message_usage(id.0, parent, tokens, report);
        }
        // The tool_use unit's steps: the line's tool_use blocks (the message unit's is the id).
        let mut block_ids: Vec<&[u8]> = Vec::new();
        // (block id, name, input) of the line's top-level tool_use blocks.
        let mut calls: Vec<(&[u8], Option<RawValue<'_>>, Option<RawValue<'_>>)> = Vec::new();
        let want_calls = self.calls && parent.is_none();
        // Blocks are read for the tool_use unit, and on top-level lines for the tool calls.
        if let Some(content) = content.filter(|_| !self.by_message || want_calls) {
            content.for_each_element(|block| {
                if let Some([Some(kind), Some(block_id), name, input]) =
                    block.fields(["type", "id", "name", "input"])
                    && kind.is_str("tool_use")
                {
                    if !self.by_message {
                        block_ids.push(block_id.0);
                    }
                    if want_calls {
                        calls.push((block_id.0, name, input));
                    }
                }
            });
        }
        let message = [id.0];
        let step_ids: &[&[u8]] = if self.by_message {
            &message
        } else {
            &block_ids
        };
        match parent {
            Some(parent) => self.sub_agent_steps(parent, step_ids, report),
            None => {
                if !self.saw_events {
                    report.turns += 1;
                }
                self.saw_events = true;
                for step in step_ids {
                    if self.steps.insert(step) {
                        report.steps_begun += 1;
                        if self.by_message && std::mem::replace(&mut self.message_open, true) {
                            self.completed += 1;
                            report.steps_completed += 1;
                        }
                    }
                }
                for (block_id, name, input) in calls {
                    self.tool_call(block_id, name, input, report);
                }
            }
        }
    }

    /// Counts a sub-agent's steps for it, once each.
    fn sub_agent_steps(&mut self, parent: RawValue<'_>, steps: &[&[u8]], report: &mut LineReport) {
        let mut name = None;
        for step in steps {
            sub_agent_key(&mut self.key, parent.0, step);
            if self.sub_agent_seen.insert(&self.key) {
                let name = name.get_or_insert_with(|| {
                    parent.as_str().map(|p| p.into_owned()).unwrap_or_default()
                });
                match self.sub_agent_steps.get_mut(name.as_str()) {
                    Some(n) => *n += 1,
                    None => {
                        self.sub_agent_steps.insert(name.clone(), 1);
                    }
                }
                report.sub_agent_steps += 1;
            }
        }
    }

    /// Queues a top-level `tool_use` block as a tool call, once per block id (a message split
    /// over lines repeats its earlier blocks). Its input is parsed only here.
    fn tool_call(
        &mut self,
        block_id: &[u8],
        name: Option<RawValue<'_>>,
        input: Option<RawValue<'_>>,
        report: &mut LineReport,
    ) {
        if !self.calls_seen.insert(block_id) {
            return;
        }
        let name = name
            .and_then(|n| n.as_str())
            .map(|n| n.into_owned())
            .unwrap_or_default();
        let mut arguments = input
            .and_then(|i| i.to_json())
            .unwrap_or(serde_json::Value::Null);
        let mut command = None;
        if name == "Bash"
            && let Some(object) = arguments.as_object_mut()
        {
            // Annotates the command for the user and does not change what runs; a looping
            // model rewords it.
            object.remove("description");
            command = match object.remove("command") {
                Some(serde_json::Value::String(c)) => Some(c),
                _ => None,
            };
        }
        let call = match command {
            Some(command) => ToolCall::shell(name, &command, &arguments),
            None => ToolCall::new(name, &arguments),
        };
        let id = String::from_utf8_lossy(block_id);
        self.tool_calls.push(call.with_id(id.trim_matches('"')));
        report.flags |= LineReport::TOOL_CALL;
    }

    /// Records what a line says of a message's usage: each count is the largest seen for the
    /// message, and what that adds is reported, to the message's sub-agent or the top level.
    fn message_usage(
        &mut self,
        id: &[u8],
        parent: Option<RawValue<'_>>,
        tokens: Tokens,
        report: &mut LineReport,
    ) {
        self.usage_seen = true;
        let before = self.message_usage.get(id).copied();
        let now = before.map_or(tokens, |b| b.max_each(tokens));
        let delta = now.saturating_sub(before.unwrap_or_default());
        if delta.is_zero() {
            return;
        }
        self.message_usage.insert(id, now);
        match parent.and_then(|p| p.as_str()) {
            Some(parent) => {
                let sub = self
                    .sub_agent_tokens
                    .entry(parent.into_owned())
                    .or_default();
                *sub = sub.saturating_add(delta);
            }
            None => self.main_tokens = self.main_tokens.saturating_add(delta),
        }
        self.add_usage(delta, report);
    }

    /// Queues `delta` for the host and flags the line.
    fn add_usage(&mut self, delta: Tokens, report: &mut LineReport) {
        self.pending_usage = Some(self.pending_usage.unwrap_or_default().saturating_add(delta));
        report.flags |= LineReport::USAGE;
    }

    /// The usage reported so far: top level, sub-agents and what only the result showed.
    fn total_tokens(&self) -> Tokens {
        self.sub_agent_tokens.values().fold(
            self.main_tokens.saturating_add(self.other_tokens),
            |sum, t| sum.saturating_add(*t),
        )
    }

    /// A `stream_event` line (`--include-partial-messages`): `message_start` names the message
    /// being streamed and its starting usage, `message_delta` its counts so far.
    fn stream_event(
        &mut self,
        event: Option<RawValue<'_>>,
        parent: Option<RawValue<'_>>,
        report: &mut LineReport,
    ) {
        let Some([Some(kind), message, usage]) =
            event.and_then(|e| e.fields(["type", "message", "usage"]))
        else {
            return;
        };
        let parent = parent.filter(|p| !p.is_null());
        let stream = parent
            .and_then(|p| p.as_str())
            .map(|p| p.into_owned())
            .unwrap_or_default();
        if kind.is_str("message_start") {
            let Some([Some(id), usage]) = message.and_then(|m| m.fields(["id", "usage"])) else {
                return;
            };
            self.streaming.insert(stream, id.0.to_vec());
            if let Some(tokens) = usage.and_then(usage_tokens) {
                self.message_usage(id.0, parent, tokens, report);
            }
        } else if kind.is_str("message_delta")
            && let Some(tokens) = usage.and_then(usage_tokens)
            && let Some(id) = self.streaming.get(&stream).cloned()
        {
            self.message_usage(&id, parent, tokens, report);
        }
    }

    /// Tops the reported usage up to what a `result` line says: the top-level messages to
    /// `result.usage`, the whole to the sum of `result.modelUsage`, each count to the larger.
    fn result_usage(&mut self, v: &serde_json::Value, report: &mut LineReport) {
        let main = json_usage_tokens(&v["usage"]);
        let models = model_usage_tokens(&v["modelUsage"]);
        if main.is_none() && models.is_none() {
            return;
        }
        self.usage_seen = true;
        let before = self.total_tokens();
        if let Some(main) = main {
            self.main_tokens = self.main_tokens.max_each(main);
        }
        if let Some(models) = models {
            let total = self.total_tokens();
            let extra = total.max_each(models).saturating_sub(total);
            self.other_tokens = self.other_tokens.saturating_add(extra);
        }
        let delta = self.total_tokens().saturating_sub(before);
        if !delta.is_zero() {
            self.add_usage(delta, report);
        }
    }

    fn user(
        &mut self,
        message: Option<RawValue<'_>>,
        parent: Option<RawValue<'_>>,
        report: &mut LineReport,
    ) {
        if parent.is_some_and(|p| !p.is_null()) {
            return;
        }
        let Some([Some(content)]) = message.and_then(|m| m.fields(["content"])) else {
            return;
        };
        let mut has_result = false;
        content.for_each_element(|block| {
            if let Some([Some(kind), tool_use_id, output, is_error]) =
                block.fields(["type", "tool_use_id", "content", "is_error"])
                && kind.is_str("tool_result")
            {
                has_result = true;
                if let Some(id) = tool_use_id {
                    if self.calls {
                        self.tool_result(id, output, is_error, report);
                    }
                    // A tool_use step completes with its result.
                    if !self.by_message && self.steps.contains(id.0) {
                        self.completed += 1;
                        report.steps_completed += 1;
                    }
                }
            }
        });
        if has_result {
            self.tool_result_lines += 1;
            self.saw_events = true;
            report.turns += 1;
        }
    }

    /// Queues the result of a top-level call reported before (`content` is a string or a
    /// list of text blocks; `is_error` marks a failure, e.g. a non-zero exit status).
    fn tool_result(
        &mut self,
        id: RawValue<'_>,
        output: Option<RawValue<'_>>,
        is_error: Option<RawValue<'_>>,
        report: &mut LineReport,
    ) {
        if !self.calls_seen.contains(id.0) {
            return;
        }
        let Some(id) = id.as_str() else {
            return;
        };
        let text = output
            .and_then(|o| o.to_json())
            .map(|o| output_text(&o))
            .unwrap_or_default();
        let failed = is_error.and_then(|e| e.as_bool()).unwrap_or(false);
        self.tool_results
            .push(ToolResult::new(id.into_owned(), &text, failed));
        report.flags |= LineReport::TOOL_RESULT;
    }

    fn result(&mut self, line: &[u8], report: &mut LineReport) {
        report.flags |= LineReport::TERMINAL;
        self.saw_events = true;
        if std::mem::take(&mut self.message_open) {
            self.completed += 1;
            report.steps_completed += 1;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        self.turns_reported = v["num_turns"].as_u64();
        self.cost = v["total_cost_usd"].as_f64();
        self.result_usage(&v, report);
        let is_error = v["is_error"].as_bool().unwrap_or(false);
        let subtype = v["subtype"].as_str().unwrap_or_default();
        let message = v["errors"]
            .as_array()
            .and_then(|e| e.first())
            .and_then(|e| e.as_str())
            .or_else(|| v["result"].as_str())
            .map(str::to_owned);
        let slug = if !is_error {
            None
        } else if subtype == "error_max_turns" || v["terminal_reason"] == "max_turns" {
            Some("max_steps")
        } else if subtype == "error_max_budget_usd" {
            Some("max_cost")
        } else if v["api_error_status"].as_u64() == Some(429)
            || self.rate_limit_rejected
            || message
                .as_deref()
                .is_some_and(|m| slug_for_error_text(m) == "rate_limited")
        {
            Some("rate_limited")
        } else {
            Some("provider_error")
        };
        let mut terminal = match slug {
            None => Terminal::success(),
            Some(slug) => Terminal::failed(slug, None),
        };
        terminal.message = message;
        self.terminal = Some(terminal);
    }
}

impl ClaudeCounter {
    /// Keeps the session id of the first `system` line that has one (`init`).
    fn system(&mut self, line: &[u8]) {
        if self.session_id.is_none()
            && let Some([Some(id)]) = scan(line, ["session_id"])
        {
            self.session_id = id.as_str().map(|s| s.into_owned());
        }
    }
}

impl StepCounter for ClaudeCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        let mut report = LineReport::empty();
        let Some([ty, message, parent, info, event]) = scan(
            line,
            [
                "type",
                "message",
                "parent_tool_use_id",
                "rate_limit_info",
                "event",
            ],
        ) else {
            self.noise += 1;
            return Ok(LineReport::noise());
        };
        let ty = ty.and_then(|t| t.as_str()).unwrap_or_default();
        match ty.as_ref() {
            "assistant" => self.assistant(message, parent, &mut report),
            "user" => self.user(message, parent, &mut report),
            "result" => self.result(line, &mut report),
            "rate_limit_event" => {
                if let Some([Some(status)]) = info.and_then(|i| i.fields(["status"])) {
                    self.rate_limit_rejected |= status.is_str("rejected");
                }
            }
            "stream_event" => self.stream_event(event, parent, &mut report),
            "system" => self.system(line),
            _ => {
                self.unknown += 1;
                report.flags |= LineReport::UNKNOWN_EVENT;
            }
        }
        Ok(report)
    }

    fn finish(&mut self) -> CounterStats {
        let mut stats = CounterStats::default();
        stats.num_steps_computed = self.steps.len() as u64;
        stats.num_turns_reported = self.turns_reported;
        stats.num_turns_computed = self.saw_events.then_some(1 + self.tool_result_lines);
        stats.terminal = self.terminal.clone();
        stats.tokens = self.usage_seen.then(|| self.total_tokens());
        stats.cost_usd = self.cost;
        stats.noise_lines = self.noise;
        stats.unknown_events = self.unknown;
        stats.sub_agent_steps = self.sub_agent_steps.clone();
        stats.sub_agent_tokens = self.sub_agent_tokens.clone();
        stats.session_id = self.session_id.clone();
        stats
    }

    fn take_tool_calls(&mut self) -> Vec<ToolCall> {
        std::mem::take(&mut self.tool_calls)
    }

    fn take_tool_results(&mut self) -> Vec<ToolResult> {
        std::mem::take(&mut self.tool_results)
    }

    fn take_usage(&mut self) -> Option<Tokens> {
        self.pending_usage.take()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use stepguard_core::loops::{
        Call, DEFAULT_LOOP_LIMIT, LoopDetector, LoopFound, LoopKind, LoopSettings, Outcome,
    };
    use stepguard_plugin_api::testing::outcome;

    use super::*;

    fn fixture(rel: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(rel);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn count_bytes(bytes: &[u8], unit: &str) -> (LineReport, CounterStats) {
        stepguard_plugin_api::testing::count(&ClaudePlugin, unit, bytes).unwrap()
    }

    #[test]
    fn streams_match_expected_json_for_both_units() {
        let expected: serde_json::Value =
            serde_json::from_slice(&fixture("streams/claude/expected.json")).unwrap();
        for (name, e) in expected.as_object().unwrap() {
            let bytes = fixture(&format!("streams/claude/{name}"));
            let (sum, stats) = count_bytes(&bytes, "message");
            assert_eq!(
                stats.num_steps_computed,
                e["api_rounds_top_level"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                u64::from(sum.steps_begun),
                stats.num_steps_computed,
                "{name}"
            );
            let sub: u64 = stats.sub_agent_steps.values().sum();
            assert_eq!(
                sub,
                e["distinct_assistant_message_ids_subagent"]
                    .as_u64()
                    .unwrap(),
                "{name}"
            );
            let (_, tools) = count_bytes(&bytes, "tool_use");
            assert_eq!(
                tools.num_steps_computed,
                e["tool_use_blocks_top_level"].as_u64().unwrap(),
                "{name}"
            );
            let sub: u64 = tools.sub_agent_steps.values().sum();
            assert_eq!(
                sub,
                e["tool_use_blocks_subagent"].as_u64().unwrap(),
                "{name}"
            );
            let result = &e["result"];
            assert_eq!(
                stats.num_turns_reported,
                result["num_turns"].as_u64(),
                "{name}"
            );
            assert_eq!(
                stats.num_turns_computed,
                Some(1 + e["tool_result_user_lines_top_level"].as_u64().unwrap()),
                "{name}"
            );
            assert_eq!(
                stats.terminal.as_ref().map(|t| !t.success),
                result["is_error"].as_bool(),
                "{name}"
            );
        }
    }

    /// (file, message steps, tool_use steps, reported turns, outcome)
    const CASES: &[(&str, u64, u64, Option<u64>, &str)] = &[
        (
            "streams/claude/error_api_midrun.jsonl",
            2,
            2,
            Some(3),
            "provider_error",
        ),
        (
            "streams/claude/error_billing_at_start.jsonl",
            0,
            0,
            Some(1),
            "provider_error",
        ),
        ("streams/claude/long_run.jsonl", 35, 40, Some(41), "success"),
        ("streams/claude/max_turns.jsonl", 3, 3, Some(4), "max_steps"),
        (
            "streams/claude/success_include_partial_messages.jsonl",
            2,
            1,
            Some(2),
            "success",
        ),
        (
            "streams/claude/success_multi_tool.jsonl",
            5,
            5,
            Some(6),
            "success",
        ),
        ("real/claude/tools3.jsonl", 4, 3, Some(4), "success"),
        ("real/claude/tools12.jsonl", 13, 12, Some(13), "success"),
        ("real/claude/maxturns2.jsonl", 2, 2, Some(3), "max_steps"),
        ("real/claude/error429.jsonl", 1, 1, Some(2), "rate_limited"),
        (
            "streams/claude/max_budget_usd.jsonl",
            3,
            3,
            Some(3),
            "max_cost",
        ),
        (
            "streams/claude/sub_agent_usage.jsonl",
            3,
            3,
            Some(4),
            "success",
        ),
    ];

    #[test]
    fn every_fixture_counts_and_outcome() {
        for (file, messages, tools, turns, expected) in CASES {
            let bytes = fixture(file);
            let (_, stats) = count_bytes(&bytes, "message");
            assert_eq!(stats.num_steps_computed, *messages, "{file}");
            assert_eq!(stats.num_turns_reported, *turns, "{file}");
            assert_eq!(&outcome(&stats), expected, "{file}");
            let (_, stats) = count_bytes(&bytes, "tool_use");
            assert_eq!(stats.num_steps_computed, *tools, "{file}");
        }
    }

    /// Every stream file of the fixtures, by path from `tests/fixtures`.
    fn all_streams() -> Vec<String> {
        ["streams/claude", "real/claude"]
            .iter()
            .flat_map(|dir| {
                let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
                std::fs::read_dir(root.join(dir))
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|f| f.ends_with(".jsonl"))
                    .map(|f| format!("{dir}/{f}"))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn a_host_that_takes_no_calls_gets_none_and_the_same_counts() {
        let files = all_streams();
        assert!(files.len() >= 10);
        for file in files {
            for unit in ["message", "tool_use"] {
                let bytes = fixture(&file);
                let mut quiet = ClaudePlugin
                    .open_counter(&CounterRequest::new(unit).without_tool_calls())
                    .unwrap();
                let (sum, stats) =
                    stepguard_plugin_api::testing::feed_all(quiet.as_mut(), &bytes).unwrap();
                assert!(!sum.has(LineReport::TOOL_CALL) && !sum.has(LineReport::TOOL_RESULT));
                assert!(quiet.take_tool_calls().is_empty());
                let (full_sum, full) = count_bytes(&bytes, unit);
                let key =
                    |s: &LineReport| (s.steps_begun, s.steps_completed, s.turns, s.sub_agent_steps);
                assert_eq!(key(&sum), key(&full_sum), "{file} {unit}");
                assert_eq!(stats, full, "{file} {unit}");
            }
        }
    }

    fn assistant(id: &str, parent: &str) -> String {
        format!(
            r#"{{"type":"assistant","message":{{"id":"{id}","model":"claude","content":[{{"type":"tool_use","id":"toolu_{id}","name":"Read","input":{{}}}}]}},"parent_tool_use_id":{parent}}}"#
        )
    }

    #[test]
    fn a_message_seen_again_after_a_long_gap_is_not_a_new_step() {
        let mut stream = assistant("msg_first", "null");
        for i in 0..50_000 {
            stream.push('\n');
            stream.push_str(&assistant(&format!("msg_{i:024x}"), "null"));
        }
        stream.push('\n');
        stream.push_str(&assistant("msg_first", "null"));
        for unit in ["message", "tool_use"] {
            let (sum, stats) = count_bytes(stream.as_bytes(), unit);
            assert_eq!(sum.steps_begun, 50_001, "{unit}");
            assert_eq!(stats.num_steps_computed, 50_001, "{unit}");
        }
        assert_eq!(calls(stream.as_bytes(), "message").len(), 50_001);
    }

    #[test]
    fn sub_agents_count_their_own_steps_even_with_the_same_ids() {
        let stream = [
            assistant("m1", r#""toolu_a""#),
            assistant("m1", r#""toolu_a""#),
            assistant("m1", r#""toolu_b""#),
            // The step id and the parent are read whole: no pair's key is another's.
            assistant("m1", r#""toolu_a\"""#),
            assistant("m1", "null"),
        ]
        .join("\n");
        let (sum, stats) = count_bytes(stream.as_bytes(), "message");
        assert_eq!((sum.steps_begun, sum.sub_agent_steps), (1, 3));
        assert_eq!(stats.sub_agent_steps["toolu_a"], 1);
        assert_eq!(stats.sub_agent_steps["toolu_b"], 1);
        assert_eq!(stats.sub_agent_steps["toolu_a\""], 1);
    }

    #[test]
    fn long_run_sub_agent_is_reported_separately() {
        let (sum, stats) = count_bytes(&fixture("streams/claude/long_run.jsonl"), "message");
        assert_eq!(stats.sub_agent_steps.len(), 1);
        assert_eq!(sum.sub_agent_steps, 3);
        assert_eq!(stats.num_steps_computed, 35);
    }

    #[test]
    fn tokens_and_cost_come_from_the_result() {
        let (_, stats) = count_bytes(&fixture("real/claude/tools3.jsonl"), "message");
        assert_eq!(stats.cost_usd, Some(0.004));
        assert!(stats.tokens.unwrap().input_tokens >= 400);
    }

    #[test]
    fn message_steps_complete_when_the_next_begins_or_the_result_arrives() {
        let (sum, _) = count_bytes(
            &fixture("streams/claude/success_multi_tool.jsonl"),
            "message",
        );
        assert_eq!((sum.steps_begun, sum.steps_completed), (5, 5));
        let (sum, _) = count_bytes(
            &fixture("streams/claude/success_multi_tool.jsonl"),
            "tool_use",
        );
        assert_eq!((sum.steps_begun, sum.steps_completed), (5, 5));
    }

    /// The tool calls of `bytes` counted by `unit`, each with the step it was made in.
    fn calls(bytes: &[u8], unit: &str) -> Vec<(ToolCall, u64)> {
        // Without their ids, which every call has its own of: what identifies a call is
        // compared.
        stepguard_plugin_api::testing::tool_calls(&ClaudePlugin, unit, bytes)
            .unwrap()
            .into_iter()
            .map(|(mut call, step)| {
                call.id = None;
                (call, step)
            })
            .collect()
    }

    fn names(calls: &[(ToolCall, u64)]) -> Vec<&str> {
        calls.iter().map(|(c, _)| c.tool.as_str()).collect()
    }

    /// The first loop under `settings`, with the step of the call that completed it.
    fn first_loop(calls: &[(ToolCall, u64)], settings: LoopSettings) -> Option<(LoopFound, u64)> {
        let mut detector = LoopDetector::new(settings);
        calls.iter().find_map(|(call, step)| {
            detector
                .observe(&call.tool, &call.fingerprint, *step)
                .map(|found| (found, *step))
        })
    }

    fn limit(limit: u32, window: u32) -> LoopSettings {
        LoopSettings {
            window,
            ..LoopSettings::with_limit(limit)
        }
    }

    #[test]
    fn every_top_level_tool_use_block_is_one_tool_call() {
        let expected: serde_json::Value =
            serde_json::from_slice(&fixture("streams/claude/expected.json")).unwrap();
        for (name, e) in expected.as_object().unwrap() {
            let bytes = fixture(&format!("streams/claude/{name}"));
            // Sub-agents' blocks are not reported; the unit does not matter.
            let top_level = e["tool_use_blocks_top_level"].as_u64().unwrap();
            for unit in ["message", "tool_use"] {
                assert_eq!(calls(&bytes, unit).len() as u64, top_level, "{name} {unit}");
            }
        }
        let multi = calls(
            &fixture("streams/claude/success_multi_tool.jsonl"),
            "message",
        );
        assert_eq!(names(&multi), ["Glob", "Read", "Read", "Edit", "Bash"]);
        // Parallel calls are made in the same step.
        let steps: Vec<u64> = multi.iter().map(|(_, s)| *s).collect();
        assert_eq!(steps, [1, 2, 2, 3, 4]);
        assert_eq!(
            calls(&fixture("real/claude/tools12.jsonl"), "message").len(),
            12
        );
    }

    #[test]
    fn a_block_repeated_on_later_lines_of_its_message_is_reported_once() {
        let line = |blocks: &str| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"msg_1","model":"claude","content":[{blocks}]}},"parent_tool_use_id":null}}"#
            )
        };
        let a = r#"{"type":"tool_use","id":"toolu_a","name":"Read","input":{"file_path":"a.rs"}}"#;
        let b = r#"{"type":"tool_use","id":"toolu_b","name":"Read","input":{"file_path":"b.rs"}}"#;
        let stream = [
            line(r#"{"type":"text","text":"Reading."}"#),
            line(a),
            line(&format!("{a},{b}")),
            line(&format!("{a},{b}")),
        ]
        .join("\n");
        let seen = calls(stream.as_bytes(), "message");
        assert_eq!(names(&seen), ["Read", "Read"]);
        assert_ne!(seen[0].0.fingerprint, seen[1].0.fingerprint);
        // A synthetic message's blocks and a sub-agent's are not calls.
        let sub = r#"{"type":"assistant","message":{"id":"msg_2","model":"claude","content":[{"type":"tool_use","id":"toolu_c","name":"Bash","input":{}}]},"parent_tool_use_id":"toolu_task"}"#;
        let synthetic = r#"{"type":"assistant","message":{"id":"x","model":"<synthetic>","content":[{"type":"tool_use","id":"toolu_d","name":"Bash","input":{}}]},"parent_tool_use_id":null}"#;
        assert!(calls(format!("{sub}\n{synthetic}").as_bytes(), "message").is_empty());
    }

    #[test]
    fn equal_arguments_are_one_fingerprint_whatever_their_layout() {
        let call = |id: &str, name: &str, input: &str| {
            let line = format!(
                r#"{{"type":"assistant","message":{{"id":"msg_{id}","model":"claude","content":[{{"type":"tool_use","id":"toolu_{id}","name":"{name}","input":{input}}}]}},"parent_tool_use_id":null}}"#
            );
            calls(line.as_bytes(), "message").remove(0).0
        };
        let a = call(
            "1",
            "Grep",
            r#"{"pattern":"fn main","path":"src","output_mode":"content"}"#,
        );
        let b = call(
            "2",
            "Grep",
            "{ \"output_mode\" : \"content\",\t\"path\": \"src\", \"pattern\": \"fn main\" }",
        );
        assert_eq!(a, b);
        assert_eq!(a.tool, "Grep");
        assert_ne!(
            a,
            call(
                "3",
                "Grep",
                r#"{"pattern":"fn main","path":"tests","output_mode":"content"}"#
            )
        );
        assert_ne!(
            a,
            call(
                "4",
                "Glob",
                r#"{"pattern":"fn main","path":"src","output_mode":"content"}"#
            )
        );
        // Bash's description does not change what runs.
        let build = call(
            "5",
            "Bash",
            r#"{"command":"cargo build","description":"Build"}"#,
        );
        assert_eq!(
            build,
            call(
                "6",
                "Bash",
                r#"{"description":"Build it again","command":"cargo build"}"#
            )
        );
        assert_ne!(
            build,
            call("7", "Bash", r#"{"command":"cargo build --release"}"#)
        );
    }

    #[test]
    fn the_repeated_call_is_a_loop_at_its_limit() {
        let seen = calls(&fixture("streams/claude/loop_repeat.jsonl"), "message");
        assert_eq!(seen.len(), 9);
        let (found, step) = first_loop(&seen, limit(3, 20)).unwrap();
        assert_eq!((found.tool.as_str(), found.count), ("Bash", 3));
        assert_eq!(
            (found.kind, found.first_step, step),
            (LoopKind::Repeat, 1, 4)
        );
        // The default limit: the fifth build, in round 7 of 8.
        let (found, step) =
            first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)).unwrap();
        assert_eq!((found.tool.as_str(), found.count, step), ("Bash", 5, 7));
    }

    #[test]
    fn the_read_edit_cycle_is_a_loop() {
        let seen = calls(&fixture("streams/claude/loop_cycle.jsonl"), "message");
        assert_eq!(names(&seen[..5]), ["Grep", "Read", "Edit", "Read", "Edit"]);
        // In a wide window the cycle's first call repeats first.
        let (found, step) = first_loop(&seen, limit(3, 20)).unwrap();
        assert_eq!(
            (found.tool.as_str(), found.kind, step),
            ("Read", LoopKind::Repeat, 6)
        );
        // In a window too narrow for that, the cycle itself: three times round from round 2.
        let (found, step) = first_loop(&seen, limit(3, 4)).unwrap();
        assert_eq!(found.kind, LoopKind::Cycle { period: 2 });
        assert_eq!(
            (found.tool.as_str(), found.first_step, step),
            ("Read → Edit", 2, 7)
        );
        assert!(first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)).is_some());
    }

    #[test]
    fn polling_a_log_is_a_loop_unless_its_tool_is_exempt() {
        let seen = calls(&fixture("streams/claude/loop_exempt_read.jsonl"), "message");
        assert_eq!(
            names(&seen),
            ["Bash", "Read", "Read", "Read", "Read", "Read"]
        );
        let found = first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT));
        assert_eq!(found.map(|(f, _)| f.tool), Some("Read".to_owned()));
        let exempt = LoopSettings {
            ignore_tools: vec!["Read".to_owned()],
            ..limit(2, 20)
        };
        assert_eq!(first_loop(&seen, exempt), None);
    }

    #[test]
    fn the_default_limit_flags_no_recording_but_the_loops() {
        for dir in ["streams/claude", "real/claude"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if !name.ends_with(".jsonl") || name == "loop_exempt_read.jsonl" {
                    continue;
                }
                let seen = calls(&std::fs::read(&path).unwrap(), "message");
                let found = first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT));
                assert_eq!(
                    found.is_some(),
                    name.starts_with("loop_"),
                    "{dir}/{name}: {found:?}"
                );
            }
        }
    }

    #[test]
    fn tool_calls_are_declared_and_taken_once() {
        let m = ClaudePlugin.manifest();
        assert!(m.tool_calls);
        assert_eq!(m.min_protocol(), "1.8.0");
        assert!(m.tool_results);
        let mut counter = ClaudePlugin
            .open_counter(&CounterRequest::new("message"))
            .unwrap();
        let bytes = fixture("real/claude/tools3.jsonl");
        let chunk =
            stepguard_plugin_api::testing::feed_chunk(counter.as_mut(), &bytes, 100).unwrap();
        assert!(chunk.sum.has(LineReport::TOOL_CALL));
        let taken: Vec<String> = counter
            .take_tool_calls()
            .into_iter()
            .map(|c| c.tool)
            .collect();
        assert_eq!(taken, ["Bash"; 3]);
        assert!(counter.take_tool_calls().is_empty());
    }

    #[test]
    fn native_limit_is_declared() {
        let m = ClaudePlugin.manifest();
        let limit = m.native_limit.unwrap();
        assert_eq!(
            limit.args_for(&["claude".into(), "-p".into()], 9),
            Some(vec!["--max-turns".into(), "9".into()])
        );
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn native_cost_limit_is_declared_and_no_token_limit() {
        let m = ClaudePlugin.manifest();
        assert!(m.reports_usage);
        assert_eq!(m.native_token_limit, None);
        let cost = m.native_cost_limit.unwrap();
        let command = words(&["claude", "-p", "fix it", "--output-format", "stream-json"]);
        assert_eq!(
            cost.command_for_cost(&command, 2.5),
            Some(words(&[
                "claude",
                "-p",
                "fix it",
                "--output-format",
                "stream-json",
                "--max-budget-usd",
                "2.5"
            ]))
        );
        let given = words(&["claude", "-p", "x", "--max-budget-usd", "1"]);
        assert_eq!(cost.command_for_cost(&given, 2.5), None);
    }

    /// A run's token counts with unknown ones as zero: the deltas and the final numbers may
    /// differ in whether a zero count is known.
    fn counts(t: Tokens) -> (u64, u64, u64, u64) {
        (
            t.input_tokens,
            t.output_tokens,
            t.cached_input_tokens.unwrap_or(0),
            t.reasoning_output_tokens.unwrap_or(0),
        )
    }

    fn live(bytes: &[u8], unit: &str) -> Tokens {
        stepguard_plugin_api::testing::usage(&ClaudePlugin, unit, bytes).unwrap()
    }

    #[test]
    fn the_live_usage_adds_up_to_the_final_tokens_in_every_recording() {
        for dir in ["streams/claude", "real/claude"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "jsonl") {
                    continue;
                }
                let bytes = std::fs::read(&path).unwrap();
                for unit in ["message", "tool_use"] {
                    let (_, stats) = count_bytes(&bytes, unit);
                    assert_eq!(
                        counts(live(&bytes, unit)),
                        counts(stats.tokens.unwrap_or_default()),
                        "{} {unit}",
                        path.display()
                    );
                    let sub: Tokens = stats
                        .sub_agent_tokens
                        .values()
                        .fold(Tokens::default(), |sum, t| sum.saturating_add(*t));
                    assert!(
                        sub.total() <= stats.tokens.unwrap_or_default().total(),
                        "{}",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn sub_agent_usage_is_reported_per_sub_agent_and_in_the_total() {
        let bytes = fixture("streams/claude/sub_agent_usage.jsonl");
        let (sum, stats) = count_bytes(&bytes, "message");
        assert_eq!((sum.steps_begun, sum.sub_agent_steps), (3, 4));
        // Two Explore agents in parallel, each keyed like its steps: A's Grep and Read rounds,
        // B's Glob round and its two parallel Reads (one message over two lines, once).
        let keys: Vec<&String> = stats.sub_agent_tokens.keys().collect();
        assert_eq!(keys, stats.sub_agent_steps.keys().collect::<Vec<_>>());
        assert!(keys.iter().all(|k| k.starts_with("toolu_01")), "{keys:?}");
        let mut per_agent: Vec<(u64, u64, u64, u64)> = stats
            .sub_agent_tokens
            .values()
            .map(|t| counts(*t))
            .collect();
        per_agent.sort_unstable();
        // B: 3 + 4290 in, then 5 + 388 + 4290 (4290 cached); A: 3 + 4317, then 6 + 612 + 4317.
        assert_eq!(per_agent, [(8976, 4, 4290, 0), (9255, 3, 4317, 0)]);
        // The total: the main loop topped up to `result.usage`, the sub-agents, and what only
        // `result.modelUsage` shows (the sub-agents' final answers, a side call), each count
        // to the larger: here `modelUsage` covers everything.
        assert_eq!(
            counts(stats.tokens.unwrap()),
            (
                51_347 + 637 + 13_252 + 18_214,
                763 + 1035,
                47_516 + 18_214,
                0
            )
        );
        assert_eq!(
            counts(live(&bytes, "message")),
            counts(stats.tokens.unwrap())
        );
        // Live, the sub-agents' usage arrives with their messages, before the result.
        let deltas =
            stepguard_plugin_api::testing::usage_deltas(&ClaudePlugin, "message", &bytes).unwrap();
        let before_result = deltas
            .iter()
            .filter(|(line, _)| *line < 20)
            .fold(Tokens::default(), |sum, (_, t)| sum.saturating_add(*t));
        assert_eq!(
            counts(before_result),
            (51_347 + 9255 + 8976, 7 + 3 + 4, 47_516 + 4317 + 4290, 0)
        );
        // A message split over lines is reported on its first line only.
        assert_eq!(deltas.iter().filter(|(line, _)| *line <= 4).count(), 1);
    }

    #[test]
    fn the_cost_budget_ending_the_run_is_max_cost() {
        let bytes = fixture("streams/claude/max_budget_usd.jsonl");
        let (_, stats) = count_bytes(&bytes, "message");
        let terminal = stats.terminal.clone().unwrap();
        assert_eq!(terminal.slug.as_deref(), Some("max_cost"));
        assert_eq!(
            terminal.message.as_deref(),
            Some("Reached maximum budget ($0.0025)")
        );
        assert_eq!(stats.cost_usd, Some(0.003));
        // `result.usage` (200 in, 40 out) left out the last call; `modelUsage` has all three.
        assert_eq!(counts(stats.tokens.unwrap()), (300, 60, 0, 0));
    }

    #[test]
    fn partial_messages_give_the_output_counts_as_they_stream() {
        let bytes = fixture("streams/claude/success_include_partial_messages.jsonl");
        let deltas =
            stepguard_plugin_api::testing::usage_deltas(&ClaudePlugin, "message", &bytes).unwrap();
        let (last, _) = *deltas.last().unwrap();
        let streamed = deltas
            .iter()
            .filter(|(line, _)| *line < last)
            .fold(Tokens::default(), |sum, (_, t)| sum.saturating_add(*t));
        // Everything `result.usage` says was known before the result; the result adds only
        // the side call `modelUsage` shows (612 in, 24 out).
        assert_eq!(counts(streamed), (31_024, 83, 29_624, 0));
        let (_, stats) = count_bytes(&bytes, "message");
        assert_eq!(
            counts(stats.tokens.unwrap()),
            (31_024 + 612, 83 + 24, 29_624, 0)
        );
    }

    #[test]
    fn a_message_is_counted_once_with_the_largest_usage_its_lines_show() {
        let line = |id: &str, parent: &str, input: u64, output: u64| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"{id}","model":"claude","content":[],"usage":{{"input_tokens":{input},"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":{output}}}}},"parent_tool_use_id":{parent}}}"#
            )
        };
        let stream = [
            line("msg_1", "null", 5, 1),
            line("msg_1", "null", 5, 1),
            line("msg_1", "null", 5, 40),
            line("msg_2", r#""toolu_task""#, 7, 2),
            line("msg_1", "null", 5, 3),
        ]
        .join("\n");
        let deltas = stepguard_plugin_api::testing::usage_deltas(
            &ClaudePlugin,
            "message",
            stream.as_bytes(),
        )
        .unwrap();
        let per_line: Vec<(u64, (u64, u64, u64, u64))> =
            deltas.iter().map(|(n, t)| (*n, counts(*t))).collect();
        assert_eq!(
            per_line,
            [
                (1, (115, 1, 100, 0)),
                (3, (0, 39, 0, 0)),
                (4, (117, 2, 100, 0))
            ]
        );
        let (_, stats) = count_bytes(stream.as_bytes(), "message");
        assert_eq!(counts(stats.tokens.unwrap()), (232, 42, 200, 0));
        assert_eq!(
            counts(stats.sub_agent_tokens["toolu_task"]),
            (117, 2, 100, 0)
        );
        // Without a result, the final numbers are what the stream showed.
        assert_eq!(stats.terminal, None);
    }

    #[test]
    fn tool_results_answer_their_calls_and_the_same_output_is_one_fingerprint() {
        let pairs = stepguard_plugin_api::testing::tool_results(
            &ClaudePlugin,
            "message",
            &fixture("streams/claude/loop_repeat.jsonl"),
        )
        .unwrap();
        let builds: Vec<_> = pairs
            .iter()
            .filter(|(call, _)| call.program.as_deref() == Some("cargo"))
            .collect();
        assert_eq!(builds.len(), 6);
        let build = &builds[0].1;
        for (call, result) in &builds {
            assert_eq!(call.tool, "Bash");
            assert_eq!(
                (result.failed, &result.fingerprint),
                (true, &build.fingerprint)
            );
        }
        // The other calls returned other things.
        assert!(
            pairs
                .iter()
                .filter(|(call, _)| call.program.is_none())
                .all(|(_, r)| r.fingerprint != build.fingerprint && !r.failed)
        );
        // By progress, the build that keeps giving the same error is a loop at the limit.
        let mut detector = LoopDetector::new(LoopSettings::with_limit(DEFAULT_LOOP_LIMIT));
        detector.judge_by_progress();
        let found = pairs.iter().enumerate().find_map(|(i, (call, result))| {
            let seen = Call {
                program: call.program.clone(),
                id: call.id.clone(),
                ..Call::new(&call.tool, &call.fingerprint, i as u64 + 1)
            };
            // By progress only a result completes a loop; the call is recorded for it.
            let _ = detector.call(seen);
            detector.result(&Outcome {
                call_id: result.call_id.clone(),
                fingerprint: result.fingerprint.clone(),
                failed: result.failed,
            })
        });
        let found = found.expect("a loop");
        assert!(
            matches!(found.kind, LoopKind::Repeat | LoopKind::NoProgress),
            "{found:?}"
        );
        assert_eq!(found.count, DEFAULT_LOOP_LIMIT);
    }

    #[test]
    fn the_session_id_comes_from_the_init_line_and_the_manifest_resumes_it() {
        for (file, id) in [
            (
                "real/claude/tools3.jsonl",
                "8c23ee89-d9d5-41e5-8483-52efeb6b6d2a",
            ),
            (
                "real/claude/maxturns2.jsonl",
                "680614a0-7eae-4ea1-843b-6836083ab4b4",
            ),
        ] {
            let (_, stats) = count_bytes(&fixture(file), "message");
            assert_eq!(stats.session_id.as_deref(), Some(id), "{file}");
        }
        let (_, none) = count_bytes(b"{\"type\":\"system\",\"subtype\":\"init\"}\n", "message");
        assert_eq!(none.session_id, None);
        let resume = ClaudePlugin.manifest().resume.expect("claude resumes");
        let original: Vec<String> = [
            "claude",
            "-p",
            "fix",
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            "3",
            "--dangerously-skip-permissions",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            resume.command(&original, "s-1", "go on").unwrap(),
            [
                "claude",
                "-p",
                "go on",
                "--resume",
                "s-1",
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions"
            ]
        );
    }
}
