//! The per-attempt report, kept apart so the governor and its log events both depend on it.

use serde::Serialize;
use stepguard_core::FailureSlug;

/// How one attempt went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttemptReport {
    /// The step (request) number.
    pub step: u32,
    /// The turn it belonged to (1-based).
    pub turn: u32,
    /// The attempt within the turn (1-based).
    pub attempt: u32,
    /// `progress`, `final_report` or `failed`.
    pub classification: &'static str,
    /// The slugs found (failed attempts; `tool_exec_failed` may accompany progress).
    pub slugs: Vec<FailureSlug>,
    /// Real tool calls executed (including failed ones).
    pub executed: u32,
}
