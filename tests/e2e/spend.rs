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
    // No model on the command line: the gateway prices each call and refuses the first. (Claude's
    // default model is priced: the environment names one nobody prices.)
    let agent = Agent::start(Cli::Claude, Script::tool_rounds(3));
    let run = agent.run_env(
        &["--wrap-up", "--max-cost-usd", "1"],
        &[("ANTHROPIC_MODEL", "sg-unpriced-model")],
    );
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

/// A stand-in for Claude that prints the first `lines` of a real recording (its usage with
/// them, but not its final `result` and the cost that reports), then waits to be stopped.
fn claude_cut_short(sb: &Sandbox, lines: usize) -> String {
    let agent = sb.write(
        "claude-cut.sh",
        format!(
            "#!/bin/sh\nhead -n {lines} {}\nsleep 20\n",
            crate::harness::fixture("real/claude/tools12.jsonl")
        ),
    );
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    agent.display().to_string()
}

#[test]
fn a_run_stopped_for_cost_records_the_cost_it_was_stopped_at() {
    // It used to say "cost unknown" with `cost_usd: null` right after pricing the stream.
    let sb = Sandbox::new();
    let agent = claude_cut_short(&sb, 8);
    let run = sb.run(&[
        "run",
        "-p",
        "claude",
        "--max-cost-usd",
        "0.001",
        "--max-steps",
        "50",
        "--",
        &agent,
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "claude-sonnet-4-5",
    ]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    // 400 input tokens at $3 per million and 4 output tokens at $15: $0.00126.
    assert!(
        run.stderr.contains("costs $0.0013 as claude-sonnet-4-5")
            && run.stderr.contains("| $0.0013 of $0.001")
            && !run.stderr.contains("cost unknown"),
        "{}",
        run.stderr
    );
    let export = sb.run(&["history", "export", "--last", "1"]);
    let rec: Value = serde_json::from_str(export.stdout.trim()).unwrap();
    assert_eq!(rec["error_type"], "max_cost", "{rec}");
    assert_eq!(rec["tokens"]["input_tokens"], 400, "{rec}");
    assert_eq!(rec["tokens"]["output_tokens"], 4, "{rec}");
    let cost = rec["cost_usd"].as_f64().unwrap_or_else(|| panic!("{rec}"));
    assert!((cost - 0.00126).abs() < 1e-9, "{rec}");
}

#[test]
fn a_cost_budget_on_claudes_default_model_is_kept_not_refused() {
    // Claude Code's default model (and its 1M-context spelling) had no price: every cost budget
    // failed closed before the start.
    let sb = Sandbox::new();
    let agent = claude_cut_short(&sb, 8);
    for model in ["claude-opus-4-8", "claude-opus-4-8[1m]"] {
        let run = sb.run(&[
            "run",
            "-p",
            "claude",
            "--max-cost-usd",
            "0.0018",
            "--max-steps",
            "50",
            "--",
            &agent,
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            model,
        ]);
        // Four calls of 100 in at $5 per million and 1 out at $25: $0.0021, over $0.0018
        // (three were $0.0016).
        assert_eq!(run.code, Some(3), "{model}: {}", run.stderr);
        assert!(
            run.stderr.contains("| $0.0021 of $0.0018"),
            "{model}: {}",
            run.stderr
        );
    }
}

/// The pinned agent CLIs (tests/agent-clis/package.json) and the models they call by default
/// (found by running each offline: /work/shared/docs/offline-clis.md). A new pin must say its
/// models here.
const PINNED_DEFAULT_MODELS: &[(&str, &str, &[&str])] = &[
    (
        "@anthropic-ai/claude-code",
        "2.1.197",
        &["claude-opus-4-8", "claude-opus-4-8[1m]"],
    ),
    ("@openai/codex", "0.169.0", &["gpt-5.5"]),
    // `auto` resolves to the flash model; the router's side calls go to the lite one.
    (
        "@google/gemini-cli",
        "0.61.0",
        &["gemini-3.8-flash", "gemini-3.5-flash-lite"],
    ),
];

#[test]
fn every_default_model_of_the_pinned_clis_is_priced() {
    let package: Value = serde_json::from_str(
        &std::fs::read_to_string(crate::harness::workspace().join("tests/agent-clis/package.json"))
            .unwrap(),
    )
    .unwrap();
    let deps = package["dependencies"].as_object().unwrap();
    let sb = Sandbox::new();
    for (cli, version, models) in PINNED_DEFAULT_MODELS {
        assert_eq!(
            deps[*cli], *version,
            "{cli} is pinned at another version: find its default models and update this list"
        );
        let mut args = vec!["prices", "--json"];
        args.extend(models.iter());
        let run = sb.run(&args);
        assert_eq!(run.code, Some(0), "{cli}: {}", run.stderr);
        let v: Value = run.json();
        let quotes = v["models"].as_array().unwrap();
        assert_eq!(quotes.len(), models.len(), "{v}");
        for (q, model) in quotes.iter().zip(models.iter()) {
            assert_eq!(q["query"], *model, "{v}");
            assert_eq!(q["priced"], true, "{cli}: {model}: {v}");
            assert!(q["input_per_mtok"].as_f64().unwrap() > 0.0, "{v}");
            assert!(q["output_per_mtok"].as_f64().unwrap() > 0.0, "{v}");
        }
    }
    // OpenCode has no model of its own: it calls what its config names.
    assert!(deps.contains_key("opencode-ai"));
    assert_eq!(deps.len(), PINNED_DEFAULT_MODELS.len() + 1);
}

#[test]
fn prices_says_where_the_prices_come_from_and_how_old_they_are() {
    let sb = Sandbox::new();
    let run = sb.run(&["prices"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout
            .starts_with("# prices: genai-prices (https://github.com/pydantic/genai-prices, MIT) ")
            && run.stdout.contains("\n# taken: 2026-10-26\n"),
        "{}",
        run.stdout
    );
    // What it prints after the comments is a prices file that works as it is.
    let template = sb.write("template.toml", &run.stdout);
    let template = template.to_str().unwrap();
    let mine = sb.run(&[
        "prices",
        "--prices",
        template,
        "my-model",
        "my-model-latest",
    ]);
    assert_eq!(mine.code, Some(0), "{}", mine.stderr);
    assert!(
        mine.stdout
            .contains("my-model: my-model, $2/Mtok in, $8/Mtok out"),
        "{}",
        mine.stdout
    );
    let v: Value = sb.run(&["prices", "--json"]).json();
    assert_eq!(v["taken"], "2026-10-26", "{}", &v["source"]);
    assert_eq!(v["genai_prices_version"], "0.2.1");
    let models = v["models"].as_array().unwrap();
    assert!(models.len() > 500, "{}", models.len());
    let opus = models
        .iter()
        .find(|m| m["provider"] == "anthropic" && m["model"] == "claude-opus-4-8")
        .unwrap();
    assert_eq!(
        (
            opus["input_per_mtok"].as_f64(),
            opus["output_per_mtok"].as_f64()
        ),
        (Some(5.0), Some(25.0))
    );
}

#[test]
fn prices_files_in_toml_or_genai_prices_json_and_their_errors() {
    let sb = Sandbox::new();
    // TOML without `taken`, with a cache-write price.
    let toml = sb.write(
        "mine.toml",
        "[models.\"gpt-5.5\"]\ninput_per_mtok = 1\noutput_per_mtok = 2\ncache_write_per_mtok = 1.5\n",
    );
    let toml = toml.to_str().unwrap();
    let run = sb.run(&["prices", "--prices", toml, "gpt-5.5", "gemini-3.8-flash"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains(
            "gpt-5.5: gpt-5.5, $1/Mtok in, $2/Mtok out, $1/Mtok cache read, $1.5/Mtok cache write"
        ) && run
            .stdout
            .contains("gemini-3.8-flash: google/gemini-3.8-flash, $0.75/Mtok in"),
        "{}",
        run.stdout
    );
    // genai-prices' own data replaces the bundled snapshot.
    let json = sb.write(
        "data.json",
        r#"[{"id":"acme","name":"Acme","api_pattern":"https://api\\.acme\\.test","model_match":{"starts_with":"acme-"},"models":[{"id":"acme-1","match":{"starts_with":"acme-1"},"prices":{"input_mtok":1,"output_mtok":2}}]}]"#,
    );
    let json = json.to_str().unwrap();
    let run = sb.run(&["prices", "--prices", json, "acme-1"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout
            .contains("acme-1: acme/acme-1, $1/Mtok in, $2/Mtok out"),
        "{}",
        run.stdout
    );
    let run = sb.run(&["prices", "--prices", json]);
    assert!(run.stdout.contains("# taken: unknown"), "{}", run.stdout);
    // An unpriced model is an error naming the fix.
    let run = sb.run(&["prices", "--prices", json, "gpt-5.5"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("no price for `gpt-5.5`") && run.stderr.contains("--prices FILE"),
        "{}",
        run.stderr
    );
    // A JSON file that is not genai-prices' data says what to give instead.
    let bad = sb.write("bad.json", r#"{"models": {}}"#);
    let run = sb.run(&["prices", "--prices", bad.to_str().unwrap()]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("bad.json: not genai-prices' provider data")
            && run.stderr.contains("TOML prices file"),
        "{}",
        run.stderr
    );
    // A run refuses it before the start too.
    let run = sb.run(&[
        "run",
        "-p",
        "codex",
        "--max-cost-usd",
        "1",
        "--prices",
        bad.to_str().unwrap(),
        "--",
        "codex",
        "exec",
        "--json",
        "-m",
        "gpt-5.5",
        "go",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--prices: "), "{}", run.stderr);
}

/// `--wrap-up --max-cost-usd` on a CLI in its default model: the gateway prices every call
/// (main and side calls) with the bundled data; the run ends by itself within the budget.
fn default_model_is_priced_through_the_gateway(cli: Cli, models: &[&str]) {
    let agent = Agent::start(cli, Script::tool_rounds(3));
    let run = agent.run(&["--wrap-up", "--max-cost-usd", "1", "--max-steps", "50"]);
    run.assert_exit(0);
    let rec = agent.last_record();
    assert_eq!(rec["outcome"], "success", "{rec}");
    // The model is in the body (Anthropic) or the path (Gemini: /v1beta/models/MODEL:…).
    let seen: Vec<String> = agent
        .server
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| match r.body["model"].as_str() {
            Some(m) => m.to_owned(),
            None => r
                .target
                .split("/models/")
                .nth(1)
                .and_then(|rest| rest.split(':').next())
                .unwrap_or_default()
                .to_owned(),
        })
        .collect();
    assert!(!seen.is_empty(), "no model call");
    assert!(
        seen.iter().all(|m| models.contains(&m.as_str())),
        "the CLI called {seen:?}, expected only {models:?}"
    );
    let cost = rec["cost_usd"].as_f64().unwrap_or_else(|| panic!("{rec}"));
    assert!(cost > 0.0 && cost < 0.1, "{rec}");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn claudes_default_model_is_priced_through_the_gateway() {
    default_model_is_priced_through_the_gateway(
        Cli::Claude,
        &["claude-opus-4-8", "claude-opus-4-8[1m]"],
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn geminis_default_models_are_priced_through_the_gateway() {
    default_model_is_priced_through_the_gateway(
        Cli::Gemini,
        &["gemini-3.8-flash", "gemini-3.5-flash-lite"],
    );
}
