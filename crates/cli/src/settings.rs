//! Turns global flags, the environment and config files into the inputs of budget resolution.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use stepguard_config::{ConfigError, LoadedConfig};
use stepguard_core::{BudgetRequest, ConfigModel, LevelSettings, Origin, Setting};

use crate::args::BudgetArgs;

/// Environment variable holding the per-run budget (below `--max-steps`).
pub const ENV_MAX_STEPS: &str = "STEPGUARD_MAX_STEPS";
/// Deprecated environment spelling of [`ENV_MAX_STEPS`].
pub const ENV_MAX_TURNS: &str = "STEPGUARD_MAX_TURNS";
/// Environment variable selecting a profile (below `--profile`).
pub const ENV_PROFILE: &str = "STEPGUARD_PROFILE";

/// Returns the config files in effect: `--config`, else discovery from the working directory.
pub fn config_paths(explicit: Option<&Path>) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(path) = explicit {
        if !path.is_file() {
            return Err(ConfigError::Read {
                path: path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            }
            .into());
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let cwd = std::env::current_dir().context("failed to read the working directory")?;
    Ok(stepguard_config::discover(
        &cwd,
        stepguard_config::user_config_path().as_deref(),
    ))
}

/// Loads and merges the config files in effect.
pub fn load_config(explicit: Option<&Path>) -> anyhow::Result<LoadedConfig> {
    Ok(stepguard_config::load(&config_paths(explicit)?)?)
}

fn env_setting(var: &str) -> Option<Setting> {
    std::env::var(var)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| Setting::text(v, Origin::Env(var.to_owned())))
}

/// Builds the budget request for a run from its flags, the environment and the config.
pub fn budget_request<'a>(args: &'a BudgetArgs, config: &'a ConfigModel) -> BudgetRequest<'a> {
    let flag = |v: &Option<String>, name: &str| {
        v.as_ref()
            .map(|v| Setting::text(v.clone(), Origin::Flag(name.to_owned())))
    };
    let profile = args
        .profile
        .clone()
        .map(|p| (p, Origin::Flag("--profile".to_owned())))
        .or_else(|| {
            std::env::var(ENV_PROFILE)
                .ok()
                .filter(|p| !p.trim().is_empty())
                .map(|p| (p, Origin::Env(ENV_PROFILE.to_owned())))
        });
    BudgetRequest {
        flags: LevelSettings {
            max_steps: flag(&args.max_steps, "--max-steps"),
            max_turns: flag(&args.max_turns, "--max-turns"),
        },
        env: LevelSettings {
            max_steps: env_setting(ENV_MAX_STEPS),
            max_turns: env_setting(ENV_MAX_TURNS),
        },
        profile,
        task_type: args.task_type.as_deref(),
        config,
    }
}
