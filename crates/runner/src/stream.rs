//! Counting a stream without a process, and turning a counter's numbers into run stats and
//! records.

use std::io::Read;

use stepguard_core::loops::{Call, LoopDetector, LoopFound, LoopSettings, Outcome};
use stepguard_core::verdict::{RunFacts, StreamVerdict, classify};
use stepguard_core::{FailureSlug, RunRecord, RunStats, TokenUsage};
use stepguard_jsonl::{Framing, HostileFraming, LineSplitter, SplitChunk};
use stepguard_plugin_api::host::{CallError, Counter};
use stepguard_plugin_api::{ChunkReport, CounterStats, LineReport};

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
    /// Whether any line was recognised as the provider's stream.
    pub recognition: Recognition,
    /// The loops found in the tool calls, in order; `None` when loops were not looked for.
    pub loops: Option<Vec<LoopFound>>,
}

/// Loop detection over the tool calls a counter reports, chunk by chunk.
#[derive(Debug)]
pub(crate) struct LoopWatch {
    detector: LoopDetector,
    /// Every loop found so far, in order.
    pub found: Vec<LoopFound>,
}

impl LoopWatch {
    pub fn new(settings: LoopSettings) -> Self {
        LoopWatch {
            detector: LoopDetector::new(settings),
            found: Vec::new(),
        }
    }

    /// After a chunk whose lines carried tool calls or results, asks the counter for them (one
    /// call each per chunk, never per line) and returns the first loop they complete. The
    /// detector then starts afresh, so a later loop is found on its own.
    ///
    /// Each call is taken to be made in the step the plugin stamped it with, else in `step`.
    /// Within a chunk, calls are seen before results; by progress only results complete a
    /// loop, so how the stream was chunked changes nothing.
    pub fn after_chunk(
        &mut self,
        counter: &mut Counter,
        chunk: &ChunkReport,
        step: u64,
    ) -> Result<Option<LoopFound>, CallError> {
        let calls = if chunk.sum.has(LineReport::TOOL_CALL) {
            counter.tool_calls()?
        } else {
            Vec::new()
        };
        let results = if chunk.sum.has(LineReport::TOOL_RESULT) {
            counter.tool_results()?
        } else {
            Vec::new()
        };
        if !results.is_empty() {
            self.detector.judge_by_progress();
        }
        let mut first = None;
        for call in calls {
            let call = Call {
                tool: call.tool,
                fingerprint: call.fingerprint,
                program: call.program,
                id: call.id,
                step: call.step.unwrap_or(step),
            };
            let found = self.detector.call(call);
            self.keep(found, &mut first);
        }
        for result in results {
            let found = self.detector.result(&Outcome {
                call_id: result.call_id,
                fingerprint: result.fingerprint,
                failed: result.failed,
            });
            self.keep(found, &mut first);
        }
        Ok(first)
    }

    /// Keeps a loop found, and looks afresh for the next.
    fn keep(&mut self, found: Option<LoopFound>, first: &mut Option<LoopFound>) {
        if let Some(found) = found {
            self.detector.reset();
            self.found.push(found.clone());
            first.get_or_insert(found);
        }
    }
}

/// Unrecognised lines a recognised stream may hold before the whole-run rule applies: the
/// same 50 lines the start's window allows.
pub const MOSTLY_UNRECOGNISED_MIN: u64 = 50;

/// Whether a stream has shown itself to be the provider's, judged over the whole run: at least
/// one line was an event the provider's mapping knows (not noise, not an unknown event type),
/// and the lines that were not are no more than half of its output (or fewer than
/// [`MOSTLY_UNRECOGNISED_MIN`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recognition {
    /// Lines seen so far (oversized ones included).
    pub lines: u64,
    /// True once a line was recognised.
    pub recognised: bool,
    /// Lines that were not the provider's events: noise, oversized lines, and unknown events
    /// (seen line by line until the first recognised one; after it, from the counter's totals).
    pub unrecognised: u64,
    /// The first line framed to hide events, when one came: such output is refused.
    pub refused: Option<Refusal>,
}

/// A line refused for its framing ([`stepguard_jsonl::framing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The line's number in the stream (from 1).
    pub line: u64,
    /// How it was framed.
    pub framing: HostileFraming,
}

