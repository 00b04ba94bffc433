//! Claude Code (`claude -p --output-format stream-json`) under stepguard, with and without its
//! native `--max-turns` limit.

use serde_json::Value;
use stepguard_modelserver::Script;

use crate::agents::{Agent, Cli, scenarios};

/// Message unit: three tool-use messages and the final text message.
const STEPS_FOR_3_ROUNDS: u64 = 4;

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn under_budget_succeeds_with_the_served_counts() {
    scenarios::under_budget(Cli::Claude, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn over_budget_without_the_native_limit_is_stopped_by_stepguard() {
    scenarios::over_budget(
        Cli::Claude,
        "sleep 2; echo round 6 call 1",
        &["--no-native-limit"],
        |_| {},
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn persistent_429_is_rate_limited() {
    scenarios::persistent_rate_limit(Cli::Claude, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn broken_stream_is_a_provider_error() {
    scenarios::broken_stream(Cli::Claude, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn http_500_is_a_provider_error() {
    scenarios::server_error(Cli::Claude, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_single_429_recovers() {
    scenarios::single_rate_limit_recovers(Cli::Claude, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn over_budget_with_the_native_limit_claude_stops_itself() {
    // By default stepguard passes the budget on as `--max-turns 5`: Claude ends the run itself
    // after five model calls, and the outcome is still the budget's.
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(12));
    let run = agent.run(&["--max-steps", "5"]);
    run.assert_exit(3);
    assert_eq!(
        run.steps_and_turns().0,
        5,
        "Claude stopped within the budget"
    );
    assert_eq!(agent.server.last_round_served(), 5);
    assert!(agent.server.max_tool_results_seen() < 5);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_steps", "{rec}");
    assert_eq!(
        rec["terminated_by"],
        Value::Null,
        "Claude stopped, not stepguard: {rec}"
    );
    assert_eq!(rec["child_exit_code"], 1, "{rec}");
    assert_eq!(rec["num_steps_computed"], 5, "{rec}");
    let command: Vec<&str> = rec["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(command.ends_with(&["--max-turns", "5"]), "{command:?}");
    assert!(agent.live_processes().is_empty());
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn parallel_calls_with_text_beside_them() {
    // Message unit: one message per round, however many calls and text blocks it holds.
    scenarios::parallel_calls_with_text(Cli::Claude, &[], 3);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_repeated_tool_call_is_a_loop() {
    scenarios::repeated_call_is_a_loop(Cli::Claude, "Bash");
}
