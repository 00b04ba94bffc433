//! `stepguard run`: arguments → a run spec for [`stepguard_runner`], observers registered,
//! the report → the summary line and the exit code. The engine (threads, signals, the process
//! tree) lives in the runner crate.

use std::io::{self, IsTerminal as _};

use stepguard_config::LoadedConfig;
use stepguard_core::ExitCode;
use stepguard_runner::{
    Containment, LimitPolicy, OnUnrecognized, RunMeta, RunObserver, RunReport, RunSpec, Runner,
    SpendLimits, StopAtLimit, WrapUp,
};

use crate::args::{Cli, ContainmentArg, OnLimit, RunArgs, StdinMode, Unrecognized};
use crate::exit::UsageError;
use crate::recording::{HistoryRecorder, SummaryFile};
use crate::session::Session;
use crate::settings::Limits;
use crate::terminal::{AskOnTerminal, StatusLine};
use crate::{output, providers, settings};
use stepguard_telemetry::TelemetryObserver;

/// Runs `stepguard run`.
pub fn run(cli: &Cli, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let session = Session::load(cli)?;
    let config = &session.config;
    for d in config.diagnostics() {
        output::diag("warning", d.to_string().trim_start_matches("warning: "));
    }
    let limits = session.limits(&args.budget, args.loops.loop_limit.as_deref())?;
    for w in limits
        .budget
        .warnings
        .iter()
        .chain(&limits.loops.warnings)
        .chain(&limits.spend.warnings)
    {
        output::diag("warning", w);
    }
    let selection = providers::select(
        session.registry(),
        &args.provider,
        args.unit.as_deref(),
        Some(config),
    )?;
    let manifest = selection.provider.manifest();
    preflight(args, manifest)?;
    let counter = selection.provider.open_counter(&selection.request)?;
    warn_without_tool_calls(manifest, &limits);
    let unit = &selection.request.unit;
    let agent = agent_command(args, config, manifest, unit, &limits)?;
    tracing::info!(
        max_steps = %limits.budget.max_steps,
        source = %limits.budget.source,
        provider = %manifest.name,
        unit = %unit,
        "step budget"
    );
    tracing::info!(
        loop_limit = %limits.loops.limit,
        source = %limits.loops.source,
        window = limits.loops.window,
        "loop limit"
    );

    let cwd = std::env::current_dir().unwrap_or_default();
    let mut status = StatusLine::new(!args.quiet, &manifest.name, unit);
    let mut spec = RunSpec::new(agent.command, counter, limits.budget.max_steps);
    spec.budget_source = limits.budget.source.clone();
    spec.meta = RunMeta {
        provider: manifest.name.clone(),
        plugin_version: Some(manifest.version.clone()),
        plugin_source: Some(selection.source.clone()),
        unit: Some(unit.clone()),
        task_type: args.budget.task_type.clone(),
        profile: limits.budget.profile.clone(),
        cwd: Some(cwd.display().to_string()),
    };
    spec.loops = limits.loops.settings.filter(|_| manifest.tool_calls);
    spec.on_limit = limit_policy(args, config, manifest, &status);
    spec.output = status.passthrough();
    spec.stderr = status.agent_stderr();
    spec.expects = manifest.expects.clone();
    spec.wrap_up = agent.wrap_up;
    spec.spend = agent.spend;
    apply_run_options(&mut spec, args, config);
    let report = supervise(&session, args, &cwd, spec, &mut status);
    Ok(report_outcome(&report))
}

/// Refuses a command line the provider's manifest says cannot be counted (its `preflight`
/// rules), unless `--no-preflight`.
fn preflight(args: &RunArgs, manifest: &stepguard_plugin_api::Manifest) -> anyhow::Result<()> {
    if !args.no_preflight
        && let Some(rule) = manifest.preflight_failure(&args.command)
    {
        return Err(UsageError(format!(
            "this {} command cannot be counted: {}. (`--no-preflight` runs it anyway; stepguard then stops it if none of its output is recognised)",
            manifest.name, rule.fix
        ))
        .into());
    }
    Ok(())
}

