//! `stepguard config`: the effective budget, token and cost budgets and loop limit, their
//! sources, the policy, provider options and warnings.

use std::collections::BTreeMap;

use serde::Serialize;
use stepguard_config::{
    LoadedConfig, LoopLimit, OnLedgerError, Origin, ResolvedLimit, RunFacts, Severity,
};
use stepguard_core::{ExitCode, StepLimit};

use crate::args::{Cli, ConfigArgs};
use crate::session::Session;
use crate::settings::Limits;
use crate::{output, providers};

#[derive(Serialize)]
struct ConfigReport<'a> {
    max_steps: StepLimit,
    source: &'a str,
    source_file: Option<&'a str>,
    /// The token budget (null when none) and where it came from.
    max_tokens: Option<u64>,
    max_tokens_source: &'a str,
    max_tokens_source_file: Option<&'a str>,
    /// The cost budget in US dollars (null when none) and where it came from.
    max_cost_usd: Option<f64>,
    max_cost_usd_source: &'a str,
    max_cost_usd_source_file: Option<&'a str>,
    /// The loop limit (null when off) and where it came from.
    loop_limit: LoopLimit,
    loop_limit_source: &'a str,
    loop_limit_source_file: Option<&'a str>,
    /// The window (calls a repeat is looked for in) and the exempt tools.
    loop_window: u32,
    loop_ignore_tools: &'a [String],
    profile: Option<&'a str>,
    task_type: Option<&'a str>,
    provider: Option<&'a str>,
    config_files: Vec<&'a str>,
    provider_options: BTreeMap<&'a str, BTreeMap<&'a str, &'a serde_json::Value>>,
    policy: PolicyReport<'a>,
    /// Every pool declared, whether a run with these flags would join it and why, and where it
    /// was declared.
    pools: Vec<PoolLine>,
    /// Where pools are kept: the local ledger, or the fleet ledger (without its password) and
    /// where it was named; what a run does when the fleet ledger is unreachable at its start.
    ledger: LedgerLine,
    /// Problems that make `validate` fail and `run`/`count` refuse to start (exit 2), as
    /// `FILE: KEY: message`.
    errors: Vec<String>,
    warnings: Vec<String>,
}

/// The ledger in `config`'s report.
#[derive(Serialize)]
struct LedgerLine {
    /// `local` or `fleet`.
    kind: &'static str,
    /// The fleet ledger's URL without its password; null for the local ledger.
    url: Option<String>,
    /// `--ledger`, `env STEPGUARD_LEDGER_URL` or `FILE: ledger.url`; null for the local ledger.
    source: Option<String>,
    /// `refuse` (the default) or `local`.
    on_ledger_error: &'static str,
    /// `FILE: ledger.on_ledger_error`; null for the default.
    on_ledger_error_source: Option<String>,
}

impl LedgerLine {
    fn of(choice: &crate::ledger::Choice) -> Self {
        let (on_error, on_error_source) = match &choice.on_error {
            Some((what, origin)) => (*what, Some(origin.to_string())),
            None => (OnLedgerError::default(), None),
        };
        LedgerLine {
            kind: if choice.fleet.is_some() {
                "fleet"
            } else {
                "local"
            },
            url: choice.fleet.as_ref().map(crate::ledger_pg::Fleet::shown),
            source: choice.fleet.as_ref().map(|f| f.origin.to_string()),
            on_ledger_error: on_error.as_str(),
            on_ledger_error_source: on_error_source,
        }
    }

    fn print(&self) -> std::io::Result<()> {
        match (&self.url, &self.source) {
            (Some(url), Some(source)) => {
                output::line(format!("ledger: fleet {url} (from {source})"))?;
            }
            _ => output::line("ledger: local (the history database)")?,
        }
        let from = self
            .on_ledger_error_source
            .as_deref()
            .map_or_else(|| "default".to_owned(), |s| format!("from {s}"));
        output::line(format!(
            "  on_ledger_error: {} ({from})",
            self.on_ledger_error
        ))
    }
}

/// One pool in `config`'s report.
#[derive(Serialize)]
struct PoolLine {
    name: String,
    /// `match` (the run meets the pool's match), `--pool` (named), or null (it would not join).
    joins_by: Option<&'static str>,
    r#match: String,
    window: String,
    max_cost_usd: Option<f64>,
    max_tokens: Option<u64>,
    max_steps: Option<u64>,
    max_runs: Option<u64>,
    max_concurrent_runs: Option<u64>,
    /// The files and keys that declare it, highest precedence first.
    declared_in: Vec<String>,
}

