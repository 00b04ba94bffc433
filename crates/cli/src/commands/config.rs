//! `stepguard config`: the effective budget, its source, provider options and warnings.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use stepguard_core::{ExitCode, StepLimit, budget};

use crate::args::ConfigArgs;
use crate::{output, settings};

#[derive(Serialize)]
struct ConfigReport<'a> {
    max_steps: StepLimit,
    source: &'a str,
    source_file: Option<&'a str>,
    profile: Option<&'a str>,
    task_type: Option<&'a str>,
    provider: Option<&'a str>,
    config_files: Vec<&'a str>,
    provider_options: BTreeMap<&'a str, BTreeMap<&'a str, &'a serde_json::Value>>,
    warnings: Vec<String>,
}

/// Runs `stepguard config`.
pub fn run(config_path: Option<&Path>, args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let loaded = settings::load_config(config_path)?;
    let resolved = budget::resolve(&settings::budget_request(&args.budget, &loaded.model))?;
    let mut warnings: Vec<String> = loaded.diagnostics().map(|d| d.to_string()).collect();
    warnings.extend(resolved.warnings.iter().cloned());
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
    let report = ConfigReport {
        max_steps: resolved.max_steps,
        source: &resolved.source,
        source_file: resolved.source_file.as_deref(),
        profile: resolved.profile.as_deref(),
        task_type: args.budget.task_type.as_deref(),
        provider: args.provider.as_deref(),
        config_files: loaded.files.iter().map(|f| f.path.as_str()).collect(),
        provider_options,
        warnings,
    };
    if args.json {
        output::json(&report)?;
        return Ok(ExitCode::Success);
    }
    let from = match report.source_file {
        Some(file) => format!("{} in {file}", report.source),
        None => report.source.to_owned(),
    };
    output::line(format!("max_steps: {} (from {from})", report.max_steps))?;
    if let Some(explicit) = resolved.explicit_max_steps {
        output::line(format!(
            "  explicit budget {explicit}, bounded by the profile"
        ))?;
    }
    output::line(format!("profile: {}", report.profile.unwrap_or("none")))?;
    output::line(format!("task type: {}", report.task_type.unwrap_or("none")))?;
    if report.config_files.is_empty() {
        output::line("config files: none found")?;
    } else {
        output::line("config files:")?;
        for f in &report.config_files {
            output::line(format!("  {f}"))?;
        }
    }
    for (provider, opts) in &report.provider_options {
        output::line(format!("[{provider}] options:"))?;
        for (k, v) in opts {
            output::line(format!("  {k} = {v}"))?;
        }
    }
    for w in &report.warnings {
        output::diag("warning", w.strip_prefix("warning: ").unwrap_or(w));
    }
    Ok(ExitCode::Success)
}
