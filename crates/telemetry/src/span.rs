//! A run as a span: its identity (fixed before the agent starts), its attributes and events.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};
use stepguard_core::{Containment, Outcome, RunRecord, TerminatedBy};

/// The span's name, as the GenAI semantic conventions name an agent invocation.
pub(crate) const SPAN_NAME: &str = "invoke_agent";

/// The name and version every span and metric of stepguard's is reported under.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("stepguard")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// Who a run's span is: its ids, and its parent's. Decided before the agent starts, so the
/// agent can be told (`TRACEPARENT`) to put its own spans under it.
#[derive(Clone, Debug)]
pub(crate) struct SpanIdentity {
    pub context: SpanContext,
    pub parent_span_id: SpanId,
    pub parent_is_remote: bool,
}

impl SpanIdentity {
    /// A new span: in the parent's trace and with its sampling decision when there is a
    /// parent, else the root of a new sampled trace.
    pub fn new(parent: Option<&SpanContext>) -> Self {
        let ids = RandomIdGenerator::default();
        let span_id = ids.new_span_id();
        match parent {
            Some(parent) => SpanIdentity {
                context: SpanContext::new(
                    parent.trace_id(),
                    span_id,
                    parent.trace_flags(),
                    false,
                    parent.trace_state().clone(),
                ),
                parent_span_id: parent.span_id(),
                parent_is_remote: parent.is_remote(),
            },
            None => SpanIdentity {
                context: SpanContext::new(
                    ids.new_trace_id(),
                    span_id,
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                ),
                parent_span_id: SpanId::INVALID,
                parent_is_remote: false,
            },
        }
    }

    /// Returns the W3C `traceparent` naming this span as the parent.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.context.trace_id(),
            self.context.span_id(),
            self.context.trace_flags().to_u8()
        )
    }

    /// Returns the W3C `tracestate` to pass on with it, when there is one.
    pub fn tracestate(&self) -> Option<String> {
        let state = self.context.trace_state().header();
        (!state.is_empty()).then_some(state)
    }

    pub fn trace_id(&self) -> TraceId {
        self.context.trace_id()
    }
}

/// When each step began, as progress ticks told (at most `cap` remembered; the rest counted).
#[derive(Clone, Debug)]
pub(crate) struct StepLog {
    times: Vec<SystemTime>,
    begun: u64,
    cap: usize,
}

impl StepLog {
    pub fn new(cap: usize) -> Self {
        StepLog {
            times: Vec::new(),
            begun: 0,
            cap,
        }
    }

    /// Notes that `steps` steps have begun by `at`. Costs nothing once the cap is reached.
    pub fn begun(&mut self, steps: u64, at: SystemTime) {
        if steps <= self.begun {
            return;
        }
        let room = self.cap.saturating_sub(self.times.len());
        let new = usize::try_from(steps - self.begun).unwrap_or(usize::MAX);
        self.times.extend(std::iter::repeat_n(at, new.min(room)));
        self.begun = steps;
    }

    /// Returns when step `step` (1-based) began, when remembered.
    pub fn time_of(&self, step: u64) -> Option<SystemTime> {
        let index = usize::try_from(step.checked_sub(1)?).ok()?;
        self.times.get(index).copied()
    }

    /// Returns the steps begun but not remembered (over the cap).
    pub fn dropped(&self) -> u64 {
        self.begun
            .saturating_sub(u64::try_from(self.times.len()).unwrap_or(u64::MAX))
    }

    fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.times
            .iter()
            .zip(1_i64..)
            .map(|(at, n)| Event::new("step", *at, vec![KeyValue::new("stepguard.step", n)], 0))
    }
}

/// Returns the run's start and end as its record says (`started_at`, `ended_at`, else the start
/// plus `duration_ms`).
pub(crate) fn record_times(record: &RunRecord) -> (Option<SystemTime>, Option<SystemTime>) {
    let parse = |t: &Option<String>| {
        t.as_deref()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    };
    let start = parse(&record.invocation.started_at);
    let end = parse(&record.invocation.ended_at).or_else(|| {
        start
            .zip(record.invocation.duration_ms)
            .map(|(s, ms)| s + Duration::from_millis(ms))
    });
    (start, end)
}

