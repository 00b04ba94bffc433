//! stepguard-telemetry against a real OTLP/HTTP receiver on 127.0.0.1, decoded with
//! `opentelemetry-proto`, and against collectors that refuse or never answer.
// The receiver's helpers are test code outside `#[test]` functions.
#![allow(clippy::unwrap_used)]

mod receiver;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{Span, status};
use stepguard_core::{Outcome, RunRecord, TokenUsage};
use stepguard_telemetry::{
    Protocol, REPLAY_BATCH, Replay, TelemetryConfig, TelemetryError, TelemetryObserver,
    TelemetrySettings, Temporality, export_records,
};
use tracing_subscriber::layer::SubscriberExt as _;

use receiver::{Receiver, Request, Silent, refused_endpoint};

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// A config from the given variables only.
fn config(vars: &[(&str, &str)]) -> Option<TelemetryConfig> {
    config_over(vars, &TelemetrySettings::default())
}

fn config_over(vars: &[(&str, &str)], settings: &TelemetrySettings) -> Option<TelemetryConfig> {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    TelemetryConfig::resolve(|name| vars.get(name).cloned(), settings)
}

fn at(rfc3339: &str) -> SystemTime {
    humantime::parse_rfc3339(rfc3339).unwrap()
}

fn nanos(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_nanos()).unwrap()
}

/// A run stopped at step 6 of a budget of 5.
fn over_budget_record() -> RunRecord {
    let mut r = RunRecord::new("codex", Outcome::Failed);
    r.id = Some(42);
    r.source.unit = Some("tool_call".into());
    r.source.task_type = Some("review".into());
    r.source.profile = Some("ci".into());
    r.step_budget.max_steps = Some(5);
    r.step_budget.max_steps_source = Some("--max-steps".into());
    r.invocation.command = Some(vec!["codex".into(), "exec".into(), "--json".into()]);
    r.invocation.started_at = Some("2025-03-01T10:00:00.000Z".into());
    r.invocation.ended_at = Some("2025-03-01T10:00:07.500Z".into());
    r.invocation.duration_ms = Some(7500);
    r.verdict.error_type = Some("max_steps".into());
    r.verdict.message = Some("step budget exceeded".into());
    r.verdict.exit_code = Some(3);
    r.verdict.child_signal = Some(15);
    r.verdict.terminated_by = Some("budget".parse().unwrap());
    r.supervision.containment = Some("cgroup".parse().unwrap());
    r.supervision.breached_at_step = Some(6);
    r.counts.num_steps_computed = Some(6);
    r.usage.tokens = Some(TokenUsage {
        input_tokens: 1200,
        output_tokens: 300,
        ..TokenUsage::default()
    });
    r.usage.cost_usd = Some(0.042);
    r.spend.max_tokens = Some(100_000);
    r.spend.max_tokens_source = Some("--max-tokens".into());
    r.spend.max_cost_usd = Some(0.5);
    r.spend.max_cost_usd_source = Some("profiles.ci.max_cost_usd".into());
    r
}

