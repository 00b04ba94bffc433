//! `stepguard count`: apply a provider's step mapping to recorded streams.

use std::fs::File;
use std::io;
use std::path::Path;

use anyhow::Context as _;
use stepguard_core::loops::LoopSettings;
use stepguard_core::{ExitCode, RunRecord};
use stepguard_runner::{
    CountError, RunMeta, StreamCount, count_stream_with_loops, run_stats, stream_record,
};

use crate::args::{Cli, CountArgs};
use crate::session::Session;
use crate::{output, plan, providers, settings};

/// Runs `stepguard count`.
pub(crate) fn run(cli: &Cli, args: &CountArgs) -> anyhow::Result<ExitCode> {
    let session = Session::load(cli)?;
    let config = &session.config;
    let selection = plan::provider(&session, &args.provider, args.unit.as_deref())?;
    if selection.request.unit == stepguard_plugin_api::host::REQUEST_UNIT {
        return Err(crate::exit::UsageError(format!(
            "unit `{}` counts model calls, which only the model gateway of `run --wrap-up` \
             sees; a recorded stream has none: count another unit of {}",
            selection.request.unit,
            selection.provider.manifest().unit_names()
        ))
        .into());
    }
    // No task type or profile flags here: `STEPGUARD_PROFILE` and the config's `profile` apply.
    let loops = settings::resolve_loops(
        args.loops.loop_limit.as_deref(),
        &crate::args::BudgetArgs::default(),
        &config.model,
    )?;
    for w in &loops.warnings {
        output::diag("warning", w);
    }
    let manifest = selection.provider.manifest();
    let settings = plan::loop_settings(manifest, &loops);
    let mut failed = false;
    for path in &args.files {
        match count_file(&selection, path, settings.clone()) {
            Ok(count) => {
                let record = record(&selection, path, &count);
                if let Some(refusal) = count.recognition.refused {
                    output::diag(
                        "warning",
                        format!("{}: {}", path.display(), refusal.message()),
                    );
                } else if count.recognition.mostly_unrecognised() {
                    output::diag(
                        "warning",
                        format!(
                            "{}: {}",
                            path.display(),
                            count.recognition.mostly_unrecognised_message()
                        ),
                    );
                } else if count.recognition.failed() {
                    let manifest = selection.provider.manifest();
                    let lines = count.recognition.lines;
                    output::diag(
                        "warning",
                        format!(
                            "{}: none of its {lines} line{} was recognised as a {} stream (expected {}); is `--provider` right?",
                            path.display(),
                            if lines == 1 { "" } else { "s" },
                            manifest.name,
                            if manifest.expects.is_empty() {
                                "the plugin's event stream"
                            } else {
                                manifest.expects.as_str()
                            }
                        ),
                    );
                }
                if args.json {
                    output::json(&record)?;
                } else {
                    let noise = count.stats.noise_lines;
                    output::line(format!(
                        "{}: {} (provider {}, unit {}, {noise} noise line{}){}",
                        path.display(),
                        record.summary_line(),
                        record.source.provider,
                        selection.request.unit,
                        if noise == 1 { "" } else { "s" },
                        super::history::loops_brief(
                            record.supervision.loops.as_deref().unwrap_or_default()
                        )
                    ))?;
                }
            }
            Err(e)
                if e.chain()
                    .any(|c| c.is::<stepguard_plugin_api::host::CallError>()) =>
            {
                return Err(e);
            }
            Err(e) => {
                // Like wc: report the file, go on with the others, fail at the end.
                if args.json {
                    output::json(&crate::exit::error_object(&e))?;
                } else {
                    output::diag("error", crate::exit::render(&e));
                }
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::Usage
    } else {
        ExitCode::Success
    })
}

fn count_file(
    selection: &providers::Selection<'_>,
    path: &Path,
    loops: Option<LoopSettings>,
) -> anyhow::Result<StreamCount> {
    let mut request = selection.request.clone();
    if loops.is_none() {
        // Nothing looks for loops: the counter need not find tool calls, nothing keeps them.
        request = request.without_tool_calls();
    }
    let mut counter = selection.provider.open_counter(&request)?;
    let counted = if path == Path::new("-") {
        count_stream_with_loops(&mut counter, io::stdin().lock(), "standard input", loops)
    } else {
        let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        if file.metadata().is_ok_and(|m| m.is_dir()) {
            return Err(
                anyhow::Error::from(io::Error::from(io::ErrorKind::IsADirectory))
                    .context(format!("cannot read {}", path.display())),
            );
        }
        count_stream_with_loops(&mut counter, file, &path.display().to_string(), loops)
    };
    counted.map_err(|e| match e {
        // Kept as its own type: a plugin failure is exit 4, not a file problem.
        CountError::Plugin(e) => anyhow::Error::from(e),
        e @ CountError::Read { .. } => anyhow::Error::from(e),
    })
}

/// The run record of one counted file: process fields null.
fn record(selection: &providers::Selection<'_>, path: &Path, count: &StreamCount) -> RunRecord {
    let manifest = selection.provider.manifest();
    let meta = RunMeta {
        provider: manifest.name.clone(),
        plugin_version: Some(manifest.version.clone()),
        plugin_source: Some(selection.source.clone()),
        unit: Some(selection.request.unit.clone()),
        ..RunMeta::default()
    };
    let mut record = stream_record(&meta, &run_stats(&count.stats), count);
    record.file = Some(path.display().to_string());
    record
}