impl Refusal {
    /// Says why the output was refused (the record's message).
    pub fn message(&self) -> String {
        format!(
            "line {} of the agent's output has {}: a stream framed to hide events cannot be counted",
            self.line,
            self.framing.describe()
        )
    }
}

impl Recognition {
    /// Returns true when lines were seen and none of them was recognised, or when most of a
    /// recognised stream was not: either way the run was not counted and is not a success.
    pub fn failed(&self) -> bool {
        (self.lines > 0 && !self.recognised) || self.mostly_unrecognised() || self.refused.is_some()
    }

    /// Returns true when a recognised stream holds at least [`MOSTLY_UNRECOGNISED_MIN`]
    /// unrecognised lines and they are more than half of its lines: text after a valid start
    /// (tool calls written as plain text) is output stepguard cannot count.
    pub fn mostly_unrecognised(&self) -> bool {
        self.recognised
            && self.unrecognised >= MOSTLY_UNRECOGNISED_MIN
            && self.unrecognised.saturating_mul(2) > self.lines
    }

    /// Takes the counter's final totals into account: unknown events after the first
    /// recognised line are only known from them (a chunk reports its noise lines, not its
    /// unknown events). `stats.noise_lines` must include the oversized lines.
    pub fn settle(&mut self, stats: &CounterStats) {
        let total = stats.noise_lines.saturating_add(stats.unknown_events);
        self.unrecognised = self.unrecognised.max(total.min(self.lines));
    }

    /// Says why a mostly unrecognised stream is not counted (the record's message).
    pub fn mostly_unrecognised_message(&self) -> String {
        format!(
            "{} of the agent's {} lines of output were not the provider's events (noise or unknown events): output stepguard cannot count is not a success",
            self.unrecognised, self.lines
        )
    }

    /// Returns true when not one line was seen: silence, which is no stream either.
    pub fn silent(&self) -> bool {
        self.lines == 0
    }

    /// Returns true when `report` says its line was one of the provider's events.
    pub fn recognises(report: &LineReport) -> bool {
        report.steps_begun > 0
            || report.steps_completed > 0
            || report.turns > 0
            || report.sub_agent_steps > 0
            || report.has(LineReport::TERMINAL)
            || !(report.has(LineReport::NOISE) || report.has(LineReport::UNKNOWN_EVENT))
    }

    /// Feeds a run of whole lines as [`Counter::feed_chunk`] does, stopping after the line whose
    /// steps exceed `allowance`, and judges the framing of every line it consumed. Until a line is recognised, lines cross the boundary one at a
    /// time (a chunk's summed report cannot say which line was which); then the rest of the
    /// run crosses at once.
    pub fn feed(
        &mut self,
        counter: &mut Counter,
        bytes: &[u8],
        allowance: u64,
    ) -> Result<ChunkReport, CallError> {
        let first_line = self.lines;
        let report = self.feed_lines(counter, bytes, allowance)?;
        if self.refused.is_none() {
            let consumed =
                usize::try_from(report.consumed).map_or(bytes, |n| &bytes[..n.min(bytes.len())]);
            self.refused = first_hostile(consumed).map(|(i, framing)| Refusal {
                line: first_line + i + 1,
                framing,
            });
        }
        Ok(report)
    }

    fn feed_lines(
        &mut self,
        counter: &mut Counter,
        bytes: &[u8],
        allowance: u64,
    ) -> Result<ChunkReport, CallError> {
        if self.recognised {
            let report = counter.feed_chunk(bytes, allowance)?;
            self.lines += report.lines;
            self.unrecognised += report.noise_lines;
            return Ok(report);
        }
        let mut out = ChunkReport::default();
        let mut begun: u64 = 0;
        let mut rest = bytes;
        while !rest.is_empty() {
            let (line, taken) = match memchr::memchr(b'\n', rest) {
                Some(nl) => (&rest[..nl], nl + 1),
                None => (rest, rest.len()),
            };
            rest = &rest[taken..];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let r = counter.feed(line)?;
            self.lines += 1;
            self.unrecognised += u64::from(!Self::recognises(&r));
            out.consumed += taken as u64;
            out.lines += 1;
            out.noise_lines += u64::from(r.has(LineReport::NOISE));
            stepguard_plugin_api::guest::add_report(&mut out.sum, &r);
            begun += u64::from(r.steps_begun);
            if begun > allowance {
                out.stopped = true;
                return Ok(out);
            }
            if Self::recognises(&r) {
                self.recognised = true;
                if !rest.is_empty() {
                    let more = counter.feed_chunk(rest, allowance - begun)?;
                    self.lines += more.lines;
                    self.unrecognised += more.noise_lines;
                    out.consumed += more.consumed;
                    out.lines += more.lines;
                    out.noise_lines += more.noise_lines;
                    stepguard_plugin_api::guest::add_report(&mut out.sum, &more.sum);
                    out.stopped = more.stopped;
                }
                return Ok(out);
            }
        }
        Ok(out)
    }
}

