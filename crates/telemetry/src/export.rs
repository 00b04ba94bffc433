//! Sending spans and metric points, each signal on a thread of its own that is abandoned when
//! it has not finished within the bound.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry_otlp::{RetryPolicy, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::resource::TelemetryResourceDetector;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};

use crate::config::{Protocol, TelemetryConfig, Temporality};
use crate::error::{ExportFailure, TelemetryError};
use crate::metrics::{Meters, RunPoint, sdk_cause};
use crate::transport::Transport;

/// A signal's export, run on a thread of its own: (signal, endpoint, the work).
type Job = (
    &'static str,
    String,
    Box<dyn FnOnce() -> Result<(), String> + Send>,
);

/// Exports `spans` and `points` to the configured endpoints (a signal with no endpoint, or
/// nothing to send, is skipped), waiting at most `bound` for both together. Failed requests
/// are retried as `retry` says, within the bound.
pub(crate) fn export(
    config: &TelemetryConfig,
    spans: Vec<SpanData>,
    points: Vec<RunPoint>,
    bound: Duration,
    retry: &RetryPolicy,
) -> Result<(), TelemetryError> {
    let mut jobs: Vec<Job> = Vec::new();
    if let Some(endpoint) = config
        .traces_endpoint
        .as_ref()
        .filter(|_| !spans.is_empty())
    {
        let setup = Setup::new(config, endpoint, bound, retry);
        jobs.push((
            "traces",
            endpoint.clone(),
            Box::new(move || setup.export_spans(spans)),
        ));
    }
    if let Some(endpoint) = config
        .metrics_endpoint
        .as_ref()
        .filter(|_| !points.is_empty())
    {
        let setup = Setup::new(config, endpoint, bound, retry);
        let temporality = config.temporality;
        jobs.push((
            "metrics",
            endpoint.clone(),
            Box::new(move || setup.export_points(&points, temporality)),
        ));
    }
    run(jobs, bound)
}

/// The meters a replay records its runs into, for `config`'s metrics endpoint (`None` when it
/// has none), exporting within `bound` with `retry`.
pub(crate) fn meters(
    config: &TelemetryConfig,
    bound: Duration,
    retry: &RetryPolicy,
) -> Option<Result<Meters, TelemetryError>> {
    let endpoint = config.metrics_endpoint.as_ref()?;
    let setup = Setup::new(config, endpoint, bound, retry);
    Some(
        setup
            .meters(config.temporality)
            .map_err(|cause| TelemetryError::Export {
                failures: vec![ExportFailure {
                    signal: "metrics",
                    endpoint: endpoint.clone(),
                    cause,
                }],
                bound,
            }),
    )
}

/// Exports what `meters` recorded to `config`'s metrics endpoint, waiting at most `bound`.
pub(crate) fn export_meters(
    config: &TelemetryConfig,
    meters: Meters,
    bound: Duration,
) -> Result<(), TelemetryError> {
    let endpoint = config.metrics_endpoint.clone().unwrap_or_default();
    run(
        vec![("metrics", endpoint, Box::new(move || meters.export()))],
        bound,
    )
}

