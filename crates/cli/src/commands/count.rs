//! `stepguard count`: apply a provider's step mapping to recorded streams.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;
use stepguard_core::{ExitCode, TokenUsage};
use stepguard_jsonl::{LineSplitter, SplitChunk};
use stepguard_plugin_api::host::Counter;

use crate::args::{Cli, CountArgs};
use crate::{output, providers, settings};

/// The `count --json` object for one file.
#[derive(Debug, Serialize)]
pub struct FileReport<'a> {
    file: String,
    #[serde(flatten)]
    stream: StreamReport<'a>,
}

/// What a stream's counts and outcome were: the fields `count --json` and `run --summary-file`
/// share.
#[derive(Debug, Serialize)]
pub struct StreamReport<'a> {
    provider: &'a str,
    unit: &'a str,
    num_steps_computed: Option<u64>,
    num_steps_reported: Option<u64>,
    num_turns_reported: Option<u64>,
    num_turns_computed: Option<u64>,
    outcome: &'static str,
    error_type: Option<&'static str>,
    message: Option<String>,
    noise_lines: u64,
    unknown_events: u64,
    oversized_lines: u64,
    truncated_last_line: bool,
    tokens: Option<TokenUsage>,
    cost_usd: Option<f64>,
    sub_agent_steps: BTreeMap<String, u64>,
}

impl<'a> StreamReport<'a> {
    /// Builds the report from the run's stats and the counter's own numbers.
    pub fn new(
        provider: &'a str,
        unit: &'a str,
        stats: &stepguard_core::RunStats,
        counter: &stepguard_plugin_api::CounterStats,
        oversized_lines: u64,
        truncated_last_line: bool,
    ) -> Self {
        StreamReport {
            provider,
            unit,
            num_steps_computed: stats.num_steps_computed,
            num_steps_reported: stats.num_steps_reported,
            num_turns_reported: stats.num_turns_reported,
            num_turns_computed: stats.num_turns_computed,
            outcome: stats.outcome.as_str(),
            error_type: stats.slug.map(|s| s.as_str()),
            message: counter.terminal.as_ref().and_then(|t| t.message.clone()),
            noise_lines: counter.noise_lines,
            unknown_events: counter.unknown_events,
            oversized_lines,
            truncated_last_line,
            tokens: stats.tokens,
            cost_usd: stats.cost_usd,
            sub_agent_steps: counter.sub_agent_steps.clone(),
        }
    }
}

/// What reading one stream produced.
pub struct StreamCount {
    /// The counter's final numbers.
    pub stats: stepguard_plugin_api::CounterStats,
    /// Lines over the length cap (counted as noise, content skipped).
    pub oversized_lines: u64,
    /// True when the last line had no newline (a cut stream).
    pub truncated_last_line: bool,
}

/// Feeds a whole stream through a counter, a run of whole lines per boundary crossing; `name`
/// labels read errors.
pub fn count_stream(
    counter: &mut Counter,
    reader: impl Read,
    name: &str,
) -> anyhow::Result<StreamCount> {
    let mut lines = LineSplitter::new(reader);
    let mut oversized_lines = 0;
    while let Some(chunk) = lines
        .next_chunk()
        .with_context(|| format!("cannot read {name}"))?
    {
        match chunk {
            SplitChunk::Lines(bytes) => {
                counter.feed_chunk(bytes, u64::MAX)?;
            }
            SplitChunk::Oversized(len) => {
                oversized_lines += 1;
                tracing::warn!(
                    bytes = len,
                    "skipped a line longer than the {} MiB cap",
                    stepguard_jsonl::MAX_LINE_BYTES >> 20
                );
            }
        }
    }
    let mut stats = counter.finish()?;
    stats.noise_lines += oversized_lines;
    Ok(StreamCount {
        stats,
        oversized_lines,
        truncated_last_line: lines.last_line_unterminated,
    })
}

/// Runs `stepguard count`.
pub fn run(cli: &Cli, args: &CountArgs) -> anyhow::Result<ExitCode> {
    let config = settings::load_config(cli.config.as_deref())?;
    let registry = providers::load_registry(&cli.plugin_dir);
    let selection = providers::select(
        &registry,
        &args.provider,
        args.unit.as_deref(),
        Some(&config),
    )?;
    let mut failed = false;
    for path in &args.files {
        match count_file(&selection, path) {
            Ok(count) => {
                let report = report(&args.provider, &selection.request.unit, path, &count);
                if args.json {
                    output::json(&report)?;
                } else {
                    let stats = providers::run_stats(&count.stats);
                    output::line(format!(
                        "{}: {} (provider {}, unit {}, {} noise line{})",
                        report.file,
                        stats.summary_line(),
                        report.stream.provider,
                        report.stream.unit,
                        report.stream.noise_lines,
                        if report.stream.noise_lines == 1 {
                            ""
                        } else {
                            "s"
                        }
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
                output::diag("error", format!("{e:#}"));
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

fn count_file(selection: &providers::Selection<'_>, path: &Path) -> anyhow::Result<StreamCount> {
    let mut counter = selection.provider.open_counter(&selection.request)?;
    if path == Path::new("-") {
        return count_stream(&mut counter, io::stdin().lock(), "standard input");
    }
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        anyhow::bail!("cannot read {}: is a directory", path.display());
    }
    count_stream(&mut counter, file, &path.display().to_string())
}

fn report<'a>(
    provider: &'a str,
    unit: &'a str,
    path: &Path,
    count: &StreamCount,
) -> FileReport<'a> {
    let stats = providers::run_stats(&count.stats);
    FileReport {
        file: path.display().to_string(),
        stream: StreamReport::new(
            provider,
            unit,
            &stats,
            &count.stats,
            count.oversized_lines,
            count.truncated_last_line,
        ),
    }
}