/// The first line of `bytes` (whole lines) framed to hide events: its index and framing.
fn first_hostile(bytes: &[u8]) -> Option<(u64, HostileFraming)> {
    // Lines found with memchr: a byte-by-byte split cost a third of counting.
    let mut start = 0;
    let mut index = 0;
    while start < bytes.len() {
        let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |p| start + p);
        if let Framing::Hostile(h) = stepguard_jsonl::framing(&bytes[start..end]) {
            return Some((index, h));
        }
        start = end + 1;
        index += 1;
    }
    None
}

/// Feeds a whole stream through a counter, a run of whole lines per boundary crossing; `name`
/// labels read errors.
pub fn count_stream(
    counter: &mut Counter,
    reader: impl Read,
    name: &str,
) -> Result<StreamCount, CountError> {
    count_stream_with_loops(counter, reader, name, None)
}

/// [`count_stream`], also looking for loops in the tool calls the counter reports (give
/// `None` for a plugin that does not report them: protocol before 1.3).
pub fn count_stream_with_loops(
    counter: &mut Counter,
    reader: impl Read,
    name: &str,
    loops: Option<LoopSettings>,
) -> Result<StreamCount, CountError> {
    let mut watch = loops.map(LoopWatch::new);
    let mut lines = LineSplitter::new(reader);
    let mut oversized_lines = 0;
    let mut recognition = Recognition::default();
    let mut totals = LineReport::empty();
    loop {
        let chunk = lines.next_chunk().map_err(|source| CountError::Read {
            name: name.to_owned(),
            source,
        })?;
        match chunk {
            None => break,
            Some(SplitChunk::Lines(bytes)) => match watch.as_mut() {
                None => {
                    let report = recognition.feed(counter, bytes, u64::MAX)?;
                    stepguard_plugin_api::guest::add_report(&mut totals, &report.sum);
                }
                // A recorded stream arrives as one big chunk: to say in which step a loop
                // began, its lines cross one at a time (a live run's chunks are small anyway).
                Some(watch) => {
                    for line in bytes.split_inclusive(|b| *b == b'\n') {
                        let report = recognition.feed(counter, line, u64::MAX)?;
                        stepguard_plugin_api::guest::add_report(&mut totals, &report.sum);
                        watch.after_chunk(counter, &report, u64::from(totals.steps_begun))?;
                    }
                }
            },
            Some(SplitChunk::Oversized(len)) => {
                oversized_lines += 1;
                recognition.lines += 1;
                recognition.unrecognised += 1;
                tracing::warn!(
                    bytes = len,
                    "skipped a line longer than the {} MiB cap",
                    stepguard_jsonl::MAX_LINE_BYTES >> 20
                );
            }
        }
    }
    let mut stats = counter.finish()?;
    reconcile(&mut stats, &totals);
    stats.noise_lines += oversized_lines;
    recognition.settle(&stats);
    Ok(StreamCount {
        stats,
        oversized_lines,
        truncated_last_line: lines.last_line_unterminated,
        recognition,
        loops: watch.map(|w| w.found),
    })
}

