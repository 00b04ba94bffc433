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
//! It is built only against `stepguard-plugin-api`, exactly as a third party would build theirs.
#![deny(unsafe_code)] // not `forbid`: export_plugin! allows it on its own generated items

use std::collections::HashSet;

use stepguard_plugin_api::{
    CounterRequest, CounterStats, LineReport, Manifest, PreflightRule, ProviderPlugin, StepCounter,
    Terminal, Tokens, slug_for_error_text,
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
            .unit("step", "model steps, begun at step_start", true)
            .unit("tool_use", "tool_use events, deduplicated by callID", false)
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
    }

    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        tracing::debug!(unit = %request.unit, "opencode counter opened");
        Ok(Box::new(OpenCodeCounter {
            by_step: request.unit == "step",
            ..OpenCodeCounter::default()
        }))
    }
}

/// Counts one OpenCode stream.
#[derive(Debug, Default)]
pub struct OpenCodeCounter {
    by_step: bool,
    steps: HashSet<String>,
    finished_steps: u64,
    tools: HashSet<String>,
    terminal: Option<Terminal>,
    tokens: Option<Tokens>,
    cost: Option<f64>,
    noise: u64,
    unknown: u64,
}

impl OpenCodeCounter {
    fn step_finish(&mut self, part: &serde_json::Value, report: &mut LineReport) {
        self.finished_steps += 1;
        if self.by_step {
            report.steps_completed += 1;
        }
        let t = &part["tokens"];
        if let Some(input) = t["input"].as_u64() {
            let sum = self.tokens.get_or_insert_with(Tokens::default);
            sum.input_tokens += input + t["cache"]["read"].as_u64().unwrap_or(0);
            sum.output_tokens += t["output"].as_u64().unwrap_or(0);
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
                if self.tools.insert(id) && !self.by_step {
                    report.steps_begun += 1;
                    report.steps_completed += 1;
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
        stats
    }
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
}