fn value<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match value(attributes, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match value(attributes, key) {
        Some(any_value::Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn float(attributes: &[KeyValue], key: &str) -> Option<f64> {
    match value(attributes, key) {
        Some(any_value::Value::DoubleValue(f)) => Some(*f),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn spans(receiver: &Receiver) -> Vec<Span> {
    receiver
        .traces()
        .into_iter()
        .flat_map(|t| t.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect()
}

fn metrics(receiver: &Receiver) -> Vec<Metric> {
    receiver
        .metrics()
        .into_iter()
        .flat_map(|m| m.resource_metrics)
        .flat_map(|r| r.scope_metrics)
        .flat_map(|s| s.metrics)
        .collect()
}

/// Returns the histogram's (count, sum) for its one data point.
fn histogram(metrics: &[Metric], name: &str) -> (u64, f64) {
    let metric = metrics.iter().find(|m| m.name == name).unwrap_or_else(|| {
        panic!(
            "no {name} among {:?}",
            metrics.iter().map(|m| &m.name).collect::<Vec<_>>()
        )
    });
    match &metric.data {
        Some(metric::Data::Histogram(h)) => {
            assert_eq!(h.data_points.len(), 1, "{name}");
            (h.data_points[0].count, h.data_points[0].sum.unwrap())
        }
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

/// Collects the `tracing` warnings `f` emits on this thread.
fn warnings_of<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    #[derive(Clone, Default)]
    struct Warnings(Arc<Mutex<Vec<String>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            if *event.metadata().level() == tracing::Level::WARN {
                let mut message = Message(String::new());
                event.record(&mut message);
                self.0.lock().unwrap().push(message.0);
            }
        }
    }
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    let out = tracing::subscriber::with_default(subscriber, f);
    let seen = warnings.0.lock().unwrap().clone();
    (out, seen)
}

#[test]
fn an_over_budget_run_reaches_the_collector_as_a_span_with_step_events_and_metrics() {
    let receiver = Receiver::start();
    let endpoint = receiver.endpoint();
    let traceparent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let config = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-team=fleet,authorization=Bearer%20t0ken",
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=ci,ci.runner=r-7",
        ),
        ("TRACEPARENT", &traceparent),
    ])
    .unwrap();
    let mut observer = TelemetryObserver::new(config);

    // Before the run: the agent's TRACEPARENT is in the same trace, under the run's span.
    let child = observer.traceparent_for_child().unwrap();
    let parts: Vec<&str> = child.split('-').collect();
    assert_eq!(parts.len(), 4, "{child}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", PARENT_TRACE, "01"));
    assert_ne!(parts[2], PARENT_SPAN);
    assert_eq!(observer.child_env(), vec![("TRACEPARENT", child.clone())]);
    assert_eq!(observer.trace_id(), PARENT_TRACE);

    // During the run: ticks report steps begun so far (sometimes several at once).
    let start = at("2025-03-01T10:00:00Z");
    observer.mark_started(start);
    for (steps, second) in [(1, 1), (1, 2), (3, 3), (4, 4), (6, 5)] {
        observer.record_steps(steps, start + Duration::from_secs(second));
    }
    let record = over_budget_record();
    let ((), warnings) = warnings_of(|| observer.finish(&record));
    assert!(warnings.is_empty(), "{warnings:?}");
    receiver.wait_for(2);

    let requests = receiver.requests();
    for request in &requests {
        assert_eq!(request.header("x-team"), Some("fleet"), "{}", request.path);
        assert_eq!(request.header("authorization"), Some("Bearer t0ken"));
        assert_eq!(
            request.header("content-type"),
            Some("application/x-protobuf")
        );
    }

    let traces = receiver.traces();
    assert_eq!(traces.len(), 1);
    let resource = traces[0].resource_spans[0].resource.as_ref().unwrap();
    assert_eq!(
        text(&resource.attributes, "service.name"),
        Some("stepguard")
    );
    assert_eq!(
        text(&resource.attributes, "deployment.environment"),
        Some("ci")
    );
    assert_eq!(text(&resource.attributes, "ci.runner"), Some("r-7"));
    assert_eq!(
        text(&resource.attributes, "service.version"),
        Some(env!("CARGO_PKG_VERSION"))
    );

    let spans = spans(&receiver);
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    assert_eq!(span.name, "invoke_agent");
    assert_eq!(hex(&span.trace_id), PARENT_TRACE);
    assert_eq!(hex(&span.parent_span_id), PARENT_SPAN);
    assert_eq!(hex(&span.span_id), parts[2]);
    assert_eq!(span.start_time_unix_nano, nanos(start));
    assert_eq!(
        span.end_time_unix_nano,
        nanos(start + Duration::from_millis(7500))
    );
    let status = span.status.as_ref().unwrap();
    assert_eq!(status.code, status::StatusCode::Error as i32);
    // stepguard's own words only: the record's message can hold what the model wrote.
    assert_eq!(status.message, "failed: max_steps");

    let a = &span.attributes;
    assert_eq!(text(a, "gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(text(a, "gen_ai.provider.name"), Some("codex"));
    assert_eq!(text(a, "gen_ai.agent.name"), Some("codex"));
    assert_eq!(int(a, "gen_ai.usage.input_tokens"), Some(1200));
    assert_eq!(int(a, "gen_ai.usage.output_tokens"), Some(300));
    assert_eq!(text(a, "error.type"), Some("max_steps"));
    assert_eq!(text(a, "stepguard.unit"), Some("tool_call"));
    assert_eq!(int(a, "stepguard.steps"), Some(6));
    assert_eq!(int(a, "stepguard.max_steps"), Some(5));
    assert_eq!(text(a, "stepguard.max_steps_source"), Some("--max-steps"));
    assert_eq!(text(a, "stepguard.terminated_by"), Some("budget"));
    assert_eq!(text(a, "stepguard.task_type"), Some("review"));
    assert_eq!(text(a, "stepguard.profile"), Some("ci"));
    assert_eq!(int(a, "stepguard.exit_code"), Some(3));
    assert_eq!(text(a, "stepguard.containment"), Some("cgroup"));
    assert_eq!(int(a, "stepguard.run_id"), Some(42));
    assert_eq!(int(a, "stepguard.steps_dropped"), None);
    assert_eq!(int(a, "stepguard.max_tokens"), Some(100_000));
    assert_eq!(text(a, "stepguard.max_tokens_source"), Some("--max-tokens"));
    assert_eq!(float(a, "stepguard.max_cost_usd"), Some(0.5));
    assert_eq!(
        text(a, "stepguard.max_cost_usd_source"),
        Some("profiles.ci.max_cost_usd")
    );
    assert_eq!(float(a, "stepguard.cost_usd"), Some(0.042));

    // One event per step begun, at the tick that reported it; then the breach and the stop.
    let steps: Vec<(i64, u64)> = span
        .events
        .iter()
        .filter(|e| e.name == "step")
        .map(|e| {
            (
                int(&e.attributes, "stepguard.step").unwrap(),
                e.time_unix_nano,
            )
        })
        .collect();
    let second = |s: u64| nanos(start + Duration::from_secs(s));
    assert_eq!(
        steps,
        vec![
            (1, second(1)),
            (2, second(3)),
            (3, second(3)),
            (4, second(4)),
            (5, second(5)),
            (6, second(5)),
        ]
    );
    let breach = span.events.iter().find(|e| e.name == "breach").unwrap();
    assert_eq!(int(&breach.attributes, "stepguard.step"), Some(6));
    assert_eq!(breach.time_unix_nano, second(5));
    let stop = span.events.iter().find(|e| e.name == "stop").unwrap();
    assert_eq!(
        text(&stop.attributes, "stepguard.terminated_by"),
        Some("budget")
    );
    assert_eq!(span.events.len(), 8);

    // The metrics: one run, its steps, tokens, cost and duration.
    let metrics = metrics(&receiver);
    let runs = metrics.iter().find(|m| m.name == "stepguard.runs").unwrap();
    assert_eq!(runs.unit, "{run}");
    let Some(metric::Data::Sum(sum)) = &runs.data else {
        panic!("stepguard.runs is not a sum: {runs:?}");
    };
    assert!(sum.is_monotonic);
    assert_eq!(sum.aggregation_temporality, 1, "delta");
    assert_eq!(sum.data_points.len(), 1);
    let point = &sum.data_points[0];
    assert_eq!(
        point.value,
        Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(1))
    );
    assert_eq!(
        text(&point.attributes, "gen_ai.provider.name"),
        Some("codex")
    );
    assert_eq!(
        text(&point.attributes, "stepguard.task_type"),
        Some("review")
    );
    assert_eq!(text(&point.attributes, "stepguard.outcome"), Some("failed"));
    assert_eq!(text(&point.attributes, "error.type"), Some("max_steps"));
    assert_eq!(histogram(&metrics, "stepguard.run.steps"), (1, 6.0));
    assert_eq!(histogram(&metrics, "stepguard.run.tokens"), (1, 1500.0));
    assert_eq!(histogram(&metrics, "stepguard.run.cost_usd"), (1, 0.042));
    assert_eq!(histogram(&metrics, "stepguard.run.duration"), (1, 7.5));

    // Only the first finish exports.
    observer.finish(&record);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(receiver.requests().len(), 2);
}

#[test]
fn steps_the_ticks_missed_get_events_at_the_end_and_the_cap_counts_the_rest() {
    let receiver = Receiver::start();
    let mut config = config(&[(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        &format!("{}/v1/traces", receiver.endpoint()),
    )])
    .unwrap();
    config.max_step_events = 4;
    let mut observer = TelemetryObserver::new(config);
    let start = at("2025-03-01T10:00:00Z");
    observer.record_steps(2, start + Duration::from_secs(1));
    let mut record = over_budget_record();
    record.counts.num_steps_computed = Some(9);
    record.supervision.breached_at_step = None;
    observer.export_run(&record).unwrap();

    let spans = spans(&receiver);
    let span = &spans[0];
    let steps: Vec<_> = span.events.iter().filter(|e| e.name == "step").collect();
    assert_eq!(steps.len(), 4);
    assert_eq!(
        steps[1].time_unix_nano,
        nanos(start + Duration::from_secs(1))
    );
    assert_eq!(steps[2].time_unix_nano, span.end_time_unix_nano);
    assert_eq!(int(&span.attributes, "stepguard.steps_dropped"), Some(5));
    assert_eq!(span.dropped_events_count, 5);
    // Only traces were configured: nothing was posted for metrics.
    assert!(receiver.requests().iter().all(|r| r.path == "/v1/traces"));
}

#[test]
fn http_json_is_spoken_when_asked_for() {
    let receiver = Receiver::start();
    let config = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ])
    .unwrap();
    assert_eq!(config.protocol, Protocol::HttpJson);
    TelemetryObserver::new(config)
        .export_run(&over_budget_record())
        .unwrap();
    let requests = receiver.wait_for(2);
    for request in &requests {
        assert_eq!(request.header("content-type"), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        if request.path == "/v1/traces" {
            assert!(body.to_string().contains("invoke_agent"), "{body}");
        }
    }
}

#[test]
fn an_unsampled_parent_keeps_the_span_unexported_and_is_passed_on() {
    let receiver = Receiver::start();
    let traceparent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-00");
    let config = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
        ("TRACEPARENT", &traceparent),
    ])
    .unwrap();
    let mut observer = TelemetryObserver::new(config);
    assert_eq!(observer.traceparent_for_child(), Some(traceparent));
    observer.export_run(&over_budget_record()).unwrap();
    let requests = receiver.wait_for(1);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/metrics");
}

