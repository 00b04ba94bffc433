//! An example third-party stepguard plugin: step counting for OpenCode
//! (`opencode run --format json`).
//!
//! OpenCode's own `steps` limit only adds a warning to the conversation and keeps running tools;
//! loaded into stepguard with `--plugin-dir`, this plugin makes the budget a hard limit.
//!
//! Units:
//! * `step` (default): one model step, begun at `step_start` (deduplicated by the part id) and
//!   completed at `step_finish`;
//! * `tool_use`: each `tool_use` event, deduplicated by `callID`.
//!
//! The stream has no terminal event: a final `step_finish` with reason `stop` is success, an
//! `error` event is a failure (`rate_limited` for HTTP 429, else `provider_error`), and anything
//! else means the stream was cut. Tokens and cost are the sums over `step_finish` parts.
//!
//! Token usage (protocol 1.5) is reported live, one model step at a time: each `step_finish`
//! part's `tokens` are that step's. OpenCode splits the provider's counts (1.18:
//! `input = inputTokens - cache.read - cache.write`, `output = outputTokens - reasoning`), so the
//! input tokens are `input + cache.read + cache.write`, the cached ones `cache.read`, the output
//! tokens `output + reasoning` and the reasoning ones `reasoning`. OpenCode has no native token
//! or cost budget.
//!
//! Tool calls (for loop detection, protocol 1.3) are the `tool_use` events, each reported once
//! by `callID`, as `part.tool` and `part.state.input`. OpenCode prints a call when it has run,
//! so the host sees it after its result, not before: the same line carries the result (protocol
//! 1.6), `state.output` or `state.error`, failed when `state.status` is `error` or a command's
//! `state.metadata.exit` is not 0. A `bash` call is its normalised `command` with its program.
//!
//! It is built only against `stepguard-plugin-api`, exactly as a third party would build theirs.
#![deny(unsafe_code)] // not `forbid`: export_plugin! allows it on its own generated items

use std::collections::HashSet;

use stepguard_plugin_api::{
    BaseUrlRule, CounterRequest, CounterStats, LineReport, Manifest, ModelEndpoint, PreflightRule,
    ProviderPlugin, ResumeTemplate, StepCounter, Terminal, Tokens, ToolCall, ToolResult,
    fingerprint::output_text, slug_for_error_text,
};

/// The OpenCode provider plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenCodePlugin;

stepguard_plugin_api::export_plugin!(OpenCodePlugin);

impl ProviderPlugin for OpenCodePlugin {
    fn manifest(&self) -> Manifest {
        Manifest::new("opencode", env!("CARGO_PKG_VERSION"))
            .description(
                "OpenCode (`opencode run --format json`); its own `steps` limit only warns",
            )
            .unit_costing("step", "model steps, begun at step_start", true, 1)
            .unit_costing("tool_use", "tool_use events, deduplicated by callID", false, 0)
            // OpenAI-compatible providers (`@ai-sdk/openai-compatible`), configured in
            // `opencode.json`; OPENCODE_CONFIG_CONTENT is merged over it.
            .model_endpoint(
                ModelEndpoint::new("openai-chat", "https://api.openai.com/v1").base_url(
                    BaseUrlRule::JsonConfig {
                        file: "opencode.json".into(),
                        env: "OPENCODE_CONFIG_CONTENT".into(),
                        model_flags: vec!["-m".into(), "--model".into()],
                        key: "provider.{}.options.baseURL".into(),
                    },
                ),
            )
            .expects("JSONL events of `opencode run --format json` (`step_start`, `tool_use`, `step_finish`, …)")
            .preflight(PreflightRule::new(
                "opencode",
                &["run"],
                "stepguard supervises `opencode run --format json \"PROMPT\"`; the interactive `opencode` prints no event stream",
            ))
            .preflight(
                PreflightRule::new(
                    "opencode",
                    &["--format=json"],
                    "add `--format json` after `opencode run`: stepguard counts its JSONL events",
                )
                .when_any(&["run"]),
            )
            .reports_tool_results()
            .reports_usage()
            .resume(
                ResumeTemplate::new(&["opencode", "run", "--session", "{session}", "{flags}", "{prompt}"])
                    .keep_flags(&["--auto", "--thinking", "--pure"])
                    .keep_options(&["--format", "-m", "--model", "--agent", "--variant"]),
            )
    }

    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        tracing::debug!(unit = %request.unit, "opencode counter opened");
        Ok(Box::new(OpenCodeCounter {
            by_step: request.unit == "step",
            calls: !request.tool_calls_unused,
            ..OpenCodeCounter::default()
        }))
    }
}

