//! stepguard's step mapping for Gemini CLI (`gemini -p … --output-format stream-json`).
//!
//! Units (public interface):
//!
//! * `tool_use` (default): each `tool_use` event, deduplicated by `tool_id`, completed by its
//!   `tool_result`. Reported steps are `result.stats.tool_calls`.
//! * `turn`: model turns, inferred as the first assistant `message` or `tool_use` after the user
//!   message or after a `tool_result` (the unit of Gemini's own `model.maxSessionTurns`).
//!
//! Assistant `message` events are streamed chunks and never count. Legacy turns are the inferred
//! model turns. Outcome: `result.status`; `error.type: FatalTurnLimitedError`, or an `error` event
//! with severity `error` saying "Maximum session turns exceeded" before a `success` result, is
//! `max_steps`; API errors are `rate_limited` (429, quota) or `provider_error`.
//!
//! Tool calls (for loop detection, protocol 1.3) are the `tool_use` events, each reported once
//! by `tool_id`, as `tool_name` and `parameters` (`run_shell_command`'s `description` left out:
//! it annotates the command and does not change what runs; its `command` normalised, with its
//! program). Their results (protocol 1.6) are the `tool_result` events of reported calls: the
//! `output` or `error`, failed when `status` is `error` or the output says `Exit Code: N`, N
//! not 0.
//!
//! Token usage (protocol 1.5) is `result.stats` (`input_tokens`, cached ones included, `cached`,
//! `output_tokens`), the session's totals over every model, side requests included: stream-json
//! carries no usage before it, so it is reported once, on the `result` line. Gemini CLI has no
//! native token or cost budget.
//!
//! ```
//! use stepguard_plugin_api::{CounterRequest, ProviderPlugin};
//! let plugin = stepguard_provider_gemini::GeminiPlugin;
//! let mut counter = plugin.open_counter(&CounterRequest::new("turn")).unwrap();
//! let tool = br#"{"type":"tool_use","tool_name":"read_file","tool_id":"t1","parameters":{}}"#;
//! assert_eq!(counter.feed(tool).unwrap().steps_begun, 1);
//! ```
#![deny(unsafe_code)] // not `forbid`: export_plugin! allows it on its own generated items

use stepguard_jsonl::{IdSet, RawValue, scan};
use stepguard_plugin_api::{
    BaseUrlRule, CounterRequest, CounterStats, LineReport, Manifest, ModelEndpoint, PreflightRule,
    ProviderBox, ProviderPlugin, ResumeTemplate, StepCounter, Terminal, Tokens, ToolCall,
    ToolResult, fingerprint::output_text, slug_for_error_text,
};

/// The Gemini CLI provider plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct GeminiPlugin;

/// Returns the built-in Gemini provider, behind the plugin interface.
pub fn provider() -> ProviderBox {
    stepguard_plugin_api::provider_box(GeminiPlugin)
}

#[cfg(feature = "plugin")]
stepguard_plugin_api::export_plugin!(GeminiPlugin);

impl ProviderPlugin for GeminiPlugin {
    fn manifest(&self) -> Manifest {
        Manifest::new("gemini", env!("CARGO_PKG_VERSION"))
            .description("Google Gemini CLI (`gemini -p … --output-format stream-json`)")
            .unit_costing("tool_use", "tool_use events, deduplicated by tool_id", true, 0)
            .unit_costing(
                "turn",
                "model turns inferred from tool_result boundaries (the unit of maxSessionTurns)",
                false,
                1,
            )
            .model_endpoint(
                ModelEndpoint::new("gemini", "https://generativelanguage.googleapis.com")
                    .base_url(BaseUrlRule::Env {
                        name: "GOOGLE_GEMINI_BASE_URL".into(),
                    })
                    // Sent as `x-goog-api-key` (or `?key=`).
                    .api_key_env("GEMINI_API_KEY")
                    .api_key_env("GOOGLE_API_KEY"),
            )
            .expects("JSONL events of `gemini --output-format stream-json` (`init`, `message`, `tool_use`, `tool_result`, `result`)")
            .preflight(PreflightRule::new(
                "gemini",
                &["--output-format=stream-json", "-o=stream-json"],
                "add `--output-format stream-json`: stepguard counts its JSONL events",
            ))
            .reports_tool_results()
            .reports_usage()
            .resume(
                ResumeTemplate::new(&["gemini", "--resume", "{session}", "-p", "{prompt}", "{flags}"])
                    .keep_flags(&["--yolo", "-y", "--skip-trust"])
                    .keep_options(&[
                        "--output-format",
                        "-o",
                        "--model",
                        "-m",
                        "--approval-mode",
                        "--include-directories",
                    ]),
            )
    }

    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        let by_turn = match request.unit.as_str() {
            "tool_use" => false,
            "turn" => true,
            other => return Err(format!("unknown unit `{other}`")),
        };
        Ok(Box::new(GeminiCounter {
            by_turn,
            calls: !request.tool_calls_unused,
            ..GeminiCounter::default()
        }))
    }
}