/// The export is abandoned at the bound: `finish` returns within it (plus slack for starting
/// threads on a loaded machine) with exactly one warning, which it returns.
fn assert_bounded_with_one_warning(endpoint: &str) -> String {
    let config = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]).unwrap();
    assert_eq!(config.flush_timeout, Duration::from_secs(2));
    let mut observer = TelemetryObserver::new(config);
    let record = over_budget_record();
    let begun = Instant::now();
    let ((), warnings) = warnings_of(|| observer.finish(&record));
    let took = begun.elapsed();
    assert!(took < Duration::from_secs(4), "finish took {took:?}");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert!(
        warning.starts_with(&format!(
            "telemetry: could not export to {endpoint}/v1/traces"
        )),
        "{warning}"
    );
    assert!(warning.contains(" within 2s: "), "{warning}");
    assert!(warning.ends_with("; the run is unaffected"), "{warning}");
    warning.clone()
}

#[test]
fn a_refused_connection_is_one_warning_within_the_bound() {
    let warning = assert_bounded_with_one_warning(&refused_endpoint());
    // The transport's own reason, not the exporter's "network error".
    assert!(warning.to_lowercase().contains("refused"), "{warning}");
}

#[test]
fn a_collector_that_never_answers_is_given_up_at_the_bound() {
    let silent = Silent::start();
    let warning = assert_bounded_with_one_warning(&silent.endpoint());
    assert!(
        warning.contains("no answer") || warning.contains("timed out"),
        "{warning}"
    );
    assert!(silent.connections() >= 1, "the exporter did try");
}

