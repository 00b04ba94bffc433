//! `stepguard resume ID`: a recorded run's session, resumed with the agent CLI's own resume.
//!
//! Everything is checked before anything starts: the run exists and has ended, its provider
//! declares how its CLI resumes a session (protocol 1.8), its stream named a session, its
//! directory is still there. The resumed command comes from the provider's
//! [`ResumeTemplate`](stepguard_plugin_api::ResumeTemplate) and the run's recorded command (the
//! native limits stepguard added taken out first; the plan adds the new budget's), and is run
//! as `stepguard run` would, in the run's directory, with its provider, unit, task type,
//! profile, token and cost budgets and pools, under the new step budget, its record linked to
//! the run it resumes (`resumed_from`).

use std::path::PathBuf;

use clap::Parser as _;
use stepguard_core::{ExitCode, Outcome, RunRecord};
use stepguard_plugin_api::{Manifest, NativeLimit};

use crate::args::{Cli, Command, ResumeArgs};
use crate::commands::history::{chain, stored_run};
use crate::exit::UsageError;
use crate::output;
use crate::session::Session;

/// Runs `stepguard resume`.
pub(crate) fn run(cli: &Cli, args: &ResumeArgs) -> anyhow::Result<ExitCode> {
    let (store, record) = stored_run(cli, args.id)?;
    let chain = chain(&store, record)?;
    drop(store);
    let session = Session::load(cli)?;
    let last = chain.last().expect("a chain holds the run itself");
    let manifest = session
        .registry_for(&last.source.provider)
        .get(&last.source.provider)?
        .provider
        .manifest()
        .clone();
    let resumed = Resumed::plan(args, &chain, &manifest)?;
    if args.dry_run {
        output::line(format!("cd {}", resumed.cwd.display()))?;
        for arg in &resumed.run_argv {
            output::line(arg)?;
        }
        return Ok(ExitCode::Success);
    }
    std::env::set_current_dir(&resumed.cwd).map_err(|e| {
        UsageError(format!(
            "cannot enter run {}'s directory {}: {e}",
            args.id,
            resumed.cwd.display()
        ))
    })?;
    let parsed = Cli::try_parse_from(&resumed.run_argv)
        .map_err(|e| UsageError(format!("the resumed run's arguments do not parse: {e}")))?;
    let Command::Run(mut run_args) = parsed.command else {
        unreachable!("the resumed command line is a `run`")
    };
    run_args.resumed_from = Some(args.id);
    output::note(format!(
        "resuming run {} (session {}) in {}",
        args.id,
        resumed.session,
        resumed.cwd.display()
    ));
    crate::commands::run::run(cli, &run_args)
}

/// What a resume runs: where, and the `stepguard run` arguments.
#[derive(Debug)]
struct Resumed {
    /// The run's directory.
    cwd: PathBuf,
    /// The session resumed.
    session: String,
    /// `stepguard run …` as it would be typed, the program's name first.
    run_argv: Vec<String>,
}

impl Resumed {
    /// Checks that the last run of `chain` can be resumed and builds the run that resumes it.
    fn plan(args: &ResumeArgs, chain: &[RunRecord], manifest: &Manifest) -> anyhow::Result<Self> {
        let last = chain.last().expect("a chain holds the run itself");
        let id = args.id;
        let provider = &last.source.provider;
        let Some(template) = &manifest.resume else {
            return Err(UsageError(format!(
                "provider `{provider}` cannot resume a session: its plugin declares no resume \
                 template (manifest `resume`, plugin protocol 1.8); start a new run with \
                 `stepguard run`"
            ))
            .into());
        };
        if matches!(last.verdict.outcome, Outcome::Running) {
            return Err(UsageError(format!(
                "run {id} is still running (or its stepguard died without a word; `stepguard \
                 history` marks such runs when it finds them): resume it once it has ended"
            ))
            .into());
        }
        let Some(session) = last.chain.session_id.clone() else {
            return Err(UsageError(format!(
                "run {id} has no session id to resume: its stream named none, or it was \
                 recorded before stepguard kept them; start a new run with `stepguard run`"
            ))
            .into());
        };
        if last.verdict.outcome == Outcome::Success && args.prompt.is_none() {
            return Err(UsageError(format!(
                "run {id} succeeded: give `--prompt TEXT` to continue its session with a new \
                 instruction"
            ))
            .into());
        }
        let (Some(command), Some(cwd)) = (&last.invocation.command, &last.invocation.cwd) else {
            return Err(UsageError(format!(
                "run {id} has no recorded command or directory: it never started"
            ))
            .into());
        };
        let cwd = PathBuf::from(cwd);
        if !cwd.is_dir() {
            return Err(UsageError(format!(
                "run {id}'s directory {} is gone: nothing to resume in",
                cwd.display()
            ))
            .into());
        }
        let prompt = args.prompt.clone().unwrap_or_else(|| default_prompt(last));
        let original = without_native_limits(manifest, command);
        let resumed = template
            .command(&original, &session, &prompt)
            .map_err(|e| UsageError(format!("cannot resume run {id}: {e}")))?;
        let max_steps = step_budget(args, chain)?;
        let run_argv = run_argv(args, last, max_steps, resumed);
        Ok(Resumed {
            cwd,
            session,
            run_argv,
        })
    }
}

