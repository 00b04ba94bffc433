//! `stepguard validate`: check every config file in effect and report each problem.

use std::path::Path;

use serde::Serialize;
use stepguard_config::{Diagnostic, Severity};
use stepguard_core::ExitCode;

use crate::args::{Cli, ValidateArgs};
use crate::{output, providers, settings};

/// What `validate --json` prints: one object.
#[derive(Serialize)]
struct ValidateReport<'a> {
    /// True when there is no error (exit 0).
    valid: bool,
    /// The config files checked, highest precedence first.
    files: Vec<String>,
    errors: Vec<Problem<'a>>,
    warnings: Vec<Problem<'a>>,
}

/// One problem: the file, the dotted key (null when the problem is the whole file) and what is
/// wrong.
#[derive(Serialize)]
struct Problem<'a> {
    file: &'a str,
    key: Option<&'a str>,
    message: &'a str,
}

impl<'a> From<&'a Diagnostic> for Problem<'a> {
    fn from(d: &'a Diagnostic) -> Self {
        Problem {
            file: &d.file,
            key: d.key.as_deref(),
            message: &d.message,
        }
    }
}

/// Runs `stepguard validate`.
pub(crate) fn run(
    cli: &Cli,
    config_path: Option<&Path>,
    args: &ValidateArgs,
) -> anyhow::Result<ExitCode> {
    let sources = settings::config_sources(config_path)?;
    let files: Vec<String> = sources
        .iter()
        .map(|s| s.path.display().to_string())
        .collect();
    let mut diags = Vec::new();
    if !sources.is_empty() {
        let (loaded, failures) = stepguard_config::load_all(&sources);
        diags.extend(failures);
        diags.extend(stepguard_config::validate(&loaded, args.strict));
        let registry =
            crate::session::load_registry(cli, &loaded, stepguard_plugin_host::Needed::All);
        diags.extend(providers::check_config(&registry, &loaded.model, None));
    }
    if args.strict {
        for d in &mut diags {
            d.severity = Severity::Error;
        }
    }
    let (errors, warnings): (Vec<&Diagnostic>, Vec<&Diagnostic>) =
        diags.iter().partition(|d| d.severity == Severity::Error);
    let code = if errors.is_empty() {
        ExitCode::Success
    } else {
        ExitCode::Usage
    };
    if args.json {
        output::json(&ValidateReport {
            valid: errors.is_empty(),
            files,
            errors: errors.into_iter().map(Problem::from).collect(),
            warnings: warnings.into_iter().map(Problem::from).collect(),
        })?;
        return Ok(code);
    }
    if sources.is_empty() {
        output::line(
            "no config file in effect (looked for stepguard.toml here and in parent directories, and the user config file)",
        )?;
        return Ok(code);
    }
    for d in &diags {
        output::line(d.to_string())?;
    }
    let (errors, warnings) = (errors.len(), warnings.len());
    output::line(format!(
        "{} file{} checked: {errors} error{}, {warnings} warning{}",
        sources.len(),
        plural(sources.len()),
        plural(errors),
        plural(warnings)
    ))?;
    Ok(code)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
