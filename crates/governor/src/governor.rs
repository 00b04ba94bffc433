//! The governor: asked before every model request, told after every response.

use serde::Serialize;
use stepguard_core::{FailureSlug, StepLimit};

use crate::agent::{AgentDef, DefinitionError, ReportFormat, ToolKind, ToolSpec};
use crate::conversation::{Message, ModelResponse, Notice, Request, ToolCall, ToolOutcome};
use crate::events;

pub use crate::attempt::AttemptReport;
pub use crate::events::MAX_LOGGED_RESPONSE;

/// The final report a session always ends with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FinalReport {
    /// Whether the session succeeded.
    pub success: bool,
    /// The report itself: the accepted text or JSON, or for a synthetic report the reason.
    pub content: serde_json::Value,
    /// True when stepguard made the report up because the session failed.
    pub synthetic: bool,
    /// Why the session failed.
    pub slug: Option<FailureSlug>,
    /// A status message for people (e.g. "stopped at the step limit (5 steps)").
    pub status: String,
}

/// What the loop does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Send this request to the model.
    Request(Request),
    /// The session is over.
    Done(FinalReport),
}

/// Runs one agent session's budget semantics.
#[derive(Debug)]
pub struct Governor {
    def: AgentDef,
    limit: StepLimit,
    validators: Vec<(String, Option<jsonschema::Validator>)>,
    report_validator: Option<jsonschema::Validator>,
    step: u32,
    turn: u32,
    attempt: u32,
    max_turns: u32,
    notice: Option<String>,
    notice_sent_this_turn: bool,
    history: Vec<Message>,
    done: Option<FinalReport>,
    attempts: Vec<AttemptReport>,
}

