//! The run observer: remembers a run's steps in memory, exports the run once it has ended.

use std::time::{Duration, Instant, SystemTime};

use opentelemetry_otlp::RetryPolicy;
use stepguard_core::RunRecord;
use stepguard_runner::{Progress, RunObserver, RunReport, RunStarted};

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::export::export;
use crate::metrics::RunPoint;
use crate::span::{SpanIdentity, StepLog, record_times, run_span};

/// Exports one supervised run as an `invoke_agent` span and metric points.
///
/// Create it before the run's spec is built: its span's identity is fixed then, so that
/// [`TelemetryObserver::child_env`] can put the agent's own spans under it. While the run goes
/// on it only notes in memory when each step began (the engine's thread enforces the budget and
/// must not wait on a network); the export happens once, at the end, within
/// [`TelemetryConfig::flush_timeout`].
#[derive(Debug)]
pub struct TelemetryObserver {
    config: TelemetryConfig,
    identity: SpanIdentity,
    started_at: SystemTime,
    steps: StepLog,
    exported: bool,
}

impl TelemetryObserver {
    /// Prepares the run's span: its trace (the `TRACEPARENT`'s when one was given) and its
    /// ids. Logs the configuration's warnings; creates no thread and touches no network.
    pub fn new(config: TelemetryConfig) -> Self {
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let identity = SpanIdentity::new(config.parent().as_ref());
        let steps = StepLog::new(config.max_step_events);
        TelemetryObserver {
            config,
            identity,
            started_at: SystemTime::now(),
            steps,
            exported: false,
        }
    }

    /// Returns the configuration in use.
    pub fn config(&self) -> &TelemetryConfig {
        &self.config
    }

    /// Returns the run's trace id (32 hex digits).
    pub fn trace_id(&self) -> String {
        self.identity.trace_id().to_string()
    }

    /// Returns the `TRACEPARENT` to give the agent so its spans nest under the run's span.
    /// When spans are not exported (only metrics are), the parent stepguard was given, if
    /// any, is passed on unchanged instead.
    pub fn traceparent_for_child(&self) -> Option<String> {
        if self.exports_span() {
            Some(self.identity.traceparent())
        } else {
            self.config.traceparent.clone()
        }
    }

    /// Returns the variables to set in the agent's environment: `TRACEPARENT`, and
    /// `TRACESTATE` when there is one.
    pub fn child_env(&self) -> Vec<(&'static str, String)> {
        let Some(traceparent) = self.traceparent_for_child() else {
            return Vec::new();
        };
        let tracestate = if self.exports_span() {
            self.identity.tracestate()
        } else {
            self.config.tracestate.clone()
        };
        let mut env = vec![("TRACEPARENT", traceparent)];
        env.extend(tracestate.map(|state| ("TRACESTATE", state)));
        env
    }

    /// Notes when the agent started (the span starts then unless the record says otherwise).
    pub fn mark_started(&mut self, at: SystemTime) {
        self.started_at = at;
    }

    /// Notes that `steps` steps have begun by `at`: one `step` event for each new one, up to
    /// [`TelemetryConfig::max_step_events`]. Memory only.
    pub fn record_steps(&mut self, steps: u64, at: SystemTime) {
        self.steps.begun(steps, at);
    }

    /// Exports the run its `record` describes, as [`TelemetryObserver::export_run`] does, and
    /// turns a failure into one warning: the run is unaffected either way.
    pub fn finish(&mut self, record: &RunRecord) {
        if let Err(e) = self.export_run(record) {
            tracing::warn!("telemetry: {e}; the run is unaffected");
        }
    }

    /// Exports the run its `record` describes: the span (with a `step` event for each step
    /// noted, and for steps the record counts beyond them, at the end), and the metric points.
    /// Returns within [`TelemetryConfig::flush_timeout`] (plus the time to start two threads)
    /// whatever the collector does. Only the first call exports.
    ///
    /// # Errors
    ///
    /// [`TelemetryError::Export`] when a signal was refused, failed, or not sent in time.
    pub fn export_run(&mut self, record: &RunRecord) -> Result<(), TelemetryError> {
        self.export_within(record, self.config.flush_timeout)
    }

    /// [`TelemetryObserver::export_run`] within `bound` (the run's exit bound, when shorter
    /// than the flush timeout).
    fn export_within(&mut self, record: &RunRecord, bound: Duration) -> Result<(), TelemetryError> {
        if std::mem::replace(&mut self.exported, true) {
            return Ok(());
        }
        let now = SystemTime::now();
        let (start, end) = record_times(record);
        let start = start.unwrap_or(self.started_at);
        let end = end.unwrap_or(now).max(start);
        self.steps.begun(record.steps().unwrap_or(0), end);
        let spans = if self.exports_span() {
            vec![run_span(record, &self.identity, &self.steps, start, end)]
        } else {
            Vec::new()
        };
        let duration = end.duration_since(start).ok();
        let points = vec![RunPoint::new(record, duration)];
        // One retry at most: a collector that is down at the end of one run stays down for the
        // rest of the bound, and every retry delays the exit.
        let retry = RetryPolicy::recommended().with_max_retries(1);
        export(&self.config, spans, points, bound, &retry)
    }

    /// Whether a span is exported: there is somewhere to send it, and the parent (if any) did
    /// not decide against sampling the trace.
    fn exports_span(&self) -> bool {
        self.config.traces_endpoint.is_some() && self.identity.context.is_sampled()
    }
}

/// A thin adapter: the work is in [`TelemetryObserver::record_steps`] and
/// [`TelemetryObserver::finish`].
impl RunObserver for TelemetryObserver {
    fn started(&mut self, run: &RunStarted<'_>) {
        self.mark_started(run.started_at);
    }

    fn tick(&mut self, progress: &Progress) {
        let at = self.started_at + progress.elapsed;
        self.record_steps(progress.steps, at);
    }

    /// Exports within the flush timeout, and never past the run's exit bound.
    fn finished(&mut self, report: &mut RunReport) {
        let left = report.exit_by.saturating_duration_since(Instant::now());
        let bound = self.config.flush_timeout.min(left);
        if let Err(e) = self.export_within(&report.record, bound) {
            tracing::warn!("telemetry: {e}; the run is unaffected");
        }
    }
}