/// What the agent is told when `--prompt` is not given.
fn default_prompt(last: &RunRecord) -> String {
    let why = last
        .verdict
        .error_type
        .as_ref()
        .map_or_else(|| "it ended".to_owned(), |s| format!("`{}`", s.as_str()));
    format!(
        "You were stopped before the task was finished ({why}): your budget was reached. \
         Continue the same task from where you stopped, finish what is left, then say briefly \
         what you did."
    )
}

/// The chain's steps so far.
fn chain_steps(chain: &[RunRecord]) -> u64 {
    chain
        .iter()
        .map(|r| r.counts.num_steps_computed.unwrap_or(0))
        .sum()
}

/// The resumed run's step budget: `--more-steps N`; what `--max-steps N` leaves of the chain's
/// steps; else the resumed run's own budget again (`None`: it had none, the usual ladder
/// decides).
fn step_budget(args: &ResumeArgs, chain: &[RunRecord]) -> anyhow::Result<Option<u32>> {
    if let Some(more) = args.more_steps {
        return Ok(Some(more));
    }
    let Some(total) = args.max_steps else {
        return Ok(chain.last().and_then(|r| r.step_budget.max_steps));
    };
    let used = chain_steps(chain);
    let left = u64::from(total).saturating_sub(used);
    if left == 0 {
        return Err(UsageError(format!(
            "the chain of run {} has used {used} steps, all of --max-steps {total}: raise \
             --max-steps, or give --more-steps N",
            args.id
        ))
        .into());
    }
    Ok(Some(u32::try_from(left).unwrap_or(u32::MAX)))
}

/// Returns `command` without the arguments of the manifest's native limits (which the plan
/// adds again for the new budget): each limit's arguments where they appear in a row, a
/// placeholder (`{max_steps}`) matching any value.
fn without_native_limits(manifest: &Manifest, command: &[String]) -> Vec<String> {
    let limits = [
        &manifest.native_limit,
        &manifest.native_token_limit,
        &manifest.native_cost_limit,
    ];
    let mut out = command.to_vec();
    for limit in limits.into_iter().flatten() {
        remove_limit(limit, &mut out);
    }
    out
}

/// Removes the first run of `limit`'s arguments from `command`.
fn remove_limit(limit: &NativeLimit, command: &mut Vec<String>) {
    let pattern = &limit.args;
    if pattern.is_empty() || pattern.len() > command.len() {
        return;
    }
    let matches = |arg: &str, want: &str| match (want.find('{'), want.rfind('}')) {
        (Some(open), Some(close)) if open < close => {
            arg.len() >= want.len() - (close - open + 1)
                && arg.starts_with(&want[..open])
                && arg.ends_with(&want[close + 1..])
        }
        _ => arg == want,
    };
    let found = (0..=command.len() - pattern.len()).find(|&at| {
        pattern
            .iter()
            .zip(&command[at..])
            .all(|(want, arg)| matches(arg, want))
    });
    if let Some(at) = found {
        command.drain(at..at + pattern.len());
    }
}

/// `stepguard run …` for the resumed command: the run's provider, unit, task type, profile,
/// token and cost budgets (unless a pool's share set them: the pools decide again) and pools,
/// the new step budget, and `resume`'s own flags.
fn run_argv(
    args: &ResumeArgs,
    last: &RunRecord,
    max_steps: Option<u32>,
    command: Vec<String>,
) -> Vec<String> {
    let mut argv: Vec<String> = vec!["stepguard".into(), "run".into()];
    let mut flag = |name: &str, value: String| argv.extend([name.to_owned(), value]);
    flag("--provider", last.source.provider.clone());
    if let Some(n) = max_steps {
        flag("--max-steps", n.to_string());
    }
    if let Some(unit) = &last.source.unit {
        flag("--unit", unit.clone());
    }
    if let Some(t) = &last.source.task_type {
        flag("--task-type", t.clone());
    }
    if let Some(p) = &last.source.profile {
        flag("--profile", p.clone());
    }
    let not_pool = |s: &Option<String>| !s.as_deref().is_some_and(|s| s.starts_with("pool "));
    if let Some(t) = last
        .spend
        .max_tokens
        .filter(|_| not_pool(&last.spend.max_tokens_source))
    {
        flag("--max-tokens", t.to_string());
    }
    if let Some(c) = last
        .spend
        .max_cost_usd
        .filter(|_| not_pool(&last.spend.max_cost_usd_source))
    {
        flag("--max-cost-usd", c.to_string());
    }
    for pool in last.spend.pools.iter().flatten() {
        flag("--pool", pool.clone());
    }
    if let Some(t) = args.timeout {
        flag("--timeout", humantime::format_duration(t).to_string());
    }
    if args.quiet {
        argv.push("--quiet".into());
    }
    argv.push("--".into());
    argv.extend(command);
    argv
}

