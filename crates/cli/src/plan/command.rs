//! The agent's command as the plan runs it: the provider's native limits added, the model
//! gateway checked, the token and cost budgets priced, all before anything starts.

use std::path::Path;

use stepguard_config::ResolvedSpend;
use stepguard_config::notices::NoticeSetting;
use stepguard_plugin_api::{Manifest, NativeLimit, program_name};
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
    /// The staged notices' setting, resolved.
    pub notices: &'a NoticeSetting,
    pub cwd: &'a Path,
    /// The price table in effect, loaded only for a cost budget.
    pub prices: &'a dyn Fn() -> anyhow::Result<stepguard_prices::PriceTable>,
}

/// Plans the agent's command: the provider's native step limit, the model gateway, the token
/// and cost budgets (refused when nothing can keep them) and the provider's native token and
/// cost budgets, as second lines of defence like its step limit. A native limit goes only into
/// a command that runs the provider's CLI; one left out is said once, to `warn`.
pub(super) fn agent_command(
    args: &RunArgs,
    cx: &Context<'_>,
    warn: &mut dyn FnMut(&str),
) -> anyhow::Result<AgentCommand> {
    let manifest = cx.manifest;
    let mut native = NativeLimits::new(manifest, &args.command, args.no_native_limit);
    let mut command = args.command.clone();
    if let (Some(limit), Some(max)) = (&manifest.native_limit, cx.limits.budget.max_steps.get())
        && native.fits(limit, "step limit")
        && let Some(extra) = limit.args_for(&command, max)
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
    if let (Some(limit), Some(max)) = (&manifest.native_token_limit, spend.max_tokens)
        && native.fits(limit, "token budget")
        && let Some(with) = limit.command_for_tokens(&command, max)
    {
        tracing::info!("adding the provider's native token budget");
        command = with;
    }
    if let (Some(limit), Some(max)) = (&manifest.native_cost_limit, spend.max_cost_usd)
        && native.fits(limit, "cost budget")
        && let Some(with) = limit.command_for_cost(&command, max)
    {
        tracing::info!("adding the provider's native cost budget");
        command = with;
    }
    if let Some(line) = native.left_out() {
        warn(&line);
    }
    Ok(AgentCommand {
        command,
        wrap_up,
        spend,
    })
}

/// Which of the provider's native limits may go into the agent's command: only into a command
/// whose program is the provider's CLI (the pre-flight's rule: the program's file name), never
/// into a wrapper (`env`, `npx`, a script), whose options they are not, nor into another CLI,
/// where they may mean something else (Codex's `-c` is Claude's `--continue`).
struct NativeLimits<'a> {
    manifest: &'a Manifest,
    /// The program the agent's command runs (its file name).
    program: &'a str,
    /// `--no-native-limit`.
    off: bool,
    /// The limits left out, and why.
    left_out: Vec<&'static str>,
    why: Option<String>,
}

impl<'a> NativeLimits<'a> {
    fn new(manifest: &'a Manifest, command: &'a [String], off: bool) -> Self {
        NativeLimits {
            manifest,
            program: program_name(command).unwrap_or_default(),
            off,
            left_out: Vec::new(),
            why: None,
        }
    }

    /// Returns true when `limit` (the `what` of the provider's CLI) may go into the command;
    /// otherwise remembers that it was left out, and why.
    fn fits(&mut self, limit: &NativeLimit, what: &'static str) -> bool {
        if self.off {
            return false;
        }
        let why = match self.manifest.native_program(limit) {
            Some(cli) if cli == self.program => return true,
            Some(cli) => format!(
                "the command runs `{}`, not `{cli}`, and a wrapper or another CLI must not get \
                 {cli}'s flags",
                self.program
            ),
            None => format!(
                "the {} plugin does not say which program takes it (`NativeLimit::program`)",
                self.manifest.name
            ),
        };
        self.left_out.push(what);
        self.why.get_or_insert(why);
        false
    }

    /// The one warning line for the limits left out, if any.
    fn left_out(&self) -> Option<String> {
        let why = self.why.as_ref()?;
        Some(format!(
            "provider {}'s native {} left out of the agent's command: {why}; stepguard's own \
             limits still hold (run the CLI directly after `--` to have both, or pass \
             --no-native-limit to say you know)",
            self.manifest.name,
            self.left_out.join(" and ")
        ))
    }
}

