//! Where and how to export: the standard `OTEL_*` variables over stepguard's `[telemetry]` table.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The service name when neither `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` nor the config
/// table names one.
pub const DEFAULT_SERVICE_NAME: &str = "stepguard";

/// How long the export at the end of a run may take before it is given up.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// How many `step` events a run's span carries; steps beyond are counted in
/// `stepguard.steps_dropped`.
pub const DEFAULT_MAX_STEP_EVENTS: usize = 1000;

/// What the `[telemetry]` table of a config file says (every key optional). The CLI fills it;
/// the environment overrides it key by key, as it overrides config files everywhere in
/// stepguard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// The base OTLP endpoint (`http://collector:4318`); `/v1/traces` and `/v1/metrics` are
    /// appended.
    pub endpoint: Option<String>,
    /// `http/protobuf`, `http/json` or `grpc` (not built in: exported over `http/protobuf`).
    pub protocol: Option<String>,
    /// Headers sent with every export (e.g. an API key).
    pub headers: BTreeMap<String, String>,
    /// The `service.name` resource attribute.
    pub service_name: Option<String>,
    /// The bound on the export at the end of a run ([`DEFAULT_FLUSH_TIMEOUT`] when unset).
    pub flush_timeout: Option<Duration>,
}

/// The OTLP encoding used over HTTP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// `http/protobuf` (the default).
    #[default]
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
}

impl Protocol {
    /// Returns the name the `OTEL_EXPORTER_OTLP_PROTOCOL` variable uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }
}

/// How metric points relate to earlier exports
/// (`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Temporality {
    /// Each export carries what happened since the last one: right for a process that reports
    /// one run and exits (the default; a collector's `deltatocumulative` processor turns the
    /// points into the running totals Prometheus expects).
    #[default]
    Delta,
    /// Each export carries totals since the process started (the OpenTelemetry default).
    Cumulative,
    /// Delta for counters and histograms, as the SDK's `lowmemory` preference.
    LowMemory,
}

/// Where and how runs are exported. Built by [`TelemetryConfig::from_env`] or
/// [`TelemetryConfig::resolve`]; `None` from them means telemetry is off and nothing may be
/// created or contacted.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// The full URL spans are posted to; `None`: spans are not exported.
    pub traces_endpoint: Option<String>,
    /// The full URL metrics are posted to; `None`: metrics are not exported.
    pub metrics_endpoint: Option<String>,
    /// The OTLP encoding.
    pub protocol: Protocol,
    /// Headers sent with every export.
    pub headers: BTreeMap<String, String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Further resource attributes (`OTEL_RESOURCE_ATTRIBUTES`), in the order given.
    pub resource_attributes: Vec<(String, String)>,
    /// The metric temporality.
    pub temporality: Temporality,
    /// The bound on the export at the end of a run.
    pub flush_timeout: Duration,
    /// How many `step` events a span carries at most.
    pub max_step_events: usize,
    /// The W3C `traceparent` the run's span is a child of (`TRACEPARENT`), when valid.
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with it (`TRACESTATE`).
    pub tracestate: Option<String>,
    warnings: Vec<String>,
}

