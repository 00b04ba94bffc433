//! stepguard's step mapping for `codex exec --json`.
//!
//! Codex runs a whole prompt as one turn made of many items, and has no limit of its own, so this
//! mapping is what makes a Codex budget possible. Units (public interface):
//!
//! * `item` (default): every item, begun at `item.started`, or counted at `item.completed` when
//!   it had no start; deduplicated by `item.id`;
//! * `actionable`: `agent_message` and `command_execution` items;
//! * `tool`: `command_execution`, `file_change`, `mcp_tool_call`, `web_search`, `collab_tool_call`;
//! * `message`: `agent_message` items.
//!
//! Legacy turns are the `turn.started` count. `turn.completed` is success; `turn.failed` is
//! `provider_error`, or `rate_limited` when its message says so, or `max_tokens` when the
//! session's token budget ended it (`budget reached`, Codex's `SessionBudgetExceeded`). Top-level
//! `error` events reading `Reconnecting…` are retries.
//!
//! Token usage (protocol 1.5): `turn.completed.usage` (`input_tokens`, cached ones included,
//! `cached_input_tokens`, `output_tokens`, `reasoning_output_tokens`) is the thread's running
//! total, restored on `codex exec resume`, so each count is the largest seen and what it grew by
//! is reported on the line, live; the final tokens are the last total. Codex writes usage only
//! when a turn completes, so within the one turn of a `codex exec` it arrives at the end, and a
//! resumed thread's first total includes its earlier runs. The native token limit is Codex's
//! own session budget (`-c features.rollout_budget.*`, experimental since 0.142: one count for
//! all the session's threads, checked before each model call, input and output tokens weighted
//! 1), inserted after the program because `codex exec` takes no options after `--`.
//!
//! Archived logs in the pre-0.44 `{"id","msg"}` format are accepted: `*_begin`/`*_end` events map
//! to the matching item types (deduplicated by `call_id`), `agent_message`/`agent_reasoning` to
//! completed items, `task_started` to a turn, `task_complete` to success and `token_count` to usage.
//!
//! Tool calls (for loop detection, protocol 1.3) are the tool items (the `tool` unit's types),
//! each reported once by item id: at `item.started`, or at `item.completed` when it had no start.
//! A `command_execution` is `shell` with its `command`; an `mcp_tool_call` is `SERVER/TOOL` with
//! its `arguments`; a `web_search` is reported when it completes, since its query is empty until
//! then; a `collab_tool_call` is its tool (`spawn_agent`, `wait` …) with its prompt and
//! receivers. A `file_change` names the files but not the patch, so each one is a call of its
//! own: editing one file several times is normal work, not a loop. Archived logs report their
//! `*_begin` events (where a patch's diff is known) and `web_search_end`. A command's call is
//! its normalised command with its program (`cargo` in `/bin/bash -lc 'cargo build'`).
//!
//! Tool results (protocol 1.6) are the `item.completed` lines of items reported as calls: a
//! command's `exit_code` and `aggregated_output` (failed: a non-zero exit code or status
//! `failed`), an MCP call's `result` or `error`, another item's `status`. Archived logs report
//! no results, so their loops are judged by identical calls.
//!
//! ```
//! use stepguard_plugin_api::{CounterRequest, ProviderPlugin};
//! let plugin = stepguard_provider_codex::CodexPlugin;
//! let mut counter = plugin.open_counter(&CounterRequest::new("tool")).unwrap();
//! let r = counter.feed(br#"{"type":"item.started","item":{"id":"item_0","type":"command_execution"}}"#).unwrap();
//! assert_eq!(r.steps_begun, 1);
//! ```
#![deny(unsafe_code)] // not `forbid`: export_plugin! allows it on its own generated items

use serde_json::{Value, json};
use stepguard_jsonl::{IdSet, RawValue, scan, scan_prefix};
use stepguard_plugin_api::{
    BaseUrlRule, CounterRequest, CounterStats, LineReport, Manifest, ModelEndpoint, NativeLimit,
    PreflightRule, ProviderBox, ProviderPlugin, ResumeTemplate, StepCounter, Terminal, Tokens,
    ToolCall, ToolResult, fingerprint::output_text, slug_for_error_text,
};

/// The Codex provider plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct CodexPlugin;

/// Returns the built-in Codex provider, behind the plugin interface.
pub fn provider() -> ProviderBox {
    stepguard_plugin_api::provider_box(CodexPlugin)
}

#[cfg(feature = "plugin")]
stepguard_plugin_api::export_plugin!(CodexPlugin);

/// Which item types a unit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Item,
    Actionable,
    Tool,
    Message,
}

impl Unit {
    fn counts(self, item_type: &[u8]) -> bool {
        match self {
            Unit::Item => true,
            Unit::Actionable => matches!(item_type, b"agent_message" | b"command_execution"),
            Unit::Tool => matches!(
                item_type,
                b"command_execution"
                    | b"file_change"
                    | b"mcp_tool_call"
                    | b"web_search"
                    | b"collab_tool_call"
            ),
            Unit::Message => item_type == b"agent_message",
        }
    }
}

