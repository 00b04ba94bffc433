//! Codex CLI (`codex exec --json`) under stepguard: no native limit, so stepguard is the only one.

use stepguard_modelserver::Script;

use crate::agents::{Cli, scenarios};

/// Item unit: three command_execution items and the final agent_message.
const STEPS_FOR_3_ROUNDS: u64 = 4;

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn under_budget_succeeds_with_the_served_counts() {
    scenarios::under_budget(Cli::Codex, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn over_budget_stops_a_long_shell_command_and_leaves_no_process() {
    // The breaching step is a command that would run for five minutes; and round 5 left a
    // process behind in a session of its own, as a dev server would. Neither survives the stop.
    let script = Script::tool_rounds(12)
        .command_at(
            5,
            "setsid sleep 300 > /dev/null 2>&1 & echo $! > background.pid",
        )
        .command_at(6, "sleep 300");
    let (agent, _) = scenarios::over_budget_with(Cli::Codex, script, &[], |_| {});
    let pid = std::fs::read_to_string(agent.work().join("background.pid"))
        .expect("round 5 started its background process");
    let pid = pid.trim();
    assert!(!pid.is_empty());
    // Gone, or at most a zombie waiting for a reaper that is not ours.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or("").trim_start();
    assert!(
        stat.is_empty() || state.starts_with('Z'),
        "background process {pid} survived: {stat}"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn persistent_429_is_rate_limited() {
    scenarios::persistent_rate_limit(Cli::Codex, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn broken_stream_is_a_provider_error() {
    scenarios::broken_stream(Cli::Codex, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn http_500_is_a_provider_error() {
    scenarios::server_error(Cli::Codex, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_single_429_recovers() {
    scenarios::single_rate_limit_recovers(Cli::Codex, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn parallel_calls_with_text_beside_them() {
    // Tool unit: the four commands; the text beside them is an agent_message, not a tool.
    scenarios::parallel_calls_with_text(Cli::Codex, &["--unit", "tool"], 4);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn parallel_calls_with_text_beside_them_by_item() {
    // Item unit: per round the agent_message and two commands, then the final message.
    scenarios::parallel_calls_with_text(Cli::Codex, &[], 7);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_repeated_tool_call_is_a_loop() {
    scenarios::repeated_call_is_a_loop(Cli::Codex, "shell");
}
