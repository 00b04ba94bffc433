//! `stepguard validate`: check every config file in effect and report each problem.

use std::path::Path;

use stepguard_config::{Diagnostic, Severity};
use stepguard_core::ExitCode;

use crate::args::{Cli, ValidateArgs};
use crate::{output, providers, settings};

/// Runs `stepguard validate`.
pub fn run(cli: &Cli, config_path: Option<&Path>, args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let sources = settings::config_sources(config_path)?;
    if sources.is_empty() {
        output::line(
            "no config file in effect (looked for stepguard.toml here and in parent directories, and the user config file)",
        )?;
        return Ok(ExitCode::Success);
    }
    let (loaded, mut diags) = stepguard_config::load_all(&sources);
    diags.extend(stepguard_config::validate(&loaded, args.strict));
    diags.extend(provider_options(cli, &loaded, args.strict));
    for d in &diags {
        output::line(d.to_string())?;
    }
    let errors = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diags.len() - errors;
    output::line(format!(
        "{} file{} checked: {errors} error{}, {warnings} warning{}",
        sources.len(),
        plural(sources.len()),
        plural(errors),
        plural(warnings)
    ))?;
    Ok(if errors == 0 {
        ExitCode::Success
    } else {
        ExitCode::Usage
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Asks each provider's plugin to check the options of its table, and checks the units of the
/// tables and of the policy.
fn provider_options(
    cli: &Cli,
    loaded: &stepguard_config::LoadedConfig,
    strict: bool,
) -> Vec<Diagnostic> {
    if loaded.model.providers.is_empty() && loaded.model.policy.units.is_empty() {
        return Vec::new();
    }
    let registry = providers::load_registry(&cli.plugin_dir, cli.allow_override);
    let mut out = Vec::new();
    let at = |severity, origin: &stepguard_core::Origin, message: String| match origin {
        stepguard_core::Origin::File { path, key } => Diagnostic {
            severity,
            file: path.clone(),
            key: Some(key.clone()),
            message,
        },
        other => Diagnostic {
            severity,
            file: other.to_string(),
            key: None,
            message,
        },
    };
    for (name, (unit, origin)) in &loaded.model.policy.units {
        let severity = if strict {
            Severity::Error
        } else {
            Severity::Warning
        };
        match registry.get(name) {
            Ok(entry) => {
                let manifest = entry.provider.manifest();
                if !manifest.units.iter().any(|u| u.name == *unit) {
                    out.push(at(
                        Severity::Error,
                        origin,
                        format!(
                            "unknown unit `{unit}` for provider `{name}`; valid units: {}",
                            manifest.unit_names()
                        ),
                    ));
                }
            }
            Err(e) => out.push(at(
                severity,
                origin,
                format!("policy for a provider that is not available: {e}"),
            )),
        }
    }
    for (name, table) in &loaded.model.providers {
        let Some((_, first_origin)) = table.values().next() else {
            continue;
        };
        let provider = match registry.get(name) {
            Ok(entry) => &entry.provider,
            Err(e) => {
                let severity = if strict {
                    Severity::Error
                } else {
                    Severity::Warning
                };
                out.push(at(
                    severity,
                    first_origin,
                    format!("options for a provider that is not available: {e}"),
                ));
                continue;
            }
        };
        let manifest = provider.manifest();
        let mut options = serde_json::Map::new();
        for (key, (value, origin)) in table {
            if key == providers::UNIT_OPTION {
                if !value
                    .as_str()
                    .is_some_and(|u| manifest.units.iter().any(|x| x.name == u))
                {
                    out.push(at(
                        Severity::Error,
                        origin,
                        format!(
                            "unknown unit {value} for provider `{name}`; valid units: {}",
                            manifest.unit_names()
                        ),
                    ));
                }
            } else {
                options.insert(key.clone(), value.clone());
            }
        }
        if let Err(e) = provider.validate_options(&options) {
            out.push(at(
                Severity::Error,
                first_origin,
                format!("invalid options: {}", e.message),
            ));
        }
    }
    out
}
