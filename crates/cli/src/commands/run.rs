//! `stepguard run`: arguments → a [`RunPlan`] → a run spec for [`stepguard_runner`], observers
//! registered, the report → the summary line and the exit code. Everything decided before the
//! agent starts lives in the plan ([`crate::plan`]); the engine (threads, signals, the process
//! tree) lives in the runner crate.

use std::io::{self, IsTerminal as _};
use std::time::{Duration, Instant};

use stepguard_core::{ExitCode, Outcome, RunRecord};
use stepguard_runner::{
    Io, LimitPolicy, Limits, RunObserver, RunReport, RunSpec, Runner, StopAtLimit,
};
use stepguard_store::{NewRun, Store};
use stepguard_telemetry::TelemetryObserver;

use crate::args::{Cli, RunArgs};
use crate::checkpointing::Checkpointer;
use crate::plan::RunPlan;
use crate::pools::{Membership, PoolRefused};
use crate::recording::{HistoryRecorder, SummaryFile};
use crate::session::Session;
use crate::terminal::{AskOnTerminal, StatusLine};
use crate::{output, settings};

/// However late in the run's exit bound, the summary line gets this long to reach the
/// terminal; a terminal paused with Ctrl-S does not hold stepguard's exit longer.
const SUMMARY_WAIT: Duration = Duration::from_millis(100);

/// Runs `stepguard run`.
pub(crate) fn run(cli: &Cli, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let session = Session::load(cli)?;
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut plan = match RunPlan::new(args, &session, &cwd, &mut |w| output::diag("warning", w)) {
        Ok(plan) => plan,
        Err(e) => match e.downcast::<PoolRefused>() {
            Ok(refused) => return refuse(args, &session, &cwd, &refused),
            Err(e) => return Err(e),
        },
    };
    plan.log();
    let pools = plan.pools.take();
    let renewer = pools.as_ref().map(Membership::renew);
    // With the gateway, every main model call reserves in the pools and settles.
    if let (Some(w), Some(p)) = (plan.wrap_up.as_mut(), pools.as_ref()) {
        w.shared_budget = Some(p.shared_budget());
    }
    let mut status = StatusLine::new(
        plan.observers.status_line,
        &plan.manifest().name,
        plan.unit(),
    );
    let (history, summary_file, repository) = (
        plan.observers.history.clone(),
        plan.observers.summary_file.clone(),
        plan.repository.clone(),
    );
    let mut spec = spec(plan, &status);
    let mut recorder = HistoryRecorder::new(history, repository);
    let mut summary = SummaryFile(summary_file);
    let mut checkpointer = crate::checkpointing::settings(args, &session.config)
        .map(|s| Checkpointer::new(cwd.clone(), s, recorder.row_id()));
    // OpenTelemetry, when asked for: the run's span is known before the agent starts, so the
    // agent's own traces nest under it (TRACEPARENT). It exports once, at the end, bounded.
    let mut telemetry = settings::telemetry(&session.config.model).map(TelemetryObserver::new);
    if let Some(t) = &telemetry {
        let env = t.child_env().into_iter().map(|(k, v)| (k.into(), v.into()));
        spec.io.env.extend(env);
    }
    let mut observers: Vec<&mut dyn RunObserver> = vec![&mut status];
    // Before the history: the record names the checkpoint's ref.
    if let Some(c) = checkpointer.as_mut() {
        observers.push(c);
    }
    observers.extend([&mut recorder as &mut dyn RunObserver, &mut summary]);
    // Last: it sees the record's history id, after the summary file is written.
    if let Some(t) = telemetry.as_mut() {
        observers.push(t);
    }
    // From here on stderr is written by a thread of its own: the engine never waits for it.
    let stderr = output::queue_stderr();
    let runner = Runner::new(spec);
    // The stream's spend charged live, and the pools watched for other runs spending them.
    let (keeper, mut live) = pools
        .as_ref()
        .map(|p| p.live(runner.outside_limits()))
        .unzip();
    if let Some(live) = live.as_mut() {
        observers.push(live);
    }
    let report = runner.run(&mut observers);
    drop(observers);
    if let (Some(pools), Some(renewer), Some(keeper)) = (pools, renewer, keeper) {
        pools.finish(&report.record, renewer, keeper, report.exit_by);
    }
    let code = report_outcome(&report);
    if let Some(queue) = stderr {
        queue.settle(report.exit_by.max(Instant::now() + SUMMARY_WAIT));
    }
    Ok(code)
}