#[test]
fn the_error_names_each_signal_that_failed() {
    let silent = Silent::start();
    let mut config = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &silent.endpoint())]).unwrap();
    config.flush_timeout = Duration::from_millis(300);
    let error = TelemetryObserver::new(config)
        .export_run(&over_budget_record())
        .unwrap_err();
    let TelemetryError::Export { failures, bound } = &error else {
        panic!("{error}");
    };
    assert_eq!(*bound, Duration::from_millis(300));
    let signals: Vec<_> = failures.iter().map(|f| f.signal).collect();
    assert_eq!(signals, ["traces", "metrics"]);
    assert!(error.to_string().contains("within 300ms"), "{error}");
}

#[test]
fn nothing_set_means_no_telemetry() {
    assert!(TelemetryConfig::from_env(|_| None).is_none());
    // Variables that say how, but not where, do not turn it on.
    assert!(
        config(&[
            ("OTEL_SERVICE_NAME", "ci"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=b"),
            (
                "TRACEPARENT",
                &format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01")
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        ])
        .is_none()
    );
    // Switched off, whatever else is set.
    for disabled in [
        vec![("OTEL_SDK_DISABLED", "TRUE")],
        vec![
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    ] {
        let mut vars = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        vars.extend(disabled);
        assert!(config(&vars).is_none(), "{vars:?}");
    }
    assert!(
        config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "false"),
        ])
        .is_some()
    );
}