#[cfg(test)]
mod tests {
    use stepguard_plugin_api::ProviderPlugin as _;

    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn native_limits_are_taken_out_whatever_their_value() {
        let claude = stepguard_provider_claude::ClaudePlugin.manifest();
        let command = strings(&[
            "claude",
            "-p",
            "x",
            "--max-turns",
            "7",
            "--verbose",
            "--max-budget-usd",
            "0.5",
        ]);
        assert_eq!(
            without_native_limits(&claude, &command),
            strings(&["claude", "-p", "x", "--verbose"])
        );
        let codex = stepguard_provider_codex::CodexPlugin.manifest();
        let limit = codex.native_token_limit.clone().unwrap();
        let with = limit
            .command_for_tokens(
                &strings(&["codex", "exec", "--json", "-c", "a=b", "go"]),
                900,
            )
            .unwrap();
        assert_eq!(
            without_native_limits(&codex, &with),
            strings(&["codex", "exec", "--json", "-c", "a=b", "go"])
        );
        // A command without them is left as it is.
        assert_eq!(without_native_limits(&codex, &command), command);
    }

    fn record(steps: u64, max: Option<u32>) -> RunRecord {
        let mut r = RunRecord::new("claude", Outcome::Failed);
        r.counts.num_steps_computed = Some(steps);
        r.step_budget.max_steps = max;
        r
    }

    fn args(max: Option<u32>, more: Option<u32>) -> ResumeArgs {
        ResumeArgs {
            id: 9,
            max_steps: max,
            more_steps: more,
            prompt: None,
            timeout: None,
            quiet: false,
            dry_run: false,
        }
    }

    #[test]
    fn the_step_budget_is_more_steps_what_the_chain_has_left_or_the_same_again() {
        let chain = [record(5, Some(5)), record(3, Some(3))];
        assert_eq!(step_budget(&args(None, Some(4)), &chain).unwrap(), Some(4));
        assert_eq!(step_budget(&args(Some(12), None), &chain).unwrap(), Some(4));
        assert_eq!(step_budget(&args(None, None), &chain).unwrap(), Some(3));
        assert_eq!(
            step_budget(&args(None, None), &[record(2, None)]).unwrap(),
            None
        );
        let spent = step_budget(&args(Some(8), None), &chain).unwrap_err();
        assert_eq!(
            spent.to_string(),
            "the chain of run 9 has used 8 steps, all of --max-steps 8: raise --max-steps, or give --more-steps N"
        );
    }

    #[test]
    fn the_run_line_keeps_the_settings_and_leaves_pool_shares_to_the_pools() {
        let mut last = record(5, Some(5));
        last.source.unit = Some("message".into());
        last.spend.max_tokens = Some(9000);
        last.spend.max_tokens_source = Some("--max-tokens".into());
        last.spend.max_cost_usd = Some(0.5);
        last.spend.max_cost_usd_source = Some("pool team".into());
        last.spend.pools = Some(vec!["team".into()]);
        let argv = run_argv(
            &args(None, None),
            &last,
            Some(6),
            strings(&["claude", "-p", "x"]),
        );
        assert_eq!(
            argv.join(" "),
            "stepguard run --provider claude --max-steps 6 --unit message --max-tokens 9000 \
             --pool team -- claude -p x"
        );
    }

    #[test]
    fn what_cannot_be_resumed_is_refused_with_the_reason() {
        let claude = stepguard_provider_claude::ClaudePlugin.manifest();
        let mut run = record(4, Some(3));
        run.invocation.command = Some(strings(&["claude", "-p", "x"]));
        run.invocation.cwd = Some(std::env::temp_dir().display().to_string());
        let refusal = |manifest: &Manifest, r: &RunRecord, a: &ResumeArgs| {
            Resumed::plan(a, std::slice::from_ref(r), manifest)
                .unwrap_err()
                .to_string()
        };
        let plain = Manifest::new("claude", "1");
        assert!(refusal(&plain, &run, &args(None, None)).contains("cannot resume a session"));
        assert!(
            refusal(&claude, &run, &args(None, None)).contains("run 9 has no session id to resume")
        );
        run.chain.session_id = Some("s-1".into());
        let mut running = run.clone();
        running.verdict.outcome = Outcome::Running;
        assert!(refusal(&claude, &running, &args(None, None)).contains("is still running"));
        let mut ok = run.clone();
        ok.verdict.outcome = Outcome::Success;
        assert!(
            refusal(&claude, &ok, &args(None, None)).contains("succeeded: give `--prompt TEXT`")
        );
        let mut gone = run.clone();
        gone.invocation.cwd = Some("/nonexistent/stepguard-resume".into());
        assert!(refusal(&claude, &gone, &args(None, None)).contains("is gone"));
        let mut dashed = args(None, None);
        dashed.prompt = Some("--yolo".into());
        assert!(refusal(&claude, &run, &dashed).contains("starts with `-`"));
        // And what can be: the plan's command resumes the session.
        let planned = Resumed::plan(&args(None, Some(2)), &[run], &claude).unwrap();
        let tail = planned.run_argv.join(" ");
        assert!(tail.ends_with("--resume s-1"), "{tail}");
        assert!(tail.contains("--max-steps 2 "), "{tail}");
    }
}
