//! `stepguard validate`: check every config file in effect and report each problem.

use std::path::Path;

use stepguard_config::Severity;
use stepguard_core::ExitCode;

use crate::args::ValidateArgs;
use crate::{output, settings};

/// Runs `stepguard validate`.
pub fn run(config_path: Option<&Path>, args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let paths = settings::config_paths(config_path)?;
    if paths.is_empty() {
        output::line(
            "no config file in effect (looked for stepguard.toml here and in parent directories, and the user config file)",
        )?;
        return Ok(ExitCode::Success);
    }
    let (loaded, mut diags) = stepguard_config::load_all(&paths);
    diags.extend(stepguard_config::validate(&loaded, args.strict));
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
        paths.len(),
        plural(paths.len()),
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
