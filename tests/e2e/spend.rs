//! Token and cost budgets (`--max-tokens`, `--max-cost-usd`) on the real CLIs, offline: the
//! model server reports 100 input and 20 output tokens per reply, so the arithmetic is exact.

use serde_json::Value;
use stepguard_modelserver::{INPUT_TOKENS, OUTPUT_TOKENS, Script};

use crate::agents::{Agent, Cli};
use crate::harness::Sandbox;

/// Tokens of one model call as the server reports them.
const PER_CALL: u64 = INPUT_TOKENS + OUTPUT_TOKENS;

/// `--wrap-up --max-tokens` covering three main calls (plus the CLI's side calls, which cost
/// too): three calls reach the model, the third without tools; `max_tokens`, exit 3.
fn three_calls_of_tokens(cli: Cli, side_calls: u64) {
    let agent = Agent::start(
        cli,
        Script::tool_rounds(12).final_answer("Done three; nine left."),
    );
    let budget = (3 + side_calls) * PER_CALL;
    let budget_arg = budget.to_string();
    let run = agent.run(&[
        "--wrap-up",
        "--max-tokens",
        &budget_arg,
        "--max-steps",
        "50",
    ]);
    run.assert_exit(3);
    let main = agent.server.main_requests();
    assert_eq!(main.len(), 3, "three calls reached the model");
    assert!(
        main[2].tools_disabled && main[2].notices == 1,
        "the third was the last"
    );
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_tokens", "{rec}");
    assert_eq!(rec["terminated_by"], "wrap_up", "{rec}");
    assert_eq!(rec["max_tokens"], budget, "{rec}");
    assert_eq!(rec["max_tokens_source"], "--max-tokens", "{rec}");
    assert_eq!(rec["final_report"], "Done three; nine left.", "{rec}");
    let tokens = &rec["tokens"];
    let used = tokens["input_tokens"].as_u64().unwrap() + tokens["output_tokens"].as_u64().unwrap();
    assert_eq!(
        used, budget,
        "every call's usage, side calls included: {rec}"
    );
    assert!(
        run.run
            .stderr
            .contains(&format!("tokens {budget} of {budget}")),
        "{}",
        run.run.stderr
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claude_token_budget_ends_after_three_calls_with_a_wrap_up() {
    three_calls_of_tokens(Cli::Claude, 0);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_token_budget_ends_after_three_calls_with_a_wrap_up() {
    three_calls_of_tokens(Cli::Codex, 0);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn gemini_token_budget_ends_after_three_calls_with_a_wrap_up() {
    // Its router call comes first and costs too.
    three_calls_of_tokens(Cli::Gemini, 1);
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn opencode_token_budget_ends_after_three_calls_with_a_wrap_up() {
    // Its title call goes beside the first step and costs too.
    three_calls_of_tokens(Cli::OpenCode, 1);
}

/// A price file that prices the test model at $100 per million tokens each way: $0.012 a call.
fn price_file(agent: &Agent) -> String {
    let path = agent.work().with_file_name("prices.toml");
    std::fs::write(
        &path,
        "taken = \"2026-11-23\"\n[models.\"sg-test-model\"]\ninput_per_mtok = 100\noutput_per_mtok = 100\n",
    )
    .unwrap();
    path.display().to_string()
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_cost_budget_with_a_price_override_ends_after_three_calls() {
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(12));
    let prices = price_file(&agent);
    let run = agent.run_agent_args(
        &["--wrap-up", "--max-cost-usd", "0.036", "--prices", &prices],
        &["--model", "sg-test-model"],
    );
    run.assert_exit(3);
    let main = agent.server.main_requests();
    assert_eq!(main.len(), 3);
    assert!(main[2].tools_disabled);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_cost", "{rec}");
    assert_eq!(rec["max_cost_usd"], 0.036, "{rec}");
    // Claude's own total_cost_usd wins where it reports one; either way it is a number.
    assert!(rec["cost_usd"].is_f64(), "{rec}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn an_unknown_model_with_a_cost_budget_is_refused_before_the_start() {
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(3));
    let run = agent.run_agent_args(
        &["--wrap-up", "--max-cost-usd", "1"],
        &["--model", "no-such-model-9"],
    );
    run.assert_exit(2);
    assert!(
        run.run
            .stderr
            .contains("the model `no-such-model-9` has no price")
            && run.run.stderr.contains("--prices FILE"),
        "{}",
        run.run.stderr
    );
    assert!(
        agent.server.requests().is_empty(),
        "the agent never started"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_model_the_gateway_cannot_price_is_never_called() {
    // No model on the command line: the gateway prices each call and refuses the first.
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(3));
    let run = agent.run(&["--wrap-up", "--max-cost-usd", "1"]);
    run.assert_exit(2);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "unpriced_model", "{rec}");
    assert_eq!(rec["terminated_by"], "unpriced", "{rec}");
    assert!(
        rec["message"]
            .as_str()
            .unwrap_or("")
            .contains("has no price"),
        "{rec}"
    );
    assert!(
        agent.server.main_requests().is_empty(),
        "no call reached the model"
    );
}

#[test]
fn cost_budgets_need_a_known_model_before_the_start() {
    let sb = Sandbox::new();
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--max-cost-usd",
        "2",
        "--",
        "codex",
        "exec",
        "--json",
        "x",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("names none"), "{}", run.stderr);
    let bad = sb.write(
        "prices.toml",
        "taken = \"2026-01-01\"\n[models.x]\ninput_per_mtok = -1\n",
    );
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--max-cost-usd",
        "2",
        "--prices",
        bad.to_str().unwrap(),
        "--",
        "codex",
        "exec",
        "--json",
        "-m",
        "x",
        "go",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("prices.toml") && run.stderr.contains("input_per_mtok"),
        "{}",
        run.stderr
    );
    // A model the shipped table knows passes the check: stepguard goes on to start the agent,
    // which does not exist here.
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--max-cost-usd",
        "2",
        "--",
        "sg-no-such-codex",
        "exec",
        "--json",
        "-m",
        "gpt-5",
        "go",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        !run.stderr.contains("has no price")
            && run
                .stderr
                .contains("cannot run `sg-no-such-codex`: command not found"),
        "{}",
        run.stderr
    );
    let v: Value = sb.run(&["prices", "--json"]).json();
    assert!(v["models"].as_array().is_some_and(|m| m.len() > 10), "{v}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn without_the_gateway_claudes_stream_usage_keeps_the_token_budget() {
    // Claude reports each message's usage as it arrives (100 input, and the first output
    // tokens, per call): the third message crosses 250 and the tree is stopped.
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(12));
    let run = agent.run(&["--max-tokens", "250", "--max-steps", "50"]);
    run.assert_exit(3);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_tokens", "{rec}");
    assert_eq!(rec["terminated_by"], "tokens", "{rec}");
    assert!(
        rec["message"]
            .as_str()
            .unwrap_or("")
            .contains("over the token budget of 250"),
        "{rec}"
    );
    let calls = agent.server.main_requests().len();
    assert!((3..=4).contains(&calls), "{calls} calls");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn codex_gets_its_own_session_budget_as_a_second_line() {
    // Without the gateway Codex reports usage only at the end of its turn, so its own session
    // budget (added like Claude's --max-turns) is what stops it; the outcome is the same slug.
    let agent = Agent::start(Cli::Codex, Script::tool_rounds(12));
    let budget = (3 * PER_CALL).to_string();
    let run = agent.run(&["--max-tokens", &budget, "--max-steps", "50"]);
    run.assert_exit(3);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_tokens", "{rec}");
    let command: Vec<&str> = rec["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command.contains(&format!("features.rollout_budget.limit_tokens={budget}").as_str()),
        "{command:?}"
    );
    let calls = agent.server.main_requests().len();
    assert!(
        (3..=4).contains(&calls),
        "Codex stopped itself near its budget: {calls} calls"
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn without_the_gateway_a_cost_budget_prices_the_stream_as_the_commands_model() {
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(12));
    let prices = price_file(&agent);
    let run = agent.run_agent_args(
        &[
            "--max-cost-usd",
            "0.025",
            "--prices",
            &prices,
            "--max-steps",
            "50",
        ],
        &["--model", "sg-test-model"],
    );
    run.assert_exit(3);
    let rec = agent.last_record();
    assert_eq!(rec["error_type"], "max_cost", "{rec}");
    let calls = agent.server.main_requests().len();
    assert!(
        calls <= 4,
        "{calls} calls for a budget of about two and a half"
    );
}

#[test]
fn sub_agent_usage_rolls_up_into_the_run_and_is_kept_per_sub_agent() {
    let sb = Sandbox::new();
    let file = crate::harness::fixture("streams/claude/sub_agent_usage.jsonl");
    let rec: Value = sb.run(&["count", "-p", "claude", "--json", &file]).json();
    let per_agent = rec["sub_agent_tokens"].as_object().unwrap();
    assert_eq!(per_agent.len(), 2, "{rec}");
    let steps = rec["sub_agent_steps"].as_object().unwrap();
    assert!(per_agent.keys().all(|k| steps.contains_key(k)), "{rec}");
    let sub_input: u64 = per_agent
        .values()
        .map(|t| t["input_tokens"].as_u64().unwrap())
        .sum();
    let total_input = rec["tokens"]["input_tokens"].as_u64().unwrap();
    assert_eq!(sub_input, 8976 + 9255);
    assert!(
        total_input > sub_input,
        "the run's total includes its sub-agents: {rec}"
    );
    assert_eq!(total_input, 83450);
}

#[test]
fn a_budget_nobody_could_keep_is_refused_before_the_start() {
    // The fixture plugin reports no usage (protocol < 1.5): without the gateway a token budget
    // would be recorded and never kept.
    let sb = Sandbox::new();
    let dir = crate::harness::plugin_dirs().good.display().to_string();
    let run = sb.run(&[
        "--plugin-dir",
        &dir,
        "run",
        "-p",
        "fixture",
        "--max-tokens",
        "1000",
        "--",
        "sh",
        "-c",
        "echo '{\"type\":\"step\"}'",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("reports no token usage") && run.stderr.contains("--wrap-up"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_cost_budget_is_shown_with_the_digits_it_was_given() {
    // $0.0049 used to print as "$0.00" in the summary line.
    let sb = Sandbox::new();
    let agent = sb.write(
        "agent.sh",
        format!(
            "#!/bin/sh\ncat {}\n",
            crate::harness::fixture("real/codex/tools3.jsonl")
        ),
    );
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = agent.display().to_string();
    for (budget, shown) in [("0.0049", "$0.0049"), ("2", "$2.00"), ("0.125", "$0.125")] {
        let run = sb.run(&[
            "run",
            "--no-record",
            "-p",
            "codex",
            "--max-cost-usd",
            budget,
            "--",
            &agent,
            "exec",
            "--json",
            "-m",
            "gpt-5",
            "go",
        ]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!(" of {shown}")),
            "{budget}: {}",
            run.stderr
        );
    }
}
