//! The agent's command as the plan runs it: the provider's native limits added, the model
//! gateway checked, the token and cost budgets priced, all before anything starts.

use std::path::Path;

use stepguard_config::ResolvedSpend;
use stepguard_plugin_api::Manifest;
use stepguard_runner::{SpendLimits, WrapUp};

use crate::args::{OnLimit, RunArgs};
use crate::exit::UsageError;
use crate::settings::Limits;

/// The agent's command with the provider's native limits added, the model gateway and the
/// token and cost budgets, all checked before anything starts.
pub(super) struct AgentCommand {
    pub command: Vec<String>,
    pub wrap_up: Option<WrapUp>,
    pub spend: SpendLimits,
}

/// What the agent's command is planned from, besides the arguments.
pub(super) struct Context<'a> {
    pub manifest: &'a Manifest,
    pub unit: &'a str,
    pub limits: &'a Limits,
    /// Whether the run has the model gateway.
    pub wrap_up: bool,
    pub cwd: &'a Path,
    /// The price table in effect, loaded only for a cost budget.
    pub prices: &'a dyn Fn() -> anyhow::Result<stepguard_prices::PriceTable>,
}

/// Plans the agent's command: the provider's native step limit, the model gateway, the token
/// and cost budgets (refused when nothing can keep them) and the provider's native token and
/// cost budgets, as second lines of defence like its step limit.
pub(super) fn agent_command(args: &RunArgs, cx: &Context<'_>) -> anyhow::Result<AgentCommand> {
    let manifest = cx.manifest;
    let mut command = args.command.clone();
    if let (Some(native), Some(limit), false) = (
        &manifest.native_limit,
        cx.limits.budget.max_steps.get(),
        args.no_native_limit,
    ) && let Some(extra) = native.args_for(&command, limit)
    {
        tracing::info!(args = ?extra, "adding the provider's native limit");
        command.extend(extra);
    }
    let wrap_up = wrap_up_spec(args, cx, &command)?;
    let mut spend = spend_limits(&cx.limits.spend, &command, wrap_up.is_some(), cx.prices)?;
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

/// The model gateway of the run, checked before anything starts: the provider must declare
/// how its CLI reaches its model, and the command must say where (a usage error names the fix).
fn wrap_up_spec(
    args: &RunArgs,
    cx: &Context<'_>,
    command: &[String],
) -> anyhow::Result<Option<WrapUp>> {
    let (manifest, unit) = (cx.manifest, cx.unit);
    if !cx.wrap_up {
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
    let env = |name: &str| std::env::var(name).ok();
    stepguard_gateway::point(&endpoint, command, &env, cx.cwd, "http://127.0.0.1:1/probe")
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
    budgets: &ResolvedSpend,
    command: &[String],
    gateway: bool,
    prices: &dyn Fn() -> anyhow::Result<stepguard_prices::PriceTable>,
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
    let table = prices()?;
    match &limits.model {
        Some(model) if priced_name(&table, model).is_none() => {
            return Err(UsageError(format!(
                "--max-cost-usd: the model `{model}` has no price in {} (taken {}); add it to a \
                 price file given with --prices FILE (`stepguard prices` prints a template)",
                table
                    .source()
                    .unwrap_or_else(|| "the price files".to_owned()),
                table.taken().unwrap_or("on no given date")
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
    // Before the agent starts, not on its first model call.
    table.prepare();
    limits.price = Some(stepguard_gateway::Pricing(std::sync::Arc::new(
        move |model: &str, u: &stepguard_gateway::CallUsage| {
            let usage = stepguard_prices::Usage {
                input: u.input,
                cache_read: u.cached_input,
                // The usage carries cache writes inside the input: priced as input.
                cache_write: 0,
                output: u.output,
            };
            table.cost(model, &usage).or_else(|| {
                let (_, bare) = model.split_once('/')?;
                table.cost(bare, &usage)
            })
        },
    )));
    Ok(limits)
}

/// The name `model` is priced under: itself, or the model part of OpenCode's `provider/model`.
fn priced_name<'m>(table: &stepguard_prices::PriceTable, model: &'m str) -> Option<&'m str> {
    if table.priced_as(model).is_some() {
        return Some(model);
    }
    let (_, bare) = model.split_once('/')?;
    table.priced_as(bare).is_some().then_some(bare)
}

/// The model an agent command names: `--model M`, `-m M` (also `--model=M`), or Codex's
/// `-c model=M`.
pub(super) fn command_model(command: &[String]) -> Option<String> {
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