impl ProviderPlugin for CodexPlugin {
    fn manifest(&self) -> Manifest {
        Manifest::new("codex", env!("CARGO_PKG_VERSION"))
            .description("OpenAI Codex CLI (`codex exec --json`); no native limit, so stepguard's is the only one")
            .unit_costing("item", "every item, begun at item.started (or item.completed without a start)", true, 1)
            .unit_costing("actionable", "agent_message and command_execution items", false, 1)
            .unit_costing("tool", "command_execution, file_change, mcp_tool_call, web_search and collab_tool_call items", false, 0)
            .unit_costing("message", "agent_message items", false, 1)
            // A provider chosen with `-c model_provider=NAME` has its base URL in
            // `model_providers.NAME`; the built-in OpenAI one reads the `openai_base_url` key
            // (Codex 0.169 ignores OPENAI_BASE_URL: set, it pointed nowhere).
            .model_endpoint(
                ModelEndpoint::new("openai-responses", "https://api.openai.com/v1")
                    .base_url(BaseUrlRule::ConfigFlag {
                        flag: "-c".into(),
                        selector: "model_provider".into(),
                        key: "model_providers.{}.base_url".into(),
                        files: codex_config(),
                    })
                    .base_url(BaseUrlRule::ConfigFlag {
                        flag: "-c".into(),
                        selector: String::new(),
                        key: "openai_base_url".into(),
                        files: codex_config(),
                    })
                    // The built-in provider's key; a chosen provider names its own variable.
                    .api_key_env("OPENAI_API_KEY")
                    .api_key_env("CODEX_API_KEY")
                    .api_key_env_key("model_providers.{}.env_key"),
            )
            .expects("JSONL events of `codex exec --json` (`thread.started`, `turn.started`, `item.completed`, …)")
            .preflight(PreflightRule::new(
                "codex",
                &["exec", "e"],
                "stepguard supervises `codex exec --json \"PROMPT\"`; the interactive `codex` prints no event stream",
            ))
            .preflight(
                PreflightRule::new(
                    "codex",
                    &["--json", "--experimental-json"],
                    "add `--json` after `codex exec`: stepguard counts its JSONL events",
                )
                .when_any(&["exec", "e"]),
            )
            .reports_tool_results()
            .reports_usage()
            // `codex exec resume [OPTIONS] ID PROMPT` takes the options kept here (0.169).
            .resume(
                ResumeTemplate::new(&["codex", "exec", "resume", "{flags}", "{session}", "{prompt}"])
                    .keep_flags(&[
                        "--json",
                        "--experimental-json",
                        "--skip-git-repo-check",
                        "--dangerously-bypass-approvals-and-sandbox",
                        "--ignore-user-config",
                        "--ignore-rules",
                    ])
                    .keep_options(&["-c", "--config", "-m", "--model", "--enable", "--disable"]),
            )
            // `thread.started` comes before the first model call: silence past this is a text
            // mode (a forgotten `--json` behind a wrapper), which prints nothing until it ends.
            .first_event_within(std::time::Duration::from_secs(FIRST_EVENT_SECS))
            .native_token_limit(
                NativeLimit::new(
                    &[
                        "-c",
                        "features.rollout_budget.enabled=true",
                        "-c",
                        "features.rollout_budget.limit_tokens={max_tokens}",
                        "-c",
                        "features.rollout_budget.enforce_limit=true",
                        "-c",
                        "features.rollout_budget.reminder_at_remaining_tokens=[]",
                        "-c",
                        "features.rollout_budget.prefill_token_weight=1.0",
                        "-c",
                        "features.rollout_budget.sampling_token_weight=1.0",
                    ],
                    &["features.rollout_budget", "features.rollout_budget.limit_tokens"],
                )
                .after_program(),
            )
    }

    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        let unit = match request.unit.as_str() {
            "item" => Unit::Item,
            "actionable" => Unit::Actionable,
            "tool" => Unit::Tool,
            "message" => Unit::Message,
            other => return Err(format!("unknown unit `{other}`")),
        };
        Ok(Box::new(CodexCounter::new(
            unit,
            !request.tool_calls_unused,
        )))
    }
}

/// Counts one Codex stream.
#[derive(Debug)]
pub struct CodexCounter {
    unit: Unit,
    /// The thread id of `thread.started` (`codex exec resume` takes it).
    thread_id: Option<String>,
    /// Items begun and not yet completed. A completed item's id is forgotten: Codex never
    /// reuses an id, so one that comes back is a new item and counts again, exactly as an id
    /// never seen (memory follows the items open, not the stream's length).
    open: IdSet,
    /// Steps begun so far.
    steps: u64,
    turns: u64,
    terminal: Option<Terminal>,
    last_error: Option<String>,
    tokens: Option<Tokens>,
    noise: u64,
    unknown: u64,
    /// Whether the host takes tool calls and results: when not, they are not looked for.
    calls: bool,
    /// Ids of the open tool items (or legacy call ids) already reported as tool calls.
    calls_seen: IdSet,
    /// Tool calls not yet taken by the host.
    tool_calls: Vec<ToolCall>,
    /// Tool results not yet taken by the host.
    tool_results: Vec<ToolResult>,
    /// Usage not yet taken by the host.
    pending_usage: Option<Tokens>,
}

/// Where Codex reads its config: `$CODEX_HOME` when set, else `~/.codex`.
fn codex_config() -> Vec<String> {
    vec![
        "$CODEX_HOME/config.toml".into(),
        "~/.codex/config.toml".into(),
    ]
}

/// Whether an error text is Codex's session token budget ending the turn: `budget reached` in
/// 0.169 (`CodexErr::SessionBudgetExceeded`), or the names of that error.
fn is_session_budget(text: &str) -> bool {
    let lower = text.trim().to_ascii_lowercase();
    lower == "budget reached"
        || [
            "session budget exceeded",
            "sessionbudgetexceeded",
            "session_budget_exceeded",
        ]
        .iter()
        .any(|needle| lower.contains(needle))
}

impl CodexCounter {
    fn new(unit: Unit, calls: bool) -> Self {
        CodexCounter {
            unit,
            thread_id: None,
            open: IdSet::new(),
            steps: 0,
            turns: 0,
            terminal: None,
            last_error: None,
            tokens: None,
            noise: 0,
            unknown: 0,
            calls,
            calls_seen: IdSet::new(),
            tool_calls: Vec::new(),
            tool_results: Vec::new(),
            pending_usage: None,
        }
    }

    /// Takes in a running total of the thread's usage: each count is the largest seen, and what
    /// that adds is reported on the line.
    fn usage_total(&mut self, total: Tokens, report: &mut LineReport) {
        let before = self.tokens;
        let now = before.map_or(total, |b| b.max_each(total));
        self.tokens = Some(now);
        let delta = now.saturating_sub(before.unwrap_or_default());
        if !delta.is_zero() {
            self.pending_usage = Some(self.pending_usage.unwrap_or_default().saturating_add(delta));
            report.flags |= LineReport::USAGE;
        }
    }

    /// Reports the tool call of a tool item's line once per item id: at `item.started`, or at
    /// the first `item.completed` when there was none (and for `web_search`, whose query is
    /// known only then). Only these lines get a full scan and their arguments parsed.
    fn item_call(
        &mut self,
        line: &[u8],
        started: bool,
        id: &[u8],
        kind: &[u8],
        report: &mut LineReport,
    ) {
        if !Unit::Tool.counts(kind)
            || (started && kind == b"web_search")
            || self.calls_seen.contains(id)
        {
            return;
        }
        let Some(call) = scan(line, ["item"])
            .and_then(|[item]| item)
            .and_then(|item| item_tool_call(item, id, kind))
        else {
            return;
        };
        self.calls_seen.insert(id);
        self.tool_calls.push(call.with_id(item_id(id)));
        report.flags |= LineReport::TOOL_CALL;
    }

    /// Reports the result of a tool item reported as a call, at its `item.completed`: what it
    /// printed or returned, and whether it failed. The item is then closed: its id is
    /// forgotten, and one that comes back is a new item with a call of its own.
    fn item_result(&mut self, line: &[u8], id: &[u8], kind: &[u8], report: &mut LineReport) {
        if !Unit::Tool.counts(kind) || !self.calls_seen.remove(id) {
            return;
        }
        let Some((text, failed)) = scan(line, ["item"])
            .and_then(|[item]| item)
            .and_then(|item| item_outcome(item, kind))
        else {
            return;
        };
        self.tool_results
            .push(ToolResult::new(item_id(id), &text, failed));
        report.flags |= LineReport::TOOL_RESULT;
    }

