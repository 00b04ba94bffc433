//! Turns global flags, the environment and config files into the inputs of budget, token and
//! cost budget, and loop-settings resolution.

use std::path::Path;

use anyhow::Context as _;
use stepguard_config::{
    BudgetRequest, ConfigError, ConfigModel, ConfigSource, LevelSettings, LoadedConfig,
    LoopRequest, Origin, ResolvedBudget, ResolvedLoops, ResolvedSpend, SearchPaths, Setting,
    SpendRequest, budget, loop_settings, spend,
};

use crate::args::BudgetArgs;

/// Environment variable holding the per-run budget (below `--max-steps`).
pub(crate) const ENV_MAX_STEPS: &str = "STEPGUARD_MAX_STEPS";
/// Deprecated environment spelling of [`ENV_MAX_STEPS`].
pub(crate) const ENV_MAX_TURNS: &str = "STEPGUARD_MAX_TURNS";
/// Environment variable holding the per-run token budget (below `--max-tokens`).
pub(crate) const ENV_MAX_TOKENS: &str = "STEPGUARD_MAX_TOKENS";
/// Environment variable holding the per-run cost budget in US dollars (below `--max-cost-usd`).
pub(crate) const ENV_MAX_COST_USD: &str = "STEPGUARD_MAX_COST_USD";
/// Environment variable selecting a profile (below `--profile`).
pub(crate) const ENV_PROFILE: &str = "STEPGUARD_PROFILE";
/// Environment variable holding the loop limit (below `--loop-limit`).
pub(crate) const ENV_LOOP_LIMIT: &str = "STEPGUARD_LOOP_LIMIT";

/// Returns the config files in effect, each with its role: `--config`, else discovery from the
/// working directory, then the user and system files and the `STEPGUARD_POLICY` file.
pub(crate) fn config_sources(explicit: Option<&Path>) -> anyhow::Result<Vec<ConfigSource>> {
    if let Some(path) = explicit
        && !path.is_file()
    {
        return Err(ConfigError::Read {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        }
        .into());
    }
    let cwd = std::env::current_dir().context("failed to read the working directory")?;
    Ok(stepguard_config::discover_sources(
        &cwd,
        explicit,
        &SearchPaths::from_env()?,
    ))
}

/// Loads and merges the config files in effect, policy included.
pub(crate) fn load_config(explicit: Option<&Path>) -> anyhow::Result<LoadedConfig> {
    Ok(stepguard_config::load(&config_sources(explicit)?)?)
}

/// Returns whether plugin files may replace built-in providers: a policy's
/// `allow_plugin_override` decides when one says it (a policy's `false` beats `--allow-override`,
/// which is warned about), else the `--allow-override` flag. A project file cannot consent.
pub(crate) fn allow_override(config: &LoadedConfig, flag: bool) -> bool {
    match &config.model.policy.allow_plugin_override {
        Some((false, origin)) => {
            if flag {
                crate::output::diag(
                    "warning",
                    format!("--allow-override is refused by the policy at {origin}"),
                );
            }
            false
        }
        Some((true, _)) => true,
        None => flag,
    }
}

/// Returns the unit the policy fixes for `provider` (`[policy.P] max_steps_unit`) and where it
/// was fixed, e.g. `("item", "/etc/stepguard/stepguard.toml: policy.codex.max_steps_unit")`.
pub(crate) fn policy_unit(config: &LoadedConfig, provider: &str) -> Option<(String, String)> {
    config
        .model
        .policy
        .units
        .get(provider)
        .map(|(unit, origin)| (unit.clone(), origin.to_string()))
}

fn env_setting(var: &str) -> Option<Setting> {
    std::env::var(var)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| Setting::text(v, Origin::Env(var.to_owned())))
}

/// Returns the profile asked for: `--profile`, else `STEPGUARD_PROFILE` (the config's `profile`
/// is below both, in the model).
fn profile_choice(args: &BudgetArgs) -> Option<(String, Origin)> {
    args.profile
        .clone()
        .map(|p| (p, Origin::Flag("--profile".to_owned())))
        .or_else(|| {
            std::env::var(ENV_PROFILE)
                .ok()
                .filter(|p| !p.trim().is_empty())
                .map(|p| (p, Origin::Env(ENV_PROFILE.to_owned())))
        })
}

/// Resolves the loop settings of a command: `--loop-limit` (`loop_limit`),
/// `STEPGUARD_LOOP_LIMIT`, then the config for the task type and profile of `budget` (see
/// [`stepguard_config::loop_settings`]).
pub(crate) fn resolve_loops(
    loop_limit: Option<&str>,
    budget: &BudgetArgs,
    config: &ConfigModel,
) -> anyhow::Result<ResolvedLoops> {
    let request = LoopRequest {
        flag: loop_limit.map(|v| Setting::text(v, Origin::Flag("--loop-limit".to_owned()))),
        env: env_setting(ENV_LOOP_LIMIT),
        profile: profile_choice(budget),
        task_type: budget.task_type.as_deref(),
        config,
    };
    Ok(loop_settings::resolve(&request)?)
}