/// Loop detection needs the plugin's tool calls; says so when someone asked for a limit.
fn warn_without_tool_calls(manifest: &stepguard_plugin_api::Manifest, limits: &Limits) {
    let loops = &limits.loops;
    let asked_for_loops = loops.source != "default" && !loops.source.starts_with("profile ");
    if !manifest.tool_calls && loops.settings.is_some() && asked_for_loops {
        output::diag(
            "warning",
            format!(
                "provider {} does not report tool calls (plugin protocol < 1.3): no loop \
                 detection, the loop limit from {} is ignored",
                manifest.name, loops.source
            ),
        );
    }
}

/// The agent's command with the provider's native limits added, the model gateway and the
/// token and cost budgets, all checked before anything starts.
struct AgentCommand {
    command: Vec<String>,
    wrap_up: Option<WrapUp>,
    spend: SpendLimits,
}

/// Plans the agent's command: the provider's native step limit, the model gateway, the token
/// and cost budgets (refused when nothing can keep them) and the provider's native token and
/// cost budgets, as second lines of defence like its step limit.
fn agent_command(
    args: &RunArgs,
    config: &LoadedConfig,
    manifest: &stepguard_plugin_api::Manifest,
    unit: &str,
    limits: &Limits,
) -> anyhow::Result<AgentCommand> {
    let mut command = args.command.clone();
    if let (Some(native), Some(limit), false) = (
        &manifest.native_limit,
        limits.budget.max_steps.get(),
        args.no_native_limit,
    ) && let Some(extra) = native.args_for(&command, limit)
    {
        tracing::info!(args = ?extra, "adding the provider's native limit");
        command.extend(extra);
    }
    let wrap_up = wrap_up_spec(args, config, manifest, unit, &command)?;
    let mut spend = spend_limits(args, &limits.spend, &command, wrap_up.is_some())?;
    spend.stream_usage = manifest.reports_usage;
    // Without the gateway the stream is the only meter: a plugin that reports no usage cannot
    // keep a token or cost budget, and a budget nobody keeps is worse than none.
    if (spend.max_tokens.is_some() || spend.max_cost_usd.is_some())
        && wrap_up.is_none()
        && !manifest.reports_usage
    {
        return Err(UsageError(format!(
            "provider {} reports no token usage in its stream (plugin protocol < 1.5), so the \
             token or cost budget cannot be kept without the model gateway: add --wrap-up",
            manifest.name
        ))
        .into());
    }
    if !args.no_native_limit {
        if let (Some(native), Some(max)) = (&manifest.native_token_limit, spend.max_tokens)
            && let Some(with) = native.command_for_tokens(&command, max)
        {
            tracing::info!("adding the provider's native token budget");
            command = with;
        }
        if let (Some(native), Some(max)) = (&manifest.native_cost_limit, spend.max_cost_usd)
            && let Some(with) = native.command_for_cost(&command, max)
        {
            tracing::info!("adding the provider's native cost budget");
            command = with;
        }
    }
    Ok(AgentCommand {
        command,
        wrap_up,
        spend,
    })
}

/// What happens at the limit: ask on the terminal (`--on-limit ask`, without the gateway and
/// with a terminal to ask on; else `ask` behaves like `stop`), or stop.
fn limit_policy(
    args: &RunArgs,
    config: &LoadedConfig,
    manifest: &stepguard_plugin_api::Manifest,
    status: &StatusLine,
) -> Box<dyn LimitPolicy> {
    let ask = args.on_limit == OnLimit::Ask
        && !wrap_up_on(args, config)
        && io::stdin().is_terminal()
        && io::stderr().is_terminal();
    if !ask {
        return Box::new(StopAtLimit);
    }
    let ceiling = config
        .model
        .policy
        .max_steps_ceiling
        .as_ref()
        .map(|c| c.max_steps);
    Box::new(AskOnTerminal::new(&manifest.name, status.clone(), ceiling))
}