    /// Reports the tool call of an archived `*_begin` event (or of `web_search_end`, which
    /// alone carries the query), once per call id.
    fn legacy_call(&mut self, kind: &str, msg: RawValue<'_>, report: &mut LineReport) {
        if !matches!(
            kind,
            "exec_command_begin" | "patch_apply_begin" | "mcp_tool_call_begin" | "web_search_end"
        ) {
            return;
        }
        let Some(msg) = msg.to_json() else { return };
        let Some(call_id) = msg["call_id"].as_str() else {
            return;
        };
        if self.calls_seen.contains(call_id.as_bytes()) {
            return;
        }
        let call = match kind {
            "exec_command_begin" => ToolCall::new("shell", &json!({"command": msg["command"]})),
            "patch_apply_begin" => {
                // The archived format carries the diffs: the same patch is the same call.
                ToolCall::new("file_change", &json!({"changes": msg["changes"]}))
            }
            "mcp_tool_call_begin" => {
                let invocation = &msg["invocation"];
                ToolCall::new(
                    mcp_name(invocation["server"].as_str(), invocation["tool"].as_str()),
                    &invocation["arguments"],
                )
            }
            _ => ToolCall::new("web_search", &json!({"query": msg["query"]})),
        };
        self.calls_seen.insert(call_id.as_bytes());
        self.tool_calls.push(call);
        report.flags |= LineReport::TOOL_CALL;
    }

    /// An item begins: a step, unless it is open already. Codex never reuses an item's id:
    /// one that comes back after its item completed is a new item, so a stream cannot hide
    /// steps behind an old id (a replayed `completed` line counts again too: counting more is
    /// the safe side).
    fn begin(&mut self, id: &[u8], report: &mut LineReport) {
        if self.open.insert(id) {
            self.steps += 1;
            report.steps_begun += 1;
        }
    }

    /// An item completes: it closes if it was open, else it begins and completes at once.
    fn complete(&mut self, id: &[u8], report: &mut LineReport) {
        if !self.open.remove(id) {
            self.steps += 1;
            report.steps_begun += 1;
        }
        report.steps_completed += 1;
    }

    /// An archived item without an id (a message): its own item, begun (and completed).
    fn anonymous(&mut self, started: bool, report: &mut LineReport) {
        self.steps += 1;
        report.steps_begun += 1;
        report.steps_completed += u32::from(!started);
    }

    fn item_event(
        &mut self,
        line: &[u8],
        item: Option<RawValue<'_>>,
        started: bool,
        report: &mut LineReport,
    ) {
        let Some([Some(id), Some(kind)]) = item.and_then(|i| i.prefix_fields(["id", "type"]))
        else {
            self.unknown += 1;
            report.flags |= LineReport::UNKNOWN_EVENT;
            return;
        };
        let kind = kind.plain_str_bytes().unwrap_or_default();
        self.item(line, started, id.0, kind, report);
    }

    /// An item line read: its step, and its tool call and result when they are taken.
    #[inline]
    fn item(
        &mut self,
        line: &[u8],
        started: bool,
        id: &[u8],
        kind: &[u8],
        report: &mut LineReport,
    ) {
        if self.unit.counts(kind) {
            if started {
                self.begin(id, report);
            } else {
                self.complete(id, report);
            }
        }
        if self.calls {
            self.item_call(line, started, id, kind, report);
            if !started {
                self.item_result(line, id, kind, report);
            }
        }
    }

    fn legacy_event(&mut self, msg: RawValue<'_>, report: &mut LineReport) {
        let Some([Some(kind), call_id, info, message]) =
            msg.fields(["type", "call_id", "info", "message"])
        else {
            self.unknown += 1;
            report.flags |= LineReport::UNKNOWN_EVENT;
            return;
        };
        let kind = kind.as_str().unwrap_or_default();
        if self.calls {
            self.legacy_call(&kind, msg, report);
        }
        let item_type: Option<(&[u8], bool)> = match kind.as_ref() {
            "exec_command_begin" => Some((b"command_execution", true)),
            "exec_command_end" => Some((b"command_execution", false)),
            "patch_apply_begin" => Some((b"file_change", true)),
            "patch_apply_end" => Some((b"file_change", false)),
            "mcp_tool_call_begin" => Some((b"mcp_tool_call", true)),
            "mcp_tool_call_end" => Some((b"mcp_tool_call", false)),
            "web_search_begin" => Some((b"web_search", true)),
            "web_search_end" => Some((b"web_search", false)),
            "agent_message" => Some((b"agent_message", false)),
            "agent_reasoning" => Some((b"reasoning", false)),
            _ => None,
        };
        match (item_type, kind.as_ref()) {
            (Some((item_type, started)), _) if self.unit.counts(item_type) => {
                // Messages have no call id: each one is its own item.
                match call_id {
                    Some(id) if started => self.begin(id.0, report),
                    Some(id) => self.complete(id.0, report),
                    None => self.anonymous(started, report),
                }
            }
            (Some(_), _) => {}
            (None, "task_started") => {
                self.turns += 1;
                report.turns += 1;
            }
            (None, "task_complete") => {
                self.terminal = Some(Terminal::success());
                report.flags |= LineReport::TERMINAL;
            }
            (None, "token_count") => {
                if let Some(total) = info
                    .and_then(|i| i.fields(["total_token_usage"]))
                    .and_then(|[u]| u)
                    .and_then(usage_tokens)
                {
                    self.usage_total(total, report);
                }
            }
            (None, "error" | "stream_error") => {
                self.last_error = message.and_then(|m| m.as_str()).map(|m| m.into_owned());
            }
            _ => {}
        }
    }
}

impl CodexCounter {
    /// Terminal and error events: rare, so they get the full, validating scan.
    fn rare_event(&mut self, line: &[u8], report: &mut LineReport) {
        let Some([Some(ty), usage, error, message]) =
            scan(line, ["type", "usage", "error", "message"])
        else {
            self.noise += 1;
            report.flags |= LineReport::NOISE;
            return;
        };
        match ty.plain_str_bytes().unwrap_or_default() {
            b"turn.completed" => {
                if let Some(total) = usage.and_then(usage_tokens) {
                    self.usage_total(total, report);
                }
                self.terminal = Some(Terminal::success());
                report.flags |= LineReport::TERMINAL;
            }
            b"turn.failed" => {
                let text = error
                    .and_then(|e| e.fields(["message"]))
                    .and_then(|[m]| m)
                    .and_then(|m| m.as_str())
                    .map(|m| m.into_owned())
                    .or_else(|| self.last_error.clone())
                    .unwrap_or_else(|| "turn failed".to_owned());
                let slug = if is_session_budget(&text)
                    || self.last_error.as_deref().is_some_and(is_session_budget)
                {
                    "max_tokens"
                } else {
                    slug_for_error_text(&text)
                };
                self.terminal = Some(Terminal::failed(slug, text));
                report.flags |= LineReport::TERMINAL;
            }
            _ => {
                let text = message.and_then(|m| m.as_str()).unwrap_or_default();
                // `Reconnecting... k/n` is a retry, not a failure.
                if !text.starts_with("Reconnecting") {
                    self.last_error = Some(text.into_owned());
                }
            }
        }
    }
}