/// Builds the span of one run from its record, the steps seen begin, and its times.
pub(crate) fn run_span(
    record: &RunRecord,
    identity: &SpanIdentity,
    steps: &StepLog,
    start: SystemTime,
    end: SystemTime,
) -> SpanData {
    let mut attributes = span_attributes(record);
    let mut events: Vec<Event> = steps.events().collect();
    let dropped = steps.dropped();
    if dropped > 0 {
        attributes.push(KeyValue::new("stepguard.steps_dropped", int(dropped)));
    }
    if let Some(step) = record.supervision.breached_at_step {
        let mut fields = vec![KeyValue::new("stepguard.step", int(step))];
        if let Some(max) = record.step_budget.max_steps {
            fields.push(KeyValue::new("stepguard.max_steps", i64::from(max)));
        }
        events.push(Event::new(
            "breach",
            steps.time_of(step).unwrap_or(end),
            fields,
            0,
        ));
    }
    events.extend(loop_events(record, end));
    if let Some(by) = record.verdict.terminated_by {
        if by == TerminatedBy::WrapUp {
            events.push(wrap_up_event(record, end));
        }
        events.push(Event::new(
            "stop",
            end,
            vec![KeyValue::new("stepguard.terminated_by", by.as_str())],
            0,
        ));
    }
    let mut span_events = SpanEvents::default();
    span_events.events = events;
    span_events.dropped_count = u32::try_from(dropped).unwrap_or(u32::MAX);

    SpanData {
        span_context: identity.context.clone(),
        parent_span_id: identity.parent_span_id,
        parent_span_is_remote: identity.parent_is_remote,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(SPAN_NAME),
        start_time: start,
        end_time: end.max(start),
        attributes,
        dropped_attributes_count: 0,
        events: span_events,
        links: SpanLinks::default(),
        status: status(record),
        instrumentation_scope: scope(),
    }
}

/// The span's attributes: the GenAI conventions' where they fit, stepguard's own after.
fn span_attributes(record: &RunRecord) -> Vec<KeyValue> {
    let mut kv = vec![
        KeyValue::new("gen_ai.operation.name", SPAN_NAME),
        KeyValue::new("gen_ai.provider.name", record.source.provider.clone()),
        KeyValue::new("gen_ai.agent.name", record.source.provider.clone()),
    ];
    if let Some(tokens) = record.usage.tokens {
        kv.push(KeyValue::new(
            "gen_ai.usage.input_tokens",
            int(tokens.input_tokens),
        ));
        kv.push(KeyValue::new(
            "gen_ai.usage.output_tokens",
            int(tokens.output_tokens),
        ));
        if let Some(cached) = tokens.cached_input_tokens {
            kv.push(KeyValue::new(
                "gen_ai.usage.cache_read.input_tokens",
                int(cached),
            ));
        }
    }
    if let Some(slug) = &record.verdict.error_type {
        kv.push(KeyValue::new("error.type", slug.to_string()));
    }
    kv.push(KeyValue::new(
        "stepguard.outcome",
        record.verdict.outcome.as_str(),
    ));
    let text = [
        ("stepguard.unit", record.source.unit.as_deref()),
        (
            "stepguard.max_steps_source",
            record.step_budget.max_steps_source.as_deref(),
        ),
        (
            "stepguard.max_tokens_source",
            record.spend.max_tokens_source.as_deref(),
        ),
        (
            "stepguard.max_cost_usd_source",
            record.spend.max_cost_usd_source.as_deref(),
        ),
        (
            "stepguard.terminated_by",
            record.verdict.terminated_by.map(TerminatedBy::as_str),
        ),
        ("stepguard.task_type", record.source.task_type.as_deref()),
        ("stepguard.profile", record.source.profile.as_deref()),
        (
            "stepguard.containment",
            record.supervision.containment.map(Containment::as_str),
        ),
        (
            "stepguard.plugin_version",
            record.source.plugin_version.as_deref(),
        ),
    ];
    for (key, value) in text {
        if let Some(value) = value {
            kv.push(KeyValue::new(key, value.to_owned()));
        }
    }
    if let Some(pools) = record.spend.pools.as_ref().filter(|p| !p.is_empty()) {
        kv.push(KeyValue::new("stepguard.pools", pools.join(",")));
    }
    if let Some(steps) = record.steps() {
        kv.push(KeyValue::new("stepguard.steps", int(steps)));
    }
    if let Some(max) = record.step_budget.max_steps {
        kv.push(KeyValue::new("stepguard.max_steps", i64::from(max)));
    }
    if let Some(max) = record.spend.max_tokens {
        kv.push(KeyValue::new("stepguard.max_tokens", int(max)));
    }
    if let Some(max) = record.spend.max_cost_usd {
        kv.push(KeyValue::new("stepguard.max_cost_usd", max));
    }
    let numbers = [
        ("stepguard.exit_code", record.verdict.exit_code),
        ("stepguard.child_exit_code", record.verdict.child_exit_code),
        ("stepguard.child_signal", record.verdict.child_signal),
    ];
    for (key, value) in numbers {
        if let Some(value) = value {
            kv.push(KeyValue::new(key, i64::from(value)));
        }
    }
    if let Some(step) = record.supervision.breached_at_step {
        kv.push(KeyValue::new("stepguard.breached_at_step", int(step)));
    }
    if let Some(calls) = record.gateway.model_calls {
        kv.push(KeyValue::new("stepguard.model_calls", int(calls)));
    }
    if let Some(cost) = record.usage.cost_usd {
        kv.push(KeyValue::new("stepguard.cost_usd", cost));
    }
    if let Some(id) = record.id {
        kv.push(KeyValue::new("stepguard.run_id", id));
    }
    kv
}