impl Governor {
    /// Starts a session for `def`.
    pub fn new(def: AgentDef) -> Result<Self, DefinitionError> {
        def.validate()?;
        let limit = def.step_limit()?;
        // `validate` compiled every schema already.
        let validators = def
            .tools
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.schema
                        .as_ref()
                        .and_then(|s| jsonschema::validator_for(s).ok()),
                )
            })
            .collect();
        let report_validator = match &def.final_report {
            ReportFormat::Json { schema } => jsonschema::validator_for(schema).ok(),
            _ => None,
        };
        Ok(Governor {
            max_turns: def.max_turns,
            def,
            limit,
            validators,
            report_validator,
            step: 0,
            turn: 1,
            attempt: 0,
            notice: None,
            notice_sent_this_turn: false,
            history: Vec::new(),
            done: None,
            attempts: Vec::new(),
        })
    }

    /// Returns the effective step limit.
    pub fn step_limit(&self) -> StepLimit {
        self.limit
    }

    /// Returns the model requests made so far.
    pub fn steps_used(&self) -> u32 {
        self.step
    }

    /// Returns the conversation so far (notices are never in it).
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// Returns every attempt so far.
    pub fn attempts(&self) -> &[AttemptReport] {
        &self.attempts
    }

    /// Returns the turn limit in force.
    pub fn max_turns(&self) -> u32 {
        self.max_turns
    }

    /// Allows at most `remaining` more turns after the current one. Limits only shrink: asking
    /// for more than is left changes nothing.
    pub fn collapse_remaining_turns(&mut self, remaining: u32) {
        let wanted = self.turn.saturating_add(remaining);
        self.max_turns = self.max_turns.min(wanted);
    }

    /// Returns what to do next.
    pub fn next_request(&mut self) -> Next {
        if let Some(report) = &self.done {
            return Next::Done(report.clone());
        }
        self.step += 1;
        let last = self.limit.get() == Some(self.step);
        let notice = self.notice.take().map(|text| Notice {
            text,
            cacheable: false,
        });
        if last {
            tracing::info!(agent = %self.def.name, step = self.step, "last step: offering no tools");
        }
        Next::Request(Request {
            step: self.step,
            tools: (!last).then(|| self.def.tools.clone()),
            notice,
        })
    }

    fn tool(&self, name: &str) -> Option<(&ToolSpec, Option<&jsonschema::Validator>)> {
        let i = self.def.tools.iter().position(|t| t.name == name)?;
        Some((&self.def.tools[i], self.validators[i].1.as_ref()))
    }

    /// Answers one call: returns (result, is_error, executed_real, slug).
    fn answer(
        &self,
        call: &ToolCall,
        tools_offered: bool,
        exec: &mut dyn FnMut(&ToolCall) -> ToolOutcome,
    ) -> (serde_json::Value, bool, u32, Option<FailureSlug>) {
        use serde_json::json;
        if !tools_offered {
            return (
                json!("no tools are available at this step: answer in text"),
                true,
                0,
                Some(FailureSlug::NoTools),
            );
        }
        let Some(args) = call.arguments.object().filter(|_| !call.name.is_empty()) else {
            return (
                json!(format!(
                    "malformed tool call `{}`: arguments must be a JSON object",
                    call.name
                )),
                true,
                0,
                Some(FailureSlug::MalformedToolCall),
            );
        };
        let Some((spec, validator)) = self.tool(&call.name) else {
            let names: Vec<&str> = self.def.tools.iter().map(|t| t.name.as_str()).collect();
            return (
                json!(format!(
                    "unknown tool `{}`; available tools: {}",
                    call.name,
                    names.join(", ")
                )),
                true,
                0,
                Some(FailureSlug::UnknownTool),
            );
        };
        if let Some(v) = validator
            && let Err(e) = v.validate(&args)
        {
            return (
                json!(format!(
                    "arguments of `{}` do not match its schema: {e}",
                    call.name
                )),
                true,
                0,
                Some(FailureSlug::SchemaInvalidToolCall),
            );
        }
        match spec.kind {
            ToolKind::Progress => (json!("progress noted"), false, 0, None),
            ToolKind::Batch => {
                let calls = args
                    .get("calls")
                    .and_then(|c| c.as_array())
                    .cloned()
                    .unwrap_or_default();
                let mut results = Vec::new();
                let mut executed = 0;
                for (i, inner) in calls.iter().enumerate() {
                    let inner_call = ToolCall {
                        id: format!("{}#{i}", call.id),
                        name: inner["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: crate::conversation::Arguments::Json(
                            inner.get("arguments").cloned().unwrap_or_else(|| json!({})),
                        ),
                    };
                    // Nested batches are not allowed: answer them as unknown.
                    let (content, is_error, n, slug) = if self
                        .tool(&inner_call.name)
                        .is_some_and(|(t, _)| t.kind == ToolKind::Batch)
                    {
                        (
                            json!("batches cannot be nested"),
                            true,
                            0,
                            Some(FailureSlug::MalformedToolCall),
                        )
                    } else {
                        self.answer(&inner_call, true, exec)
                    };
                    executed += n;
                    results.push(json!({"name": inner_call.name, "is_error": is_error, "content": content, "slug": slug}));
                }
                (json!({ "results": results }), false, executed, None)
            }
            ToolKind::Real | ToolKind::SubAgent => match exec(call) {
                ToolOutcome::Ok(v) => (v, false, 1, None),
                ToolOutcome::Failed(m) => (json!(m), true, 1, Some(FailureSlug::ToolExecFailed)),
            },
        }
    }

    /// Checks text against the report format.
    fn check_report(&self, text: &str) -> Result<serde_json::Value, FailureSlug> {
        match &self.def.final_report {
            ReportFormat::Text => {
                if text.trim().is_empty() {
                    Err(FailureSlug::FinalReportMissing)
                } else {
                    Ok(serde_json::Value::String(text.to_owned()))
                }
            }
            ReportFormat::Json { .. } => {
                let v: serde_json::Value = serde_json::from_str(text)
                    .map_err(|_| FailureSlug::FinalReportInvalidFormat)?;
                match &self.report_validator {
                    Some(val) if !val.is_valid(&v) => Err(FailureSlug::FinalReportSchemaFail),
                    _ => Ok(v),
                }
            }
            ReportFormat::Chat => {
                let v: serde_json::Value = serde_json::from_str(text)
                    .map_err(|_| FailureSlug::FinalReportInvalidFormat)?;
                if v.get("messages").is_some_and(|m| m.is_array()) {
                    Ok(v)
                } else {
                    Err(FailureSlug::FinalReportInvalidFormat)
                }
            }
        }
    }

    /// Tells the governor what the model answered. Tool calls are answered here, each exactly
    /// once: real ones through `exec`, the rest with a descriptive error or acknowledgement.
    pub fn respond(
        &mut self,
        response: &ModelResponse,
        exec: &mut dyn FnMut(&ToolCall) -> ToolOutcome,
    ) -> AttemptReport {
        if self.done.is_some() {
            return self.attempts.last().cloned().unwrap_or(AttemptReport {
                step: self.step,
                turn: self.turn,
                attempt: self.attempt,
                classification: "failed",
                slugs: Vec::new(),
                executed: 0,
            });
        }
        self.attempt += 1;
        let tools_offered = self.limit.get() != Some(self.step);
        let mut slugs = Vec::new();
        let mut executed = 0;
        self.history.push(Message::Assistant {
            text: response.text.clone(),
            tool_calls: response.tool_calls.clone(),
        });
        for call in &response.tool_calls {
            let (content, is_error, n, slug) = self.answer(call, tools_offered, exec);
            executed += n;
            if let Some(s) = slug {
                slugs.push(s);
            }
            self.history.push(Message::Tool {
                call_id: call.id.clone(),
                is_error,
                content,
            });
        }
        let (classification, report) = self.classify_attempt(response, executed, &mut slugs);
        slugs.dedup();
        let attempt = AttemptReport {
            step: self.step,
            turn: self.turn,
            attempt: self.attempt,
            classification,
            slugs: slugs.clone(),
            executed,
        };
        self.attempts.push(attempt.clone());
        self.advance(&attempt, report, tools_offered, response);
        attempt
    }

    /// What an attempt came to: `progress` (a real tool ran), `final_report` (with the
    /// report), or `failed` (with the slugs saying why).
    fn classify_attempt(
        &self,
        response: &ModelResponse,
        executed: u32,
        slugs: &mut Vec<FailureSlug>,
    ) -> (&'static str, Option<serde_json::Value>) {
        let text = response.text.as_deref().unwrap_or_default();
        let mut report = None;
        let classification = if executed > 0 {
            "progress"
        } else if response.tool_calls.is_empty() {
            if !text.trim().is_empty() {
                match self.check_report(text) {
                    Ok(v) => {
                        report = Some(v);
                        "final_report"
                    }
                    Err(slug) => {
                        slugs.push(FailureSlug::TextOnly);
                        slugs.push(slug);
                        "failed"
                    }
                }
            } else if response
                .reasoning
                .as_deref()
                .is_some_and(|r| !r.trim().is_empty())
            {
                slugs.push(FailureSlug::ReasoningOnly);
                "failed"
            } else {
                slugs.push(FailureSlug::EmptyResponse);
                "failed"
            }
        } else {
            // Calls were made but none was real progress (unknown, invalid, progress reports).
            if slugs.is_empty() {
                slugs.push(FailureSlug::NoTools);
            }
            "failed"
        };
        (classification, report)
    }

    /// Moves on after an attempt: finish with the report, a new turn after progress, or a
    /// retry (with a notice, once per turn) until the retries run out.
    fn advance(
        &mut self,
        attempt: &AttemptReport,
        report: Option<serde_json::Value>,
        tools_offered: bool,
        response: &ModelResponse,
    ) {
        match attempt.classification {
            "final_report" => {
                let status = if tools_offered {
                    format!("finished after {} step{}", self.step, plural(self.step))
                } else {
                    format!(
                        "finished at the step limit ({} steps) with a summary",
                        self.step
                    )
                };
                self.finish(FinalReport {
                    success: true,
                    content: report.unwrap_or_default(),
                    synthetic: false,
                    slug: None,
                    status,
                });
            }
            "progress" => {
                self.turn += 1;
                self.attempt = 0;
                self.notice_sent_this_turn = false;
                if !tools_offered {
                    self.fail(FailureSlug::MaxSteps);
                } else if self.turn > self.max_turns {
                    self.fail(FailureSlug::FinalReportMissing);
                }
            }
            _ => {
                events::failed_attempt(&self.def.name, attempt, response);
                if !tools_offered {
                    self.fail(FailureSlug::MaxSteps);
                } else if self.attempt >= self.def.max_retries {
                    self.fail(FailureSlug::RetriesExhausted);
                } else if !self.notice_sent_this_turn {
                    self.notice_sent_this_turn = true;
                    self.notice = Some(notice_for(&attempt.slugs));
                }
            }
        }
    }

    fn fail(&mut self, slug: FailureSlug) {
        let status = match slug {
            FailureSlug::MaxSteps => format!(
                "stopped at the step limit ({} steps) without a final report",
                self.step
            ),
            FailureSlug::RetriesExhausted => {
                format!("turn {} failed {} times in a row", self.turn, self.attempt)
            }
            FailureSlug::FinalReportMissing => {
                format!("used all {} turns without a final report", self.max_turns)
            }
            other => format!("failed: {other}"),
        };
        if slug == FailureSlug::MaxSteps {
            tracing::info!(agent = %self.def.name, limit = self.step, "step limit reached");
        }
        events::failed_session(&self.def.name, slug, &status);
        self.finish(FinalReport {
            success: false,
            content: serde_json::json!({ "reason": slug.as_str(), "status": status }),
            synthetic: true,
            slug: Some(slug),
            status,
        });
    }

    fn finish(&mut self, report: FinalReport) {
        self.done = Some(report);
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The feedback for the model after a failed attempt: what went wrong, why the turn did not
/// progress, and what to do now.
fn notice_for(slugs: &[FailureSlug]) -> String {
    let names: Vec<&str> = slugs.iter().map(|s| s.as_str()).collect();
    let todo = match slugs.first() {
        Some(FailureSlug::UnknownTool) => "call one of the tools offered, by its exact name",
        Some(FailureSlug::SchemaInvalidToolCall) => {
            "call the tool again with arguments that match its schema"
        }
        Some(FailureSlug::MalformedToolCall) => "send tool arguments as a single JSON object",
        Some(FailureSlug::NoTools) => {
            "call a real tool to make progress, or give your final report"
        }
        Some(FailureSlug::EmptyResponse | FailureSlug::ReasoningOnly) => {
            "answer with a tool call or with your final report"
        }
        Some(
            FailureSlug::TextOnly
            | FailureSlug::FinalReportInvalidFormat
            | FailureSlug::FinalReportSchemaFail,
        ) => "call a tool to make progress, or give the final report in the required format",
        _ => "make progress with a tool call, or give your final report",
    };
    format!(
        "system notice: the last attempt failed ({}); it neither ran a tool nor gave an accepted final report, so the turn did not progress. Now: {todo}.",
        names.join(", ")
    )
}