/// The tool call a tool item stands for, from what the item carries: `shell` and the command;
/// `SERVER/TOOL` and the arguments of an MCP call; `web_search` and the query and action; the
/// collab tool's own name (`spawn_agent`, `wait` …) and its prompt and receivers. A
/// `file_change` item carries the paths but not the patch, so it is made unique by its id:
/// different edits of one file must not look like the same call repeated.
fn item_tool_call(item: RawValue<'_>, id: &[u8], kind: &[u8]) -> Option<ToolCall> {
    let json = |v: Option<RawValue<'_>>| v.and_then(|v| v.to_json()).unwrap_or(Value::Null);
    let text = |v: Option<RawValue<'_>>| v.and_then(|v| v.as_str()).map(|v| v.into_owned());
    Some(match kind {
        b"command_execution" => {
            let [command] = item.fields(["command"])?;
            match text(command) {
                Some(command) => ToolCall::shell("shell", &command, &json!({})),
                None => ToolCall::new("shell", &json!({"command": json(command)})),
            }
        }
        b"mcp_tool_call" => {
            let [server, tool, arguments] = item.fields(["server", "tool", "arguments"])?;
            let name = mcp_name(text(server).as_deref(), text(tool).as_deref());
            ToolCall::new(name, &json(arguments))
        }
        b"web_search" => {
            let [query, action] = item.fields(["query", "action"])?;
            ToolCall::new(
                "web_search",
                &json!({"query": json(query), "action": json(action)}),
            )
        }
        b"file_change" => {
            let [changes] = item.fields(["changes"])?;
            let id = String::from_utf8_lossy(id);
            ToolCall::new(
                "file_change",
                &json!({"changes": json(changes), "item": id}),
            )
        }
        _ => {
            let [tool, prompt, receivers] =
                item.fields(["tool", "prompt", "receiver_thread_ids"])?;
            let name = text(tool).unwrap_or_else(|| "collab_tool_call".to_owned());
            ToolCall::new(
                name,
                &json!({"prompt": json(prompt), "receiver_thread_ids": json(receivers)}),
            )
        }
    })
}

/// An item's id as text, whichever way it was read (with or without its quotes).
fn item_id(id: &[u8]) -> String {
    String::from_utf8_lossy(id).trim_matches('"').to_owned()
}

/// What a completed tool item returned, as text, and whether it failed: a command's output
/// and exit code; an MCP call's result or error; otherwise its `status` (and a file change's
/// paths), `failed` meaning failure.
fn item_outcome(item: RawValue<'_>, kind: &[u8]) -> Option<(String, bool)> {
    let json = |v: Option<RawValue<'_>>| v.and_then(|v| v.to_json()).unwrap_or(Value::Null);
    let [status, output, exit_code, result, error, changes] = item.fields([
        "status",
        "aggregated_output",
        "exit_code",
        "result",
        "error",
        "changes",
    ])?;
    let failed_status = status.is_some_and(|s| s.is_str("failed"));
    Some(match kind {
        b"command_execution" => {
            let code = exit_code.and_then(|c| c.as_u64());
            let text = format!(
                "exit {}\n{}",
                code.map_or("?".to_owned(), |c| c.to_string()),
                output_text(&json(output))
            );
            (text, failed_status || code.is_some_and(|c| c != 0))
        }
        b"mcp_tool_call" => {
            let error = json(error);
            let failed = failed_status || !error.is_null();
            let text = if error.is_null() {
                output_text(&json(result))
            } else {
                output_text(&error)
            };
            (text, failed)
        }
        b"file_change" => (json(changes).to_string(), failed_status),
        _ => (json(status).to_string(), failed_status),
    })
}

/// An MCP tool's name as reported: `SERVER/TOOL`.
fn mcp_name(server: Option<&str>, tool: Option<&str>) -> String {
    format!(
        "{}/{}",
        server.unwrap_or_default(),
        tool.unwrap_or_default()
    )
}

fn usage_tokens(usage: RawValue<'_>) -> Option<Tokens> {
    let [input, cached, output, reasoning] = usage.fields([
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "reasoning_output_tokens",
    ])?;
    let input = input.and_then(|v| v.as_u64())?;
    let output = output.and_then(|v| v.as_u64()).unwrap_or(0);
    Some(
        Tokens::new(input, output)
            .cached_input_tokens(cached.and_then(|v| v.as_u64()))
            .reasoning_output_tokens(reasoning.and_then(|v| v.as_u64())),
    )
}

/// How soon `codex exec --json` prints its first event (`thread.started`), in seconds: measured
/// at 0.6–0.7 s on a loaded 2-core machine (codex 0.169 from npm), before any model call; 10 s
/// leaves room for a slow start and still stops a silent text mode before its first calls.
const FIRST_EVENT_SECS: u64 = 10;

/// Item lines as Codex writes them (serde, fixed field order, no whitespace).
const ITEM_PREFIX: &[u8] = br#"{"type":"item."#;

/// Finds the closing quote of a short field with a scalar loop (ids and type names are a few
/// bytes, where a vectorised search costs more than it saves).
#[inline]
fn short_field(rest: &[u8]) -> Option<usize> {
    rest.iter()
        .take(64)
        .position(|&c| c == b'"' || c == b'\\')
        .filter(|&i| rest[i] == b'"')
}

