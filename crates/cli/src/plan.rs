//! The run plan: everything `stepguard run` decides before the agent starts, from its
//! arguments and the [`Session`] (ripgrep's low-level arguments → high-level arguments). One
//! function, [`RunPlan::new`], reads nothing beyond what the session loads (and the variables
//! the limits' ladder and the gateway's probe read) and prints nothing itself (warnings go to a
//! sink). It decides the provider and its counter, the agent's command with the provider's
//! native limits added, every limit with its source, the clocks, the model gateway, the token
//! and cost budgets with their prices, the loop settings and the observers. `run` turns the plan into the runner's spec;
//! `count` shares its provider and loop resolution, `config` its limits ([`Session::limits`]).

use std::path::{Path, PathBuf};

use stepguard_config::notices::NoticeSetting;
use stepguard_config::{LoadedConfig, Lock, ResolvedLoops, RunFacts};
use stepguard_core::loops::LoopSettings;
use stepguard_plugin_api::Manifest;
use stepguard_plugin_api::host::Counter;
use stepguard_runner::{
    Clocks, Confinement, Containment, OnUnrecognized, RunMeta, SpendLimits, StreamRecognition,
    WrapUp,
};

use crate::args::{ContainmentArg, OnLimit, RunArgs, StdinMode, Unrecognized};
use crate::exit::UsageError;
use crate::pools::Membership;
use crate::providers::{self, Selection};
use crate::session::Session;
use crate::settings::Limits;

mod command;

/// Everything a run is, decided before its agent starts.
pub(crate) struct RunPlan<'s> {
    /// The provider, where it came from, and the unit and options it counts with.
    pub selection: Selection<'s>,
    /// The provider's counter, opened for the unit.
    pub counter: Counter,
    /// The agent's command, the provider's native limits added.
    pub command: Vec<String>,
    /// Every limit of the run, each with its source.
    pub limits: Limits,
    /// The labels of the run's record.
    pub meta: RunMeta,
    /// Loop detection: the resolved settings when the provider reports tool calls.
    pub loops: Option<LoopSettings>,
    /// `--on-limit ask` without the gateway: ask at the limit, when there is a terminal to ask
    /// on (else stop).
    pub ask_at_limit: bool,
    /// The policy's step ceiling, the most an answer at the limit may allow.
    pub ceiling: Option<u32>,
    /// The model gateway, when the run has one.
    pub wrap_up: Option<WrapUp>,
    /// The token and cost budgets, with the prices and the model they are kept by.
    pub spend: SpendLimits,
    /// Grace, timeout, idle, startup and ask timeouts.
    pub clocks: Clocks,
    /// Containment, and signals forwarded (the trampoline is found when the run starts).
    pub confinement: Confinement,
    /// What the stream looks like and what an unrecognised one does.
    pub recognition: StreamRecognition,
    /// The agent's standard input.
    pub stdin: stepguard_runner::StdinMode,
    /// Who watches the run.
    pub observers: Observers,
    /// The git repository the run works in (recorded; matched by pools).
    pub repository: Option<String>,
    /// The pools the run was admitted to (none when it joins none).
    pub pools: Option<Membership>,
}

/// The observers a run is planned with (telemetry comes from the environment and `[telemetry]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Observers {
    /// The status line on the terminal (not with `--quiet`).
    pub status_line: bool,
    /// The history database the run is recorded in (none with `--no-record`).
    pub history: Option<PathBuf>,
    /// Where to write the summary of the run (`--summary-file`).
    pub summary_file: Option<PathBuf>,
}