/// The `wrap_up` event of a run the gateway wrapped up: the final report's length in characters
/// (`stepguard.final_report_chars`, when there is one), never its text, which may say anything
/// about the code and data the agent worked on.
fn wrap_up_event(record: &RunRecord, at: SystemTime) -> Event {
    let fields = record
        .gateway
        .final_report
        .as_deref()
        .map(|report| {
            let chars = u64::try_from(report.chars().count()).unwrap_or(u64::MAX);
            vec![KeyValue::new("stepguard.final_report_chars", int(chars))]
        })
        .unwrap_or_default();
    Event::new("wrap_up", at, fields, 0)
}

/// Error when the run failed (or its supervisor died); unset otherwise, as the conventions
/// ask for successful operations. The description is stepguard's own words only, the outcome
/// and the slug (`failed: max_steps`): the record's message can hold what the model or the CLI
/// wrote (a wrap-up's final report, a provider's error text), which never leaves the machine.
fn status(record: &RunRecord) -> Status {
    let outcome = record.verdict.outcome;
    match outcome {
        Outcome::Failed | Outcome::Interrupted => Status::error(match &record.verdict.error_type {
            Some(slug) => format!("{}: {slug}", outcome.as_str()),
            None => outcome.as_str().to_owned(),
        }),
        _ => Status::Unset,
    }
}

/// One `loop_detected` event per loop the record lists under `loops`. Read through the
/// record's JSON so that records from before (and after) that key existed are all fine: every
/// field of a loop becomes a `stepguard.loop.<field>` attribute.
fn loop_events(record: &RunRecord, at: SystemTime) -> Vec<Event> {
    let Ok(json) = serde_json::to_value(record) else {
        return Vec::new();
    };
    loop_events_from(&json, at)
}

fn loop_events_from(record: &serde_json::Value, at: SystemTime) -> Vec<Event> {
    let loops = match record.get("loops") {
        Some(serde_json::Value::Array(items)) => items.iter().collect(),
        Some(item @ serde_json::Value::Object(_)) => vec![item],
        _ => Vec::new(),
    };
    loops
        .into_iter()
        .map(|found| {
            let fields = found
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| KeyValue::new(format!("stepguard.loop.{k}"), json_value(v)))
                        .collect()
                })
                .unwrap_or_default();
            Event::new("loop_detected", at, fields, 0)
        })
        .collect()
}

fn json_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::I64(i),
            (None, Some(f)) => Value::F64(f),
            _ => Value::String(n.to_string().into()),
        },
        serde_json::Value::String(s) => Value::String(s.clone().into()),
        other => Value::String(other.to_string().into()),
    }
}