#[test]
fn the_base_endpoint_gets_signal_paths_and_signal_endpoints_are_used_as_given() {
    let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap();
    assert_eq!(
        c.traces_endpoint.as_deref(),
        Some("http://c:4318/v1/traces")
    );
    assert_eq!(
        c.metrics_endpoint.as_deref(),
        Some("http://c:4318/v1/metrics")
    );

    let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otlp.example/api/")]).unwrap();
    assert_eq!(
        c.traces_endpoint.as_deref(),
        Some("https://otlp.example/api/v1/traces")
    );

    let c = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9999/custom"),
    ])
    .unwrap();
    assert_eq!(c.traces_endpoint.as_deref(), Some("http://t:9999/custom"));
    assert_eq!(
        c.metrics_endpoint.as_deref(),
        Some("http://c:4318/v1/metrics")
    );

    // A signal endpoint alone: that signal only.
    let c = config(&[(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "http://m:4318/v1/metrics",
    )])
    .unwrap();
    assert_eq!(c.traces_endpoint, None);
    assert_eq!(
        c.metrics_endpoint.as_deref(),
        Some("http://m:4318/v1/metrics")
    );

    // A signal switched off.
    let c = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_METRICS_EXPORTER", "none"),
    ])
    .unwrap();
    assert_eq!(c.metrics_endpoint, None);
    assert!(c.warnings().is_empty());
}

#[test]
fn protocol_values_and_grpc_falls_back_with_a_warning() {
    let with = |protocol: &str| {
        config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ])
        .unwrap()
    };
    assert_eq!(with("http/protobuf").protocol, Protocol::HttpProtobuf);
    assert!(with("http/protobuf").warnings().is_empty());
    assert_eq!(with("http/json").protocol, Protocol::HttpJson);
    let grpc = with("grpc");
    assert_eq!(grpc.protocol, Protocol::HttpProtobuf);
    assert_eq!(grpc.warnings().len(), 1);
    assert!(grpc.warnings()[0].contains("gRPC is not built into stepguard"));
    let unknown = with("carrier-pigeon");
    assert_eq!(unknown.protocol, Protocol::HttpProtobuf);
    assert!(unknown.warnings()[0].contains("carrier-pigeon"));
    let default = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap();
    assert_eq!(default.protocol, Protocol::HttpProtobuf);
    assert_eq!(default.temporality, Temporality::Delta);
}

#[test]
fn headers_and_resource_attributes_are_parsed_and_decoded() {
    let c = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            " api-key = s%3Dcr%2Ct ,x-b=2,broken, =nokey",
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=from-attrs,deployment.environment=ci%20east",
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            "Cumulative",
        ),
    ])
    .unwrap();
    assert_eq!(
        c.headers,
        BTreeMap::from([
            ("api-key".to_owned(), "s=cr,t".to_owned()),
            ("x-b".to_owned(), "2".to_owned()),
        ])
    );
    assert_eq!(c.warnings().len(), 2, "{:?}", c.warnings());
    assert!(c.warnings()[0].contains("`broken`"));
    assert_eq!(
        c.resource_attributes,
        vec![
            ("service.name".to_owned(), "from-attrs".to_owned()),
            ("deployment.environment".to_owned(), "ci east".to_owned()),
        ]
    );
    // OTEL_SERVICE_NAME is not set, so the resource attribute names the service.
    assert_eq!(c.service_name, "from-attrs");
    assert_eq!(c.temporality, Temporality::Cumulative);
}