/// Where the inference of model turns stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum TurnState {
    /// At the start, after the user message or after a tool result: the next model output opens a
    /// turn.
    #[default]
    AwaitingModel,
    /// Inside a model turn.
    InModel,
}

/// Counts one Gemini CLI stream.
#[derive(Debug, Default)]
pub struct GeminiCounter {
    by_turn: bool,
    /// The session id of the `init` event (`gemini --resume` takes it).
    session_id: Option<String>,
    /// Whether the host takes tool calls and results: when not, they are not looked for.
    calls: bool,
    /// Calls begun whose result has not come. A call's id is forgotten at its result: Gemini
    /// never reuses one, so an id that comes back is a new call, exactly as one never seen,
    /// and a second result of a closed call is ignored, as one of a call never seen
    /// (memory follows the calls open, not the stream's length).
    open: IdSet,
    /// `tool_use` events so far (the tool_use unit's steps).
    tool_uses: u64,
    turns: u64,
    turn_state: TurnState,
    turn_limit_event: bool,
    last_error_event: Option<String>,
    terminal: Option<Terminal>,
    reported_tool_calls: Option<u64>,
    tokens: Option<Tokens>,
    noise: u64,
    unknown: u64,
    /// Tool calls not yet taken by the host.
    tool_calls: Vec<ToolCall>,
    /// Tool results not yet taken by the host.
    pending_results: Vec<ToolResult>,
    /// Usage not yet taken by the host.
    pending_usage: Option<Tokens>,
}

impl GeminiCounter {
    /// A `tool_use` event: a new call unless its id is open already. Gemini never reuses a
    /// call's id: one that comes back after its result is a new call, so a stream cannot hide
    /// steps behind an old id. A call without an id is a call of its own.
    fn tool_use(&mut self, line: &[u8], tool_id: Option<RawValue<'_>>, report: &mut LineReport) {
        let new = match tool_id {
            Some(id) => self.open.insert(id.0),
            None => true,
        };
        if !new {
            return;
        }
        self.tool_uses += 1;
        if !self.by_turn {
            report.steps_begun += 1;
        }
        if self.calls {
            match tool_id {
                Some(id) => self.tool_call(line, id.0, report),
                None => self.tool_call(line, format!("anon_{}", self.tool_uses).as_bytes(), report),
            }
        }
    }

    /// Queues the call of a new `tool_use` line; only these lines are scanned for the name and
    /// parameters.
    fn tool_call(&mut self, line: &[u8], id: &[u8], report: &mut LineReport) {
        let Some([name, parameters]) = scan(line, ["tool_name", "parameters"]) else {
            return;
        };
        let name = name
            .and_then(|n| n.as_str())
            .map(|n| n.into_owned())
            .unwrap_or_default();
        let mut arguments = parameters
            .and_then(|p| p.to_json())
            .unwrap_or(serde_json::Value::Null);
        let mut command = None;
        if name == "run_shell_command"
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
        let id = String::from_utf8_lossy(id);
        self.tool_calls.push(call.with_id(id.trim_matches('"')));
        report.flags |= LineReport::TOOL_CALL;
    }

    /// Queues the result of a reported call: its `output` or `error`, failed when its status
    /// is `error` or a shell command says it exited non-zero (`Exit Code: 1`).
    fn tool_result(&mut self, line: &[u8], id: &[u8], report: &mut LineReport) {
        let Some([status, output, error]) = scan(line, ["status", "output", "error"]) else {
            return;
        };
        let json = |v: Option<RawValue<'_>>| v.and_then(|v| v.to_json()).unwrap_or_default();
        let error = json(error);
        let text = if error.is_null() {
            output_text(&json(output))
        } else {
            output_text(&error)
        };
        let exited_non_zero = text.lines().any(|l| {
            l.trim()
                .strip_prefix("Exit Code:")
                .is_some_and(|code| code.trim() != "0")
        });
        let failed = status.is_some_and(|s| s.is_str("error")) || exited_non_zero;
        let id = String::from_utf8_lossy(id).trim_matches('"').to_owned();
        self.pending_results
            .push(ToolResult::new(id, &text, failed));
        report.flags |= LineReport::TOOL_RESULT;
    }