/// Makes the per-line reports the one source of truth for counts: `finish()`'s step count, and
/// its turn and sub-agent counts when it gives them, are checked against the sums of the lines'
/// reports (what enforcement counted); a disagreement is warned about once and the sums win.
pub(crate) fn reconcile(stats: &mut CounterStats, totals: &LineReport) {
    let steps = u64::from(totals.steps_begun);
    let turns = u64::from(totals.turns);
    let sub_agents = u64::from(totals.sub_agent_steps);
    let reported_sub_agents: u64 = stats.sub_agent_steps.values().sum();
    let mut disagreements = Vec::new();
    if stats.num_steps_computed != steps {
        disagreements.push(format!(
            "steps {} (lines: {steps})",
            stats.num_steps_computed
        ));
        stats.num_steps_computed = steps;
    }
    if let Some(t) = stats
        .num_turns_computed
        .filter(|t| *t != turns && turns > 0)
    {
        disagreements.push(format!("turns {t} (lines: {turns})"));
        stats.num_turns_computed = Some(turns);
    }
    if reported_sub_agents != sub_agents {
        disagreements.push(format!(
            "sub-agent steps {reported_sub_agents} (lines: {sub_agents})"
        ));
    }
    if !disagreements.is_empty() {
        tracing::warn!(
            "the provider plugin's final counts disagree with its per-line reports: {}; the per-line counts are used",
            disagreements.join(", ")
        );
    }
}

/// Returns what a stream's terminal event says, when it had one; a failure slug this
/// stepguard does not know still means the provider failed (`provider_error`).
pub fn stream_verdict(stats: &CounterStats) -> Option<StreamVerdict> {
    stats.terminal.as_ref().map(|t| StreamVerdict {
        success: t.success,
        slug: t
            .slug
            .as_deref()
            .map(|s| s.parse().unwrap_or(FailureSlug::ProviderError)),
    })
}