impl<'s> RunPlan<'s> {
    /// Plans a run of `args` in `cwd` from what `session` loaded; each warning goes to `warn`
    /// as it is found, and the first problem is the error (a usage error names its fix).
    pub(crate) fn new(
        args: &RunArgs,
        session: &'s Session<'_>,
        cwd: &Path,
        warn: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Self> {
        let config = &session.config;
        for d in config.diagnostics() {
            warn(d.to_string().trim_start_matches("warning: "));
        }
        let mut limits = session.limits(&args.budget, args.loops.loop_limit.as_deref())?;
        let (budget, loops, spend) = (&limits.budget, &limits.loops, &limits.spend);
        for w in budget
            .warnings
            .iter()
            .chain(&loops.warnings)
            .chain(&spend.warnings)
        {
            warn(w);
        }
        locked_flags(args, config)?;
        let selection = provider(session, &args.provider, args.unit.as_deref())?;
        let manifest = selection.provider.manifest();
        preflight(args, manifest, session)?;
        let mut request = selection.request.clone();
        if loop_settings(manifest, &limits.loops).is_none() {
            // Nothing takes the tool calls: the counter need not find them, nothing keeps them.
            request = request.without_tool_calls();
        }
        let counter = selection.provider.open_counter(&request)?;
        let repository = crate::repository::of(cwd);
        let pools = admit_pools(
            args,
            session,
            &selection,
            &limits,
            repository.as_deref(),
            cwd,
        )?;
        if let Some(membership) = &pools {
            membership.clamp(&mut limits);
        }
        if let Some(w) = loops_ignored(manifest, &limits.loops) {
            warn(&w);
        }
        let unit = selection.request.unit.as_str();
        let wrap_up = wrap_up_on(args, config);
        let notices = notice_setting(args, config)?;
        let agent = command::agent_command(
            args,
            &command::Context {
                manifest,
                unit,
                limits: &limits,
                wrap_up,
                notices: &notices,
                cwd,
                prices: &|| session.price_table(args.prices.as_deref()),
            },
            warn,
        )?;
        let mut meta = meta(args, &selection, &limits, cwd);
        meta.pools = pools.as_ref().map(Membership::names);
        meta.ledger = pools.as_ref().map(Membership::ledger);
        Ok(RunPlan {
            meta,
            counter,
            command: agent.command,
            loops: loop_settings(manifest, &limits.loops),
            ask_at_limit: args.on_limit == OnLimit::Ask && !wrap_up,
            ceiling: config
                .model
                .policy
                .max_steps_ceiling
                .as_ref()
                .map(|c| c.max_steps),
            wrap_up: agent.wrap_up,
            spend: agent.spend,
            clocks: clocks(args),
            confinement: confinement(args),
            recognition: recognition(args, config, manifest),
            stdin: match args.stdin {
                StdinMode::Inherit => stepguard_runner::StdinMode::Inherit,
                StdinMode::Null => stepguard_runner::StdinMode::Null,
            },
            observers: Observers {
                status_line: !args.quiet,
                history: history_db(args, session, cwd)?,
                summary_file: args.summary_file.clone(),
            },
            repository,
            pools,
            limits,
            selection,
        })
    }

    /// The provider's manifest.
    pub(crate) fn manifest(&self) -> &Manifest {
        self.selection.provider.manifest()
    }

    /// The step unit counted.
    pub(crate) fn unit(&self) -> &str {
        &self.selection.request.unit
    }

    /// Logs the budget and the loop limit of the plan, each with its source (`-v`).
    pub(crate) fn log(&self) {
        let (budget, loops) = (&self.limits.budget, &self.limits.loops);
        tracing::info!(
            max_steps = %budget.max_steps,
            source = %budget.source,
            provider = %self.manifest().name,
            unit = %self.unit(),
            "step budget"
        );
        tracing::info!(
            loop_limit = %loops.limit,
            source = %loops.source,
            window = loops.window,
            "loop limit"
        );
    }
}

/// Picks the provider, its unit (`--unit`, else the config's, else the default) and its
/// options, for a command that counts (`run`, `count`).
pub(crate) fn provider<'s>(
    session: &'s Session<'_>,
    name: &str,
    unit: Option<&str>,
) -> anyhow::Result<Selection<'s>> {
    providers::select(
        session.registry_for(name),
        name,
        unit,
        Some(&session.config),
    )
}

/// The loop settings a provider can keep: none when it does not report tool calls.
pub(crate) fn loop_settings(manifest: &Manifest, loops: &ResolvedLoops) -> Option<LoopSettings> {
    loops.settings.clone().filter(|_| manifest.tool_calls)
}