/// Sets the options of the run that come straight from its flags and the config: grace,
/// timeouts, stdin, the unrecognized-stream policy, signals, containment and the trampoline.
fn apply_run_options(spec: &mut RunSpec, args: &RunArgs, config: &LoadedConfig) {
    spec.grace = args.grace;
    spec.timeout = args.timeout;
    spec.idle_timeout = args.idle_timeout;
    spec.startup_timeout = Some(args.startup_timeout);
    spec.stdin = match args.stdin {
        StdinMode::Inherit => stepguard_runner::StdinMode::Inherit,
        StdinMode::Null => stepguard_runner::StdinMode::Null,
    };
    spec.ask_timeout = Some(args.ask_timeout);
    // The flag beats `[run] unrecognized_stream`; stopping is the default (fail closed).
    let warn = match args.unrecognized {
        Some(what) => what == Unrecognized::Warn,
        None => config
            .model
            .unrecognized_stream
            .as_ref()
            .is_some_and(|(what, _)| what == "warn"),
    };
    spec.on_unrecognized = if warn {
        OnUnrecognized::Warn
    } else {
        OnUnrecognized::Stop
    };
    // SIGINT, SIGTERM and SIGHUP stop the agent's tree (exit 130); stepguard exits right after.
    spec.forward_signals = true;
    spec.containment = match args.containment {
        ContainmentArg::Auto => Containment::Auto,
        ContainmentArg::Cgroup => Containment::Cgroup,
        ContainmentArg::ProcessWalk => Containment::ProcessWalk,
    };
    // stepguard's own binary is the agent's trampoline and the run's guardian.
    spec.trampoline = match std::env::current_exe() {
        Ok(exe) => Some(exe),
        Err(e) => {
            output::diag(
                "warning",
                format!(
                    "cannot find stepguard's own binary ({e}): the agent will not die with stepguard and no guardian watches the run"
                ),
            );
            None
        }
    };
}

/// Runs the spec with its observers: the status line, the history recorder, the summary file
/// and, when asked for, OpenTelemetry.
fn supervise(
    session: &Session<'_>,
    args: &RunArgs,
    cwd: &std::path::Path,
    mut spec: RunSpec,
    status: &mut StatusLine,
) -> RunReport {
    let db = (!args.no_record).then(|| session.history_db(cwd));
    let mut recorder = HistoryRecorder::new(db);
    let mut summary = SummaryFile(args.summary_file.clone());
    // OpenTelemetry, when asked for: the run's span is known before the agent starts, so the
    // agent's own traces nest under it (TRACEPARENT). It exports once, at the end, bounded.
    let mut telemetry = settings::telemetry(&session.config.model).map(TelemetryObserver::new);
    if let Some(t) = &telemetry {
        spec.env
            .extend(t.child_env().into_iter().map(|(k, v)| (k.into(), v.into())));
    }
    let mut observers: Vec<&mut dyn RunObserver> = vec![status, &mut recorder, &mut summary];
    // Last: it sees the record's history id, after the summary file is written.
    if let Some(t) = telemetry.as_mut() {
        observers.push(t);
    }
    Runner::new(spec).run(&mut observers)
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
    if failed_itself && let Some(message) = &report.record.verdict.message {
        output::diag("error", message);
    } else if let Some(message) = &report.record.verdict.message
        && (!report.decisions.is_empty() || report.terminated_by.is_some())
    {
        // Why stepguard ended it: no answer at the prompt, a loop, a stall …
        output::note(message);
    }
    output::note(format!(
        "{}{}",
        report.summary_line(),
        super::history::loops_brief(
            report
                .record
                .supervision
                .loops
                .as_deref()
                .unwrap_or_default()
        )
    ));
    report.exit_code
}

/// Whether the run has a model gateway: `--no-wrap-up`, else `--wrap-up`, else the config.
fn wrap_up_on(args: &RunArgs, config: &LoadedConfig) -> bool {
    if args.no_wrap_up {
        false
    } else if args.wrap_up {
        true
    } else {
        config.model.wrap_up.as_ref().is_some_and(|(on, _)| *on)
    }
}