    fn model_output(&mut self, report: &mut LineReport) {
        if self.turn_state == TurnState::AwaitingModel {
            self.turn_state = TurnState::InModel;
            // The previous turn is complete once the next one begins.
            if self.by_turn && self.turns > 0 {
                report.steps_completed += 1;
            }
            self.turns += 1;
            report.turns += 1;
            if self.by_turn {
                report.steps_begun += 1;
            }
        }
    }

    fn result(&mut self, line: &[u8], report: &mut LineReport) {
        report.flags |= LineReport::TERMINAL;
        if self.by_turn && self.turns > 0 && self.turn_state == TurnState::InModel {
            report.steps_completed += 1;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        let stats = &v["stats"];
        self.reported_tool_calls = stats["tool_calls"].as_u64();
        if let Some(input) = stats["input_tokens"].as_u64() {
            let output = stats["output_tokens"].as_u64().unwrap_or(0);
            let total = Tokens::new(input, output).cached_input_tokens(stats["cached"].as_u64());
            // A session's totals: what they add to any earlier result's is the usage.
            let before = self.tokens;
            let now = before.map_or(total, |b| b.max_each(total));
            self.tokens = Some(now);
            let delta = now.saturating_sub(before.unwrap_or_default());
            if !delta.is_zero() {
                self.pending_usage =
                    Some(self.pending_usage.unwrap_or_default().saturating_add(delta));
                report.flags |= LineReport::USAGE;
            }
        }
        let error_type = v["error"]["type"].as_str().unwrap_or_default();
        let error_message = v["error"]["message"].as_str().map(str::to_owned);
        self.terminal = Some(match v["status"].as_str() {
            Some("success") if self.turn_limit_event => {
                Terminal::failed("max_steps", self.last_error_event.clone())
            }
            Some("success") => Terminal::success(),
            _ => {
                let slug = if error_type == "FatalTurnLimitedError" {
                    "max_steps"
                } else {
                    slug_for_error_text(&format!(
                        "{error_type} {}",
                        error_message.as_deref().unwrap_or("")
                    ))
                };
                Terminal::failed(slug, error_message)
            }
        });
    }

    fn error_event(&mut self, severity: Option<RawValue<'_>>, message: Option<RawValue<'_>>) {
        if !severity.is_some_and(|s| s.is_str("error")) {
            return;
        }
        let text = message
            .and_then(|m| m.as_str())
            .map(|m| m.into_owned())
            .unwrap_or_default();
        if text.contains("Maximum session turns exceeded") {
            self.turn_limit_event = true;
        }
        self.last_error_event = Some(text);
    }
}

impl StepCounter for GeminiCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        let mut report = LineReport::empty();
        let Some([ty, role, tool_id, severity, message]) =
            scan(line, ["type", "role", "tool_id", "severity", "message"])
        else {
            self.noise += 1;
            return Ok(LineReport::noise());
        };
        let ty = ty.and_then(|t| t.as_str()).unwrap_or_default();
        match ty.as_ref() {
            "tool_use" => {
                self.model_output(&mut report);
                self.tool_use(line, tool_id, &mut report);
            }
            "tool_result" => {
                self.turn_state = TurnState::AwaitingModel;
                // Only the first result of an open call counts.
                if let Some(id) = tool_id
                    && self.open.remove(id.0)
                {
                    if !self.by_turn {
                        report.steps_completed += 1;
                    }
                    if self.calls {
                        self.tool_result(line, id.0, &mut report);
                    }
                }
            }
            "message" => match role.and_then(|r| r.as_str()).as_deref() {
                Some("assistant") => self.model_output(&mut report),
                Some("user") => self.turn_state = TurnState::AwaitingModel,
                _ => {}
            },
            "error" => self.error_event(severity, message),
            "result" => self.result(line, &mut report),
            "init" => {
                if let Some([Some(id)]) = scan(line, ["session_id"]) {
                    self.session_id = id.as_str().map(|s| s.into_owned());
                }
            }
            _ => {
                self.unknown += 1;
                report.flags |= LineReport::UNKNOWN_EVENT;
            }
        }
        Ok(report)
    }

    fn finish(&mut self) -> CounterStats {
        let (computed, reported) = if self.by_turn {
            (self.turns, None)
        } else {
            (self.tool_uses, self.reported_tool_calls)
        };
        let mut stats = CounterStats::default();
        stats.num_steps_computed = computed;
        stats.num_steps_reported = reported;
        stats.num_turns_computed = Some(self.turns);
        stats.terminal = self.terminal.clone();
        stats.tokens = self.tokens;
        stats.noise_lines = self.noise;
        stats.unknown_events = self.unknown;
        stats.session_id = self.session_id.clone();
        stats
    }

    fn take_tool_calls(&mut self) -> Vec<ToolCall> {
        std::mem::take(&mut self.tool_calls)
    }

    fn take_tool_results(&mut self) -> Vec<ToolResult> {
        std::mem::take(&mut self.pending_results)
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
        stepguard_plugin_api::testing::count(&GeminiPlugin, unit, bytes).unwrap()
    }

    #[test]
    fn streams_match_expected_json_for_both_units() {
        let expected: serde_json::Value =
            serde_json::from_slice(&fixture("streams/gemini/expected.json")).unwrap();
        for (name, e) in expected.as_object().unwrap() {
            let bytes = fixture(&format!("streams/gemini/{name}"));
            let (sum, stats) = count_bytes(&bytes, "tool_use");
            assert_eq!(
                stats.num_steps_computed,
                e["tool_use_events"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                u64::from(sum.steps_begun),
                stats.num_steps_computed,
                "{name}"
            );
            assert_eq!(
                stats.num_steps_reported,
                e["result"]["stats_tool_calls"].as_u64(),
                "{name}"
            );
            assert_eq!(
                stats.noise_lines,
                e["non_json_lines"].as_array().unwrap().len() as u64,
                "{name}"
            );
            let (sum, turns) = count_bytes(&bytes, "turn");
            assert_eq!(
                turns.num_steps_computed,
                e["inferred_model_turns"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                u64::from(sum.steps_begun),
                turns.num_steps_computed,
                "{name}"
            );
            assert_eq!(turns.num_turns_computed, Some(turns.num_steps_computed));
        }
    }

    /// (file, tool_use steps, turns, outcome)
    const CASES: &[(&str, u64, u64, &str)] = &[
        ("streams/gemini/error_api.jsonl", 1, 1, "provider_error"),
        ("streams/gemini/long_run.jsonl", 38, 34, "success"),
        ("streams/gemini/max_session_turns.jsonl", 3, 3, "max_steps"),
        (
            "streams/gemini/max_session_turns_client_event.jsonl",
            2,
            2,
            "max_steps",
        ),
        ("streams/gemini/stderr_merged_noise.jsonl", 3, 3, "success"),
        ("streams/gemini/success_multi_tool.jsonl", 5, 5, "success"),
        ("real/gemini/tools3.jsonl", 3, 4, "success"),
        ("real/gemini/tools12.jsonl", 12, 13, "success"),
        ("real/gemini/maxturns2.jsonl", 2, 2, "max_steps"),
        ("real/gemini/error429.jsonl", 1, 1, "rate_limited"),
    ];

    #[test]
    fn every_fixture_counts_and_outcome() {
        for (file, tools, turns, expected) in CASES {
            let bytes = fixture(file);
            let (_, stats) = count_bytes(&bytes, "tool_use");
            assert_eq!(stats.num_steps_computed, *tools, "{file}");
            assert_eq!(&outcome(&stats), expected, "{file}");
            let (_, stats) = count_bytes(&bytes, "turn");
            assert_eq!(stats.num_steps_computed, *turns, "{file}");
        }
    }

    #[test]
    fn a_host_that_takes_no_calls_gets_none_and_the_same_counts() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let mut files = 0;
        for dir in ["streams/gemini", "real/gemini"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "jsonl") {
                    continue;
                }
                files += 1;
                let bytes = std::fs::read(&path).unwrap();
                for unit in ["tool_use", "turn"] {
                    let mut quiet = GeminiPlugin
                        .open_counter(&CounterRequest::new(unit).without_tool_calls())
                        .unwrap();
                    let (sum, stats) =
                        stepguard_plugin_api::testing::feed_all(quiet.as_mut(), &bytes).unwrap();
                    assert!(!sum.has(LineReport::TOOL_CALL) && !sum.has(LineReport::TOOL_RESULT));
                    let (full_sum, full) = count_bytes(&bytes, unit);
                    assert_eq!(
                        (sum.steps_begun, sum.steps_completed, sum.turns),
                        (
                            full_sum.steps_begun,
                            full_sum.steps_completed,
                            full_sum.turns
                        ),
                        "{} {unit}",
                        path.display()
                    );
                    assert_eq!(stats, full, "{} {unit}", path.display());
                }
            }
        }
        assert!(files >= 8);
    }

    fn tool_use(id: &str) -> String {
        format!(
            r#"{{"type":"tool_use","tool_name":"read_file","tool_id":"{id}","parameters":{{"file_path":"{id}"}}}}"#
        )
    }

    fn tool_result(id: &str) -> String {
        format!(r#"{{"type":"tool_result","tool_id":"{id}","status":"success","output":"ok"}}"#)
    }

    #[test]
    fn memory_follows_the_open_calls_and_ids_count_as_before() {
        let mut counter = GeminiCounter {
            calls: true,
            ..GeminiCounter::default()
        };
        let mut feed = |line: &str| counter.feed(line.as_bytes()).unwrap();
        // A call left open, then 100,000 calls each answered.
        assert_eq!(feed(&tool_use("open")).steps_begun, 1);
        for i in 0..100_000 {
            let id = format!("read_file__fc_{i:024x}");
            assert_eq!(feed(&tool_use(&id)).steps_begun, 1);
            assert_eq!(feed(&tool_use(&id)).steps_begun, 0, "the same call again");
            assert_eq!(feed(&tool_result(&id)).steps_completed, 1);
            assert_eq!(
                feed(&tool_result(&id)).steps_completed,
                0,
                "a second result"
            );
        }
        // The open call, after the long gap, is still the same call; an answered one that
        // comes back is a new call.
        assert_eq!(feed(&tool_use("open")).steps_begun, 0);
        assert_eq!(
            feed(&tool_use("read_file__fc_000000000000000000000007")).steps_begun,
            1
        );
        // A result for a call never seen counts nothing.
        assert_eq!(feed(&tool_result("never")).steps_completed, 0);
        assert_eq!(counter.finish().num_steps_computed, 100_002);
        assert_eq!(counter.open.len(), 2);
        assert!(counter.open.heap_bytes() < 64 << 10);
    }

    #[test]
    fn message_chunks_never_count() {
        let stream = br#"{"type":"message","role":"user","content":"hi"}
{"type":"message","role":"assistant","content":"a","delta":true}
{"type":"message","role":"assistant","content":"b","delta":true}
{"type":"message","role":"assistant","content":"c","delta":true}
"#;
        let (_, stats) = count_bytes(stream, "turn");
        assert_eq!(stats.num_steps_computed, 1);
        let (_, stats) = count_bytes(stream, "tool_use");
        assert_eq!(stats.num_steps_computed, 0);
    }

    /// The tool calls of `bytes` counted by `unit`, each with the step it was made in.
    fn calls(bytes: &[u8], unit: &str) -> Vec<(ToolCall, u64)> {
        // Without their ids, which every call has its own of: what identifies a call is
        // compared.
        stepguard_plugin_api::testing::tool_calls(&GeminiPlugin, unit, bytes)
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
    fn every_tool_use_event_is_one_tool_call() {
        let expected: serde_json::Value =
            serde_json::from_slice(&fixture("streams/gemini/expected.json")).unwrap();
        for (name, e) in expected.as_object().unwrap() {
            let bytes = fixture(&format!("streams/gemini/{name}"));
            for unit in ["tool_use", "turn"] {
                assert_eq!(
                    calls(&bytes, unit).len() as u64,
                    e["tool_use_events"].as_u64().unwrap(),
                    "{name} {unit}"
                );
            }
        }
        let multi = calls(&fixture("streams/gemini/success_multi_tool.jsonl"), "turn");
        assert_eq!(
            names(&multi),
            [
                "glob",
                "read_file",
                "grep_search",
                "replace",
                "run_shell_command"
            ]
        );
        // Parallel calls are made in the same turn.
        let steps: Vec<u64> = multi.iter().map(|(_, s)| *s).collect();
        assert_eq!(steps, [1, 2, 2, 3, 4]);
    }

    #[test]
    fn one_call_per_tool_id_and_equal_parameters_are_one_fingerprint() {
        let tool_use = |id: &str, name: &str, parameters: &str| {
            format!(
                r#"{{"type":"tool_use","timestamp":"2026-08-20T10:15:39.138Z","tool_name":"{name}","tool_id":"{name}__{id}","parameters":{parameters}}}"#
            )
        };
        let stream = [
            tool_use("a", "read_file", r#"{"file_path":"src/a.ts","limit":50}"#),
            // The same event again (a repeated line): not a second call.
            tool_use("a", "read_file", r#"{"file_path":"src/a.ts","limit":50}"#),
            tool_use(
                "b",
                "read_file",
                "{ \"limit\" : 50,\t\"file_path\": \"src/a.ts\" }",
            ),
            tool_use("c", "read_file", r#"{"file_path":"src/b.ts","limit":50}"#),
            tool_use(
                "d",
                "run_shell_command",
                r#"{"command":"npm test","description":"Run the tests."}"#,
            ),
            tool_use(
                "e",
                "run_shell_command",
                r#"{"description":"Run them again.","command":"npm test"}"#,
            ),
            tool_use(
                "f",
                "run_shell_command",
                r#"{"command":"npm test -- reader"}"#,
            ),
        ]
        .join("\n");
        let seen: Vec<ToolCall> = calls(stream.as_bytes(), "tool_use")
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[0], seen[1], "key order and spacing do not matter");
        assert_ne!(seen[0], seen[2], "another file is another call");
        assert_eq!(
            seen[3], seen[4],
            "the description does not change what runs"
        );
        assert_ne!(seen[3], seen[5]);
        assert_eq!(seen[3].tool, "run_shell_command");
    }

    #[test]
    fn the_repeated_build_is_a_loop_at_its_limit() {
        let seen = calls(&fixture("streams/gemini/loop_repeat.jsonl"), "tool_use");
        assert_eq!(seen.len(), 8);
        let (found, step) = first_loop(&seen, limit(3, 20)).unwrap();
        assert_eq!((found.tool.as_str(), found.count), ("run_shell_command", 3));
        assert_eq!(
            (found.kind, found.first_step, step),
            (LoopKind::Repeat, 1, 4)
        );
        let (found, step) =
            first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)).unwrap();
        assert_eq!((found.count, found.first_step, step), (5, 1, 7));
    }

    #[test]
    fn the_read_replace_cycle_is_a_loop() {
        let seen = calls(&fixture("streams/gemini/loop_cycle.jsonl"), "tool_use");
        assert_eq!(names(&seen[..3]), ["glob", "read_file", "replace"]);
        let (found, step) = first_loop(&seen, limit(3, 20)).unwrap();
        assert_eq!(
            (found.tool.as_str(), found.kind, step),
            ("read_file", LoopKind::Repeat, 6)
        );
        let (found, step) = first_loop(&seen, limit(3, 4)).unwrap();
        assert_eq!(found.kind, LoopKind::Cycle { period: 2 });
        assert_eq!(
            (found.tool.as_str(), found.first_step, step),
            ("read_file → replace", 2, 7)
        );
        assert!(first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)).is_some());
    }

    #[test]
    fn polling_a_log_is_a_loop_unless_its_tool_is_exempt() {
        let seen = calls(
            &fixture("streams/gemini/loop_exempt_read.jsonl"),
            "tool_use",
        );
        assert_eq!(seen.len(), 6);
        let found = first_loop(&seen, LoopSettings::with_limit(DEFAULT_LOOP_LIMIT));
        assert_eq!(found.map(|(f, _)| f.tool), Some("read_file".to_owned()));
        let exempt = LoopSettings {
            ignore_tools: vec!["read_file".to_owned()],
            ..limit(2, 20)
        };
        assert_eq!(first_loop(&seen, exempt), None);
    }

    #[test]
    fn the_default_limit_flags_no_recording_but_the_loops() {
        for dir in ["streams/gemini", "real/gemini"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if !name.ends_with(".jsonl") || name == "loop_exempt_read.jsonl" {
                    continue;
                }
                let seen = calls(&std::fs::read(&path).unwrap(), "tool_use");
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
        let m = GeminiPlugin.manifest();
        assert!(m.tool_calls);
        assert_eq!(m.min_protocol(), "1.8.0");
        assert!(m.tool_results);
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
    fn usage_is_reported_on_the_result_and_adds_up_to_the_final_tokens() {
        let m = GeminiPlugin.manifest();
        assert!(m.reports_usage);
        assert_eq!((m.native_token_limit, m.native_cost_limit), (None, None));
        for dir in ["streams/gemini", "real/gemini"] {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "jsonl") {
                    continue;
                }
                let bytes = std::fs::read(&path).unwrap();
                for unit in ["tool_use", "turn"] {
                    let deltas =
                        stepguard_plugin_api::testing::usage_deltas(&GeminiPlugin, unit, &bytes)
                            .unwrap();
                    let live = deltas
                        .iter()
                        .fold(Tokens::default(), |sum, (_, t)| sum.saturating_add(*t));
                    let (_, stats) = count_bytes(&bytes, unit);
                    assert_eq!(
                        counts(live),
                        counts(stats.tokens.unwrap_or_default()),
                        "{} {unit}",
                        path.display()
                    );
                    assert!(deltas.len() <= 1, "{}", path.display());
                }
            }
        }
        let (_, stats) = count_bytes(&fixture("real/gemini/tools3.jsonl"), "tool_use");
        assert_eq!(counts(stats.tokens.unwrap()), (500, 100, 0, 0));
    }

    #[test]
    fn tool_results_answer_their_calls_and_the_same_output_is_one_fingerprint() {
        let pairs = stepguard_plugin_api::testing::tool_results(
            &GeminiPlugin,
            "tool_use",
            &fixture("streams/gemini/loop_repeat.jsonl"),
        )
        .unwrap();
        let builds: Vec<_> = pairs
            .iter()
            .filter(|(call, _)| call.program.as_deref() == Some("npm"))
            .collect();
        assert_eq!(builds.len(), 6);
        let build = &builds[0].1;
        for (call, result) in &builds {
            assert_eq!(call.tool, "run_shell_command");
            assert_eq!(
                (result.failed, &result.fingerprint),
                (false, &build.fingerprint)
            );
        }
        // The other calls returned other things.
        assert!(
            pairs
                .iter()
                .filter(|(call, _)| call.program.is_none())
                .all(|(_, r)| r.fingerprint != build.fingerprint && !r.failed)
        );
        // Gemini's stream does not say that a command exited non-zero (`status` is `success`):
        // the builds are no `no_progress`, and the read and the grep between them returned
        // something new, so by progress the repeat is the last three builds.
        let mut detector = LoopDetector::new(LoopSettings::with_limit(3));
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
        assert_eq!((found.kind, found.count), (LoopKind::Repeat, 3));
        let mut detector = LoopDetector::new(LoopSettings::with_limit(DEFAULT_LOOP_LIMIT));
        detector.judge_by_progress();
        let late = pairs.iter().find_map(|(call, result)| {
            detector.call(Call {
                id: call.id.clone(),
                ..Call::new(&call.tool, &call.fingerprint, 1)
            });
            detector.result(&Outcome {
                call_id: result.call_id.clone(),
                fingerprint: result.fingerprint.clone(),
                failed: result.failed,
            })
        });
        assert_eq!(late, None);
    }

    #[test]
    fn the_session_id_comes_from_init_and_the_manifest_resumes_it() {
        for (file, id) in [
            (
                "real/gemini/tools3.jsonl",
                "fa5d95f5-f5c7-431a-87e3-a0c424c893a6",
            ),
            (
                "real/gemini/maxturns2.jsonl",
                "0ed033a8-36be-40c7-8588-dba80578b169",
            ),
        ] {
            let (_, stats) =
                stepguard_plugin_api::testing::count(&GeminiPlugin, "tool_use", &fixture(file))
                    .unwrap();
            assert_eq!(stats.session_id.as_deref(), Some(id), "{file}");
        }
        let resume = GeminiPlugin.manifest().resume.expect("gemini resumes");
        let original: Vec<String> = [
            "gemini",
            "-p",
            "fix",
            "--output-format",
            "stream-json",
            "--yolo",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            resume.command(&original, "fa5d", "go on").unwrap(),
            [
                "gemini",
                "--resume",
                "fa5d",
                "-p",
                "go on",
                "--output-format",
                "stream-json",
                "--yolo"
            ]
        );
    }
}