#[test]
fn the_environment_overrides_the_config_table_key_by_key() {
    let settings = TelemetrySettings {
        endpoint: Some("http://table:4318".into()),
        protocol: Some("http/json".into()),
        headers: BTreeMap::from([
            ("a".to_owned(), "table".to_owned()),
            ("b".to_owned(), "table".to_owned()),
        ]),
        service_name: Some("table-service".into()),
        flush_timeout: Some(Duration::from_millis(500)),
    };
    let table_only = config_over(&[], &settings).unwrap();
    assert_eq!(
        table_only.traces_endpoint.as_deref(),
        Some("http://table:4318/v1/traces")
    );
    assert_eq!(table_only.protocol, Protocol::HttpJson);
    assert_eq!(table_only.service_name, "table-service");
    assert_eq!(table_only.flush_timeout, Duration::from_millis(500));

    let both = config_over(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "b=env"),
            ("OTEL_SERVICE_NAME", "env-service"),
        ],
        &settings,
    )
    .unwrap();
    assert_eq!(
        both.traces_endpoint.as_deref(),
        Some("http://env:4318/v1/traces")
    );
    assert_eq!(both.protocol, Protocol::HttpProtobuf);
    assert_eq!(
        both.headers,
        BTreeMap::from([
            ("a".to_owned(), "table".to_owned()),
            ("b".to_owned(), "env".to_owned()),
        ])
    );
    assert_eq!(both.service_name, "env-service");
}

#[test]
fn an_invalid_traceparent_is_a_warning_and_a_trace_of_its_own() {
    let c = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("TRACEPARENT", "00-not-a-parent-01"),
    ])
    .unwrap();
    assert_eq!(c.traceparent, None);
    assert_eq!(c.warnings().len(), 1);
    let observer = TelemetryObserver::new(c);
    let child = observer.traceparent_for_child().unwrap();
    assert!(child.starts_with(&format!("00-{}-", observer.trace_id())));
}

#[test]
fn past_records_replay_as_one_span_each_with_their_own_times() {
    let receiver = Receiver::start();
    let config = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
        // A replay is not part of the pipeline that runs it.
        (
            "TRACEPARENT",
            &format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01"),
        ),
    ])
    .unwrap();
    let first = over_budget_record();
    let mut second = RunRecord::new("claude", Outcome::Success);
    second.invocation.started_at = Some("2025-02-01T08:00:00.000Z".into());
    second.invocation.duration_ms = Some(2000);
    second.counts.num_steps_computed = Some(3);
    let mut running = RunRecord::new("gemini", Outcome::Running);
    running.invocation.started_at = Some("2025-02-01T09:00:00.000Z".into());

    let exported = export_records(&config, &[first, second, running]).unwrap();
    assert_eq!(exported, 2);

    let mut spans = spans(&receiver);
    assert_eq!(spans.len(), 2);
    spans.sort_by_key(|s| s.start_time_unix_nano);
    let (claude, codex) = (&spans[0], &spans[1]);
    assert_eq!(
        text(&claude.attributes, "gen_ai.provider.name"),
        Some("claude")
    );
    assert_eq!(
        claude.start_time_unix_nano,
        nanos(at("2025-02-01T08:00:00Z"))
    );
    assert_eq!(claude.end_time_unix_nano, nanos(at("2025-02-01T08:00:02Z")));
    assert_eq!(claude.status.as_ref().map_or(0, |s| s.code), 0, "unset");
    assert_eq!(text(&codex.attributes, "error.type"), Some("max_steps"));
    assert_eq!(
        codex.start_time_unix_nano,
        nanos(at("2025-03-01T10:00:00Z"))
    );
    assert_ne!(claude.trace_id, codex.trace_id);
    for span in &spans {
        assert!(span.parent_span_id.is_empty(), "a root span");
        assert!(span.events.iter().all(|e| e.name != "step"));
    }

    let metrics = metrics(&receiver);
    let runs = metrics.iter().find(|m| m.name == "stepguard.runs").unwrap();
    let Some(metric::Data::Sum(sum)) = &runs.data else {
        panic!("{runs:?}");
    };
    assert_eq!(
        sum.data_points.len(),
        2,
        "one series per provider and outcome"
    );
    assert_eq!(histogram_total(&metrics, "stepguard.run.steps"), (2, 9.0));
}