/// The model gateway of the run, checked before anything starts: the provider must declare
/// how its CLI reaches its model, and the command must say where (a usage error names the fix).
fn wrap_up_spec(
    args: &RunArgs,
    config: &LoadedConfig,
    manifest: &stepguard_plugin_api::Manifest,
    unit: &str,
    command: &[String],
) -> anyhow::Result<Option<WrapUp>> {
    let on = wrap_up_on(args, config);
    if !on {
        if args.notices || args.record_requests.is_some() {
            return Err(UsageError(
                "`--notices` and `--record-requests` need the model gateway: add `--wrap-up`"
                    .into(),
            )
            .into());
        }
        if unit == stepguard_plugin_api::host::REQUEST_UNIT {
            return Err(UsageError(format!(
                "unit `{unit}` counts model calls at the model gateway: add `--wrap-up`"
            ))
            .into());
        }
        return Ok(None);
    }
    let Some(endpoint) = manifest.model_endpoint.clone() else {
        return Err(UsageError(format!(
            "provider {} declares no model endpoint (its plugin speaks protocol < 1.4), so \
             `--wrap-up` cannot point its CLI at a gateway; run without `--wrap-up`",
            manifest.name
        ))
        .into());
    };
    if let Err(e) = endpoint.dialect.parse::<stepguard_gateway::Dialect>() {
        return Err(UsageError(format!("provider {}: {e}", manifest.name)).into());
    }
    if args.on_limit == OnLimit::Ask {
        return Err(UsageError(
            "`--wrap-up` and `--on-limit ask` do not go together: with the gateway the agent \
             wraps up by itself at the limit"
                .into(),
        )
        .into());
    }
    // Where the CLI would have gone must be known now, not after the agent started.
    let cwd = std::env::current_dir().unwrap_or_default();
    let env = |name: &str| std::env::var(name).ok();
    stepguard_gateway::point(&endpoint, command, &env, &cwd, "http://127.0.0.1:1/probe")
        .map_err(|e| UsageError(format!("--wrap-up with provider {}: {e}", manifest.name)))?;
    let reply_cost = manifest
        .units
        .iter()
        .find(|u| u.name == unit)
        .and_then(|u| u.reply_cost)
        .unwrap_or(1);
    Ok(Some(WrapUp {
        endpoint,
        reply_cost,
        notices: args.notices,
        record_requests: args.record_requests.clone(),
    }))
}

/// The run's token and cost budgets, checked before anything starts: a cost budget needs a
/// price for the model, known from the command (or, through the gateway, from each call).
fn spend_limits(
    args: &RunArgs,
    budgets: &stepguard_config::ResolvedSpend,
    command: &[String],
    gateway: bool,
) -> anyhow::Result<SpendLimits> {
    let mut limits = SpendLimits {
        max_tokens: budgets.max_tokens(),
        max_tokens_source: Some(budgets.tokens.source.clone()),
        max_cost_usd: budgets.max_cost_usd(),
        max_cost_usd_source: Some(budgets.cost.source.clone()),
        price: None,
        model: command_model(command),
        stream_usage: false,
    };
    if limits.max_cost_usd.is_none() {
        return Ok(limits);
    }
    let table = settings::price_table(args.prices.as_deref())?;
    match &limits.model {
        Some(model) if price_of(&table, model).is_none() => {
            return Err(UsageError(format!(
                "--max-cost-usd: the model `{model}` has no price in the price table (taken {}); \
                 add it to a price file given with --prices FILE (`stepguard prices` prints the \
                 table to start from)",
                table.taken()
            ))
            .into());
        }
        None if !gateway => {
            return Err(UsageError(
                "--max-cost-usd without --wrap-up prices the usage the stream reports as the \
                 model the command names, and this command names none: give the agent its \
                 model (--model / -m / -c model=…), or add --wrap-up to price every call"
                    .into(),
            )
            .into());
        }
        _ => {}
    }
    limits.price = Some(stepguard_gateway::Pricing(std::sync::Arc::new(
        move |model: &str, u: &stepguard_gateway::CallUsage| {
            let price = price_of(&table, model)?;
            Some(price.cost(u.input, u.cached_input, u.output))
        },
    )));
    Ok(limits)
}

/// The price of `model`, also as the model part of OpenCode's `provider/model`.
fn price_of<'t>(
    table: &'t stepguard_prices::PriceTable,
    model: &str,
) -> Option<&'t stepguard_prices::Price> {
    table
        .price(model)
        .or_else(|| model.split_once('/').and_then(|(_, m)| table.price(m)))
}

/// The model an agent command names: `--model M`, `-m M` (also `--model=M`), or Codex's
/// `-c model=M`.
fn command_model(command: &[String]) -> Option<String> {
    let mut found = None;
    let mut args = command.iter().skip(1).peekable();
    while let Some(arg) = args.next() {
        if arg == "--model" || arg == "-m" {
            found = args.next().cloned();
        } else if let Some(m) = arg.strip_prefix("--model=") {
            found = Some(m.to_owned());
        } else if (arg == "-c" || arg == "--config")
            && let Some(kv) = args.peek()
            && let Some(value) = kv.strip_prefix("model=")
        {
            found = Some(value.trim_matches('"').to_owned());
        }
    }
    found.filter(|m| !m.is_empty())
}