/// Refuses a command line the provider's manifest says cannot be counted (its `preflight`
/// rules) or that runs another provider's CLI, unless `--no-preflight`.
fn preflight(args: &RunArgs, manifest: &Manifest, session: &Session<'_>) -> anyhow::Result<()> {
    if args.no_preflight {
        return Ok(());
    }
    // The providers loaded for this run: for a built-in provider, the built-in ones only (no
    // plugin file is opened to recognise a plugin CLI's command).
    let others = session.registry().entries().map(|e| e.provider.manifest());
    command::wrong_provider(&args.command, manifest, others)?;
    if let Some(rule) = manifest.preflight_failure(&args.command) {
        return Err(UsageError(format!(
            "this {} command cannot be counted: {}. (`--no-preflight` runs it anyway; stepguard then stops it if none of its output is recognised)",
            manifest.name, rule.fix
        ))
        .into());
    }
    Ok(())
}

/// Refuses (exit 2) a flag that would loosen a setting the policy locks (`[policy] locked`),
/// naming the policy file. A locked loop limit is bounded by the ladder instead.
fn locked_flags(args: &RunArgs, config: &LoadedConfig) -> anyhow::Result<()> {
    let policy = &config.model.policy;
    let wrap_up_configured = config.model.wrap_up.as_ref().is_some_and(|(on, _)| *on);
    let loosening = [
        (
            Lock::UnrecognizedStream,
            args.unrecognized == Some(Unrecognized::Warn),
            "--unrecognized warn",
        ),
        (
            Lock::WrapUp,
            args.no_wrap_up && wrap_up_configured,
            "--no-wrap-up",
        ),
        (Lock::NativeLimit, args.no_native_limit, "--no-native-limit"),
        (Lock::Preflight, args.no_preflight, "--no-preflight"),
        (
            Lock::Containment,
            args.containment == ContainmentArg::ProcessWalk,
            "--containment process-walk",
        ),
    ];
    for (lock, asked, flag) in loosening {
        if let (true, Some(origin)) = (asked, policy.locks(lock)) {
            return Err(UsageError(format!(
                "{flag} would loosen `{}`, which the policy locks ({origin}); run without {flag}, \
                 or have the policy changed",
                lock.name()
            ))
            .into());
        }
    }
    Ok(())
}

/// Loop detection needs the plugin's tool calls: the warning when someone asked for a limit
/// that the provider cannot keep.
fn loops_ignored(manifest: &Manifest, loops: &ResolvedLoops) -> Option<String> {
    let asked_for_loops = loops.source != "default" && !loops.source.starts_with("profile ");
    (!manifest.tool_calls && loops.settings.is_some() && asked_for_loops).then(|| {
        format!(
            "provider {} does not report tool calls (plugin protocol < 1.3): no loop \
             detection, the loop limit from {} is ignored",
            manifest.name, loops.source
        )
    })
}

/// Whether the run has a model gateway: `--no-wrap-up`, else `--wrap-up`, else the config.
/// The staged notices' setting: `--notices`, else `STEPGUARD_NOTICES`, else `[run] notices`,
/// else the default thresholds. A bad value of the variable is a usage error naming it (the
/// flag's is refused by its parser, the file's by the config's diagnostics).
fn notice_setting(args: &RunArgs, config: &LoadedConfig) -> anyhow::Result<NoticeSetting> {
    if let Some(n) = &args.notices {
        return Ok(n.clone());
    }
    if let Some(text) = std::env::var_os(NOTICES_VAR) {
        let text = text.to_string_lossy();
        return stepguard_config::notices::parse(&text)
            .map_err(|e| UsageError(format!("{NOTICES_VAR}={text}: {e}")).into());
    }
    Ok(config
        .model
        .notices
        .as_ref()
        .map(|(n, _)| n.clone())
        .unwrap_or_default())
}

/// The environment variable of the staged notices' setting.
const NOTICES_VAR: &str = "STEPGUARD_NOTICES";

fn wrap_up_on(args: &RunArgs, config: &LoadedConfig) -> bool {
    if args.no_wrap_up {
        false
    } else if args.wrap_up {
        true
    } else {
        config.model.wrap_up.as_ref().is_some_and(|(on, _)| *on)
    }
}

