//! Step budgets inside your own agent loop.
//!
//! The [`Governor`] is asked before every model request ([`Governor::next_request`]) and told after every
//! response ([`Governor::respond`]). It implements, as one model, the budget semantics that
//! well-run agent systems converged on:
//!
//! * **Steps.** One step is one model request. With `max_steps = N`, request N offers no tools,
//!   forcing a text-only summary, and the session then stops (`N = 1`: an immediate text answer;
//!   `N = 2`: one tool round, then text). Absent means unlimited; 0 is invalid. A profile bounds
//!   `max_steps` from above, as everywhere in stepguard.
//! * **Turns, attempts, retries.** A turn may take up to `max_retries` attempts. It succeeds when
//!   an attempt ran at least one real tool (a call that ran and failed counts; progress reports,
//!   batch wrappers, unknown tools and invalid calls do not) or gave an accepted final report.
//!   Turns advance only on success; exhausted retries fail the session at once
//!   (`retries_exhausted`). A session never makes more than `max_turns × max_retries` requests.
//! * **Every tool call is answered**, exactly once, with a result or a descriptive error.
//! * **Feedback.** After a failed attempt the next request carries one ephemeral
//!   `system notice: …` ([`Notice`]), at most one per turn, never stored in the history and marked
//!   not cacheable.
//! * **Final reports** are validated (text, JSON against a schema, or a chat transcript). A
//!   [`FinalReport`] is always returned; a failed session gets a synthetic one naming the reason.
//! * **Observability.** One `tracing` warning per failed attempt (slugs and the model response,
//!   capped at 128 KiB with `truncated = true`), one error per failed session.
//! * **Limits only shrink** ([`Governor::collapse_remaining_turns`]).
//!
//! Plan-and-execute loops have their own small driver in [`plan`]; [`scenario`] runs both
//! against scripted models (`stepguard simulate SCENARIO.json`).
//!
//! # Example: a model client wired to the governor
//!
//! ```
//! use stepguard_governor::{AgentDef, Governor, ModelResponse, Next, ToolCall, ToolOutcome, ToolSpec};
//!
//! // Any model client: here, one that calls `run_tests` once and then reports.
//! fn complete(step: u32, tools_offered: bool) -> ModelResponse {
//!     if tools_offered && step == 1 {
//!         let call = ToolCall { id: "c1".into(), name: "run_tests".into(), arguments: Default::default() };
//!         ModelResponse { tool_calls: vec![call], ..Default::default() }
//!     } else {
//!         ModelResponse { text: Some("all tests pass".into()), ..Default::default() }
//!     }
//! }
//!
//! let def = AgentDef { max_steps: Some(5), tools: vec![ToolSpec::real("run_tests")], ..AgentDef::default() };
//! let mut governor = Governor::new(def).unwrap();
//! let report = loop {
//!     let request = match governor.next_request() {
//!         Next::Request(request) => request,
//!         Next::Done(report) => break report,
//!     };
//!     // Send history + request.notice (if any) + request.tools (None = no tools) to the model.
//!     let response = complete(request.step, request.tools.is_some());
//!     governor.respond(&response, &mut |call: &ToolCall| {
//!         ToolOutcome::Ok(serde_json::json!(format!("ran {}", call.name)))
//!     });
//! };
//! assert!(report.success);
//! assert_eq!(governor.steps_used(), 2);
//! ```
#![forbid(unsafe_code)]

pub mod agent;
mod attempt;
pub mod conversation;
pub mod events;
pub mod governor;
pub mod plan;
pub mod scenario;

pub use agent::{AgentDef, DefinitionError, ReportFormat, ToolKind, ToolSpec};
pub use conversation::{Arguments, Message, ModelResponse, Notice, Request, ToolCall, ToolOutcome};
pub use governor::{AttemptReport, FinalReport, Governor, Next};

#[cfg(test)]
mod tests;
