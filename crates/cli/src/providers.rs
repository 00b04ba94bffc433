//! The provider registry of this process, and how a command picks a provider, unit and options.

use std::path::PathBuf;

use stepguard_config::LoadedConfig;
use stepguard_plugin_api::host::Provider;
use stepguard_plugin_api::{CounterRequest, ProviderBox};
use stepguard_plugin_host::{LoadPolicy, PLUGIN_PATH_ENV, Registry};

use crate::exit::UsageError;
use crate::output;

/// The provider-table key that selects the unit; handled here, not passed to plugins.
pub const UNIT_OPTION: &str = "max_steps_unit";

/// Returns the built-in providers, reached through the plugin interface like loaded ones.
pub fn builtins() -> Vec<ProviderBox> {
    vec![
        stepguard_provider_claude::provider(),
        stepguard_provider_codex::provider(),
        stepguard_provider_gemini::provider(),
    ]
}

/// Builds the registry: built-ins, then every trusted plugin file in the search path; a plugin
/// replaces a built-in of the same name only with `allow_override` (`--allow-override`). Each
/// ignored relative `STEPGUARD_PLUGIN_PATH` entry and each file that is refused or fails to load
/// is reported once on stderr.
pub fn load_registry(plugin_dirs: &[PathBuf], allow_override: bool) -> Registry {
    let mut registry = Registry::new(builtins());
    let env = std::env::var_os(PLUGIN_PATH_ENV);
    let exe = std::env::current_exe().ok();
    let search = stepguard_plugin_host::plugin_dirs(plugin_dirs, env.as_deref(), exe.as_deref());
    for ignored in &search.ignored {
        output::diag("warning", ignored.to_string());
    }
    registry.load_dirs_with(&search.dirs, LoadPolicy { allow_override });
    for failure in registry.failures() {
        output::diag("warning", failure.to_string());
    }
    registry
}

/// A provider chosen for one command, with the counter request to open.
pub struct Selection<'r> {
    /// The provider.
    pub provider: &'r Provider,
    /// Where it came from: `builtin` or the plugin file.
    pub source: String,
    /// The unit and options to count with.
    pub request: CounterRequest,
}

/// Picks the provider, the unit (`--unit`, else `[P] max_steps_unit`, else the default) and the
/// provider options (`[P]` table), validating the unit and asking the plugin to check options.
pub fn select<'r>(
    registry: &'r Registry,
    name: &str,
    unit_flag: Option<&str>,
    config: Option<&LoadedConfig>,
) -> anyhow::Result<Selection<'r>> {
    let entry = registry.get(name)?;
    let provider = &entry.provider;
    let manifest = provider.manifest();
    let mut options = serde_json::Map::new();
    let mut unit_from_config = None;
    if let Some(table) = config.and_then(|c| c.model.providers.get(name)) {
        for (key, (value, origin)) in table {
            if key == UNIT_OPTION {
                let unit = value.as_str().ok_or_else(|| {
                    UsageError(format!("{origin}: expected a unit name (a string)"))
                })?;
                unit_from_config = Some((unit.to_owned(), origin.to_string()));
            } else {
                options.insert(key.clone(), value.clone());
            }
        }
    }
    let fixed = config.and_then(|c| crate::settings::policy_unit(c, name));
    if let Some((fixed, policy)) = &fixed {
        let asked = unit_flag
            .map(|u| (u.to_owned(), "--unit".to_owned()))
            .or_else(|| unit_from_config.clone());
        if let Some((asked, from)) = asked.filter(|(u, _)| u != fixed) {
            return Err(UsageError(format!(
                "unit `{asked}` (from {from}) is not allowed: the policy at {policy} fixes the unit of `{name}` to `{fixed}`"
            ))
            .into());
        }
    }
    let (unit, from) = match (unit_flag, unit_from_config, fixed) {
        (Some(u), _, _) => (u.to_owned(), "--unit".to_owned()),
        (None, Some((u, origin)), _) => (u, origin),
        (None, None, Some((u, policy))) => (u, policy),
        (None, None, None) => (
            manifest.default_unit().unwrap_or_default().to_owned(),
            "default".to_owned(),
        ),
    };
    if !manifest.units.iter().any(|u| u.name == unit) {
        return Err(UsageError(format!(
            "unknown unit `{unit}` for provider `{name}` (from {from}); valid units: {}",
            manifest.unit_names()
        ))
        .into());
    }
    provider.validate_options(&options).map_err(|e| {
        UsageError(format!(
            "invalid options for provider `{name}`: {}",
            e.message
        ))
    })?;
    Ok(Selection {
        provider,
        source: entry.source.to_string(),
        request: CounterRequest { unit, options },
    })
}