/// Refuses a command that runs another provider's CLI than the one counted (`-p claude --
/// codex exec …`): its stream would go uncounted, and a native limit of one CLI may be another
/// flag of another. `providers` are the manifests of every available provider.
pub(super) fn wrong_provider<'m>(
    command: &[String],
    manifest: &Manifest,
    providers: impl IntoIterator<Item = &'m Manifest>,
) -> anyhow::Result<()> {
    let Some(program) = program_name(command) else {
        return Ok(());
    };
    if manifest.names_program(program) {
        return Ok(());
    }
    let owners: Vec<&str> = providers
        .into_iter()
        .filter(|m| m.name != manifest.name && m.names_program(program))
        .map(|m| m.name.as_str())
        .collect();
    let Some(first) = owners.first() else {
        return Ok(());
    };
    Err(UsageError(format!(
        "the command runs `{program}`, the CLI of provider {}, but the run counts provider {}: \
         use `-p {first}` (or `--no-preflight` if `{program}` really prints {}'s stream)",
        owners.join(" / "),
        manifest.name,
        manifest.name
    ))
    .into())
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
        let notices = args.notices.as_ref().is_some_and(|n| !n.is_off());
        if notices || args.record_requests.is_some() {
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
    let env = |name: &str| crate::reexec::var(name);
    let probe =
        stepguard_gateway::point(&endpoint, command, &env, cx.cwd, "http://127.0.0.1:1/probe")
            .map_err(|e| UsageError(format!("--wrap-up with provider {}: {e}", manifest.name)))?;
    refuse_pointing_a_wrapper(manifest, command, &probe.command)?;
    let reply_cost = manifest
        .units
        .iter()
        .find(|u| u.name == unit)
        .and_then(|u| u.reply_cost)
        .unwrap_or(1);
    Ok(Some(WrapUp {
        endpoint,
        reply_cost,
        notices: *cx.notices == NoticeSetting::EveryStep,
        notice_thresholds: cx.notices.thresholds().to_vec(),
        record_requests: args.record_requests.clone(),
        shared_budget: None,
    }))
}

/// Pointing that adds arguments goes only into the provider's own CLI, never into a wrapper
/// (`env`, `npx`, a script) or another program, whose options they are not (a manifest that
/// names no program cannot be checked, and is trusted as before).
fn refuse_pointing_a_wrapper(
    manifest: &Manifest,
    command: &[String],
    pointed: &[String],
) -> anyhow::Result<()> {
    let Some(program) = stepguard_plugin_api::program_name(command) else {
        return Ok(());
    };
    let limits = [
        &manifest.native_limit,
        &manifest.native_token_limit,
        &manifest.native_cost_limit,
    ];
    let names_any = !manifest.preflight.is_empty()
        || limits
            .iter()
            .any(|l| l.as_ref().is_some_and(|l| l.program.is_some()));
    if pointed == command || !names_any || manifest.names_program(program) {
        return Ok(());
    }
    // What pointing added: the run of arguments from the first difference on.
    let at = command
        .iter()
        .zip(pointed)
        .take_while(|(a, b)| a == b)
        .count();
    let added = pointed[at..at + pointed.len().saturating_sub(command.len())].join(" ");
    Err(UsageError(format!(
        "--wrap-up points provider {}'s CLI at the gateway by adding `{added}` to its command \
         line, and the command runs `{program}`, not the CLI: put the CLI first after `--` (set \
         environment variables in stepguard's environment, not through a wrapper)",
        manifest.name
    ))
    .into())
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

#[cfg(test)]
mod tests {
    use stepguard_plugin_api::PreflightRule;

    use super::*;

    fn command(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    fn cli(name: &str, program: &str) -> Manifest {
        Manifest::new(name, "1").preflight(PreflightRule::new(program, &[], "fix"))
    }

    #[test]
    fn a_native_limit_fits_only_the_providers_own_cli_and_is_said_once() {
        let manifest =
            cli("codex", "codex").native_limit(NativeLimit::new(&["--max", "{max_steps}"], &[]));
        let limit = manifest.native_limit.clone().unwrap();
        let direct = command(&["/usr/bin/codex", "exec"]);
        let mut native = NativeLimits::new(&manifest, &direct, false);
        assert!(native.fits(&limit, "step limit"));
        assert_eq!(native.left_out(), None);
        let wrapped = command(&["npx", "codex", "exec"]);
        let mut native = NativeLimits::new(&manifest, &wrapped, false);
        assert!(!native.fits(&limit, "step limit"));
        assert!(!native.fits(&limit, "token budget"));
        let line = native.left_out().unwrap();
        assert!(
            line.starts_with("provider codex's native step limit and token budget left out")
                && line.contains("the command runs `npx`, not `codex`"),
            "{line}"
        );
        // Turned off: nothing fits and nothing is said.
        let mut off = NativeLimits::new(&manifest, &wrapped, true);
        assert!(!off.fits(&limit, "step limit"));
        assert_eq!(off.left_out(), None);
        // A plugin that names no program gets nothing added.
        let bare = Manifest::new("bare", "1");
        let mut native = NativeLimits::new(&bare, &direct, false);
        assert!(!native.fits(&limit, "step limit"));
        assert!(
            native
                .left_out()
                .unwrap()
                .contains("does not say which program")
        );
    }

    #[test]
    fn another_providers_cli_is_refused_unless_this_provider_claims_it_too() {
        let (claude, codex) = (cli("claude", "claude"), cli("codex", "codex"));
        let alt = cli("codex-alt", "codex");
        let all = [&claude, &codex, &alt];
        let run_codex = command(&["codex", "exec", "--json"]);
        let err = wrong_provider(&run_codex, &claude, all)
            .unwrap_err()
            .to_string();
        assert!(err.contains("use `-p codex`"), "{err}");
        assert!(err.contains("provider codex / codex-alt"), "{err}");
        assert!(wrong_provider(&run_codex, &codex, all).is_ok());
        assert!(wrong_provider(&run_codex, &alt, all).is_ok());
        // A wrapper nobody claims is left to recognition.
        assert!(wrong_provider(&command(&["env", "codex"]), &claude, all).is_ok());
    }
}