/// Counts one OpenCode stream.
#[derive(Debug, Default)]
pub struct OpenCodeCounter {
    by_step: bool,
    /// The session id its events carry (`opencode run --session` takes it).
    session_id: Option<String>,
    /// Whether the host takes tool calls and results (protocol 1.7): when not, none are made.
    calls: bool,
    steps: HashSet<String>,
    finished_steps: u64,
    tools: HashSet<String>,
    terminal: Option<Terminal>,
    tokens: Option<Tokens>,
    cost: Option<f64>,
    noise: u64,
    unknown: u64,
    /// Tool calls not yet taken by the host.
    tool_calls: Vec<ToolCall>,
    /// Tool results not yet taken by the host.
    tool_results: Vec<ToolResult>,
    /// Usage not yet taken by the host.
    pending_usage: Option<Tokens>,
}

/// A `step_finish` part's `tokens` as counts of the whole step (see the crate docs), or `None`
/// when it has none.
fn step_tokens(t: &serde_json::Value) -> Option<Tokens> {
    let input = t["input"].as_u64()?;
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let (read, write) = (n(&t["cache"]["read"]), n(&t["cache"]["write"]));
    let reasoning = t["reasoning"].as_u64();
    Some(
        Tokens::new(
            input + read + write,
            n(&t["output"]) + reasoning.unwrap_or(0),
        )
        .cached_input_tokens(read)
        .reasoning_output_tokens(reasoning),
    )
}

impl OpenCodeCounter {
    fn step_finish(&mut self, part: &serde_json::Value, report: &mut LineReport) {
        self.finished_steps += 1;
        if self.by_step {
            report.steps_completed += 1;
        }
        if let Some(step) = step_tokens(&part["tokens"]) {
            self.tokens = Some(self.tokens.unwrap_or_default().saturating_add(step));
            if !step.is_zero() {
                self.pending_usage =
                    Some(self.pending_usage.unwrap_or_default().saturating_add(step));
                report.flags |= LineReport::USAGE;
            }
        }
        if let Some(cost) = part["cost"].as_f64() {
            *self.cost.get_or_insert(0.0) += cost;
        }
        if part["reason"] == "stop" {
            self.terminal = Some(Terminal::success());
            report.flags |= LineReport::TERMINAL;
        }
    }
}