/// A run a pool refused at the start: recorded (unless `--no-record`) as failed with the slug
/// (`pool_exhausted`, `pool_busy`) and the message, which is printed; exit 3. The agent never
/// started.
fn refuse(
    args: &RunArgs,
    session: &Session<'_>,
    cwd: &std::path::Path,
    refused: &PoolRefused,
) -> anyhow::Result<ExitCode> {
    output::diag("error", format!("{}: {}", refused.slug, refused.message));
    let code = ExitCode::BudgetExceeded;
    if args.no_record {
        return Ok(code);
    }
    let mut record = RunRecord::new(args.provider.clone(), Outcome::Failed);
    record.verdict.error_type = Some(refused.slug.into());
    record.verdict.message = Some(refused.message.clone());
    record.verdict.exit_code = Some(i32::from(code.code()));
    record.chain.resumed_from = args.resumed_from;
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    record.invocation.ended_at = Some(now.clone());
    let run = NewRun {
        provider: args.provider.clone(),
        task_type: args.budget.task_type.clone(),
        profile: args.budget.profile.clone(),
        command: args.command.clone(),
        cwd: Some(cwd.display().to_string()),
        repository: crate::repository::of(cwd),
        started_at: Some(now),
        ..NewRun::default()
    };
    let recorded = Store::open(&session.history_db(cwd)?).and_then(|store| {
        let id = store.begin_run(&run)?;
        store.finish_run(id, &record)
    });
    if let Err(e) = recorded {
        output::diag("warning", format!("not recording this run: {e}"));
    }
    Ok(code)
}

/// Turns the plan into the runner's spec: the terminal's policy at the limit, the status line
/// as the agent's output and stderr, and stepguard's own binary as the trampoline.
fn spec(plan: RunPlan<'_>, status: &StatusLine) -> RunSpec {
    let on_limit = limit_policy(&plan, status);
    let mut confinement = plan.confinement;
    confinement.trampoline = trampoline();
    RunSpec::builder(plan.command, plan.counter)
        .budget(plan.limits.budget.max_steps, plan.limits.budget.source)
        .meta(plan.meta)
        .limits(Limits {
            on_limit,
            loops: plan.loops,
            spend: plan.spend,
        })
        .clocks(plan.clocks)
        .confinement(confinement)
        .recognition(plan.recognition)
        .io(Io {
            stdin: plan.stdin,
            output: status.passthrough(),
            stderr: status.agent_stderr(),
            // What stepguard moved out of its own image goes to the agent (the gateway then
            // replaces its keys and base URLs), but for stepguard's own (the ledger's URL).
            env: crate::reexec::for_agent(),
        })
        .wrap_up(plan.wrap_up)
        .build()
}

/// What happens at the limit: ask on the terminal when the plan says so and there is a
/// terminal to ask on (else `ask` behaves like `stop`), or stop.
fn limit_policy(plan: &RunPlan<'_>, status: &StatusLine) -> Box<dyn LimitPolicy> {
    if plan.ask_at_limit && io::stdin().is_terminal() && io::stderr().is_terminal() {
        let provider = &plan.manifest().name;
        Box::new(AskOnTerminal::new(provider, status.clone(), plan.ceiling))
    } else {
        Box::new(StopAtLimit)
    }
}

/// stepguard's own binary: the agent's trampoline and the run's guardian.
fn trampoline() -> Option<std::path::PathBuf> {
    std::env::current_exe()
        .inspect_err(|e| {
            output::diag(
                "warning",
                format!(
                    "cannot find stepguard's own binary ({e}): the agent will not die with stepguard and no guardian watches the run"
                ),
            );
        })
        .ok()
}

/// Says how the run ended (why stepguard ended it, then the summary line) and returns its
/// exit code.
fn report_outcome(report: &RunReport) -> ExitCode {
    let failed_itself = report.spawn_error.is_some()
        || matches!(
            report.terminated_by,
            Some(
                stepguard_core::verdict::TerminatedBy::Plugin
                    | stepguard_core::verdict::TerminatedBy::Bypassed
            )
        )
        || report.stats.slug == Some(stepguard_core::FailureSlug::UnrecognizedStream);
    let message = report.record.verdict.message.as_ref();
    if let Some(message) = message.filter(|_| failed_itself) {
        output::diag("error", message);
    } else if let Some(message) = message
        && (!report.decisions.is_empty() || report.terminated_by.is_some())
    {
        // Why stepguard ended it: no answer at the prompt, a loop, a stall …
        output::note(message);
    }
    let loops = report
        .record
        .supervision
        .loops
        .as_deref()
        .unwrap_or_default();
    let brief = super::history::loops_brief(loops);
    output::note(format!("{}{brief}", report.summary_line()));
    match crate::checkpointing::told(&report.record) {
        Some(Ok(how)) => output::note(how),
        Some(Err(why)) => output::diag("warning", why),
        None => {}
    }
    report.exit_code
}
