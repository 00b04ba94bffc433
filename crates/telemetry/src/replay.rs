//! Past runs, sent again: for teams that start exporting after months of local history.

use std::time::{Duration, SystemTime};

use opentelemetry_otlp::RetryPolicy;
use opentelemetry_sdk::trace::SpanData;
use stepguard_core::RunRecord;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::export::{export, export_meters, meters};
use crate::metrics::{Meters, RunPoint};
use crate::span::{SpanIdentity, StepLog, record_times, run_span};

/// Spans sent in one request: the most runs a replay holds at once.
pub const REPLAY_BATCH: usize = 512;

/// The least time one request of a replay is given: a replay is a command of its own, not the
/// end of a run, and its requests are larger.
const MIN_REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// A replay of past runs, fed one record at a time: one `invoke_agent` span per record, with
/// the record's own start and end times (each the root of a trace of its own, with no `step`
/// events: when each step began was not recorded), sent [`REPLAY_BATCH`] to a request; and the
/// records' metric points (stamped with the time of the replay, as OpenTelemetry metrics always
/// are), aggregated as they come and sent once by [`Replay::finish`]. Memory holds one batch of
/// spans and one series per label set, whatever the number of runs.
///
/// Records without a start time, or without an end time or duration (still running), are
/// skipped.
pub struct Replay {
    config: TelemetryConfig,
    timeout: Duration,
    spans: Vec<SpanData>,
    meters: Option<Meters>,
    /// Finished records taken so far.
    taken: usize,
    /// Records whose span the collector has accepted.
    sent: usize,
}

impl Replay {
    /// Starts a replay to `config`'s collector, sending spans [`REPLAY_BATCH`] at a time.
    ///
    /// # Errors
    ///
    /// [`TelemetryError::Export`] when the metrics exporter cannot be set up.
    pub fn new(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let timeout = config.flush_timeout.max(MIN_REPLAY_TIMEOUT);
        Ok(Replay {
            meters: meters(config, timeout, &RetryPolicy::recommended()).transpose()?,
            config: config.clone(),
            timeout,
            spans: Vec::new(),
            taken: 0,
            sent: 0,
        })
    }

    /// Adds one record: its span is sent with the batch it completes, its metric point is
    /// recorded. Returns whether it was taken (`false`: skipped, not finished).
    ///
    /// # Errors
    ///
    /// [`TelemetryError::Export`] when the batch this record completed was refused, failed or
    /// not answered in time (each request is given the larger of
    /// [`TelemetryConfig::flush_timeout`] and 10 s).
    pub fn push(&mut self, record: &RunRecord) -> Result<bool, TelemetryError> {
        let (Some(start), Some(end)) = record_times(record) else {
            return Ok(false);
        };
        let end = end.max(start);
        self.taken += 1;
        if let Some(meters) = &self.meters {
            meters.record(&RunPoint::new(record, end.duration_since(start).ok()));
        }
        if self.config.traces_endpoint.is_some() {
            self.spans.push(span(record, start, end));
            if self.spans.len() >= REPLAY_BATCH {
                self.send_spans()?;
            }
        }
        Ok(true)
    }

    /// Runs whose span the collector has accepted so far (none when only metrics are
    /// exported: they go once, at the end).
    pub fn sent(&self) -> usize {
        self.sent
    }

    /// Sends the last batch of spans, then the metrics; returns how many records were exported.
    /// The metrics are sent once: a second call sends only spans pushed since.
    ///
    /// # Errors
    ///
    /// As [`Replay::push`], for the last batch and the metrics.
    pub fn finish(&mut self) -> Result<usize, TelemetryError> {
        self.send_spans()?;
        if let Some(meters) = self.meters.take() {
            export_meters(&self.config, meters, self.timeout)?;
        }
        Ok(self.taken)
    }

    fn send_spans(&mut self) -> Result<(), TelemetryError> {
        if self.spans.is_empty() {
            return Ok(());
        }
        let spans = std::mem::take(&mut self.spans);
        let n = spans.len();
        export(
            &self.config,
            spans,
            Vec::new(),
            self.timeout,
            &RetryPolicy::recommended(),
        )?;
        self.sent += n;
        Ok(())
    }
}

/// A past run's span: its own times, no step events.
fn span(record: &RunRecord, start: SystemTime, end: SystemTime) -> SpanData {
    run_span(
        record,
        &SpanIdentity::new(None),
        &StepLog::new(0),
        start,
        end,
    )
}

/// Exports past runs in one go: a [`Replay`] of `records`. Returns how many records were
/// exported.
///
/// # Errors
///
/// As [`Replay::push`] and [`Replay::finish`].
pub fn export_records(
    config: &TelemetryConfig,
    records: &[RunRecord],
) -> Result<usize, TelemetryError> {
    let mut replay = Replay::new(config)?;
    for record in records {
        replay.push(record)?;
    }
    replay.finish()
}
