//! Counting a stream without a process, and turning a counter's numbers into run stats and
//! records.

use std::io::Read;

use stepguard_core::{FailureSlug, Outcome, RunRecord, RunStats, TokenUsage};
use stepguard_jsonl::{LineSplitter, SplitChunk};
use stepguard_plugin_api::CounterStats;
use stepguard_plugin_api::host::{CallError, Counter};

use crate::spec::RunMeta;

/// A stream that could not be counted.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// Reading the stream failed.
    #[error("cannot read {name}: {source}")]
    Read {
        /// The stream's name (a file path, or `standard input`).
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The provider plugin failed.
    #[error(transparent)]
    Plugin(#[from] CallError),
}

/// What reading one stream produced.
#[derive(Clone, Debug)]
pub struct StreamCount {
    /// The counter's final numbers (oversized lines included in `noise_lines`).
    pub stats: CounterStats,
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
) -> Result<StreamCount, CountError> {
    let mut lines = LineSplitter::new(reader);
    let mut oversized_lines = 0;
    loop {
        let chunk = lines.next_chunk().map_err(|source| CountError::Read {
            name: name.to_owned(),
            source,
        })?;
        match chunk {
            None => break,
            Some(SplitChunk::Lines(bytes)) => {
                counter.feed_chunk(bytes, u64::MAX)?;
            }
            Some(SplitChunk::Oversized(len)) => {
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

/// Converts a counter's final numbers into the core's run stats; a stream without a terminal
/// event is `incomplete` (a supervised run is judged by [`stepguard_core::verdict`] instead).
pub fn run_stats(stats: &CounterStats) -> RunStats {
    let (outcome, slug) = match &stats.terminal {
        None => (Outcome::Incomplete, None),
        Some(t) if t.success => (Outcome::Success, None),
        Some(t) => {
            // A slug this stepguard does not know still means the provider failed.
            let slug = t
                .slug
                .as_deref()
                .and_then(|s| s.parse::<FailureSlug>().ok());
            (
                Outcome::Failed,
                Some(slug.unwrap_or(FailureSlug::ProviderError)),
            )
        }
    };
    RunStats {
        num_steps_reported: stats.num_steps_reported,
        num_steps_computed: Some(stats.num_steps_computed),
        num_turns_reported: stats.num_turns_reported,
        num_turns_computed: stats.num_turns_computed,
        outcome,
        slug,
        duration_ms: None,
        tokens: stats.tokens.map(|t| TokenUsage {
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            cached_input_tokens: t.cached_input_tokens,
            reasoning_output_tokens: t.reasoning_output_tokens,
        }),
        cost_usd: stats.cost_usd,
    }
}

/// Builds the run record of a counted stream: the stats, the stream's own numbers and the
/// run's labels; process fields stay null.
pub fn stream_record(meta: &RunMeta, stats: &RunStats, count: &StreamCount) -> RunRecord {
    let mut record = RunRecord::new(meta.provider.clone(), stats.outcome);
    record.plugin_version = meta.plugin_version.clone();
    record.plugin_source = meta.plugin_source.clone();
    record.unit = meta.unit.clone();
    record.task_type = meta.task_type.clone();
    record.profile = meta.profile.clone();
    record.cwd = meta.cwd.clone();
    record.set_stats(stats);
    let counter = &count.stats;
    record.message = counter.terminal.as_ref().and_then(|t| t.message.clone());
    record.noise_lines = Some(counter.noise_lines);
    record.unknown_events = Some(counter.unknown_events);
    record.oversized_lines = Some(count.oversized_lines);
    record.truncated_last_line = Some(count.truncated_last_line);
    record.sub_agent_steps = Some(counter.sub_agent_steps.clone());
    record
}