/// OpenTelemetry integers are signed; counts that large do not occur, so saturate.
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepguard_core::{FailureSlug, RecordedSlug};

    fn attribute<'a>(kv: &'a [KeyValue], key: &str) -> Option<&'a Value> {
        kv.iter().find(|k| k.key.as_str() == key).map(|k| &k.value)
    }

    #[test]
    fn step_events_stop_at_the_cap_and_the_rest_is_counted() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut log = StepLog::new(3);
        log.begun(2, t0);
        log.begun(2, t0 + Duration::from_secs(1)); // no new step
        log.begun(10_000_000_000, t0 + Duration::from_secs(2));
        assert_eq!(log.time_of(1), Some(t0));
        assert_eq!(log.time_of(3), Some(t0 + Duration::from_secs(2)));
        assert_eq!(log.time_of(4), None);
        assert_eq!(log.time_of(0), None);
        assert_eq!(log.dropped(), 10_000_000_000 - 3);

        let mut record = RunRecord::new("codex", Outcome::Success);
        record.counts.num_steps_computed = Some(10_000_000_000);
        let span = run_span(&record, &SpanIdentity::new(None), &log, t0, t0);
        assert_eq!(span.events.events.len(), 3);
        assert_eq!(
            attribute(&span.attributes, "stepguard.steps_dropped"),
            Some(&Value::I64(10_000_000_000 - 3))
        );
        assert_eq!(span.status, Status::Unset);
    }

    #[test]
    fn loops_are_read_from_the_records_json_whatever_their_fields() {
        let at = SystemTime::UNIX_EPOCH;
        let json = serde_json::json!({
            "provider": "codex",
            "loops": [{"tool": "read", "count": 5, "kind": "repeat", "first_step": 3,
                       "period": null}]
        });
        let events = loop_events_from(&json, at);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].name, "loop_detected");
        let fields = &events[0].attributes;
        assert_eq!(
            attribute(fields, "stepguard.loop.tool"),
            Some(&Value::String("read".into()))
        );
        assert_eq!(
            attribute(fields, "stepguard.loop.count"),
            Some(&Value::I64(5))
        );
        assert_eq!(attribute(fields, "stepguard.loop.period"), None);
        assert!(loop_events_from(&serde_json::json!({"provider": "codex"}), at).is_empty());
        assert!(loop_events_from(&serde_json::json!({"loops": null}), at).is_empty());
    }

    #[test]
    fn a_wrapped_up_run_has_a_wrap_up_event_with_the_reports_length_never_its_text() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let report = "Secret plan: rotate the key sk-live-1234. Left: tests — 完了";
        let mut record = RunRecord::new("codex", Outcome::Success);
        record.verdict.terminated_by = Some("wrap_up".parse().unwrap());
        record.gateway.final_report = Some(report.into());
        record.gateway.model_calls = Some(7);
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(
            attribute(&span.attributes, "stepguard.model_calls"),
            Some(&Value::I64(7))
        );
        let names: Vec<&str> = span.events.events.iter().map(|e| &*e.name).collect();
        assert_eq!(names, ["wrap_up", "stop"]);
        let wrap_up = &span.events.events[0];
        // Characters, not bytes: `—` and `完了` are one character each.
        assert_eq!(report.chars().count(), 58);
        assert_eq!(
            wrap_up.attributes,
            [KeyValue::new("stepguard.final_report_chars", 58_i64)]
        );
        // The text itself is nowhere in the span.
        let everything = format!("{span:?}");
        assert!(!everything.contains("sk-live-1234"), "{everything}");
        assert!(!everything.contains("Secret plan"), "{everything}");

        // Wrapped up without a report: the event, with nothing to measure.
        record.gateway.final_report = None;
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(span.events.events[0].name, "wrap_up");
        assert!(span.events.events[0].attributes.is_empty());
    }

    #[test]
    fn without_a_gateway_or_a_wrap_up_there_is_neither_attribute_nor_event() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut record = RunRecord::new("codex", Outcome::Failed);
        record.verdict.terminated_by = Some("upstream".parse().unwrap());
        // A report without a wrap-up is not announced as one.
        record.gateway.final_report = Some("partial".into());
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(attribute(&span.attributes, "stepguard.model_calls"), None);
        assert!(span.events.events.iter().all(|e| e.name != "wrap_up"));
        assert_eq!(
            attribute(&span.attributes, "stepguard.terminated_by"),
            Some(&Value::String("upstream".into()))
        );
        // Zero calls is a figure, reported as such.
        record.gateway.model_calls = Some(0);
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(
            attribute(&span.attributes, "stepguard.model_calls"),
            Some(&Value::I64(0))
        );
    }

    #[test]
    fn token_and_cost_budgets_are_attributes_when_set_and_absent_otherwise() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut record = RunRecord::new("claude", Outcome::Failed);
        record.verdict.error_type = Some("max_tokens".into());
        record.verdict.terminated_by = Some("tokens".parse().unwrap());
        record.spend.max_tokens = Some(50_000);
        record.spend.max_tokens_source = Some("--max-tokens".into());
        record.spend.max_cost_usd = Some(0.25);
        record.spend.max_cost_usd_source = Some("task_types.review.max_cost_usd".into());
        record.usage.cost_usd = Some(0.125);
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        let a = &span.attributes;
        assert_eq!(
            attribute(a, "stepguard.max_tokens"),
            Some(&Value::I64(50_000))
        );
        assert_eq!(
            attribute(a, "stepguard.max_tokens_source"),
            Some(&Value::String("--max-tokens".into()))
        );
        assert_eq!(
            attribute(a, "stepguard.max_cost_usd"),
            Some(&Value::F64(0.25))
        );
        assert_eq!(
            attribute(a, "stepguard.max_cost_usd_source"),
            Some(&Value::String("task_types.review.max_cost_usd".into()))
        );
        assert_eq!(attribute(a, "stepguard.cost_usd"), Some(&Value::F64(0.125)));
        assert_eq!(
            attribute(a, "error.type"),
            Some(&Value::String("max_tokens".into()))
        );
        // A budget beyond OpenTelemetry's signed integers saturates.
        record.spend.max_tokens = Some(u64::MAX);
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(
            attribute(&span.attributes, "stepguard.max_tokens"),
            Some(&Value::I64(i64::MAX))
        );

        let plain = RunRecord::new("claude", Outcome::Success);
        let span = run_span(&plain, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        for key in [
            "stepguard.max_tokens",
            "stepguard.max_tokens_source",
            "stepguard.max_cost_usd",
            "stepguard.max_cost_usd_source",
        ] {
            assert_eq!(attribute(&span.attributes, key), None, "{key}");
        }
    }

    #[test]
    fn the_pools_of_a_run_are_one_attribute() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut record = RunRecord::new("codex", Outcome::Success);
        record.spend.pools = Some(vec!["review-daily".into(), "team".into()]);
        let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(
            attribute(&span.attributes, "stepguard.pools"),
            Some(&Value::String("review-daily,team".into()))
        );
        let plain = RunRecord::new("codex", Outcome::Success);
        let span = run_span(&plain, &SpanIdentity::new(None), &StepLog::new(0), t0, t0);
        assert_eq!(attribute(&span.attributes, "stepguard.pools"), None);
    }

    #[test]
    fn a_child_traceparent_stays_in_the_parents_trace() {
        let parent = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            SpanId::from_hex("b7ad6b7169203331").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let identity = SpanIdentity::new(Some(&parent));
        let tp = identity.traceparent();
        assert!(
            tp.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
            "{tp}"
        );
        assert!(tp.ends_with("-01"));
        assert!(!tp.contains("b7ad6b7169203331"));
        assert_eq!(identity.parent_span_id, parent.span_id());
        assert!(identity.parent_is_remote);
    }

    /// What the model or the CLI wrote (a wrap-up's final report, a provider's error text, a
    /// plugin's message) is in no exported field, whatever the outcome.
    #[test]
    fn no_run_exports_the_text_of_its_message_or_final_report() {
        const SECRET: &str = "AKIAIOSFODNN7EXAMPLE hunter2";
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut exported = 0;
        for outcome in [Outcome::Success, Outcome::Failed, Outcome::Interrupted] {
            for slug in std::iter::once(None).chain(FailureSlug::ALL.iter().map(Some)) {
                let mut record = RunRecord::new("claude", outcome);
                record.verdict.error_type = slug.map(|s| RecordedSlug::Known(*s));
                record.verdict.message = Some(format!("Done. {SECRET}"));
                record.gateway.final_report = Some(format!("Report: {SECRET}"));
                record.verdict.terminated_by = Some(TerminatedBy::WrapUp);
                let span = run_span(&record, &SpanIdentity::new(None), &StepLog::new(3), t0, t0);
                let all = format!("{span:?}");
                assert!(!all.contains("hunter2"), "{outcome:?} {slug:?}: {all}");
                if let Some(slug) = slug.filter(|_| outcome != Outcome::Success) {
                    let Status::Error { description } = &span.status else {
                        panic!("{outcome:?} {slug:?}: {:?}", span.status)
                    };
                    assert_eq!(description, &format!("{}: {slug}", outcome.as_str()));
                }
                exported += 1;
            }
        }
        assert_eq!(exported, 3 * (FailureSlug::ALL.len() + 1));
    }
}
