//! A run as metric points: one on the run counter and one on each histogram it has a value for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use stepguard_core::RunRecord;

use crate::span::scope;

/// Steps per run: budgets are tens to hundreds.
const STEP_BUCKETS: [f64; 15] = [
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0,
];
/// Tokens per run: the GenAI conventions' token buckets (powers of 4).
const TOKEN_BUCKETS: [f64; 14] = [
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];
/// US dollars per run.
const COST_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 100.0,
];
/// Seconds per run: an agent run takes seconds to hours.
const DURATION_BUCKETS: [f64; 15] = [
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0, 7200.0,
    14400.0,
];

/// What one run adds to the metrics.
#[derive(Clone, Debug)]
pub(crate) struct RunPoint {
    attributes: Vec<KeyValue>,
    steps: Option<u64>,
    tokens: Option<u64>,
    cost_usd: Option<f64>,
    duration: Option<Duration>,
}

impl RunPoint {
    /// The run's point: labelled by provider, task type, outcome and slug (all few-valued, so
    /// the series stay few).
    pub fn new(record: &RunRecord, duration: Option<Duration>) -> Self {
        let mut attributes = vec![
            KeyValue::new("gen_ai.provider.name", record.source.provider.clone()),
            KeyValue::new("stepguard.outcome", record.verdict.outcome.as_str()),
        ];
        if let Some(task_type) = &record.source.task_type {
            attributes.push(KeyValue::new("stepguard.task_type", task_type.clone()));
        }
        if let Some(slug) = &record.verdict.error_type {
            attributes.push(KeyValue::new("error.type", slug.to_string()));
        }
        RunPoint {
            attributes,
            steps: record.steps(),
            tokens: record
                .usage
                .tokens
                .map(|t| t.input_tokens.saturating_add(t.output_tokens)),
            cost_usd: record.usage.cost_usd,
            duration: record
                .invocation
                .duration_ms
                .map(Duration::from_millis)
                .or(duration),
        }
    }
}

/// The SDK's error without its "Operation failed:" preamble.
pub(crate) fn sdk_cause(error: &OTelSdkError) -> String {
    match error {
        OTelSdkError::InternalFailure(message) => message.clone(),
        other => other.to_string(),
    }
}

/// The run counter and the histograms of a meter provider of their own: points are recorded
/// as runs come (memory holds one series per label set, not the points) and exported once.
pub(crate) struct Meters {
    provider: SdkMeterProvider,
    outcome: Arc<Mutex<Option<Result<(), String>>>>,
    runs: Counter<u64>,
    steps: Histogram<u64>,
    tokens: Histogram<u64>,
    cost: Histogram<f64>,
    duration: Histogram<f64>,
    /// Whether the provider's one export may go (see [`Capturing`]).
    armed: Arc<AtomicBool>,
    /// Says more about a failure than the exporter does (the transport's own reason).
    explain: Box<dyn Fn(String) -> String + Send + Sync>,
}

impl Meters {
    /// Meters whose one export goes through `exporter`; `explain` rewrites its failure.
    pub(crate) fn new<E: PushMetricExporter>(
        exporter: E,
        resource: Resource,
        explain: impl Fn(String) -> String + Send + Sync + 'static,
    ) -> Self {
        let outcome = Arc::new(Mutex::new(None));
        let armed = Arc::new(AtomicBool::new(false));
        let capturing = Capturing {
            inner: exporter,
            outcome: Arc::clone(&outcome),
            armed: Arc::clone(&armed),
        };
        // Nothing is exported on a schedule: the one export is the one shutdown makes.
        let reader = PeriodicReader::builder(capturing)
            .with_interval(Duration::from_secs(24 * 3600))
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader)
            .build();
        let meter = provider.meter_with_scope(scope());
        Meters {
            runs: meter
                .u64_counter("stepguard.runs")
                .with_unit("{run}")
                .with_description("Agent runs supervised by stepguard")
                .build(),
            steps: meter
                .u64_histogram("stepguard.run.steps")
                .with_unit("{step}")
                .with_description("Steps an agent run took")
                .with_boundaries(STEP_BUCKETS.to_vec())
                .build(),
            tokens: meter
                .u64_histogram("stepguard.run.tokens")
                .with_unit("{token}")
                .with_description("Tokens (input and output) an agent run used")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
            cost: meter
                .f64_histogram("stepguard.run.cost_usd")
                .with_unit("{USD}")
                .with_description(
                    "What an agent run cost, in US dollars, as the provider reported it",
                )
                .with_boundaries(COST_BUCKETS.to_vec())
                .build(),
            duration: meter
                .f64_histogram("stepguard.run.duration")
                .with_unit("s")
                .with_description("How long an agent run took")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
            provider,
            outcome,
            armed,
            explain: Box::new(explain),
        }
    }

    /// Records one run's point.
    pub(crate) fn record(&self, point: &RunPoint) {
        let kv = &point.attributes;
        self.runs.add(1, kv);
        if let Some(n) = point.steps {
            self.steps.record(n, kv);
        }
        if let Some(n) = point.tokens {
            self.tokens.record(n, kv);
        }
        if let Some(usd) = point.cost_usd {
            self.cost.record(usd, kv);
        }
        if let Some(d) = point.duration {
            self.duration.record(d.as_secs_f64(), kv);
        }
    }

    /// Exports what was recorded, once, returning the exporter's own error.
    pub(crate) fn export(self) -> Result<(), String> {
        self.armed.store(true, Ordering::SeqCst);
        let shutdown = self.provider.shutdown();
        let exported = self
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match exported {
            Some(result) => result.map_err(&self.explain),
            None => Err((self.explain)(match shutdown {
                Err(e) => sdk_cause(&e),
                Ok(()) => "no metrics were exported".to_owned(),
            })),
        }
    }
}

/// Passes exports on and keeps the last result, which the periodic reader would reduce to
/// "failed to shutdown".
#[derive(Debug)]
struct Capturing<E> {
    inner: E,
    outcome: Arc<Mutex<Option<Result<(), String>>>>,
    /// Set by [`Meters::export`]: meters dropped without it (a replay that failed part-way)
    /// send nothing, where the SDK would flush them as the provider goes.
    armed: Arc<AtomicBool>,
}

impl<E: PushMetricExporter> PushMetricExporter for Capturing<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        if !self.armed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let result = self.inner.export(metrics).await;
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(result.as_ref().map_err(sdk_cause).copied());
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}