/// Runs each job on a thread of its own and waits at most `bound` for all of them together.
fn run(jobs: Vec<Job>, bound: Duration) -> Result<(), TelemetryError> {
    let deadline = Instant::now() + bound;
    let (done, results) = mpsc::channel();
    let mut pending: Vec<(&'static str, String)> = Vec::new();
    let mut failures = Vec::new();
    for (signal, endpoint, work) in jobs {
        let done = done.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("stepguard-otlp-{signal}"))
            .spawn(move || {
                // The receiver is gone when the wait gave up: nothing is left to tell.
                let _ = done.send((signal, work()));
            });
        match spawned {
            Ok(_) => pending.push((signal, endpoint)),
            Err(e) => failures.push(ExportFailure {
                signal,
                endpoint,
                cause: format!("could not start a thread: {e}"),
            }),
        }
    }
    drop(done);

    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match results.recv_timeout(left) {
            Ok((signal, result)) => {
                if let Some(i) = pending.iter().position(|(s, _)| *s == signal) {
                    let (signal, endpoint) = pending.swap_remove(i);
                    if let Err(cause) = result {
                        failures.push(ExportFailure {
                            signal,
                            endpoint,
                            cause,
                        });
                    }
                }
            }
            // The threads still running are left to end on their own (their HTTP client has
            // the same timeout); the caller goes on now.
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {
                failures.extend(pending.drain(..).map(|(signal, endpoint)| ExportFailure {
                    signal,
                    endpoint,
                    cause: "no answer".to_owned(),
                }));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        // Traces before metrics, whichever answered first.
        failures.sort_by_key(|f| f.signal != "traces");
        Err(TelemetryError::Export { failures, bound })
    }
}

/// What an exporter of either signal is built from.
struct Setup {
    endpoint: String,
    protocol: Protocol,
    headers: HashMap<String, String>,
    timeout: Duration,
    retry: RetryPolicy,
    resource: Resource,
}

impl Setup {
    fn new(config: &TelemetryConfig, endpoint: &str, bound: Duration, retry: &RetryPolicy) -> Self {
        Setup {
            endpoint: endpoint.to_owned(),
            protocol: config.protocol,
            headers: config.headers.clone().into_iter().collect(),
            timeout: bound,
            retry: retry.clone(),
            resource: resource(config),
        }
    }

    fn protocol(&self) -> opentelemetry_otlp::Protocol {
        match self.protocol {
            Protocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
            Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
        }
    }

    fn export_spans(self, spans: Vec<SpanData>) -> Result<(), String> {
        let transport = Transport::new(self.timeout)?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(transport.clone())
            .with_endpoint(self.endpoint.clone())
            .with_protocol(self.protocol())
            .with_timeout(self.timeout)
            .with_retry_policy(self.retry.clone())
            .with_headers(self.headers.clone())
            .build()
            .map_err(|e| e.to_string())?;
        exporter.set_resource(&self.resource);
        futures_executor::block_on(exporter.export(spans))
            .map_err(|e| transport.explain(sdk_cause(&e)))
    }

    fn export_points(self, points: &[RunPoint], temporality: Temporality) -> Result<(), String> {
        let meters = self.meters(temporality)?;
        for point in points {
            meters.record(point);
        }
        meters.export()
    }

    /// Meters that export through an OTLP exporter of this setup (the transport explains its
    /// failures).
    fn meters(self, temporality: Temporality) -> Result<Meters, String> {
        let temporality = match temporality {
            Temporality::Delta => opentelemetry_sdk::metrics::Temporality::Delta,
            Temporality::Cumulative => opentelemetry_sdk::metrics::Temporality::Cumulative,
            Temporality::LowMemory => opentelemetry_sdk::metrics::Temporality::LowMemory,
        };
        let transport = Transport::new(self.timeout)?;
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(transport.clone())
            .with_temporality(temporality)
            .with_endpoint(self.endpoint.clone())
            .with_protocol(self.protocol())
            .with_timeout(self.timeout)
            .with_retry_policy(self.retry.clone())
            .with_headers(self.headers.clone())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Meters::new(exporter, self.resource, move |cause| {
            transport.explain(cause)
        }))
    }
}

/// The resource every span and point is reported under: the SDK's own attributes, stepguard's
/// version and the host, then `OTEL_RESOURCE_ATTRIBUTES`, then the service name.
fn resource(config: &TelemetryConfig) -> Resource {
    let mut builder = Resource::builder_empty()
        .with_detector(Box::new(TelemetryResourceDetector))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if let Some(host) = host_name() {
        builder = builder.with_attribute(KeyValue::new("host.name", host));
    }
    builder
        .with_attributes(
            config
                .resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_service_name(config.service_name.clone())
        .build()
}

/// The machine's name: runs are compared across machines.
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}
