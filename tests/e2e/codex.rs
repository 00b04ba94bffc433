//! Codex CLI (`codex exec --json`) under stepguard: no native limit, so stepguard is the only one.

use crate::agents::{Cli, scenarios};

/// Item unit: three command_execution items and the final agent_message.
const STEPS_FOR_3_ROUNDS: u64 = 4;

#[test]
fn under_budget_succeeds_with_the_served_counts() {
    scenarios::under_budget(Cli::Codex, STEPS_FOR_3_ROUNDS);
}

#[test]
fn over_budget_stops_a_long_shell_command_and_leaves_no_process() {
    // The breaching step is a command that would run for five minutes.
    scenarios::over_budget(Cli::Codex, "sleep 300", &[], |_| {});
}

#[test]
fn persistent_429_is_rate_limited() {
    scenarios::persistent_rate_limit(Cli::Codex, 1..=1);
}

#[test]
fn broken_stream_is_a_provider_error() {
    scenarios::broken_stream(Cli::Codex, 1..=1);
}

#[test]
fn http_500_is_a_provider_error() {
    scenarios::server_error(Cli::Codex, 1..=1);
}

#[test]
fn a_single_429_recovers() {
    scenarios::single_rate_limit_recovers(Cli::Codex, STEPS_FOR_3_ROUNDS);
}

#[test]
fn parallel_calls_with_text_beside_them() {
    // Tool unit: the four commands; the text beside them is an agent_message, not a tool.
    scenarios::parallel_calls_with_text(Cli::Codex, &["--unit", "tool"], 4);
}

#[test]
fn parallel_calls_with_text_beside_them_by_item() {
    // Item unit: per round the agent_message and two commands, then the final message.
    scenarios::parallel_calls_with_text(Cli::Codex, &[], 7);
}
