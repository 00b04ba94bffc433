//! Gemini CLI (`gemini -p --output-format stream-json`) under stepguard.

use crate::agents::{Cli, scenarios};

/// Tool-use unit: three tool calls; the final text is not a step.
const STEPS_FOR_3_ROUNDS: u64 = 3;

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn under_budget_succeeds_with_the_served_counts() {
    scenarios::under_budget(Cli::Gemini, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn over_budget_is_stopped_by_stepguard() {
    scenarios::over_budget(Cli::Gemini, "sleep 2; echo round 6 call 1", &[], |_| {});
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn persistent_429_is_rate_limited() {
    scenarios::persistent_rate_limit(Cli::Gemini, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn broken_stream_is_a_provider_error() {
    scenarios::broken_stream(Cli::Gemini, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_single_429_recovers() {
    scenarios::single_rate_limit_recovers(Cli::Gemini, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn parallel_calls_with_text_beside_them() {
    // Tool-use unit: every call is a step.
    scenarios::parallel_calls_with_text(Cli::Gemini, &[], 4);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_repeated_tool_call_is_a_loop() {
    scenarios::repeated_call_is_a_loop(Cli::Gemini, "run_shell_command");
}