/// Reads an item line in Codex's own layout without a general scan: returns (started, id,
/// item type), or `None` for anything else (which then takes the general path).
#[inline]
fn canonical_item(line: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let rest = line.strip_prefix(ITEM_PREFIX)?;
    let (started, rest) = match rest.strip_prefix(br#"started","item":{"id":""#) {
        Some(rest) => (true, rest),
        None => (false, rest.strip_prefix(br#"completed","item":{"id":""#)?),
    };
    if line.last() != Some(&b'}') {
        return None;
    }
    let end = short_field(rest)?;
    let id = &rest[..end];
    let rest = rest[end..].strip_prefix(br#"","type":""#)?;
    let end = short_field(rest)?;
    Some((started, id, &rest[..end]))
}

impl StepCounter for CodexCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        let mut report = LineReport::empty();
        if let Some((started, id, kind)) = canonical_item(line) {
            self.item(line, started, id, kind, &mut report);
            return Ok(report);
        }
        // Codex writes `type` first, so reading it stops early; each kind of line then reads
        // only what it needs.
        let Some([ty]) = scan_prefix(line, ["type"]) else {
            self.noise += 1;
            return Ok(LineReport::noise());
        };
        let item = || scan_prefix(line, ["item"]).and_then(|[item]| item);
        match ty.and_then(|t| t.plain_str_bytes()) {
            Some(b"item.started") => self.item_event(line, item(), true, &mut report),
            Some(b"item.completed") => self.item_event(line, item(), false, &mut report),
            Some(b"item.updated") => {}
            Some(b"thread.started") => {
                if let Some([Some(id)]) = scan(line, ["thread_id"]) {
                    self.thread_id = id.as_str().map(|s| s.into_owned());
                }
            }
            Some(b"turn.started") => {
                self.turns += 1;
                report.turns += 1;
                // A new turn (e.g. a resumed thread) reopens the run.
                self.terminal = None;
            }
            Some(b"turn.completed" | b"turn.failed" | b"error") => {
                self.rare_event(line, &mut report)
            }
            // No `type`: an archived pre-0.44 `{"id","msg"}` line, or something unknown.
            None => match scan(line, ["msg"]) {
                Some([Some(msg)]) => self.legacy_event(msg, &mut report),
                _ => {
                    self.unknown += 1;
                    report.flags |= LineReport::UNKNOWN_EVENT;
                }
            },
            Some(_) => {
                self.unknown += 1;
                report.flags |= LineReport::UNKNOWN_EVENT;
            }
        }
        Ok(report)
    }

    fn finish(&mut self) -> CounterStats {
        let mut stats = CounterStats::default();
        stats.num_steps_computed = self.steps;
        stats.num_turns_computed = Some(self.turns);
        stats.terminal = self.terminal.clone();
        stats.tokens = self.tokens;
        stats.noise_lines = self.noise;
        stats.unknown_events = self.unknown;
        stats.session_id = self.thread_id.clone();
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
    use stepguard_plugin_api::testing::{feed_all, outcome};

    use super::*;

    fn fixture(rel: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(rel);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn count(rel: &str, unit: &str) -> (LineReport, CounterStats) {
        stepguard_plugin_api::testing::count(&CodexPlugin, unit, &fixture(rel)).unwrap()
    }

    /// (file, [item, actionable, tool, message], turns, outcome slug or "success" / "incomplete").
    const CASES: &[(&str, [u64; 4], u64, &str)] = &[
        (
            "streams/codex/error_turn_failed.jsonl",
            [2, 1, 1, 0],
            1,
            "provider_error",
        ),
        (
            "streams/codex/killed_no_terminal_event.jsonl",
            [7, 6, 5, 1],
            1,
            "incomplete",
        ),
        (
            "streams/codex/legacy_pre_2025-09-30_id_msg_format.jsonl",
            [5, 3, 3, 1],
            1,
            "success",
        ),
        (
            "streams/codex/long_run.jsonl",
            [42, 26, 32, 2],
            1,
            "success",
        ),
        (
            "streams/codex/stderr_merged_noise.jsonl",
            [2, 2, 1, 1],
            1,
            "success",
        ),
        (
            "streams/codex/success_multi_tool.jsonl",
            [9, 5, 5, 2],
            1,
            "success",
        ),
        ("real/codex/tools3.jsonl", [4, 4, 3, 1], 1, "success"),
        ("real/codex/tools12.jsonl", [13, 13, 12, 1], 1, "success"),
        ("real/codex/error429.jsonl", [1, 1, 1, 0], 1, "rate_limited"),
        (
            "streams/codex/rollout_budget_exceeded.jsonl",
            [6, 5, 5, 0],
            1,
            "max_tokens",
        ),
    ];

    #[test]
    fn every_fixture_every_unit() {
        for (file, per_unit, turns, expected_outcome) in CASES {
            for (unit, expected) in ["item", "actionable", "tool", "message"]
                .iter()
                .zip(per_unit)
            {
                let (sum, stats) = count(file, unit);
                assert_eq!(stats.num_steps_computed, *expected, "{file} unit {unit}");
                assert_eq!(
                    u64::from(sum.steps_begun),
                    *expected,
                    "{file} unit {unit}: per-line sum"
                );
                assert!(sum.steps_completed <= sum.steps_begun);
                assert_eq!(stats.num_turns_computed, Some(*turns), "{file}");
                assert_eq!(stats.num_steps_reported, None);
                assert_eq!(&outcome(&stats), expected_outcome, "{file}");
            }
        }
    }

    #[test]
    fn item_unit_matches_expected_json() {
        let expected: serde_json::Value =
            serde_json::from_slice(&fixture("streams/codex/expected.json")).unwrap();
        for (name, e) in expected.as_object().unwrap() {
            let (_, stats) = count(&format!("streams/codex/{name}"), "item");
            if e["format"] == "thread_events" {
                let unfinished = e["started_without_completed"].as_array().unwrap().len() as u64;
                assert_eq!(
                    stats.num_steps_computed,
                    e["item_completed_total"].as_u64().unwrap() + unfinished,
                    "{name}"
                );
                assert_eq!(
                    stats.num_turns_computed,
                    e["turns_started"].as_u64(),
                    "{name}"
                );
                assert_eq!(
                    stats.noise_lines,
                    e["non_json_lines"].as_array().unwrap().len() as u64,
                    "{name}"
                );
                if let Some(usage) = e.get("usage") {
                    let t = stats.tokens.unwrap();
                    assert_eq!(
                        t.input_tokens,
                        usage["input_tokens"].as_u64().unwrap(),
                        "{name}"
                    );
                    assert_eq!(
                        t.output_tokens,
                        usage["output_tokens"].as_u64().unwrap(),
                        "{name}"
                    );
                }
            }
            let terminal_expected = !e["terminal"].is_null();
            assert_eq!(stats.terminal.is_some(), terminal_expected, "{name}");
        }
    }

    /// The literal-layout fast path and the general scanner agree on every item line we have.
    #[test]
    fn fast_path_agrees_with_the_general_scanner() {
        let mut fast_hits = 0;
        for dir in ["streams/codex", "real/codex", "edge"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let bytes = std::fs::read(entry.unwrap().path()).unwrap();
                for line in bytes.split(|b| *b == b'\n') {
                    let Some((started, id, kind)) = canonical_item(line) else {
                        continue;
                    };
                    fast_hits += 1;
                    let [ty, item] = stepguard_jsonl::scan_prefix(line, ["type", "item"]).unwrap();
                    let expected_ty = if started {
                        "item.started"
                    } else {
                        "item.completed"
                    };
                    assert!(ty.unwrap().is_str(expected_ty));
                    let [gid, gkind] = item.unwrap().prefix_fields(["id", "type"]).unwrap();
                    assert_eq!(gid.unwrap().plain_str_bytes(), Some(id));
                    assert_eq!(gkind.unwrap().plain_str_bytes(), Some(kind));
                }
            }
        }
        assert!(
            fast_hits > 100,
            "the fast path should cover the fixtures' item lines, hit {fast_hits}"
        );
        // Layouts it does not recognise fall through to the general path.
        assert!(
            canonical_item(br#"{"item":{"id":"i","type":"x"},"type":"item.started"}"#).is_none()
        );
        assert!(
            canonical_item(br#"{"type":"item.started","item":{"id":"a\"b","type":"x"}}"#).is_none()
        );
        assert!(canonical_item(br#"{"type":"item.started","item":{"id":"i","type":"x""#).is_none());
    }

    #[test]
    fn reconnecting_errors_are_retries_and_turn_failed_message_is_kept() {
        let (_, stats) = count("streams/codex/error_turn_failed.jsonl", "item");
        let t = stats.terminal.unwrap();
        assert!(!t.success);
        assert!(t.message.unwrap().starts_with("stream disconnected"));
    }

    #[test]
    fn fake_event_inside_command_output_does_not_count() {
        let stream = br#"{"type":"item.started","item":{"id":"item_0","type":"command_execution","aggregated_output":""}}
{"type":"item.completed","item":{"id":"item_0","type":"command_execution","aggregated_output":"{\"type\":\"item.completed\",\"item\":{\"id\":\"item_9\",\"type\":\"command_execution\"}}\n"}}
"#;
        let mut c = CodexPlugin
            .open_counter(&CounterRequest::new("item"))
            .unwrap();
        let (_, stats) = feed_all(c.as_mut(), stream).unwrap();
        assert_eq!(stats.num_steps_computed, 1);
    }

    #[test]
    fn web_search_duplicate_id_key_is_parsed_defensively() {
        // The inner provider id repeats the `id` key; the last one wins, as with serde_json::Value.
        let stream = br#"{"type":"item.started","item":{"id":"item_3","type":"web_search","id":"ws_1","query":"q"}}
{"type":"item.completed","item":{"id":"item_3","type":"web_search","id":"ws_1","query":"q"}}
"#;
        let mut c = CodexPlugin
            .open_counter(&CounterRequest::new("tool"))
            .unwrap();
        let (sum, stats) = feed_all(c.as_mut(), stream).unwrap();
        assert_eq!((stats.num_steps_computed, sum.steps_completed), (1, 1));
    }

    #[test]
    fn unknown_events_are_ignored_and_noise_is_counted() {
        let stream = b"banner\n{\"type\":\"item.plan.delta\",\"delta\":\"x\"}\n{\"type\":\"turn.started\"}\n{\"type\":\"item.completed\"\n";
        let mut c = CodexPlugin
            .open_counter(&CounterRequest::new("item"))
            .unwrap();
        let (sum, stats) = feed_all(c.as_mut(), stream).unwrap();
        assert_eq!(
            (
                stats.noise_lines,
                stats.unknown_events,
                stats.num_steps_computed
            ),
            (2, 1, 0)
        );
        assert!(sum.has(LineReport::UNKNOWN_EVENT) && sum.has(LineReport::NOISE));
    }

    /// The tool calls of `bytes` counted by `unit`, each with the step it was made in.
    fn calls(bytes: &[u8], unit: &str) -> Vec<(ToolCall, u64)> {
        // Without their ids, which every call has its own of: what identifies a call is
        // compared.
        stepguard_plugin_api::testing::tool_calls(&CodexPlugin, unit, bytes)
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
    fn every_tool_item_is_one_tool_call_whatever_the_unit() {
        for (file, per_unit, _, _) in CASES {
            let tools = per_unit[2];
            for unit in ["item", "actionable", "tool", "message"] {
                assert_eq!(
                    calls(&fixture(file), unit).len() as u64,
                    tools,
                    "{file} {unit}"
                );
            }
        }
        let multi = calls(&fixture("streams/codex/success_multi_tool.jsonl"), "item");
        assert_eq!(
            names(&multi),
            ["shell", "shell", "file_change", "shell", "github/get_issue"]
        );
        // Reported at `item.started`: the step that begins there.
        let steps: Vec<u64> = multi.iter().map(|(_, s)| *s).collect();
        assert_eq!(steps, [3, 4, 6, 7, 8]);
        let legacy = calls(
            &fixture("streams/codex/legacy_pre_2025-09-30_id_msg_format.jsonl"),
            "item",
        );
        assert_eq!(names(&legacy), ["shell", "file_change", "shell"]);
        // Event-shaped payloads are arguments, not calls.
        let fake = calls(&fixture("edge/codex_fake_events_in_payloads.jsonl"), "item");
        assert_eq!(names(&fake), ["shell", "s/t"]);
    }

    #[test]
    fn a_call_is_reported_once_per_item_at_its_first_line() {
        let started = r#"{"type":"item.started","item":{"id":"item_0","type":"command_execution","command":"ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#;
        let completed = r#"{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"ls","aggregated_output":"a\n","exit_code":0,"status":"completed"}}"#;
        let only_completed = completed.replace("item_0", "item_1");
        let stream = [started, completed, &only_completed].join("\n");
        let seen = calls(stream.as_bytes(), "item");
        assert_eq!(names(&seen), ["shell", "shell"]);
        assert_eq!(seen[0].0, seen[1].0, "the same command is the same call");
        // A completed item's id that comes back is a new item (Codex never reuses one): a
        // step again, and a call again, as the next stream's `item_0` is.
        let replayed = [started, completed, completed].join("\n");
        assert_eq!(
            names(&calls(replayed.as_bytes(), "item")),
            ["shell", "shell"]
        );
        // A web search's query is known only when it completes.
        let search = r#"{"type":"item.started","item":{"id":"item_3","type":"web_search","id":"ws_1","query":"","action":{"type":"other"}}}
{"type":"item.completed","item":{"id":"item_3","type":"web_search","id":"ws_1","query":"q","action":{"type":"search","query":"q"}}}
{"type":"item.started","item":{"id":"item_4","type":"web_search","id":"ws_2","query":"","action":{"type":"other"}}}
{"type":"item.completed","item":{"id":"item_4","type":"web_search","id":"ws_2","query":"other","action":{"type":"search","query":"other"}}}"#;
        let seen = calls(search.as_bytes(), "tool");
        assert_eq!(names(&seen), ["web_search", "web_search"]);
        assert_eq!(
            seen[0].1, 1,
            "counted at its start, reported at its completion"
        );
        assert_ne!(seen[0].0, seen[1].0);
    }

    /// A stream of `n` command items, each started and completed, ids from `first`.
    fn commands(first: u64, n: u64) -> String {
        let mut out = String::new();
        for i in first..first + n {
            for (event, status) in [("started", "in_progress"), ("completed", "completed")] {
                out.push_str(&format!(
                    r#"{{"type":"item.{event}","item":{{"id":"item_{i}","type":"command_execution","command":"echo {i}","aggregated_output":"","exit_code":0,"status":"{status}"}}}}"#
                ));
                out.push('\n');
            }
        }
        out
    }

    #[test]
    fn memory_follows_the_open_items_not_the_stream() {
        for calls in [true, false] {
            let mut counter = CodexCounter::new(Unit::Item, calls);
            let mut steps = 0;
            // An item left open, then 100,000 unique items, each closed before the next.
            let open = br#"{"type":"item.started","item":{"id":"item_open","type":"command_execution","command":"sleep 1"}}"#;
            steps += counter.feed(open).unwrap().steps_begun;
            for line in commands(0, 100_000).lines() {
                steps += counter.feed(line.as_bytes()).unwrap().steps_begun;
                drop(counter.take_tool_calls());
                drop(counter.take_tool_results());
            }
            assert_eq!(steps, 100_001);
            assert_eq!(counter.finish().num_steps_computed, 100_001);
            assert_eq!(counter.open.len(), 1, "only the open item is held");
            assert!(counter.calls_seen.len() <= 1);
            assert!(counter.open.heap_bytes() < 64 << 10);
            // The open item, seen again after the long gap, is still the same item.
            assert_eq!(counter.feed(open).unwrap().steps_begun, 0);
        }
    }

    #[test]
    fn ids_of_every_stream_in_a_concatenation_count_and_report_their_calls() {
        // Every `codex exec` numbers its items from item_0.
        let three = [commands(0, 50), commands(0, 50), commands(0, 50)].concat();
        let (sum, stats) =
            stepguard_plugin_api::testing::count(&CodexPlugin, "item", three.as_bytes()).unwrap();
        assert_eq!((sum.steps_begun, sum.steps_completed), (150, 150));
        assert_eq!(stats.num_steps_computed, 150);
        assert_eq!(calls(three.as_bytes(), "item").len(), 150);
    }

    #[test]
    fn a_host_that_takes_no_calls_gets_none_and_the_same_counts() {
        let stream = fixture("streams/codex/long_run.jsonl");
        let quiet = CodexPlugin
            .open_counter(&CounterRequest::new("item").without_tool_calls())
            .unwrap();
        let mut quiet = quiet;
        let (sum, stats) = feed_all(quiet.as_mut(), &stream).unwrap();
        assert!(!sum.has(LineReport::TOOL_CALL) && !sum.has(LineReport::TOOL_RESULT));
        assert!(quiet.take_tool_calls().is_empty() && quiet.take_tool_results().is_empty());
        let (full_sum, full) = count("streams/codex/long_run.jsonl", "item");
        assert!(full_sum.has(LineReport::TOOL_CALL));
        assert_eq!(
            (
                sum.steps_begun,
                sum.steps_completed,
                stats.num_steps_computed
            ),
            (
                full_sum.steps_begun,
                full_sum.steps_completed,
                full.num_steps_computed
            )
        );
        assert_eq!((stats.tokens, stats.terminal), (full.tokens, full.terminal));
    }

    #[test]
    fn fingerprints_follow_what_each_item_carries() {
        let one = |line: &str| calls(line.as_bytes(), "item").remove(0).0;
        let mcp = one(
            r#"{"type":"item.started","item":{"id":"item_1","type":"mcp_tool_call","server":"github","tool":"get_issue","arguments":{"repo":"r","issue_number":42},"result":null,"error":null,"status":"in_progress"}}"#,
        );
        // Another layout (not Codex's own: the general scanner reads it), other key order and
        // spacing: the same call.
        let reordered = one(
            r#"{"item": {"status": "in_progress", "arguments": { "issue_number": 42, "repo": "r" }, "tool": "get_issue", "server": "github", "type": "mcp_tool_call", "id": "item_9"}, "type": "item.started"}"#,
        );
        assert_eq!(mcp.tool, "github/get_issue");
        assert_eq!(mcp, reordered);
        let other_issue = one(
            r#"{"type":"item.started","item":{"id":"item_2","type":"mcp_tool_call","server":"github","tool":"get_issue","arguments":{"repo":"r","issue_number":43},"result":null,"error":null,"status":"in_progress"}}"#,
        );
        assert_ne!(mcp, other_issue);
        // A file change names the files but not the patch: two edits of one file are two calls.
        let edit = |id: &str| {
            one(&format!(
                r#"{{"type":"item.started","item":{{"id":"{id}","type":"file_change","changes":[{{"path":"/p/src/a.rs","kind":"update"}}],"status":"in_progress"}}}}"#
            ))
        };
        assert_eq!(edit("item_5").tool, "file_change");
        assert_ne!(edit("item_5"), edit("item_6"));
        let wait = one(
            r#"{"type":"item.started","item":{"id":"item_7","type":"collab_tool_call","tool":"wait","sender_thread_id":"t0","receiver_thread_ids":["t1"],"prompt":null,"agents_states":{},"status":"in_progress"}}"#,
        );
        assert_eq!(wait.tool, "wait");
        let shell = |command: &str| {
            one(&format!(
                r#"{{"type":"item.started","item":{{"id":"item_8","type":"command_execution","command":"{command}","aggregated_output":"","exit_code":null,"status":"in_progress"}}}}"#
            ))
        };
        assert_eq!(shell("ls -la").tool, "shell");
        assert_ne!(shell("ls -la"), shell("ls -l"));
    }

    #[test]
    fn the_repeated_build_is_a_loop_at_its_limit() {
        let seen = calls(&fixture("streams/codex/loop_repeat.jsonl"), "item");
        assert_eq!(seen.len(), 8);
        let (found, step) = first_loop(&seen, limit(3, 20)).unwrap();
        assert_eq!((found.tool.as_str(), found.count), ("shell", 3));
        assert_eq!(
            (found.kind, found.first_step, step),
            (LoopKind::Repeat, 2, 6)
        );
        let (found, step) =
            first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)).unwrap();
        assert_eq!((found.count, found.first_step, step), (5, 2, 9));
    }

    #[test]
    fn the_test_and_read_cycle_is_a_loop() {
        let seen = calls(&fixture("streams/codex/loop_cycle.jsonl"), "item");
        assert_eq!(seen.len(), 12);
        let (found, step) = first_loop(&seen, limit(3, 20)).unwrap();
        assert_eq!(
            (found.kind, found.first_step, step),
            (LoopKind::Repeat, 3, 7)
        );
        let (found, step) = first_loop(&seen, limit(3, 4)).unwrap();
        assert_eq!(found.kind, LoopKind::Cycle { period: 2 });
        assert_eq!(
            (found.tool.as_str(), found.first_step, step),
            ("shell → shell", 3, 8)
        );
        assert!(first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)).is_some());
    }

    #[test]
    fn polling_ci_is_a_loop_unless_its_tool_is_exempt() {
        let seen = calls(&fixture("streams/codex/loop_exempt_read.jsonl"), "item");
        let poll = "github/get_workflow_run";
        assert_eq!(names(&seen), ["shell", poll, poll, poll, poll, poll]);
        let found = first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT));
        assert_eq!(found.map(|(f, _)| f.tool), Some(poll.to_owned()));
        let exempt = LoopSettings {
            ignore_tools: vec![poll.to_owned()],
            ..limit(2, 20)
        };
        assert_eq!(first_loop(&seen, exempt), None);
    }

    #[test]
    fn the_default_limit_flags_no_recording_but_the_loops() {
        for dir in ["streams/codex", "real/codex"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if !name.ends_with(".jsonl") || name == "loop_exempt_read.jsonl" {
                    continue;
                }
                let seen = calls(&std::fs::read(&path).unwrap(), "item");
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
    fn tool_calls_are_declared() {
        let m = CodexPlugin.manifest();
        assert!(m.tool_calls);
        assert_eq!(m.min_protocol(), "1.8.0");
        assert!(m.tool_results);
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_native_token_limit_is_the_session_budget_placed_after_the_program() {
        let m = CodexPlugin.manifest();
        assert!(m.reports_usage);
        assert_eq!(m.native_cost_limit, None);
        let limit = m.native_token_limit.unwrap();
        let command = words(&["codex", "exec", "--json", "--", "fix the tests"]);
        let with = limit.command_for_tokens(&command, 200_000).unwrap();
        assert_eq!(
            with,
            words(&[
                "codex",
                "-c",
                "features.rollout_budget.enabled=true",
                "-c",
                "features.rollout_budget.limit_tokens=200000",
                "-c",
                "features.rollout_budget.enforce_limit=true",
                "-c",
                "features.rollout_budget.reminder_at_remaining_tokens=[]",
                "-c",
                "features.rollout_budget.prefill_token_weight=1.0",
                "-c",
                "features.rollout_budget.sampling_token_weight=1.0",
                "exec",
                "--json",
                "--",
                "fix the tests"
            ])
        );
        // A budget of the user's own, whole table or key, is left alone.
        for given in [
            "features.rollout_budget.limit_tokens=5000",
            "features.rollout_budget={enabled=true, limit_tokens=5000, reminder_at_remaining_tokens=[]}",
        ] {
            let command = words(&["codex", "-c", given, "exec", "--json", "x"]);
            assert_eq!(limit.command_for_tokens(&command, 9), None, "{given}");
        }
    }

    /// A run's token counts with unknown ones as zero.
    fn counts(t: Tokens) -> (u64, u64, u64, u64) {
        (
            t.input_tokens,
            t.output_tokens,
            t.cached_input_tokens.unwrap_or(0),
            t.reasoning_output_tokens.unwrap_or(0),
        )
    }

    #[test]
    fn the_live_usage_adds_up_to_the_final_tokens_in_every_recording() {
        for dir in ["streams/codex", "real/codex"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "jsonl") {
                    continue;
                }
                let bytes = std::fs::read(&path).unwrap();
                for unit in ["item", "actionable", "tool", "message"] {
                    let live =
                        stepguard_plugin_api::testing::usage(&CodexPlugin, unit, &bytes).unwrap();
                    let (_, stats) =
                        stepguard_plugin_api::testing::count(&CodexPlugin, unit, &bytes).unwrap();
                    assert_eq!(
                        counts(live),
                        counts(stats.tokens.unwrap_or_default()),
                        "{} {unit}",
                        path.display()
                    );
                }
            }
        }
        let (_, stats) = count("real/codex/tools3.jsonl", "item");
        assert_eq!(counts(stats.tokens.unwrap()), (400, 80, 0, 0));
    }

    #[test]
    fn the_running_total_is_reported_by_what_it_grew() {
        // A resumed thread: the first total includes the earlier run (300 in, 60 out).
        let stream = [
            r#"{"type":"turn.started"}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":400,"cached_input_tokens":100,"output_tokens":80,"reasoning_output_tokens":10}}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":650,"cached_input_tokens":300,"output_tokens":95,"reasoning_output_tokens":10}}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":650,"cached_input_tokens":300,"output_tokens":95,"reasoning_output_tokens":10}}"#,
        ]
        .join("\n");
        let deltas =
            stepguard_plugin_api::testing::usage_deltas(&CodexPlugin, "item", stream.as_bytes())
                .unwrap();
        let per_line: Vec<(u64, (u64, u64, u64, u64))> =
            deltas.iter().map(|(n, t)| (*n, counts(*t))).collect();
        assert_eq!(per_line, [(2, (400, 80, 100, 10)), (4, (250, 15, 200, 0))]);
        let (_, stats) =
            stepguard_plugin_api::testing::count(&CodexPlugin, "item", stream.as_bytes()).unwrap();
        assert_eq!(counts(stats.tokens.unwrap()), (650, 95, 300, 10));
        // The archived format's `token_count` totals work the same way.
        let token_count = |input: u64, output: u64| {
            format!(
                r#"{{"id":"0","msg":{{"type":"token_count","info":{{"total_token_usage":{{"input_tokens":{input},"cached_input_tokens":0,"output_tokens":{output}}}}}}}}}"#
            )
        };
        let legacy = [token_count(1000, 50), token_count(1800, 90)].join("\n");
        let deltas =
            stepguard_plugin_api::testing::usage_deltas(&CodexPlugin, "item", legacy.as_bytes())
                .unwrap();
        let per_line: Vec<(u64, (u64, u64, u64, u64))> =
            deltas.iter().map(|(n, t)| (*n, counts(*t))).collect();
        assert_eq!(per_line, [(1, (1000, 50, 0, 0)), (2, (800, 40, 0, 0))]);
    }

    #[test]
    fn the_session_budget_ending_the_turn_is_max_tokens() {
        // Recorded from codex-cli 0.169.0 with `features.rollout_budget.limit_tokens=500`: five
        // calls of 120 tokens, then `budget reached` before the sixth, and no usage at all.
        let (sum, stats) = count("streams/codex/rollout_budget_exceeded.jsonl", "tool");
        assert_eq!(sum.steps_begun, 5);
        let terminal = stats.terminal.unwrap();
        assert_eq!(terminal.slug.as_deref(), Some("max_tokens"));
        assert_eq!(terminal.message.as_deref(), Some("budget reached"));
        assert_eq!(stats.tokens, None);
        let failed = |message: &str| {
            let line = format!(r#"{{"type":"turn.failed","error":{{"message":"{message}"}}}}"#);
            let (_, stats) =
                stepguard_plugin_api::testing::count(&CodexPlugin, "item", line.as_bytes())
                    .unwrap();
            stats.terminal.unwrap().slug.unwrap()
        };
        assert_eq!(failed("budget reached"), "max_tokens");
        assert_eq!(failed("session budget exceeded"), "max_tokens");
        assert_eq!(failed("SessionBudgetExceeded"), "max_tokens");
        assert_eq!(
            failed("stream disconnected before completion"),
            "provider_error"
        );
        assert_eq!(
            failed("exceeded retry limit, last status: 429"),
            "rate_limited"
        );
        assert_eq!(
            failed("monthly budget reached for this workspace"),
            "provider_error"
        );
    }

    #[test]
    fn tool_results_answer_their_calls_and_the_same_output_is_one_fingerprint() {
        let pairs = stepguard_plugin_api::testing::tool_results(
            &CodexPlugin,
            "item",
            &fixture("streams/codex/loop_repeat.jsonl"),
        )
        .unwrap();
        let builds: Vec<_> = pairs
            .iter()
            .filter(|(call, _)| call.program.as_deref() == Some("cargo"))
            .collect();
        assert_eq!(builds.len(), 5);
        let build = &builds[0].1;
        for (call, result) in &builds {
            assert_eq!(call.tool, "shell");
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
    fn the_session_id_is_the_thread_id_and_the_manifest_resumes_it() {
        for (file, id) in [
            (
                "real/codex/tools3.jsonl",
                "01a2029f-c7ae-71c2-8908-53c15412e51c",
            ),
            (
                "real/codex/error429.jsonl",
                "01a2029f-f156-7410-9291-55bdaf664abf",
            ),
        ] {
            let (_, stats) =
                stepguard_plugin_api::testing::count(&CodexPlugin, "item", &fixture(file)).unwrap();
            assert_eq!(stats.session_id.as_deref(), Some(id), "{file}");
        }
        let resume = CodexPlugin.manifest().resume.expect("codex resumes");
        let original: Vec<String> = [
            "codex",
            "exec",
            "--json",
            "--skip-git-repo-check",
            "-c",
            "model_provider=mock",
            "--sandbox",
            "read-only",
            "fix it",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            resume.command(&original, "0199", "go on").unwrap(),
            [
                "codex",
                "exec",
                "resume",
                "--json",
                "--skip-git-repo-check",
                "-c",
                "model_provider=mock",
                "0199",
                "go on"
            ]
        );
    }
}
