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
//! Legacy turns are the `turn.started` count. `turn.completed` is success (its `usage` is a
//! running total, so the last one wins); `turn.failed` is `provider_error`, or `rate_limited`
//! when its message says so. Top-level `error` events reading `Reconnecting…` are retries.
//!
//! Archived logs in the pre-0.44 `{"id","msg"}` format are accepted: `*_begin`/`*_end` events map
//! to the matching item types (deduplicated by `call_id`), `agent_message`/`agent_reasoning` to
//! completed items, `task_started` to a turn, `task_complete` to success and `token_count` to usage.
//!
//! ```
//! use stepguard_plugin_api::{CounterRequest, ProviderPlugin};
//! let plugin = stepguard_provider_codex::CodexPlugin;
//! let mut counter = plugin.open_counter(&CounterRequest::new("tool")).unwrap();
//! let r = counter.feed(br#"{"type":"item.started","item":{"id":"item_0","type":"command_execution"}}"#).unwrap();
//! assert_eq!(r.steps_begun, 1);
//! ```
#![deny(unsafe_code)] // not `forbid`: export_plugin! allows it on its own generated items

use rustc_hash::FxHashSet as HashSet;
use stepguard_jsonl::{RawValue, scan, scan_prefix};
use stepguard_plugin_api::{
    CounterRequest, CounterStats, LineReport, Manifest, PreflightRule, ProviderBox, ProviderPlugin,
    StepCounter, Terminal, Tokens, slug_for_error_text,
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
            .unit("item", "every item, begun at item.started (or item.completed without a start)", true)
            .unit("actionable", "agent_message and command_execution items", false)
            .unit("tool", "command_execution, file_change, mcp_tool_call, web_search and collab_tool_call items", false)
            .unit("message", "agent_message items", false)
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
    }

    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        let unit = match request.unit.as_str() {
            "item" => Unit::Item,
            "actionable" => Unit::Actionable,
            "tool" => Unit::Tool,
            "message" => Unit::Message,
            other => return Err(format!("unknown unit `{other}`")),
        };
        Ok(Box::new(CodexCounter::new(unit)))
    }
}

/// Counts one Codex stream.
#[derive(Debug)]
pub struct CodexCounter {
    unit: Unit,
    begun: HashSet<Vec<u8>>,
    completed: HashSet<Vec<u8>>,
    turns: u64,
    terminal: Option<Terminal>,
    last_error: Option<String>,
    tokens: Option<Tokens>,
    noise: u64,
    unknown: u64,
}

impl CodexCounter {
    fn new(unit: Unit) -> Self {
        CodexCounter {
            unit,
            begun: HashSet::default(),
            completed: HashSet::default(),
            turns: 0,
            terminal: None,
            last_error: None,
            tokens: None,
            noise: 0,
            unknown: 0,
        }
    }

    fn begin(&mut self, id: &[u8], report: &mut LineReport) {
        // Look before inserting: most ids are seen twice (started, then completed).
        if !self.begun.contains(id) {
            self.begun.insert(id.to_vec());
            report.steps_begun += 1;
        }
    }

    fn complete(&mut self, id: &[u8], report: &mut LineReport) {
        self.begin(id, report);
        if !self.completed.contains(id) {
            self.completed.insert(id.to_vec());
            report.steps_completed += 1;
        }
    }

    fn item_event(&mut self, item: Option<RawValue<'_>>, started: bool, report: &mut LineReport) {
        let Some([Some(id), Some(kind)]) = item.and_then(|i| i.prefix_fields(["id", "type"]))
        else {
            self.unknown += 1;
            report.flags |= LineReport::UNKNOWN_EVENT;
            return;
        };
        let kind = kind.plain_str_bytes().unwrap_or_default();
        if self.unit.counts(kind) {
            if started {
                self.begin(id.0, report);
            } else {
                self.complete(id.0, report);
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
                let id = match call_id {
                    Some(c) => c.0.to_vec(),
                    None => format!("legacy_{}", self.begun.len()).into_bytes(),
                };
                if started {
                    self.begin(&id, report)
                } else {
                    self.complete(&id, report)
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
                if let Some(usage) = info
                    .and_then(|i| i.fields(["total_token_usage"]))
                    .and_then(|[u]| u)
                {
                    self.tokens = usage_tokens(usage).or(self.tokens);
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
                if let Some(tokens) = usage.and_then(usage_tokens) {
                    self.tokens = Some(tokens);
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
                self.terminal = Some(Terminal::failed(slug_for_error_text(&text), text));
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
            if self.unit.counts(kind) {
                if started {
                    self.begin(id, &mut report);
                } else {
                    self.complete(id, &mut report);
                }
            }
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
            Some(b"item.started") => self.item_event(item(), true, &mut report),
            Some(b"item.completed") => self.item_event(item(), false, &mut report),
            Some(b"item.updated" | b"thread.started") => {}
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
        stats.num_steps_computed = self.begun.len() as u64;
        stats.num_turns_computed = Some(self.turns);
        stats.terminal = self.terminal.clone();
        stats.tokens = self.tokens;
        stats.noise_lines = self.noise;
        stats.unknown_events = self.unknown;
        stats
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

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
}
