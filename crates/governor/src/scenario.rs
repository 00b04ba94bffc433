//! The scenario harness: runs the governor against scripted model replies and returns a JSON
//! transcript. The format is documented in `docs/scenarios.md`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::agent::{AgentDef, DefinitionError, ToolKind};
use crate::conversation::{Message, ModelResponse, ToolCall, ToolOutcome};
use crate::governor::{Governor, Next};
use crate::plan::{Plan, PlanLimits, PlanStep, PlanStepKind, StepResult, run_plan};

/// A scenario file.
#[derive(Clone, Debug, Deserialize)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// A governed agent session (with `agent`, `replies` …), or a plan-and-execute loop (`plan`).
    #[serde(flatten)]
    pub body: Body,
    /// What the run must show; the harness reports every mismatch.
    #[serde(default)]
    pub expect: BTreeMap<String, Value>,
}

/// The two kinds of scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    /// A governed agent session.
    Agent(AgentScript),
    /// A plan-and-execute loop.
    Plan(PlanScript),
}

/// A scripted agent session.
#[derive(Clone, Debug, Deserialize)]
pub struct AgentScript {
    /// The agent.
    pub agent: AgentDef,
    /// The model's replies, one per request, in order (an empty response once they run out).
    #[serde(default)]
    pub replies: Vec<ModelResponse>,
    /// Outcomes of real tools by name (default: `{"status": "ok", "content": "ok"}`).
    #[serde(default)]
    pub tool_results: BTreeMap<String, ToolOutcome>,
    /// Sub-agents run by tools of kind `sub_agent`, by tool name.
    #[serde(default)]
    pub subagents: BTreeMap<String, AgentScript>,
    /// After this many steps, collapse the remaining turns to this many (limits only shrink).
    #[serde(default)]
    pub collapse: Option<Collapse>,
}

/// A "finish soon" instruction given during the run.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Collapse {
    /// After which step.
    pub after_step: u32,
    /// Turns left after the current one.
    pub remaining_turns: u32,
}

/// A scripted plan-and-execute loop.
#[derive(Clone, Debug, Deserialize)]
pub struct PlanScript {
    /// Hard limit on executed steps.
    pub max_steps: u32,
    /// Retries of a failing code step.
    #[serde(default = "default_retries")]
    pub code_retries: u32,
    /// The planner's successive answers.
    pub plans: Vec<ScriptedPlan>,
    /// Whether the human supplies a final conclude step at the limit.
    #[serde(default)]
    pub human_conclude: bool,
}

fn default_retries() -> u32 {
    3
}

/// One planner answer.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptedPlan {
    /// Answer without steps.
    Answer(String),
    /// Steps with scripted attempt results.
    Steps(Vec<ScriptedStep>),
}

/// A planned step and the results of its attempts.
#[derive(Clone, Debug, Deserialize)]
pub struct ScriptedStep {
    /// Its kind.
    pub kind: PlanStepKind,
    /// Results of successive attempts: `done`, `failed` or `goal_reached` (default: `done`).
    #[serde(default)]
    pub results: Vec<String>,
}

/// A scenario that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The JSON does not describe a scenario.
    #[error("invalid scenario: {0}")]
    Parse(#[from] serde_json::Error),
    /// The agent definition is invalid.
    #[error(transparent)]
    Definition(#[from] DefinitionError),
}

/// Parses a scenario from JSON text.
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    Ok(serde_json::from_str(text)?)
}

/// Runs a scenario and returns its transcript, with an `expectations` section listing any
/// mismatch with `expect`.
pub fn run(scenario: &Scenario) -> Result<Value, ScenarioError> {
    let mut transcript = match &scenario.body {
        Body::Agent(script) => run_agent(script)?,
        Body::Plan(script) => run_plan_script(script),
    };
    let mut mismatches = Vec::new();
    for (path, expected) in &scenario.expect {
        let actual = path
            .split('.')
            .try_fold(&transcript, |v, key| match key.parse::<usize>() {
                Ok(i) => v.get(i),
                Err(_) => v.get(key),
            });
        if actual != Some(expected) {
            mismatches.push(json!({ "path": path, "expected": expected, "actual": actual }));
        }
    }
    transcript["name"] = json!(scenario.name);
    transcript["expectations"] = json!({ "met": mismatches.is_empty(), "mismatches": mismatches });
    Ok(transcript)
}