/// The pools of the config, and which a run with `args` would join.
fn pool_lines(
    args: &ConfigArgs,
    loaded: &LoadedConfig,
    limits: &Limits,
) -> anyhow::Result<Vec<PoolLine>> {
    let cwd = std::env::current_dir()?;
    let repository = crate::repository::of(&cwd);
    let facts = RunFacts {
        task_type: args.budget.task_type.as_deref(),
        provider: args.provider.as_deref().unwrap_or_default(),
        profile: limits.budget.profile.as_deref(),
        repository: repository.as_deref(),
    };
    let joined = crate::pools::select(&loaded.model, &facts, &args.pools)?;
    Ok(loaded
        .model
        .pools
        .values()
        .map(|p| PoolLine {
            name: p.name.clone(),
            joins_by: if !joined.iter().any(|j| j.name == p.name) {
                None
            } else if p.matcher.matches(&facts) {
                Some("match")
            } else {
                Some("--pool")
            },
            r#match: p.matcher.to_string(),
            window: p.window.to_string(),
            max_cost_usd: p.max_cost_usd,
            max_tokens: p.max_tokens,
            max_steps: p.max_steps,
            max_runs: p.max_runs,
            max_concurrent_runs: p.max_concurrent_runs,
            declared_in: p
                .origins
                .iter()
                .map(|o| format!("{} in {}", o.label(), o.file().unwrap_or("?")))
                .collect(),
        })
        .collect())
}

fn print_pools(pools: &[PoolLine]) -> std::io::Result<()> {
    if pools.is_empty() {
        return Ok(());
    }
    output::line("pools:")?;
    for p in pools {
        let joins = match p.joins_by {
            Some("match") => "joins (its match)",
            Some(_) => "joins (--pool)",
            None => "does not join",
        };
        let caps: Vec<String> = [
            p.max_cost_usd.map(|v| format!("max_cost_usd = {v}")),
            p.max_tokens.map(|v| format!("max_tokens = {v}")),
            p.max_steps.map(|v| format!("max_steps = {v}")),
            p.max_runs.map(|v| format!("max_runs = {v}")),
            p.max_concurrent_runs
                .map(|v| format!("max_concurrent_runs = {v}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        output::line(format!(
            "  {}: {joins}; {}; window {}; match {}",
            p.name,
            caps.join(", "),
            p.window,
            p.r#match
        ))?;
        output::line(format!("    declared by {}", p.declared_in.join("; ")))?;
    }
    Ok(())
}

/// The policy in effect: each value with the file and key that set it.
#[derive(Serialize)]
struct PolicyReport<'a> {
    /// The policy-bearing files that set any policy.
    files: Vec<&'a str>,
    max_steps_ceiling: Option<PolicyValue<'a, u32>>,
    max_tokens_ceiling: Option<PolicyValue<'a, u64>>,
    max_cost_usd_ceiling: Option<PolicyValue<'a, f64>>,
    /// Units fixed per provider (only `--provider`'s when given).
    units: BTreeMap<&'a str, PolicyValue<'a, &'a str>>,
    /// The effective consent: `false` with no source when no policy file sets it.
    allow_plugin_override: PolicyValue<'a, bool>,
    /// The settings nothing may loosen (`locked`), each with where it was locked.
    locked: Vec<PolicyValue<'a, &'static str>>,
}

#[derive(Serialize)]
struct PolicyValue<'a, T> {
    value: T,
    source_file: Option<&'a str>,
    key: Option<&'a str>,
}

impl<'a, T> PolicyValue<'a, T> {
    fn new(value: T, origin: &'a Origin) -> Self {
        let (source_file, key) = match origin {
            Origin::File { path, key } => (Some(path.as_str()), Some(key.as_str())),
            _ => (None, None),
        };
        PolicyValue {
            value,
            source_file,
            key,
        }
    }

    fn origin_text(&self) -> String {
        match (self.source_file, self.key) {
            (Some(file), Some(key)) => format!("from {file}: {key}"),
            _ => "default".to_owned(),
        }
    }
}

fn policy_report<'a>(loaded: &'a LoadedConfig, provider: Option<&str>) -> PolicyReport<'a> {
    let policy = &loaded.model.policy;
    PolicyReport {
        files: loaded.policy_files().map(|f| f.path.as_str()).collect(),
        max_steps_ceiling: policy
            .max_steps_ceiling
            .as_ref()
            .map(|c| PolicyValue::new(c.max_steps, &c.origin)),
        max_tokens_ceiling: policy
            .max_tokens_ceiling
            .as_ref()
            .map(|(n, origin)| PolicyValue::new(*n, origin)),
        max_cost_usd_ceiling: policy
            .max_cost_usd_ceiling
            .as_ref()
            .map(|(usd, origin)| PolicyValue::new(*usd, origin)),
        units: policy
            .units
            .iter()
            .filter(|(name, _)| provider.is_none_or(|p| p == name.as_str()))
            .map(|(name, (unit, origin))| (name.as_str(), PolicyValue::new(unit.as_str(), origin)))
            .collect(),
        locked: policy
            .locked
            .iter()
            .map(|(lock, origin)| PolicyValue::new(lock.name(), origin))
            .collect(),
        allow_plugin_override: match &policy.allow_plugin_override {
            Some((allow, origin)) => PolicyValue::new(*allow, origin),
            None => PolicyValue {
                value: false,
                source_file: None,
                key: None,
            },
        },
    }
}

