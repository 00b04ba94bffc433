//! Plans made from flags alone: no config file, no environment set by the tests.

use std::path::Path;

use clap::Parser as _;
use stepguard_core::StepLimit;
use stepguard_runner::{Containment, OnUnrecognized, StdinMode};

use super::RunPlan;
use crate::args::{Cli, Command, RunArgs};
use crate::session::Session;

fn cli(argv: &[&str]) -> Cli {
    let mut full = vec!["stepguard", "run"];
    full.extend_from_slice(argv);
    Cli::try_parse_from(full).expect("the arguments parse")
}

fn args(cli: &Cli) -> &RunArgs {
    match &cli.command {
        Command::Run(args) => args,
        other => panic!("not a run: {other:?}"),
    }
}

/// The plan of `stepguard run ARGV` over no config file, and the warnings it gave.
fn plan_of<'s>(session: &'s Session<'_>, cli: &Cli) -> (anyhow::Result<RunPlan<'s>>, Vec<String>) {
    let mut warnings = Vec::new();
    let plan = RunPlan::new(args(cli), session, Path::new("/work/here"), &mut |w| {
        warnings.push(w.to_owned())
    });
    (plan, warnings)
}

#[test]
fn flags_become_the_limits_clocks_and_labels_of_the_plan() {
    let cli = cli(&[
        "-p",
        "codex",
        "--max-steps",
        "7",
        "--timeout",
        "30s",
        "--idle-timeout",
        "5s",
        "--grace",
        "2s",
        "--stdin",
        "null",
        "--containment",
        "process-walk",
        "--unrecognized",
        "warn",
        "--task-type",
        "bugfix",
        "--quiet",
        "--no-record",
        "--",
        "codex",
        "exec",
        "--json",
        "hi",
    ]);
    let session = Session::with_config(&cli, Default::default());
    let (plan, warnings) = plan_of(&session, &cli);
    let plan = plan.expect("a plan");
    // The warnings come through the sink, as they are found.
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("unknown task type `bugfix`"),
        "{warnings:?}"
    );
    assert_eq!(plan.limits.budget.max_steps, StepLimit::Limited(7));
    assert_eq!(plan.limits.budget.source, "--max-steps");
    assert_eq!(plan.command, ["codex", "exec", "--json", "hi"]);
    assert_eq!(plan.unit(), "item");
    assert_eq!(plan.meta.provider, "codex");
    assert_eq!(plan.meta.task_type.as_deref(), Some("bugfix"));
    assert_eq!(plan.meta.cwd.as_deref(), Some("/work/here"));
    let secs = std::time::Duration::from_secs;
    assert_eq!(plan.clocks.timeout, Some(secs(30)));
    assert_eq!(plan.clocks.idle, Some(secs(5)));
    assert_eq!(plan.clocks.grace, secs(2));
    assert_eq!(plan.clocks.startup, Some(secs(600)));
    assert_eq!(plan.clocks.ask, Some(secs(300)));
    assert_eq!(plan.stdin, StdinMode::Null);
    assert_eq!(plan.confinement.containment, Containment::ProcessWalk);
    assert!(plan.confinement.forward_signals);
    assert_eq!(plan.recognition.on_unrecognized, OnUnrecognized::Warn);
    assert!(plan.recognition.expects.contains("codex exec --json"));
    assert!(!plan.observers.status_line && plan.observers.history.is_none());
    assert!(plan.wrap_up.is_none() && !plan.ask_at_limit);
    // Codex reports tool calls: the default loop limit applies.
    assert!(plan.loops.is_some());
}

