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
//! `error_max_turns` → `max_steps`; HTTP 429 or a rejected rate-limit event → `rate_limited`;
//! other errors → `provider_error`. The native budget adapter adds `--max-turns N` unless the
//! command already carries `--max-turns`.
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

use rustc_hash::FxHashSet as HashSet;

use stepguard_jsonl::{RawValue, scan};
use stepguard_plugin_api::{
    CounterRequest, CounterStats, LineReport, Manifest, NativeLimit, PreflightRule, ProviderBox,
    ProviderPlugin, StepCounter, Terminal, Tokens, slug_for_error_text,
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
            .unit(
                "message",
                "top-level assistant messages (API rounds), deduplicated by message.id",
                true,
            )
            .unit(
                "tool_use",
                "top-level tool_use blocks, deduplicated by id",
                false,
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
            .native_limit(NativeLimit::new(
                &["--max-turns", "{max_steps}"],
                &["--max-turns"],
            ))
            // Its counters fill `CounterStats::sub_agent_steps` (protocol 1.1); `expects`
            // already needs 1.2, so this only says so.
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
            ..ClaudeCounter::default()
        }))
    }
}

/// Counts one Claude Code stream.
#[derive(Debug, Default)]
pub struct ClaudeCounter {
    by_message: bool,
    steps: HashSet<Vec<u8>>,
    completed: u64,
    /// The top-level message under way (message unit), completed when the next one begins.
    current_message: Option<Vec<u8>>,
    sub_agent_steps: BTreeMap<String, u64>,
    sub_agent_seen: HashSet<(Vec<u8>, Vec<u8>)>,
    tool_result_lines: u64,
    saw_events: bool,
    rate_limit_rejected: bool,
    terminal: Option<Terminal>,
    turns_reported: Option<u64>,
    tokens: Option<Tokens>,
    cost: Option<f64>,
    noise: u64,
    unknown: u64,
}

impl ClaudeCounter {
    fn assistant(
        &mut self,
        message: Option<RawValue<'_>>,
        parent: Option<RawValue<'_>>,
        report: &mut LineReport,
    ) {
        let Some([Some(id), model, content]) =
            message.and_then(|m| m.fields(["id", "model", "content"]))
        else {
            self.unknown += 1;
            report.flags |= LineReport::UNKNOWN_EVENT;
            return;
        };
        if model.is_some_and(|m| m.is_str("<synthetic>")) {
            return;
        }
        let mut step_ids: Vec<&[u8]> = Vec::new();
        if self.by_message {
            step_ids.push(id.0);
        } else if let Some(content) = content {
            content.for_each_element(|block| {
                if let Some([Some(kind), Some(block_id)]) = block.fields(["type", "id"])
                    && kind.is_str("tool_use")
                {
                    step_ids.push(block_id.0);
                }
            });
        }
        match parent.filter(|p| !p.is_null()) {
            Some(parent) => {
                let key = parent.as_str().map(|p| p.into_owned()).unwrap_or_default();
                for step in step_ids {
                    if self
                        .sub_agent_seen
                        .insert((parent.0.to_vec(), step.to_vec()))
                    {
                        *self.sub_agent_steps.entry(key.clone()).or_default() += 1;
                        report.sub_agent_steps += 1;
                    }
                }
            }
            None => {
                if !self.saw_events {
                    report.turns += 1;
                }
                self.saw_events = true;
                for step in step_ids {
                    if self.steps.insert(step.to_vec()) {
                        report.steps_begun += 1;
                        if self.by_message && self.current_message.replace(step.to_vec()).is_some()
                        {
                            self.completed += 1;
                            report.steps_completed += 1;
                        }
                    }
                }
            }
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
        let mut finished: Vec<Vec<u8>> = Vec::new();
        content.for_each_element(|block| {
            if let Some([Some(kind), tool_use_id]) = block.fields(["type", "tool_use_id"])
                && kind.is_str("tool_result")
            {
                has_result = true;
                if let Some(id) = tool_use_id {
                    finished.push(id.0.to_vec());
                }
            }
        });
        if has_result {
            self.tool_result_lines += 1;
            self.saw_events = true;
            report.turns += 1;
            if !self.by_message {
                for id in finished {
                    if self.steps.contains(&id) {
                        self.completed += 1;
                        report.steps_completed += 1;
                    }
                }
            }
        }
    }

    fn result(&mut self, line: &[u8], report: &mut LineReport) {
        report.flags |= LineReport::TERMINAL;
        self.saw_events = true;
        if self.current_message.take().is_some() {
            self.completed += 1;
            report.steps_completed += 1;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        self.turns_reported = v["num_turns"].as_u64();
        self.cost = v["total_cost_usd"].as_f64();
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| usage[k].as_u64().unwrap_or(0);
            let input =
                n("input_tokens") + n("cache_creation_input_tokens") + n("cache_read_input_tokens");
            self.tokens = Some(
                Tokens::new(input, n("output_tokens"))
                    .cached_input_tokens(usage["cache_read_input_tokens"].as_u64()),
            );
        }
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

impl StepCounter for ClaudeCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        let mut report = LineReport::empty();
        let Some([ty, message, parent, info]) = scan(
            line,
            ["type", "message", "parent_tool_use_id", "rate_limit_info"],
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
            "system" | "stream_event" => {}
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
        stats.tokens = self.tokens;
        stats.cost_usd = self.cost;
        stats.noise_lines = self.noise;
        stats.unknown_events = self.unknown;
        stats.sub_agent_steps = self.sub_agent_steps.clone();
        stats
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

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

    #[test]
    fn native_limit_is_declared() {
        let m = ClaudePlugin.manifest();
        let limit = m.native_limit.unwrap();
        assert_eq!(
            limit.args_for(&["claude".into(), "-p".into()], 9),
            Some(vec!["--max-turns".into(), "9".into()])
        );
    }
}