/// Returns the budget flags of a command (`--max-steps`, `--max-turns`, `--max-tokens`,
/// `--max-cost-usd`) as one level of settings.
fn flag_level(args: &BudgetArgs) -> LevelSettings {
    let flag = |v: &Option<String>, name: &str| {
        v.as_ref()
            .map(|v| Setting::text(v.clone(), Origin::Flag(name.to_owned())))
    };
    LevelSettings {
        max_steps: flag(&args.max_steps, "--max-steps"),
        max_turns: flag(&args.max_turns, "--max-turns"),
        max_tokens: flag(&args.max_tokens, "--max-tokens"),
        max_cost_usd: flag(&args.max_cost_usd, "--max-cost-usd"),
    }
}

/// Returns the budget variables of the environment (`STEPGUARD_MAX_STEPS`,
/// `STEPGUARD_MAX_TURNS`, `STEPGUARD_MAX_TOKENS`, `STEPGUARD_MAX_COST_USD`) as one level.
fn env_level() -> LevelSettings {
    LevelSettings {
        max_steps: env_setting(ENV_MAX_STEPS),
        max_turns: env_setting(ENV_MAX_TURNS),
        max_tokens: env_setting(ENV_MAX_TOKENS),
        max_cost_usd: env_setting(ENV_MAX_COST_USD),
    }
}

/// Builds the budget request for a run from its flags, the environment and the config.
pub(crate) fn budget_request<'a>(
    args: &'a BudgetArgs,
    config: &'a ConfigModel,
) -> BudgetRequest<'a> {
    BudgetRequest {
        flags: flag_level(args),
        env: env_level(),
        profile: profile_choice(args),
        task_type: args.task_type.as_deref(),
        config,
    }
}

/// Builds the token and cost budget request for a run from its flags, the environment and the
/// config.
pub(crate) fn spend_request<'a>(args: &'a BudgetArgs, model: &'a ConfigModel) -> SpendRequest<'a> {
    SpendRequest {
        flags: flag_level(args),
        env: env_level(),
        profile: profile_choice(args),
        task_type: args.task_type.as_deref(),
        config: model,
    }
}

/// Resolves the token and cost budgets of a command: `--max-tokens` / `--max-cost-usd`,
/// `STEPGUARD_MAX_TOKENS` / `STEPGUARD_MAX_COST_USD`, then the config for the task type and
/// profile of `args`, bounded by the policy's ceilings (see [`stepguard_config::spend`]). A bad
/// value is an error naming where it was set (exit 2).
pub(crate) fn resolve_spend(
    args: &BudgetArgs,
    model: &ConfigModel,
) -> anyhow::Result<ResolvedSpend> {
    Ok(spend::resolve(&spend_request(args, model))?)
}

/// Every limit of a command (step budget, loop settings, token and cost budgets), resolved once
/// from its flags, the environment and the config files on `stepguard-config`'s ladder.
#[derive(Debug)]
pub(crate) struct Limits {
    /// The step budget.
    pub budget: ResolvedBudget,
    /// The loop settings.
    pub loops: ResolvedLoops,
    /// The token and cost budgets.
    pub spend: ResolvedSpend,
}

impl Limits {
    /// Resolves every limit: the budget, then the loop settings (`--loop-limit` is
    /// `loop_limit`), then the token and cost budgets; the first bad value is the error.
    pub(crate) fn resolve(
        args: &BudgetArgs,
        loop_limit: Option<&str>,
        model: &ConfigModel,
    ) -> anyhow::Result<Self> {
        Ok(Limits {
            budget: budget::resolve(&budget_request(args, model))?,
            loops: resolve_loops(loop_limit, args, model)?,
            spend: resolve_spend(args, model)?,
        })
    }
}

/// Returns the `[telemetry]` table of the config files in effect as the exporter's settings
/// (the `OTEL_*` environment overrides them key by key).
pub(crate) fn telemetry_settings(model: &ConfigModel) -> stepguard_telemetry::TelemetrySettings {
    let text = |key: &str| {
        model
            .telemetry
            .get(key)
            .and_then(|(v, _)| v.as_str().map(str::to_owned))
    };
    let mut settings = stepguard_telemetry::TelemetrySettings {
        endpoint: text("endpoint"),
        protocol: text("protocol"),
        service_name: text("service_name"),
        flush_timeout: text("flush_timeout").and_then(|t| humantime::parse_duration(&t).ok()),
        ..Default::default()
    };
    if let Some((serde_json::Value::Object(headers), _)) = model.telemetry.get("headers") {
        for (name, value) in headers {
            if let Some(value) = value.as_str() {
                settings.headers.insert(name.clone(), value.to_owned());
            }
        }
    }
    settings
}

/// Returns the run's telemetry exporter when the environment or `[telemetry]` asks for one
/// (nothing is created, and no network touched, otherwise).
pub(crate) fn telemetry(model: &ConfigModel) -> Option<stepguard_telemetry::TelemetryConfig> {
    stepguard_telemetry::TelemetryConfig::resolve(
        |name| std::env::var(name).ok(),
        &telemetry_settings(model),
    )
}

/// The price table in effect: genai-prices' bundled data, with `--prices FILE` over it.
pub(crate) fn price_table(file: Option<&Path>) -> anyhow::Result<stepguard_prices::PriceTable> {
    let builtin = stepguard_prices::PriceTable::builtin();
    Ok(match file {
        Some(path) => stepguard_prices::PriceTable::load_file(path)
            .map_err(|e| crate::exit::UsageError(format!("--prices: {e}")))?
            .merged_over(builtin),
        None => builtin,
    })
}