/// Runs a governed session against scripted replies.
fn run_agent(script: &AgentScript) -> Result<Value, ScenarioError> {
    let mut gov = Governor::new(script.agent.clone())?;
    let mut replies = script.replies.iter();
    let mut requests = Vec::new();
    let mut subagents = Vec::new();
    let mut sub_error = None;
    let report = loop {
        let request = match gov.next_request() {
            Next::Request(r) => r,
            Next::Done(report) => break report,
        };
        requests.push(json!({
            "step": request.step,
            "tools_offered": request.tools.is_some(),
            "notice": request.notice.as_ref().map(|n| &n.text),
            "notice_cacheable": request.notice.as_ref().map(|n| n.cacheable),
        }));
        let reply = replies.next().cloned().unwrap_or_default();
        let mut exec = |call: &ToolCall| -> ToolOutcome {
            let kind = script
                .agent
                .tools
                .iter()
                .find(|t| t.name == call.name)
                .map(|t| t.kind);
            if kind == Some(ToolKind::SubAgent)
                && let Some(sub) = script.subagents.get(&call.name)
            {
                match run_agent(sub) {
                    Ok(t) => {
                        let outcome = t["outcome"].clone();
                        subagents.push(
                            json!({ "tool": call.name, "call_id": call.id, "transcript": t }),
                        );
                        return if outcome["success"] == true {
                            ToolOutcome::Ok(outcome["report"].clone())
                        } else {
                            ToolOutcome::Failed(
                                outcome["status"]
                                    .as_str()
                                    .unwrap_or("sub-agent failed")
                                    .to_owned(),
                            )
                        };
                    }
                    Err(e) => {
                        sub_error = Some(e);
                        return ToolOutcome::Failed("invalid sub-agent".into());
                    }
                }
            }
            script
                .tool_results
                .get(&call.name)
                .cloned()
                .unwrap_or_else(|| ToolOutcome::Ok(json!("ok")))
        };
        gov.respond(&reply, &mut exec);
        if let Some(c) = script.collapse
            && c.after_step == gov.steps_used()
        {
            gov.collapse_remaining_turns(c.remaining_turns);
        }
    };
    if let Some(e) = sub_error {
        return Err(e);
    }
    let calls: Vec<&String> = gov
        .history()
        .iter()
        .flat_map(|m| match m {
            Message::Assistant { tool_calls, .. } => tool_calls.iter().map(|c| &c.id).collect(),
            Message::Tool { .. } => Vec::new(),
        })
        .collect();
    let answers: Vec<Value> = gov
        .history()
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                call_id, is_error, ..
            } => Some(json!({ "call_id": call_id, "is_error": is_error })),
            Message::Assistant { .. } => None,
        })
        .collect();
    Ok(json!({
        "kind": "agent",
        "step_limit": gov.step_limit().get(),
        "max_turns": gov.max_turns(),
        "requests": requests,
        "responses": gov.attempts(),
        "tool_calls": calls.len(),
        "answers": answers,
        "subagents": subagents,
        "steps_used": gov.steps_used(),
        "outcome": {
            "success": report.success,
            "slug": report.slug.map(|s| s.as_str()),
            "synthetic": report.synthetic,
            "status": report.status,
            "report": report.content,
        },
    }))
}

/// Runs a scripted plan-and-execute loop.
fn run_plan_script(script: &PlanScript) -> Value {
    let mut plans = script.plans.iter();
    let current: std::cell::RefCell<Vec<ScriptedStep>> = std::cell::RefCell::new(Vec::new());
    let offset = std::cell::Cell::new(0u32);
    let limits = PlanLimits {
        max_steps: script.max_steps,
        code_retries: script.code_retries,
        ..PlanLimits::default()
    };
    let mut attempts_log = Vec::new();
    let outcome = run_plan(
        limits,
        &mut |executed| match plans.next() {
            Some(ScriptedPlan::Answer(a)) => Plan::Answer(a.clone()),
            Some(ScriptedPlan::Steps(steps)) => {
                *current.borrow_mut() = steps.clone();
                offset.set(executed);
                Plan::Steps(
                    steps
                        .iter()
                        .map(|s| PlanStep {
                            kind: s.kind,
                            description: String::new(),
                        })
                        .collect(),
                )
            }
            None => Plan::Steps(Vec::new()),
        },
        &mut |step, index, attempt| {
            let current = current.borrow();
            let scripted = current
                .get((index - offset.get()) as usize)
                .filter(|s| s.kind == step.kind);
            let result = scripted
                .and_then(|s| s.results.get(attempt as usize - 1))
                .map_or("done", String::as_str)
                .to_owned();
            attempts_log.push(json!({ "index": index, "attempt": attempt, "result": result }));
            match result.as_str() {
                "failed" => StepResult::Failed,
                "goal_reached" => StepResult::GoalReached,
                _ => StepResult::Done,
            }
        },
        &mut |_| {
            script.human_conclude.then(|| PlanStep {
                kind: PlanStepKind::Conclude,
                description: "human".into(),
            })
        },
    );
    json!({
        "kind": "plan",
        "end": outcome.end,
        "steps": outcome.steps,
        "plans": outcome.plans,
        "executed": outcome.executed,
        "attempts": attempts_log,
    })
}