#[test]
fn a_wrapped_up_run_exports_its_model_calls_and_the_reports_length_but_never_its_text() {
    let receiver = Receiver::start();
    let config = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
        // JSON bodies, so that the text would be found verbatim if it were sent.
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ])
    .unwrap();
    let report = "Done: rotated the key hunter2-SECRET. Left: the docs — 済";
    let mut record = RunRecord::new("codex", Outcome::Success);
    record.invocation.started_at = Some("2025-03-01T10:00:00.000Z".into());
    record.invocation.duration_ms = Some(1000);
    record.counts.num_steps_computed = Some(4);
    record.verdict.terminated_by = Some("wrap_up".parse().unwrap());
    record.gateway.final_report = Some(report.into());
    record.gateway.model_calls = Some(5);
    // The same for a run's end and for a replay of its record.
    TelemetryObserver::new(config.clone())
        .export_run(&record)
        .unwrap();
    assert_eq!(export_records(&config, &[record]).unwrap(), 1);
    let requests = receiver.wait_for(4);
    for request in &requests {
        let body = String::from_utf8_lossy(&request.body);
        assert!(!body.contains("hunter2"), "{}: {body}", request.path);
        assert!(
            !body.contains("rotated the key"),
            "{}: {body}",
            request.path
        );
    }
    let traces: Vec<&Request> = requests.iter().filter(|r| r.path == "/v1/traces").collect();
    assert_eq!(traces.len(), 2);
    for request in traces {
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        let span = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        let attribute = |list: &serde_json::Value, key: &str| {
            list.as_array()
                .unwrap()
                .iter()
                .find(|kv| kv["key"] == key)
                .map(|kv| kv["value"].clone())
        };
        let calls = attribute(&span["attributes"], "stepguard.model_calls").unwrap();
        assert_eq!(
            calls["intValue"].to_string().trim_matches('"'),
            "5",
            "{span}"
        );
        // After the step events (at the end when no tick reported them): the wrap-up, then
        // the stop.
        let events: Vec<&serde_json::Value> = span["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] != "step")
            .collect();
        let names: Vec<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["wrap_up", "stop"], "{span}");
        let chars = attribute(&events[0]["attributes"], "stepguard.final_report_chars").unwrap();
        assert_eq!(
            chars["intValue"].to_string().trim_matches('"'),
            report.chars().count().to_string(),
            "{span}"
        );
    }
}

/// Returns a histogram's (count, sum) over all its data points.
fn histogram_total(metrics: &[Metric], name: &str) -> (u64, f64) {
    let metric = metrics.iter().find(|m| m.name == name).unwrap();
    let Some(metric::Data::Histogram(h)) = &metric.data else {
        panic!("{metric:?}");
    };
    h.data_points
        .iter()
        .fold((0, 0.0), |(c, s), p| (c + p.count, s + p.sum.unwrap()))
}

#[test]
fn the_run_observer_adapter_times_step_events_from_the_agents_start() {
    use stepguard_core::StepLimit;
    use stepguard_runner::{Progress, RunMeta, RunObserver, RunStarted};

    let receiver = Receiver::start();
    let endpoint = format!("{}/v1/traces", receiver.endpoint());
    let config = config(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &endpoint)]).unwrap();
    let mut observer = TelemetryObserver::new(config);
    let start = at("2025-03-01T10:00:00Z");
    let command = vec!["codex".to_owned()];
    let meta = RunMeta::default();
    let as_observer: &mut dyn RunObserver = &mut observer;
    as_observer.started(&RunStarted {
        pid: 1,
        command: &command,
        started_at: start,
        budget: StepLimit::Limited(5),
        budget_source: "--max-steps",
        meta: &meta,
    });
    as_observer.tick(&Progress {
        steps: 2,
        limit: StepLimit::Limited(5),
        elapsed: Duration::from_millis(1500),
        stream_tokens: 0,
        stream_cost_usd: None,
    });
    let mut record = over_budget_record();
    record.counts.num_steps_computed = Some(2);
    record.supervision.breached_at_step = None;
    observer.export_run(&record).unwrap();

    let spans = spans(&receiver);
    let steps: Vec<u64> = spans[0]
        .events
        .iter()
        .filter(|e| e.name == "step")
        .map(|e| e.time_unix_nano)
        .collect();
    let tick = nanos(start + Duration::from_millis(1500));
    assert_eq!(steps, [tick, tick]);
}