#[test]
fn the_providers_native_limits_are_added_to_the_command() {
    let cli = cli(&[
        "-p",
        "codex",
        "--max-tokens",
        "5000",
        "--",
        "codex",
        "exec",
        "--json",
        "hi",
    ]);
    let session = Session::with_config(&cli, Default::default());
    let plan = plan_of(&session, &cli).0.expect("a plan");
    assert_eq!(plan.spend.max_tokens, Some(5000));
    assert_eq!(
        plan.spend.max_tokens_source.as_deref(),
        Some("--max-tokens")
    );
    assert!(plan.spend.stream_usage);
    assert!(
        plan.command.iter().any(|a| a.contains("limit_tokens=5000")),
        "{:?}",
        plan.command
    );
    let cli = cli_with_no_native(&["--max-tokens", "5000"]);
    let session = Session::with_config(&cli, Default::default());
    let plan = plan_of(&session, &cli).0.expect("a plan");
    assert_eq!(plan.command, ["codex", "exec", "--json", "hi"]);
}

fn cli_with_no_native(extra: &[&str]) -> Cli {
    let mut argv = vec!["-p", "codex", "--no-native-limit"];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&["--", "codex", "exec", "--json", "hi"]);
    cli(&argv)
}

#[test]
fn a_cost_budget_is_priced_by_the_model_the_command_names() {
    let cli = cli(&[
        "-p",
        "codex",
        "--max-cost-usd",
        "2",
        "--",
        "codex",
        "exec",
        "--json",
        "-m",
        "gpt-5",
        "hi",
    ]);
    let session = Session::with_config(&cli, Default::default());
    let plan = plan_of(&session, &cli).0.expect("a plan");
    assert_eq!(plan.spend.max_cost_usd, Some(2.0));
    assert_eq!(plan.spend.model.as_deref(), Some("gpt-5"));
    assert!(plan.spend.price.is_some());
}

#[test]
fn what_cannot_be_kept_is_refused_before_anything_starts() {
    for (argv, says) in [
        (
            &[
                "-p",
                "codex",
                "--max-cost-usd",
                "2",
                "--",
                "codex",
                "exec",
                "--json",
                "hi",
            ][..],
            "names none",
        ),
        (
            &[
                "-p",
                "codex",
                "--notices",
                "0.5,0.8",
                "--",
                "codex",
                "exec",
                "--json",
                "hi",
            ][..],
            "need the model gateway",
        ),
        (
            &["-p", "codex", "--", "codex", "hi"][..],
            "cannot be counted",
        ),
        (
            &[
                "-p",
                "codex",
                "--max-steps",
                "abc",
                "--",
                "codex",
                "exec",
                "--json",
                "hi",
            ][..],
            "abc",
        ),
    ] {
        let cli = cli(argv);
        let session = Session::with_config(&cli, Default::default());
        let err = plan_of(&session, &cli).0.err().expect("refused");
        assert!(err.to_string().contains(says), "{argv:?}: {err}");
    }
}

#[test]
fn ask_at_the_limit_is_planned_only_without_the_gateway() {
    let cli = cli(&[
        "-p",
        "codex",
        "--on-limit",
        "ask",
        "--",
        "codex",
        "exec",
        "--json",
        "hi",
    ]);
    let session = Session::with_config(&cli, Default::default());
    assert!(plan_of(&session, &cli).0.expect("a plan").ask_at_limit);
    let cli = cli_with_no_native(&["--on-limit", "ask", "--wrap-up"]);
    let session = Session::with_config(&cli, Default::default());
    let err = plan_of(&session, &cli).0.err().expect("refused");
    assert!(err.to_string().contains("do not go together"), "{err}");
}

#[test]
fn the_model_is_read_from_every_spelling_of_the_flag() {
    let model = |argv: &[&str]| {
        let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
        super::command::command_model(&argv)
    };
    assert_eq!(model(&["c", "--model", "a"]).as_deref(), Some("a"));
    assert_eq!(model(&["c", "-m", "b"]).as_deref(), Some("b"));
    assert_eq!(model(&["c", "--model=d"]).as_deref(), Some("d"));
    assert_eq!(model(&["c", "-c", "model=\"e\""]).as_deref(), Some("e"));
    assert_eq!(model(&["c", "--model="]), None);
    assert_eq!(model(&["c", "hi"]), None);
}