impl TelemetryConfig {
    /// Returns the configuration the environment alone describes, or `None` when no endpoint
    /// is set (or `OTEL_SDK_DISABLED=true`). `get` reads one variable: pass
    /// `|name| std::env::var(name).ok()`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Option<Self> {
        Self::resolve(get, &TelemetrySettings::default())
    }

    /// Returns the configuration from the environment (read through `get`) over the config
    /// table's `settings`, or `None` when neither sets an endpoint, or when telemetry is
    /// disabled (`OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER` and
    /// `OTEL_METRICS_EXPORTER` both `none`).
    ///
    /// Values that cannot be used are left out with a warning ([`TelemetryConfig::warnings`]);
    /// they never make the configuration fail.
    pub fn resolve(
        get: impl Fn(&str) -> Option<String>,
        settings: &TelemetrySettings,
    ) -> Option<Self> {
        // Empty variables count as unset, as the specification says.
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let mut warnings = Vec::new();
        let base = var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .or_else(|| settings.endpoint.clone().filter(|e| !e.trim().is_empty()));
        let wanted = |exporter_var: &str, warnings: &mut Vec<String>| match var(exporter_var) {
            None => true,
            Some(v) if v.trim().eq_ignore_ascii_case("none") => false,
            Some(v) if v.trim().eq_ignore_ascii_case("otlp") => true,
            Some(v) => {
                warnings.push(format!(
                    "telemetry: {exporter_var}={v} is not supported; exporting over OTLP"
                ));
                true
            }
        };
        let traces_endpoint = wanted("OTEL_TRACES_EXPORTER", &mut warnings)
            .then(|| {
                var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    .or_else(|| base.as_deref().map(|b| signal_url(b, "v1/traces")))
            })
            .flatten();
        let metrics_endpoint = wanted("OTEL_METRICS_EXPORTER", &mut warnings)
            .then(|| {
                var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                    .or_else(|| base.as_deref().map(|b| signal_url(b, "v1/metrics")))
            })
            .flatten();
        if traces_endpoint.is_none() && metrics_endpoint.is_none() {
            return None;
        }
        warn_without_tls(&[&traces_endpoint, &metrics_endpoint], &mut warnings);

        let protocol =
            match var("OTEL_EXPORTER_OTLP_PROTOCOL").or_else(|| settings.protocol.clone()) {
                None => Protocol::HttpProtobuf,
                Some(p) => parse_protocol(&p, &mut warnings),
            };

        let mut headers = settings.headers.clone();
        if let Some(list) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            headers.extend(parse_pairs(
                &list,
                "OTEL_EXPORTER_OTLP_HEADERS",
                &mut warnings,
            ));
        }

        let resource_attributes = var("OTEL_RESOURCE_ATTRIBUTES")
            .map(|list| parse_pairs(&list, "OTEL_RESOURCE_ATTRIBUTES", &mut warnings))
            .unwrap_or_default();
        let service_name = var("OTEL_SERVICE_NAME")
            .or_else(|| {
                resource_attributes
                    .iter()
                    .rev()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .or_else(|| settings.service_name.clone().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());

        let temporality = temporality(
            var("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"),
            &mut warnings,
        );
        let tracestate = var("TRACESTATE");
        let traceparent = var("TRACEPARENT").and_then(|tp| traceparent(&tp, &mut warnings));

        Some(TelemetryConfig {
            traces_endpoint,
            metrics_endpoint,
            protocol,
            headers,
            service_name,
            resource_attributes,
            temporality,
            flush_timeout: settings.flush_timeout.unwrap_or(DEFAULT_FLUSH_TIMEOUT),
            max_step_events: DEFAULT_MAX_STEP_EVENTS,
            traceparent,
            tracestate,
            warnings,
        })
    }

    /// Returns what could not be used, one sentence each. [`crate::TelemetryObserver::new`]
    /// logs them; a caller of [`crate::export_records`] logs them itself.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Returns the parent span context from `TRACEPARENT`, when one was given.
    pub(crate) fn parent(&self) -> Option<SpanContext> {
        self.traceparent
            .as_deref()
            .and_then(|tp| remote_parent(tp, self.tracestate.as_deref()))
    }
}

/// A metrics temporality preference (`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`);
/// delta when unset or unknown.
fn temporality(value: Option<String>, warnings: &mut Vec<String>) -> Temporality {
    let Some(t) = value else {
        return Temporality::Delta;
    };
    match t.trim().to_ascii_lowercase().as_str() {
        "delta" => Temporality::Delta,
        "cumulative" => Temporality::Cumulative,
        "lowmemory" => Temporality::LowMemory,
        _ => {
            warnings.push(format!(
                "telemetry: unknown OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={t}; \
                 using delta"
            ));
            Temporality::Delta
        }
    }
}