/// Runs `stepguard config`: exit 0, or 2 when the provider options (or a policy's unit) are
/// wrong, after the report.
pub(crate) fn run(cli: &Cli, args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let session = Session::load(cli)?;
    let loaded = &session.config;
    let limits = session.limits(&args.budget, args.loops.loop_limit.as_deref())?;
    let registry = session.registry();
    if let Some(name) = &args.provider {
        registry.get(name)?;
    }
    let (errors, option_warnings): (Vec<_>, Vec<_>) =
        providers::check_config(registry, &loaded.model, args.provider.as_deref())
            .into_iter()
            .partition(|d| d.severity == Severity::Error);
    let mut warnings: Vec<String> = loaded.diagnostics().map(|d| d.to_string()).collect();
    warnings.extend(limits.budget.warnings.iter().cloned());
    warnings.extend(limits.spend.warnings.iter().cloned());
    warnings.extend(limits.loops.warnings.iter().cloned());
    warnings.extend(option_warnings.iter().map(ToString::to_string));
    let mut report = config_report(args, loaded, &limits);
    report.pools = pool_lines(args, loaded, &limits)?;
    report.ledger = LedgerLine::of(&session.ledger_choice());
    report.errors = errors.iter().map(providers::located).collect();
    report.warnings = warnings;
    let code = if report.errors.is_empty() {
        ExitCode::Success
    } else {
        ExitCode::Usage
    };
    if args.json {
        output::json(&report)?;
        return Ok(code);
    }
    print_report(&report, &limits)?;
    Ok(code)
}

/// Builds the report of the limits and the config files in effect (without errors and
/// warnings).
fn config_report<'a>(
    args: &'a ConfigArgs,
    loaded: &'a LoadedConfig,
    limits: &'a Limits,
) -> ConfigReport<'a> {
    let provider_options = loaded
        .model
        .providers
        .iter()
        .filter(|(name, _)| args.provider.as_deref().is_none_or(|p| p == name.as_str()))
        .map(|(name, opts)| {
            (
                name.as_str(),
                opts.iter().map(|(k, (v, _))| (k.as_str(), v)).collect(),
            )
        })
        .collect();
    let (budget, spend, loops) = (&limits.budget, &limits.spend, &limits.loops);
    ConfigReport {
        max_steps: budget.max_steps,
        source: &budget.source,
        source_file: budget.source_file.as_deref(),
        max_tokens: spend.tokens.value,
        max_tokens_source: &spend.tokens.source,
        max_tokens_source_file: spend.tokens.source_file.as_deref(),
        max_cost_usd: spend.cost.value,
        max_cost_usd_source: &spend.cost.source,
        max_cost_usd_source_file: spend.cost.source_file.as_deref(),
        loop_limit: loops.limit,
        loop_limit_source: &loops.source,
        loop_limit_source_file: loops.source_file.as_deref(),
        loop_window: loops.window,
        loop_ignore_tools: &loops.ignore_tools,
        profile: budget.profile.as_deref(),
        task_type: args.budget.task_type.as_deref(),
        provider: args.provider.as_deref(),
        config_files: loaded.settings_files().map(|f| f.path.as_str()).collect(),
        provider_options,
        policy: policy_report(loaded, args.provider.as_deref()),
        pools: Vec::new(),
        ledger: LedgerLine::of(&crate::ledger::Choice {
            fleet: None,
            on_error: None,
        }),
        errors: Vec::new(),
        warnings: Vec::new(),
    }
}