/// Converts a counter's final numbers into the core's run stats, judged by
/// [`stepguard_core::verdict::classify`] from the stream alone: a stream without a terminal
/// event is `incomplete` (a supervised run's facts include its process too).
pub fn run_stats(stats: &CounterStats) -> RunStats {
    let verdict = classify(RunFacts::stream(stream_verdict(stats)));
    let (outcome, slug) = (verdict.outcome, verdict.slug);
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

/// Returns the failure slug of a failed stream's terminal event when it is not one this
/// stepguard knows.
fn unknown_slug(stats: &CounterStats) -> Option<&str> {
    stats
        .terminal
        .as_ref()
        .filter(|t| !t.success)
        .and_then(|t| t.slug.as_deref())
        .filter(|s| s.parse::<FailureSlug>().is_err())
}

/// Builds the run record of a counted stream: the stats, the stream's own numbers and the
/// run's labels; process fields stay null.
pub fn stream_record(meta: &RunMeta, stats: &RunStats, count: &StreamCount) -> RunRecord {
    let mut record = RunRecord::new(meta.provider.clone(), stats.outcome);
    record.source.plugin_version = meta.plugin_version.clone();
    record.source.plugin_source = meta.plugin_source.clone();
    record.source.unit = meta.unit.clone();
    record.source.task_type = meta.task_type.clone();
    record.source.profile = meta.profile.clone();
    record.invocation.cwd = meta.cwd.clone();
    record.spend.pools = meta.pools.clone();
    record.spend.ledger = meta.ledger;
    record.set_stats(stats);
    let counter = &count.stats;
    record.chain.resumed_from = meta.resumed_from;
    record.chain.session_id = counter.session_id.clone();
    let terminal = counter.terminal.as_ref();
    // A failure slug this stepguard does not know is recorded as `provider_error` (see
    // `run_stats`); say so once per stream, and keep the plugin's word in the record.
    let unknown_slug = unknown_slug(counter);
    if let Some(slug) = unknown_slug {
        tracing::warn!(
            "plugin `{}` reported the unknown failure slug `{slug}`; recorded as provider_error",
            meta.provider
        );
    }
    record.verdict.message = terminal
        .and_then(|t| t.message.clone())
        .or_else(|| unknown_slug.map(|s| format!("plugin reported unknown slug `{s}`")));
    record.counts.noise_lines = Some(counter.noise_lines);
    record.counts.unknown_events = Some(counter.unknown_events);
    record.counts.oversized_lines = Some(count.oversized_lines);
    record.counts.truncated_last_line = Some(count.truncated_last_line);
    record.sub_agent_steps = Some(counter.sub_agent_steps.clone());
    record.sub_agent_tokens = Some(
        counter
            .sub_agent_tokens
            .iter()
            .map(|(id, t)| {
                let usage = stepguard_core::TokenUsage {
                    input_tokens: t.input_tokens,
                    output_tokens: t.output_tokens,
                    cached_input_tokens: t.cached_input_tokens,
                    reasoning_output_tokens: t.reasoning_output_tokens,
                };
                (id.clone(), usage)
            })
            .collect(),
    );
    record.supervision.loops.clone_from(&count.loops);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // Built the way code outside the API crate must build its non-exhaustive types.
    #[allow(clippy::field_reassign_with_default)]
    fn the_per_line_reports_win_over_finish() {
        // A plugin whose `finish()` says 104 steps after reporting 4 (count said 104, run 4).
        let mut stats = CounterStats::default();
        stats.num_steps_computed = 104;
        stats.num_turns_computed = Some(9);
        let mut totals = LineReport::empty();
        totals.steps_begun = 4;
        totals.turns = 2;
        reconcile(&mut stats, &totals);
        assert_eq!(stats.num_steps_computed, 4);
        assert_eq!(stats.num_turns_computed, Some(2));

        // Agreeing counts are left alone; a plugin that reports no per-line turns keeps its own.
        let mut stats = CounterStats::default();
        stats.num_steps_computed = 4;
        stats.num_turns_computed = Some(3);
        totals.turns = 0;
        reconcile(&mut stats, &totals);
        assert_eq!(
            (stats.num_steps_computed, stats.num_turns_computed),
            (4, Some(3))
        );
    }

    #[test]
    #[allow(clippy::field_reassign_with_default)]
    fn a_recognised_stream_that_is_mostly_not_the_providers_has_failed() {
        let seen = |lines, unrecognised| Recognition {
            lines,
            recognised: true,
            unrecognised,
            refused: None,
        };
        // Under 50, or not more than half: counted.
        assert!(!seen(60, 49).failed());
        assert!(!seen(100, 50).failed());
        // 50 and more than half: not the provider's stream.
        assert!(seen(99, 50).failed() && seen(99, 50).mostly_unrecognised());
        // Nothing recognised is failed as before; nothing seen is not.
        assert!(
            Recognition {
                lines: 3,
                recognised: false,
                unrecognised: 3,
                refused: None,
            }
            .failed()
        );
        assert!(!Recognition::default().failed());
        // Unknown events after the start come from the counter's totals, never beyond the lines.
        let mut r = seen(123, 0);
        let mut stats = CounterStats::default();
        stats.unknown_events = 120;
        stats.noise_lines = 1;
        r.settle(&stats);
        assert_eq!(r.unrecognised, 121);
        stats.unknown_events = 1000;
        r.settle(&stats);
        assert_eq!(r.unrecognised, 123);
    }

    #[test]
    #[allow(clippy::field_reassign_with_default)]
    fn an_unknown_failure_slug_is_provider_error_with_the_slug_kept_in_the_message() {
        use stepguard_plugin_api::Terminal;
        let record_of = |terminal: Terminal| {
            let mut stats = CounterStats::default();
            stats.terminal = Some(terminal);
            let count = StreamCount {
                stats,
                oversized_lines: 0,
                truncated_last_line: false,
                recognition: Recognition::default(),
                loops: None,
            };
            let meta = RunMeta {
                provider: "someplugin".into(),
                ..RunMeta::default()
            };
            stream_record(&meta, &run_stats(&count.stats), &count)
        };
        let record = record_of(Terminal::failed("xyz", None));
        assert_eq!(
            (
                record.verdict.error_type.as_ref().map(|s| s.as_str()),
                record.verdict.message.as_deref()
            ),
            (
                Some("provider_error"),
                Some("plugin reported unknown slug `xyz`")
            )
        );
        // The provider's own message wins; a known slug is no news.
        let record = record_of(Terminal::failed("xyz", Some("HTTP 418".to_owned())));
        assert_eq!(record.verdict.message.as_deref(), Some("HTTP 418"));
        let record = record_of(Terminal::failed("rate_limited", None));
        assert_eq!(
            (
                record.verdict.error_type.as_ref().map(|s| s.as_str()),
                record.verdict.message
            ),
            (Some("rate_limited"), None)
        );
    }
}