/// A valid W3C `TRACEPARENT`, or `None` with a warning.
fn traceparent(value: &str, warnings: &mut Vec<String>) -> Option<String> {
    let tp = value.trim().to_owned();
    if remote_parent(&tp, None).is_some() {
        Some(tp)
    } else {
        warnings.push(format!(
            "telemetry: TRACEPARENT={tp} is not a valid W3C traceparent; the run starts a trace \
             of its own"
        ));
        None
    }
}

/// Warns about an HTTPS endpoint when this build has no TLS.
fn warn_without_tls(endpoints: &[&Option<String>], warnings: &mut Vec<String>) {
    if cfg!(feature = "tls") {
        return;
    }
    let https = endpoints
        .iter()
        .filter_map(|e| e.as_deref())
        .find(|e| e.starts_with("https://"));
    if let Some(endpoint) = https {
        warnings.push(format!(
            "telemetry: this stepguard was built without TLS and cannot reach {endpoint}"
        ));
    }
}

/// Appends a signal's path to the base endpoint, as the OTLP/HTTP specification says:
/// `http://h:4318` and `http://h:4318/` both give `http://h:4318/v1/traces`, and a base with a
/// path keeps it (`http://h/otlp` gives `http://h/otlp/v1/traces`).
fn signal_url(base: &str, path: &str) -> String {
    let base = base.trim();
    if base.ends_with('/') {
        format!("{base}{path}")
    } else {
        format!("{base}/{path}")
    }
}

fn parse_protocol(value: &str, warnings: &mut Vec<String>) -> Protocol {
    match value.trim() {
        "http/protobuf" => Protocol::HttpProtobuf,
        "http/json" => Protocol::HttpJson,
        "grpc" => {
            warnings.push(
                "telemetry: OTLP over gRPC is not built into stepguard; exporting over \
                 http/protobuf (point the endpoint at the collector's HTTP port, 4318)"
                    .to_owned(),
            );
            Protocol::HttpProtobuf
        }
        other => {
            warnings.push(format!(
                "telemetry: unknown OTLP protocol `{other}`; using http/protobuf"
            ));
            Protocol::HttpProtobuf
        }
    }
}

/// Parses `key=value,key2=value2` (the W3C baggage form both `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES` use): blanks around items are trimmed, values are
/// percent-decoded, and an item without `=` or with an empty key is left out with a warning.
fn parse_pairs(list: &str, variable: &str, warnings: &mut Vec<String>) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                pairs.push((key.trim().to_owned(), percent_decode(value.trim())));
            }
            _ => warnings.push(format!(
                "telemetry: ignoring `{item}` in {variable} (expected key=value)"
            )),
        }
    }
    pairs
}

/// Decodes `%XX` escapes; a malformed escape is kept as written.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let byte = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(byte).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Returns the remote span context a `traceparent` (and `tracestate`) describe, when valid.
fn remote_parent(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut carrier = std::collections::HashMap::new();
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| context.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_are_decoded_and_bad_ones_kept() {
        assert_eq!(percent_decode("Bearer%20abc%3D"), "Bearer abc=");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn signal_paths_join_with_one_slash() {
        assert_eq!(
            signal_url("http://h:4318", "v1/traces"),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://h:4318/", "v1/traces"),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://h/otlp", "v1/metrics"),
            "http://h/otlp/v1/metrics"
        );
    }

    #[test]
    fn a_traceparent_with_zero_ids_is_not_a_parent() {
        assert!(
            remote_parent(
                "00-00000000000000000000000000000000-0000000000000000-01",
                None
            )
            .is_none()
        );
        assert!(remote_parent("garbage", None).is_none());
        let parent = remote_parent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            None,
        );
        assert!(parent.is_some_and(|p| p.is_sampled() && p.is_remote()));
    }
}