/// Prints the report as text: the limits with their sources, the files, the policy, the
/// provider options, then the warnings and errors on stderr.
fn print_report(report: &ConfigReport<'_>, limits: &Limits) -> std::io::Result<()> {
    let (resolved, loops) = (&limits.budget, &limits.loops);
    let from = match report.source_file {
        // The policy's label already names its file.
        Some(file) if !report.source.contains(file) => format!("{} in {file}", report.source),
        _ => report.source.to_owned(),
    };
    output::line(format!("max_steps: {} (from {from})", report.max_steps))?;
    // Only when the profile lowered an explicit budget; under the profile's it needs no note.
    if let (Some(explicit), Some(profile)) = (resolved.explicit_max_steps, &resolved.profile) {
        let bounded = resolved.uncapped_max_steps.unwrap_or(resolved.max_steps);
        output::line(format!(
            "  explicit budget {explicit} lowered to {bounded} by profile {profile}"
        ))?;
    }
    if let Some(uncapped) = resolved.uncapped_max_steps {
        output::line(format!(
            "  budget {uncapped} asked for, bounded by the policy ceiling"
        ))?;
    }
    output::line(format!("profile: {}", report.profile.unwrap_or("none")))?;
    output::line(format!("task type: {}", report.task_type.unwrap_or("none")))?;
    let from = match report.loop_limit_source_file {
        Some(file) => format!("{} in {file}", report.loop_limit_source),
        None => report.loop_limit_source.to_owned(),
    };
    output::line(format!("loop_limit: {} (from {from})", loops.limit))?;
    if let (Some(explicit), Some(profile)) = (loops.explicit, &resolved.profile) {
        output::line(format!(
            "  explicit loop limit {explicit} lowered to {} by profile {profile}",
            loops.limit
        ))?;
    }
    output::line(format!("loop_window: {} calls", report.loop_window))?;
    output::line(format!(
        "loop_ignore_tools: {}",
        if report.loop_ignore_tools.is_empty() {
            "none".to_owned()
        } else {
            report.loop_ignore_tools.join(", ")
        }
    ))?;
    let profile = resolved.profile.as_deref();
    print_spend("max_tokens", "token budget", &limits.spend.tokens, profile)?;
    print_spend("max_cost_usd", "cost budget", &limits.spend.cost, profile)?;
    if report.config_files.is_empty() {
        output::line("config files: none found")?;
    } else {
        output::line("config files:")?;
        for f in &report.config_files {
            output::line(format!("  {f}"))?;
        }
    }
    print_policy(&report.policy)?;
    print_pools(&report.pools)?;
    report.ledger.print()?;
    for (provider, opts) in &report.provider_options {
        output::line(format!("[{provider}] options:"))?;
        for (k, v) in opts {
            output::line(format!("  {k} = {v}"))?;
        }
    }
    for w in &report.warnings {
        output::diag("warning", w.strip_prefix("warning: ").unwrap_or(w));
    }
    for e in &report.errors {
        output::diag("error", e);
    }
    Ok(())
}

/// Prints a token or cost budget as `KEY: VALUE (from SOURCE[ in FILE])`, with a line when the
/// profile lowered an explicit budget and one when the policy ceiling did.
fn print_spend<T: std::fmt::Display + Copy>(
    key: &str,
    what: &str,
    limit: &ResolvedLimit<T>,
    profile: Option<&str>,
) -> std::io::Result<()> {
    let show = |v: Option<T>| v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string());
    let value = match limit.value {
        None if limit.source == "default" => "none".to_owned(),
        v => show(v),
    };
    let from = match limit.source_file.as_deref() {
        // The policy's label already names its file.
        Some(file) if !limit.source.contains(file) => format!("{} in {file}", limit.source),
        _ => limit.source.clone(),
    };
    output::line(format!("{key}: {value} (from {from})"))?;
    if let (Some(explicit), Some(profile)) = (limit.explicit, profile) {
        let bounded = limit.uncapped.unwrap_or(limit.value);
        output::line(format!(
            "  explicit {what} {} lowered to {} by profile {profile}",
            show(explicit),
            show(bounded)
        ))?;
    }
    // No budget (or `unlimited`) under a ceiling needs no note: the source names the policy.
    if let Some(Some(uncapped)) = limit.uncapped {
        output::line(format!(
            "  {what} {uncapped} asked for, bounded by the policy ceiling"
        ))?;
    }
    Ok(())
}

fn print_policy(policy: &PolicyReport<'_>) -> std::io::Result<()> {
    if policy.files.is_empty() {
        return output::line("policy: none");
    }
    output::line("policy:")?;
    if let Some(c) = &policy.max_steps_ceiling {
        output::line(format!(
            "  max_steps_ceiling = {} ({})",
            c.value,
            c.origin_text()
        ))?;
    }
    if let Some(c) = &policy.max_tokens_ceiling {
        output::line(format!(
            "  max_tokens_ceiling = {} ({})",
            c.value,
            c.origin_text()
        ))?;
    }
    if let Some(c) = &policy.max_cost_usd_ceiling {
        output::line(format!(
            "  max_cost_usd_ceiling = {} ({})",
            c.value,
            c.origin_text()
        ))?;
    }
    for (provider, unit) in &policy.units {
        output::line(format!(
            "  {provider}.max_steps_unit = {:?} (fixed, {})",
            unit.value,
            unit.origin_text()
        ))?;
    }
    for lock in &policy.locked {
        output::line(format!("  locked: {} ({})", lock.value, lock.origin_text()))?;
    }
    let allow = &policy.allow_plugin_override;
    output::line(format!(
        "  allow_plugin_override = {} ({})",
        allow.value,
        allow.origin_text()
    ))
}
