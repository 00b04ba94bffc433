//! OpenCode (`opencode run --format json`) under stepguard, through the example third-party
//! plugin in `plugins/opencode`, loaded with `--plugin-dir`.

use crate::agents::{Cli, scenarios};

/// Step unit: three tool steps and the final text step (the title request is not a step).
const STEPS_FOR_3_ROUNDS: u64 = 4;

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn under_budget_succeeds_with_the_served_counts() {
    scenarios::under_budget(Cli::OpenCode, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn over_budget_its_own_steps_setting_only_warns_and_stepguard_stops_it() {
    // `agent.build.steps = 2` is below the budget, yet OpenCode runs past it: round 6 is served,
    // and only stepguard ends the run.
    let (agent, _) = scenarios::over_budget(
        Cli::OpenCode,
        "sleep 2; echo round 6 call 1",
        &[],
        |agent| agent.set_opencode_steps(2),
    );
    // The setting took effect: OpenCode told the model from step 2 on. Tools went on anyway.
    let warned: Vec<usize> = agent
        .server
        .model_requests()
        .iter()
        .filter(|r| r.body.to_string().contains("MAXIMUM STEPS REACHED"))
        .map(|r| r.tool_results)
        .collect();
    assert_eq!(warned.first(), Some(&1), "{warned:?}");
    assert_eq!(warned.last(), Some(&5), "{warned:?}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn persistent_429_is_rate_limited() {
    scenarios::persistent_rate_limit(Cli::OpenCode, 1..=1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn broken_stream_is_a_provider_error() {
    // OpenCode announces the failing call's step only if the stream got far enough: 1 or 2.
    scenarios::broken_stream(Cli::OpenCode, 1..=2);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_single_429_recovers() {
    scenarios::single_rate_limit_recovers(Cli::OpenCode, STEPS_FOR_3_ROUNDS);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn parallel_calls_with_text_beside_them() {
    // Step unit: one model step per round, plus the final one.
    scenarios::parallel_calls_with_text(Cli::OpenCode, &[], 3);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_repeated_tool_call_is_a_loop() {
    scenarios::repeated_call_is_a_loop(Cli::OpenCode, "bash");
}
