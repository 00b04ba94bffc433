//! `stepguard plugins` and `stepguard plugins check PATH`.

use serde::Serialize;
use stepguard_core::ExitCode;
use stepguard_plugin_api::{Manifest, ModelEndpoint, NativeLimit, OptionInfo, UnitInfo};
use stepguard_plugin_host::Needed;

use crate::args::{Cli, PluginsAction, PluginsArgs};
use crate::{output, providers};

#[derive(Serialize)]
struct PluginReport<'a> {
    name: &'a str,
    version: &'a str,
    protocol: &'a str,
    description: &'a str,
    source: String,
    replaces_builtin: bool,
    units: &'a [UnitInfo],
    options: &'a [OptionInfo],
    native_limit: Option<&'a NativeLimit>,
    /// Whether the provider reports tool calls, which loop detection needs (protocol 1.3).
    tool_calls: bool,
    /// How its CLI reaches its model, which `--wrap-up` needs (protocol 1.4).
    model_endpoint: Option<&'a ModelEndpoint>,
}

/// Runs `stepguard plugins`.
pub(crate) fn run(cli: &Cli, args: &PluginsArgs) -> anyhow::Result<ExitCode> {
    match &args.action {
        Some(PluginsAction::Check { path }) => return check(path),
        Some(PluginsAction::New {
            name,
            dir,
            api_path,
        }) => return super::plugin_template::run(name, dir.as_deref(), api_path.as_deref()),
        None => {}
    }
    let registry = providers::load_registry(&cli.plugin_dir, cli.allow_override, Needed::All);
    // Listing plugins is the one place every refused file is news: one line each.
    for failure in registry.failures() {
        providers::warn_failure(failure);
    }
    let reports: Vec<PluginReport<'_>> = registry
        .entries()
        .map(|e| {
            let m = e.provider.manifest();
            PluginReport {
                name: &m.name,
                version: &m.version,
                protocol: &m.protocol,
                description: &m.description,
                source: e.source.to_string(),
                replaces_builtin: e.replaces_builtin,
                units: &m.units,
                options: &m.options,
                native_limit: m.native_limit.as_ref(),
                tool_calls: m.tool_calls,
                model_endpoint: m.model_endpoint.as_ref(),
            }
        })
        .collect();
    if args.json {
        output::json(&reports)?;
        return Ok(ExitCode::Success);
    }
    for r in &reports {
        let replaced = if r.replaces_builtin {
            " (replaces the built-in)"
        } else {
            ""
        };
        output::line(format!(
            "{} {} (protocol {}) from {}{replaced}",
            r.name, r.version, r.protocol, r.source
        ))?;
        if !r.description.is_empty() {
            output::line(format!("  {}", r.description))?;
        }
        for u in r.units {
            let default = if u.default { " (default)" } else { "" };
            output::line(format!("  unit {}{default}: {}", u.name, u.description))?;
        }
        for o in r.options {
            output::line(format!("  option {}: {}", o.name, o.description))?;
        }
        if let Some(limit) = r.native_limit {
            output::line(format!("  native limit: adds `{}`", limit.args.join(" ")))?;
        }
        output::line(format!("  loop detection: {}", loop_detection(r)))?;
        output::line(format!("  wrap-up: {}", wrap_up(r)))?;
    }
    Ok(ExitCode::Success)
}

/// Says whether loops can be detected in the provider's runs, and why not.
fn loop_detection(r: &PluginReport<'_>) -> &'static str {
    if r.tool_calls {
        return "yes";
    }
    if protocol_below(r.protocol, (1, 3)) {
        "no (plugin protocol < 1.3)"
    } else {
        "no (the plugin does not report tool calls)"
    }
}

/// Says whether `--wrap-up` works with the provider: its dialect, or why not.
fn wrap_up(r: &PluginReport<'_>) -> String {
    match r.model_endpoint {
        Some(e) => format!("yes ({} model calls, via the gateway)", e.dialect),
        None if protocol_below(r.protocol, (1, 4)) => "no (plugin protocol < 1.4)".into(),
        None => "no (the plugin declares no model endpoint)".into(),
    }
}

fn protocol_below(protocol: &str, than: (u64, u64)) -> bool {
    let mut parts = protocol.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < than
}

fn check(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    match stepguard_plugin_host::check_file(path) {
        Ok(manifest) => {
            output::line(format!(
                "{}: loads: {}",
                path.display(),
                describe(&manifest)
            ))?;
            Ok(ExitCode::Success)
        }
        Err(e) => {
            // One line; a long reason's full text (abi_stable's layout report) under `-v`.
            output::line(format!("{}: does not load: {e}", path.display()))?;
            if let Some(details) = e.details() {
                tracing::info!("plugin {}: {details}", path.display());
            }
            Ok(ExitCode::Plugin)
        }
    }
}

fn describe(m: &Manifest) -> String {
    format!(
        "provider `{}` {} (protocol {}), units: {} (default {})",
        m.name,
        m.version,
        m.protocol,
        m.unit_names(),
        m.default_unit().unwrap_or("none")
    )
}