impl StepCounter for OpenCodeCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        let mut report = LineReport::empty();
        // A third-party plugin may simply use serde_json; the built-ins use a faster scanner.
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(line) else {
            self.noise += 1;
            return Ok(LineReport::noise());
        };
        let part = &event["part"];
        if self.session_id.is_none() {
            self.session_id = event["sessionID"].as_str().map(str::to_owned);
        }
        match event["type"].as_str().unwrap_or_default() {
            "step_start" => {
                // A retried model call starts again under the same message: one step, not two.
                let id = part["messageID"]
                    .as_str()
                    .or(part["id"].as_str())
                    .map_or_else(|| format!("step_{}", self.steps.len()), str::to_owned);
                if self.steps.insert(id) {
                    self.terminal = None;
                    if self.by_step {
                        report.steps_begun += 1;
                    }
                }
            }
            "step_finish" => self.step_finish(part, &mut report),
            "tool_use" => {
                let id = part["callID"]
                    .as_str()
                    .map_or_else(|| format!("call_{}", self.tools.len()), str::to_owned);
                if self.tools.insert(id.clone()) {
                    if !self.by_step {
                        report.steps_begun += 1;
                        report.steps_completed += 1;
                    }
                    if !self.calls {
                        return Ok(report);
                    }
                    self.tool_calls.push(tool_call(part).with_id(id.clone()));
                    report.flags |= LineReport::TOOL_CALL;
                    if let Some(result) = tool_result(part, id) {
                        self.tool_results.push(result);
                        report.flags |= LineReport::TOOL_RESULT;
                    }
                }
            }
            "text" | "reasoning" => {}
            "error" => {
                let data = &event["error"]["data"];
                let message = data["message"]
                    .as_str()
                    .or(event["error"]["name"].as_str())
                    .unwrap_or("error")
                    .to_owned();
                let slug = if data["statusCode"].as_u64() == Some(429) {
                    "rate_limited"
                } else {
                    slug_for_error_text(&message)
                };
                self.terminal = Some(Terminal::failed(slug, message));
                report.flags |= LineReport::TERMINAL;
            }
            _ => {
                self.unknown += 1;
                report.flags |= LineReport::UNKNOWN_EVENT;
            }
        }
        Ok(report)
    }

    fn finish(&mut self) -> CounterStats {
        // Start from the default and assign: keeps compiling when a field is added.
        let mut stats = CounterStats::default();
        stats.num_steps_computed = if self.by_step {
            self.steps.len()
        } else {
            self.tools.len()
        } as u64;
        stats.num_turns_computed = Some(self.steps.len() as u64);
        stats.terminal = self.terminal.clone();
        stats.tokens = self.tokens;
        stats.cost_usd = self.cost;
        stats.noise_lines = self.noise;
        stats.unknown_events = self.unknown;
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

/// The call a `tool_use` part stands for: its `tool` and `state.input`, without `bash`'s
/// `description` (it annotates the command and does not change what runs; a looping model
/// rewords it).
fn tool_call(part: &serde_json::Value) -> ToolCall {
    let tool = part["tool"].as_str().unwrap_or_default();
    let mut input = part["state"]["input"].clone();
    if tool == "bash"
        && let Some(object) = input.as_object_mut()
    {
        object.remove("description");
        if let Some(serde_json::Value::String(command)) = object.remove("command") {
            return ToolCall::shell(tool, &command, &input);
        }
    }
    ToolCall::new(tool, &input)
}

/// The result a `tool_use` part carries (OpenCode prints a call once it has run): its
/// `state.output` (or `state.error`), failed when `state.status` is `error` or a command's
/// `state.metadata.exit` is not 0; `None` while the call is still running.
fn tool_result(part: &serde_json::Value, id: String) -> Option<ToolResult> {
    let state = &part["state"];
    let status = state["status"].as_str()?;
    if !matches!(status, "completed" | "error") {
        return None;
    }
    let exit = state["metadata"]["exit"].as_i64();
    let failed = status == "error" || exit.is_some_and(|code| code != 0);
    let output = if state["error"].is_null() {
        &state["output"]
    } else {
        &state["error"]
    };
    let text = format!("exit {}\n{}", exit.unwrap_or(0), output_text(output));
    Some(ToolResult::new(id, &text, failed))
}

#[cfg(test)]
mod tests {
    use stepguard_plugin_api::testing::feed_all;

    use super::*;

    fn count(file: &str, unit: &str) -> CounterStats {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/real/opencode")
            .join(file);
        let bytes = std::fs::read(&path).unwrap();
        let mut c = OpenCodePlugin
            .open_counter(&CounterRequest::new(unit))
            .unwrap();
        feed_all(c.as_mut(), &bytes).unwrap().1
    }

    #[test]
    fn real_recordings() {
        // (file, steps, tool uses, outcome)
        for (file, steps, tools, outcome) in [
            ("tools3.jsonl", 4, 3, Some(true)),
            ("tools12.jsonl", 13, 12, Some(true)),
            ("steps2.jsonl", 13, 12, Some(true)),
            ("error429.jsonl", 1, 1, Some(false)),
        ] {
            let s = count(file, "step");
            assert_eq!(s.num_steps_computed, steps, "{file}");
            assert_eq!(s.terminal.as_ref().map(|t| t.success), outcome, "{file}");
            assert_eq!(count(file, "tool_use").num_steps_computed, tools, "{file}");
        }
        let s = count("error429.jsonl", "step");
        assert_eq!(s.terminal.unwrap().slug.as_deref(), Some("rate_limited"));
        let s = count("tools3.jsonl", "step");
        assert_eq!(s.tokens.unwrap().input_tokens, 400);
    }

    #[test]
    fn a_host_that_takes_no_calls_gets_none_and_the_same_counts() {
        for file in [
            "tools3.jsonl",
            "tools12.jsonl",
            "steps2.jsonl",
            "error429.jsonl",
        ] {
            let bytes = std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../tests/fixtures/real/opencode")
                    .join(file),
            )
            .unwrap();
            for unit in ["step", "tool_use"] {
                let mut quiet = OpenCodePlugin
                    .open_counter(&CounterRequest::new(unit).without_tool_calls())
                    .unwrap();
                let (sum, stats) = feed_all(quiet.as_mut(), &bytes).unwrap();
                assert!(!sum.has(LineReport::TOOL_CALL) && !sum.has(LineReport::TOOL_RESULT));
                assert!(quiet.take_tool_calls().is_empty());
                assert_eq!(stats, count(file, unit), "{file} {unit}");
            }
        }
    }

    #[test]
    fn a_retried_step_is_one_step() {
        // OpenCode retries a failed model call with a new step_start part for the same message
        // (seen with a broken stream: six starts, one message).
        let start = |part: &str, msg: &str| {
            format!(
                r#"{{"type":"step_start","part":{{"id":"{part}","messageID":"{msg}","type":"step-start"}}}}"#
            )
        };
        let stream = [
            start("p1", "m1"),
            start("p2", "m2"),
            start("p3", "m2"),
            start("p4", "m2"),
        ]
        .join("\n");
        let mut c = OpenCodePlugin
            .open_counter(&CounterRequest::new("step"))
            .unwrap();
        let stats = feed_all(c.as_mut(), stream.as_bytes()).unwrap().1;
        assert_eq!(stats.num_steps_computed, 2);
    }

    /// The tool calls of `bytes`, checking on every line that the flag and the calls agree.
    fn calls(bytes: &[u8]) -> Vec<ToolCall> {
        stepguard_plugin_api::testing::tool_calls(&OpenCodePlugin, "step", bytes)
            .unwrap()
            .into_iter()
            .map(|(call, _)| call)
            .collect()
    }

    fn stream(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/streams/opencode")
            .join(name);
        std::fs::read(&path).unwrap()
    }

    /// Each call's position among the distinct fingerprints, in order of first appearance:
    /// `[0, 1, 0, 0]` is a call, another, then the first twice more.
    fn shape(calls: &[ToolCall]) -> Vec<usize> {
        let mut seen: Vec<&str> = Vec::new();
        calls
            .iter()
            .map(|c| match seen.iter().position(|f| *f == c.fingerprint) {
                Some(i) => i,
                None => {
                    seen.push(&c.fingerprint);
                    seen.len() - 1
                }
            })
            .collect()
    }

    #[test]
    fn every_tool_use_event_is_one_tool_call() {
        for file in [
            "tools3.jsonl",
            "tools12.jsonl",
            "steps2.jsonl",
            "error429.jsonl",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/real/opencode")
                .join(file);
            let seen = calls(&std::fs::read(path).unwrap());
            assert_eq!(
                seen.len() as u64,
                count(file, "tool_use").num_steps_computed
            );
            assert!(seen.iter().all(|c| c.tool == "bash"), "{file}");
            // Every recorded round ran another command.
            assert_eq!(shape(&seen), (0..seen.len()).collect::<Vec<_>>(), "{file}");
        }
        let expected: serde_json::Value = serde_json::from_slice(&stream("expected.json")).unwrap();
        for (name, e) in expected.as_object().unwrap() {
            assert_eq!(
                calls(&stream(name)).len() as u64,
                e["tool_use_events"].as_u64().unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn one_call_per_call_id_and_equal_inputs_are_one_fingerprint() {
        let tool_use = |call: &str, tool: &str, input: &str| {
            format!(
                r#"{{"type":"tool_use","timestamp":1,"sessionID":"s","part":{{"type":"tool","tool":"{tool}","callID":"{call}","state":{{"status":"completed","input":{input},"output":""}},"id":"p","sessionID":"s","messageID":"m"}}}}"#
            )
        };
        let lines = [
            tool_use("c1", "read", r#"{"filePath":"/p/a.rs","limit":50}"#),
            tool_use("c1", "read", r#"{"filePath":"/p/a.rs","limit":50}"#),
            tool_use(
                "c2",
                "read",
                "{ \"limit\" : 50,\t\"filePath\": \"/p/a.rs\" }",
            ),
            tool_use("c3", "read", r#"{"filePath":"/p/b.rs","limit":50}"#),
            tool_use(
                "c4",
                "bash",
                r#"{"command":"cargo test","description":"Run the tests"}"#,
            ),
            tool_use(
                "c5",
                "bash",
                r#"{"description":"Again","command":"cargo test"}"#,
            ),
            tool_use("c6", "bash", r#"{"command":"cargo test -q"}"#),
        ];
        let seen = calls(lines.join("\n").as_bytes());
        assert_eq!(shape(&seen), [0, 0, 1, 2, 2, 3]);
        assert_eq!(seen[3].tool, "bash");
    }

    #[test]
    fn the_loop_fixtures_repeat_one_call_or_go_round_a_cycle() {
        // The detector is the host's (stepguard-core), which this third-party example does not
        // depend on: the order of the fingerprints is all it sees.
        let repeat = calls(&stream("loop_repeat.jsonl"));
        assert_eq!(shape(&repeat), [0, 1, 0, 0, 2, 0, 0, 0]);
        assert!(
            repeat
                .iter()
                .all(|c| c.tool != "bash" || c.fingerprint == repeat[0].fingerprint)
        );
        let cycle = calls(&stream("loop_cycle.jsonl"));
        assert_eq!(shape(&cycle), [0, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2]);
        let tools: Vec<&str> = cycle[1..3].iter().map(|c| c.tool.as_str()).collect();
        assert_eq!(tools, ["read", "edit"]);
        let polls = calls(&stream("loop_exempt_read.jsonl"));
        assert_eq!(shape(&polls), [0, 1, 1, 1, 1, 1]);
        assert_eq!(polls[1].tool, "read");
    }

    #[test]
    fn tool_calls_are_declared() {
        let m = OpenCodePlugin.manifest();
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
    fn usage_is_reported_per_step_and_adds_up_to_the_final_tokens() {
        let m = OpenCodePlugin.manifest();
        assert!(m.reports_usage);
        assert_eq!((m.native_token_limit, m.native_cost_limit), (None, None));
        let real = |file: &str| {
            std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../tests/fixtures/real/opencode")
                    .join(file),
            )
            .unwrap()
        };
        for file in [
            "tools3.jsonl",
            "tools12.jsonl",
            "steps2.jsonl",
            "error429.jsonl",
        ] {
            for unit in ["step", "tool_use"] {
                let deltas =
                    stepguard_plugin_api::testing::usage_deltas(&OpenCodePlugin, unit, &real(file))
                        .unwrap();
                let live = deltas
                    .iter()
                    .fold(Tokens::default(), |sum, (_, t)| sum.saturating_add(*t));
                assert_eq!(
                    counts(live),
                    counts(count(file, unit).tokens.unwrap_or_default()),
                    "{file} {unit}"
                );
            }
        }
        // tools3: four model steps of 100 in, 20 out, each reported as it finishes.
        let deltas = stepguard_plugin_api::testing::usage_deltas(
            &OpenCodePlugin,
            "step",
            &real("tools3.jsonl"),
        )
        .unwrap();
        assert_eq!(deltas.len(), 4);
        assert!(deltas.iter().all(|(_, t)| counts(*t) == (100, 20, 0, 0)));
    }

    #[test]
    fn cache_and_reasoning_tokens_count_as_input_and_output() {
        let finish = r#"{"type":"step_finish","part":{"type":"step-finish","reason":"stop","tokens":{"total":1880,"input":100,"output":50,"reasoning":30,"cache":{"write":200,"read":1500}},"cost":0.01}}"#;
        let mut c = OpenCodePlugin
            .open_counter(&CounterRequest::new("step"))
            .unwrap();
        let report = c.feed(finish.as_bytes()).unwrap();
        assert!(report.has(LineReport::USAGE));
        let step = c.take_usage().unwrap();
        assert_eq!(counts(step), (1800, 80, 1500, 30));
        assert_eq!(step.total(), 1880);
        assert_eq!(c.take_usage(), None);
        assert_eq!(c.finish().tokens, Some(step));
    }

    #[test]
    fn a_tool_use_line_carries_its_result_too() {
        let pairs = stepguard_plugin_api::testing::tool_results(
            &OpenCodePlugin,
            "step",
            &stream("loop_repeat.jsonl"),
        )
        .unwrap();
        assert_eq!(pairs.len(), calls(&stream("loop_repeat.jsonl")).len());
        let builds: Vec<_> = pairs
            .iter()
            .filter(|(call, _)| call.program.as_deref() == Some("cargo"))
            .collect();
        assert_eq!(builds.len(), 6);
        // `| tail` exits 0: the same output, not a failure.
        assert!(
            builds
                .iter()
                .all(|(_, r)| !r.failed && r.fingerprint == builds[0].1.fingerprint)
        );
        let other = pairs.iter().find(|(c, _)| c.program.is_none()).unwrap();
        assert_ne!(other.1.fingerprint, builds[0].1.fingerprint);
        // A command that exits non-zero, or a tool error, failed; a running call has no result.
        let line = |state: &str| {
            format!(
                r#"{{"type":"tool_use","part":{{"type":"tool","tool":"bash","callID":"c1","state":{state}}}}}"#
            )
        };
        let failed = |state: &str| {
            stepguard_plugin_api::testing::tool_results(
                &OpenCodePlugin,
                "step",
                line(state).as_bytes(),
            )
            .unwrap()
            .first()
            .map(|(_, r)| r.failed)
        };
        let exit1 = r#"{"status":"completed","input":{"command":"make"},"output":"boom","metadata":{"exit":1}}"#;
        let error = r#"{"status":"error","input":{"command":"make"},"error":"denied"}"#;
        let running = r#"{"status":"running","input":{"command":"make"}}"#;
        assert_eq!(failed(exit1), Some(true));
        assert_eq!(failed(error), Some(true));
        assert_eq!(failed(running), None);
    }

    #[test]
    fn the_session_id_comes_from_the_events_and_the_manifest_resumes_it() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/real/opencode/tools3.jsonl");
        let bytes = std::fs::read(&path).unwrap();
        let (_, stats) =
            stepguard_plugin_api::testing::count(&OpenCodePlugin, "step", &bytes).unwrap();
        assert_eq!(
            stats.session_id.as_deref(),
            Some("ses_dfd5e7d4cffeyu4Wvqxv6a6IZX")
        );
        let resume = OpenCodePlugin.manifest().resume.expect("opencode resumes");
        let original: Vec<String> = ["opencode", "run", "--format", "json", "-m", "mock/m", "fix"]
            .map(String::from)
            .into();
        assert_eq!(
            resume.command(&original, "ses_1", "go on").unwrap(),
            [
                "opencode",
                "run",
                "--session",
                "ses_1",
                "--format",
                "json",
                "-m",
                "mock/m",
                "go on"
            ]
        );
    }
}
