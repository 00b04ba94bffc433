//! Past runs, sent again: for teams that start exporting after months of local history.

use std::time::Duration;

use opentelemetry_otlp::RetryPolicy;
use stepguard_core::RunRecord;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::export::export;
use crate::metrics::RunPoint;
use crate::span::{SpanIdentity, StepLog, record_times, run_span};

/// Spans sent in one request.
const BATCH: usize = 512;

/// The least time one request of a replay is given: a replay is a command of its own, not the
/// end of a run, and its requests are larger.
const MIN_REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Exports past runs: one `invoke_agent` span per record, with the record's own start and end
/// times (each the root of a trace of its own, with no `step` events: when each step began was
/// not recorded), and the records' metric points (stamped with the time of the replay, as
/// OpenTelemetry metrics always are). Records without a start time, or without an end time or
/// duration (still running), are skipped. Returns how many records were exported.
///
/// # Errors
///
/// [`TelemetryError::Export`] at the first request refused, failed or not answered in time
/// (each is given the larger of [`TelemetryConfig::flush_timeout`] and 10 s).
pub fn export_records(
    config: &TelemetryConfig,
    records: &[RunRecord],
) -> Result<usize, TelemetryError> {
    let timeout = config.flush_timeout.max(MIN_REPLAY_TIMEOUT);
    let finished: Vec<_> = records
        .iter()
        .filter_map(|record| match record_times(record) {
            (Some(start), Some(end)) => Some((record, start, end.max(start))),
            _ => None,
        })
        .collect();
    if config.traces_endpoint.is_some() {
        for batch in finished.chunks(BATCH) {
            let spans = batch
                .iter()
                .map(|(record, start, end)| {
                    run_span(
                        record,
                        &SpanIdentity::new(None),
                        &StepLog::new(0),
                        *start,
                        *end,
                    )
                })
                .collect();
            export(
                config,
                spans,
                Vec::new(),
                timeout,
                &RetryPolicy::recommended(),
            )?;
        }
    }
    let points = finished
        .iter()
        .map(|(record, start, end)| RunPoint::new(record, end.duration_since(*start).ok()))
        .collect();
    export(
        config,
        Vec::new(),
        points,
        timeout,
        &RetryPolicy::recommended(),
    )?;
    Ok(finished.len())
}