/// A finished run `i` seconds after the first, for replays.
fn past_run(i: usize) -> RunRecord {
    let mut r = RunRecord::new("codex", Outcome::Success);
    let start = at("2025-01-01T00:00:00Z") + Duration::from_secs(i as u64);
    r.invocation.started_at = Some(humantime::format_rfc3339_millis(start).to_string());
    r.invocation.duration_ms = Some(1000);
    r.counts.num_steps_computed = Some(3);
    r
}

/// The `stepguard.runs` counter summed over its data points.
fn runs_counted(metrics: &[Metric]) -> i64 {
    let runs = metrics.iter().find(|m| m.name == "stepguard.runs").unwrap();
    let Some(metric::Data::Sum(sum)) = &runs.data else {
        panic!("{runs:?}");
    };
    sum.data_points
        .iter()
        .map(|p| match p.value {
            Some(number_data_point::Value::AsInt(n)) => n,
            _ => panic!("{p:?}"),
        })
        .sum()
}

#[test]
fn a_replay_sends_its_runs_a_batch_at_a_time_and_each_once() {
    let receiver = Receiver::start();
    let config = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint())]).unwrap();
    let mut replay = Replay::new(&config).unwrap();
    let n = 2 * REPLAY_BATCH + 100;
    for i in 0..n {
        assert!(replay.push(&past_run(i)).unwrap());
    }
    let mut running = RunRecord::new("gemini", Outcome::Running);
    running.invocation.started_at = Some("2025-02-01T09:00:00.000Z".into());
    assert!(!replay.push(&running).unwrap(), "a running run is skipped");
    // Two full batches went while the runs came; the rest and the metrics wait for the end.
    assert_eq!(replay.sent(), 2 * REPLAY_BATCH);
    assert_eq!(receiver.requests().len(), 2);
    assert_eq!(replay.finish().unwrap(), n);
    assert_eq!(replay.sent(), n);

    let per_request: Vec<usize> = receiver
        .traces()
        .iter()
        .map(|t| {
            t.resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum()
        })
        .collect();
    assert_eq!(per_request, [REPLAY_BATCH, REPLAY_BATCH, 100]);
    let mut starts: Vec<u64> = spans(&receiver)
        .iter()
        .map(|s| s.start_time_unix_nano)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    assert_eq!(starts.len(), n, "every run once");
    assert_eq!(
        receiver.metrics().len(),
        1,
        "the metrics go once, at the end"
    );
    assert_eq!(runs_counted(&metrics(&receiver)), n as i64);
}

#[test]
fn a_collector_that_fails_mid_replay_stops_it_and_says_how_far_it_got() {
    let receiver = Receiver::failing_after(1);
    let config = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint())]).unwrap();
    let mut replay = Replay::new(&config).unwrap();
    let started = Instant::now();
    let mut failed_at = None;
    for i in 0..3 * REPLAY_BATCH {
        if let Err(e) = replay.push(&past_run(i)) {
            failed_at = Some((i, e));
            break;
        }
    }
    let (i, err) = failed_at.expect("the second batch fails");
    assert_eq!(
        i,
        2 * REPLAY_BATCH - 1,
        "the run that completed the second batch"
    );
    assert_eq!(replay.sent(), REPLAY_BATCH, "the first batch was taken");
    let message = err.to_string();
    assert!(
        message.contains(&format!("{}/v1/traces", receiver.endpoint())),
        "{message}"
    );
    assert!(message.contains("500"), "{message}");
    // Not retried: a 500 is the collector's answer, not a hiccup.
    assert!(started.elapsed() < Duration::from_secs(5));
    // Given up: the metrics of the runs pushed are not sent, even as the replay goes.
    drop(replay);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(receiver.traces().len(), 2);
    assert!(receiver.metrics().is_empty(), "no metrics after a failure");
}