/// Where the run is recorded: none with `--no-record`. A database named with `--db` or
/// `STEPGUARD_DB` is created in a directory that exists, never with folders of its own: a
/// mistyped path must not record the run where nobody will look.
fn history_db(
    args: &RunArgs,
    session: &Session<'_>,
    cwd: &Path,
) -> anyhow::Result<Option<PathBuf>> {
    if args.no_record {
        return Ok(None);
    }
    let path = session.history_db(cwd)?;
    if session.named_db() {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => cwd.to_path_buf(),
        };
        if !dir.is_dir() {
            return Err(UsageError(format!(
                "the history database {} (named by --db or STEPGUARD_DB) is in a directory that \
                 does not exist: create {} first, fix the path, or run with --no-record",
                path.display(),
                dir.display()
            ))
            .into());
        }
    }
    Ok(Some(path))
}

/// Admits the run to the pools it joins (its `match`es and `--pool`), in the ledger beside the
/// history or the fleet ledger (even with `--no-record`); none when it joins none. A spent or
/// full pool is a `PoolRefused`, an unreachable ledger a `LedgerError` (exit 2) unless
/// `on_ledger_error = "local"` (then the local ledger, marked in the record).
fn admit_pools(
    args: &RunArgs,
    session: &Session<'_>,
    selection: &Selection<'_>,
    limits: &Limits,
    repository: Option<&str>,
    cwd: &Path,
) -> anyhow::Result<Option<Membership>> {
    let facts = RunFacts {
        task_type: args.budget.task_type.as_deref(),
        provider: &selection.provider.manifest().name,
        profile: limits.budget.profile.as_deref(),
        repository,
    };
    let pools = crate::pools::select(&session.config.model, &facts, &args.pools)?;
    if pools.is_empty() {
        return Ok(None);
    }
    let opened = crate::ledger::open(&session.history_db(cwd)?, &session.ledger_choice(), true)?;
    crate::pools::admit(opened, pools, args.wait_for_pool).map(Some)
}

/// The labels of the run's record.
fn meta(args: &RunArgs, selection: &Selection<'_>, limits: &Limits, cwd: &Path) -> RunMeta {
    let manifest = selection.provider.manifest();
    RunMeta {
        provider: manifest.name.clone(),
        plugin_version: Some(manifest.version.clone()),
        plugin_source: Some(selection.source.clone()),
        unit: Some(selection.request.unit.clone()),
        task_type: args.budget.task_type.clone(),
        profile: limits.budget.profile.clone(),
        cwd: Some(cwd.display().to_string()),
        pools: None,
        ledger: None,
        resumed_from: args.resumed_from,
    }
}

/// The clocks of the run, from its flags.
fn clocks(args: &RunArgs) -> Clocks {
    Clocks {
        grace: args.grace,
        timeout: args.timeout,
        idle: args.idle_timeout,
        startup: Some(args.startup_timeout),
        ask: Some(args.ask_timeout),
        ..Clocks::default()
    }
}

/// How the run's processes are contained; SIGINT, SIGTERM and SIGHUP stop the agent's tree
/// (exit 130), and stepguard exits right after.
fn confinement(args: &RunArgs) -> Confinement {
    Confinement {
        containment: match args.containment {
            ContainmentArg::Auto => Containment::Auto,
            ContainmentArg::Cgroup => Containment::Cgroup,
            ContainmentArg::ProcessWalk => Containment::ProcessWalk,
        },
        trampoline: None,
        forward_signals: true,
    }
}

/// What the provider's stream looks like, and what an unrecognised one does: the flag beats
/// `[run] unrecognized_stream`; stopping is the default (fail closed).
fn recognition(args: &RunArgs, config: &LoadedConfig, manifest: &Manifest) -> StreamRecognition {
    let warn = match args.unrecognized {
        Some(what) => what == Unrecognized::Warn,
        None => config
            .model
            .unrecognized_stream
            .as_ref()
            .is_some_and(|(what, _)| what == "warn"),
    };
    let mut stream = StreamRecognition {
        expects: manifest.expects.clone(),
        on_unrecognized: if warn {
            OnUnrecognized::Warn
        } else {
            OnUnrecognized::Stop
        },
        ..StreamRecognition::default()
    };
    stream.window.first_event = manifest.first_event_deadline();
    stream
}

#[cfg(test)]
mod tests;
