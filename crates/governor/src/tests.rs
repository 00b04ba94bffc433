use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use serde_json::json;
use stepguard_core::{FailureSlug, StepLimit};

use super::*;

fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: Arguments::Json(args),
    }
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "read_file".into(),
            schema: Some(
                json!({"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}}),
            ),
            kind: ToolKind::Real,
        },
        ToolSpec {
            name: "report_progress".into(),
            schema: None,
            kind: ToolKind::Progress,
        },
        ToolSpec {
            name: "batch".into(),
            schema: None,
            kind: ToolKind::Batch,
        },
    ]
}

fn text(t: &str) -> ModelResponse {
    ModelResponse {
        text: Some(t.into()),
        ..ModelResponse::default()
    }
}

fn calls(c: Vec<ToolCall>) -> ModelResponse {
    ModelResponse {
        tool_calls: c,
        ..ModelResponse::default()
    }
}

fn good_call(id: &str) -> ModelResponse {
    calls(vec![call(id, "read_file", json!({"path": "a"}))])
}

/// Drives a governor with scripted responses; returns (requests, report).
fn drive(def: AgentDef, script: Vec<ModelResponse>) -> (Vec<Request>, FinalReport, Governor) {
    let mut gov = Governor::new(def).unwrap();
    let mut script = script.into_iter();
    let mut requests = Vec::new();
    let report = loop {
        match gov.next_request() {
            Next::Done(r) => break r,
            Next::Request(r) => {
                requests.push(r);
                let resp = script.next().unwrap_or_default();
                gov.respond(&resp, &mut |c| {
                    if c.id.starts_with("fail") {
                        ToolOutcome::Failed("boom".into())
                    } else {
                        ToolOutcome::Ok(json!("ok"))
                    }
                });
            }
        }
    };
    (requests, report, gov)
}

fn def(max_steps: Option<u32>) -> AgentDef {
    AgentDef {
        max_steps,
        max_turns: 10,
        max_retries: 3,
        tools: tools(),
        ..AgentDef::default()
    }
}

#[test]
fn the_last_step_offers_no_tools_for_n_1_2_5() {
    let (reqs, report, _) = drive(def(Some(1)), vec![text("status: nothing done")]);
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].tools.is_none());
    assert!(report.success);
    let (reqs, report, _) = drive(def(Some(2)), vec![good_call("a"), text("summary")]);
    assert_eq!(
        reqs.iter().map(|r| r.tools.is_some()).collect::<Vec<_>>(),
        [true, false]
    );
    assert!(report.success);
    assert!(report.status.contains("step limit"));
    let (reqs, report, _) = drive(
        def(Some(5)),
        (0..10).map(|i| good_call(&format!("c{i}"))).collect(),
    );
    assert_eq!(
        reqs.iter().map(|r| r.tools.is_some()).collect::<Vec<_>>(),
        [true, true, true, true, false]
    );
    // The model kept calling tools at the last step: no report, the session stops at the limit.
    assert_eq!(
        (report.success, report.slug, report.synthetic),
        (false, Some(FailureSlug::MaxSteps), true)
    );
}

#[test]
fn max_steps_zero_is_invalid_and_absent_is_unlimited() {
    assert!(matches!(
        Governor::new(def(Some(0))),
        Err(DefinitionError::ZeroMaxSteps(_))
    ));
    assert_eq!(
        Governor::new(def(None)).unwrap().step_limit(),
        StepLimit::Unlimited
    );
    let bad = AgentDef {
        max_retries: 0,
        ..def(None)
    };
    assert!(Governor::new(bad).is_err());
}

#[test]
fn profiles_bound_max_steps() {
    let gov = Governor::new(AgentDef {
        profile: Some("smoke".into()),
        ..def(Some(40))
    })
    .unwrap();
    assert_eq!(gov.step_limit(), StepLimit::Limited(5));
    let gov = Governor::new(AgentDef {
        profile: Some("strict".into()),
        ..def(Some(3))
    })
    .unwrap();
    assert_eq!(gov.step_limit(), StepLimit::Limited(3));
    let gov = Governor::new(AgentDef {
        profile: Some("fast".into()),
        ..def(None)
    })
    .unwrap();
    assert_eq!(gov.step_limit(), StepLimit::Limited(30));
    assert!(
        Governor::new(AgentDef {
            profile: Some("turbo".into()),
            ..def(None)
        })
        .is_err()
    );
}

#[test]
fn what_makes_a_turn_succeed() {
    let mut gov = Governor::new(def(None)).unwrap();
    let mut ok = |_: &ToolCall| ToolOutcome::Ok(json!("ok"));
    let _ = gov.next_request();
    // Progress report only: no progress.
    let a = gov.respond(
        &calls(vec![call("p", "report_progress", json!({}))]),
        &mut ok,
    );
    assert_eq!(
        (a.classification, a.slugs.clone()),
        ("failed", vec![FailureSlug::NoTools])
    );
    let _ = gov.next_request();
    // A real call that fails still counts.
    let a = gov.respond(
        &calls(vec![call("fail1", "read_file", json!({"path": "x"}))]),
        &mut |_| ToolOutcome::Failed("no such file".into()),
    );
    assert_eq!((a.classification, a.executed, a.turn), ("progress", 1, 1));
    for (resp, slug) in [
        (
            calls(vec![call("u", "nope", json!({}))]),
            FailureSlug::UnknownTool,
        ),
        (
            calls(vec![call("s", "read_file", json!({"path": 3}))]),
            FailureSlug::SchemaInvalidToolCall,
        ),
        (
            calls(vec![ToolCall {
                id: "m".into(),
                name: "read_file".into(),
                arguments: Arguments::Raw("{path:".into()),
            }]),
            FailureSlug::MalformedToolCall,
        ),
    ] {
        let mut gov = Governor::new(def(None)).unwrap();
        let _ = gov.next_request();
        let a = gov.respond(&resp, &mut ok);
        assert_eq!((a.classification, a.slugs.clone()), ("failed", vec![slug]));
    }
    // A batch's inner real call is progress; the batch itself is not.
    let mut gov = Governor::new(def(None)).unwrap();
    let _ = gov.next_request();
    let a = gov.respond(
        &calls(vec![call(
            "b",
            "batch",
            json!({"calls": [{"name": "read_file", "arguments": {"path": "a"}}, {"name": "nope"}]}),
        )]),
        &mut ok,
    );
    assert_eq!((a.classification, a.executed), ("progress", 1));
}

#[test]
fn retries_exhausted_fails_the_session_at_once() {
    let d = AgentDef {
        max_retries: 2,
        ..def(None)
    };
    let (reqs, report, gov) = drive(
        d,
        vec![
            good_call("a"),
            ModelResponse::default(),
            ModelResponse::default(),
            good_call("never"),
        ],
    );
    assert_eq!(reqs.len(), 3);
    assert_eq!(
        (report.success, report.slug, report.synthetic),
        (false, Some(FailureSlug::RetriesExhausted), true)
    );
    assert_eq!(
        gov.attempts()
            .iter()
            .map(|a| (a.turn, a.attempt))
            .collect::<Vec<_>>(),
        [(1, 1), (2, 1), (2, 2)]
    );
}

#[test]
fn notices_are_ephemeral_once_per_turn_and_not_cacheable() {
    let d = AgentDef {
        max_retries: 3,
        ..def(None)
    };
    let (reqs, _, gov) = drive(
        d,
        vec![
            calls(vec![call("u", "nope", json!({}))]),
            ModelResponse::default(),
            good_call("a"),
            text("done"),
        ],
    );
    let notices: Vec<Option<&Notice>> = reqs.iter().map(|r| r.notice.as_ref()).collect();
    assert!(notices[0].is_none());
    let n = notices[1].unwrap();
    assert!(
        n.text
            .starts_with("system notice: the last attempt failed (unknown_tool)"),
        "{}",
        n.text
    );
    assert!(!n.cacheable);
    assert!(notices[2].is_none(), "at most one notice per turn");
    assert!(notices[3].is_none());
    let history = serde_json::to_string(gov.history()).unwrap();
    assert!(
        !history.contains("system notice"),
        "notices are never stored"
    );
}

#[test]
fn final_report_formats() {
    let schema = json!({"type": "object", "required": ["verdict"], "properties": {"verdict": {"enum": ["pass", "fail"]}}});
    let json_def = AgentDef {
        final_report: ReportFormat::Json { schema },
        max_retries: 1,
        ..def(None)
    };
    let (_, r, _) = drive(json_def.clone(), vec![text(r#"{"verdict": "pass"}"#)]);
    assert_eq!(
        (r.success, r.content.clone(), r.synthetic),
        (true, json!({"verdict": "pass"}), false)
    );
    let (_, r, gov) = drive(json_def.clone(), vec![text(r#"{"verdict": "maybe"}"#)]);
    assert_eq!(
        gov.attempts()[0].slugs,
        [FailureSlug::TextOnly, FailureSlug::FinalReportSchemaFail]
    );
    assert_eq!((r.success, r.synthetic), (false, true));
    let (_, _, gov) = drive(json_def, vec![text("looks good to me")]);
    assert_eq!(
        gov.attempts()[0].slugs,
        [FailureSlug::TextOnly, FailureSlug::FinalReportInvalidFormat]
    );
    let chat = AgentDef {
        final_report: ReportFormat::Chat,
        max_retries: 1,
        ..def(None)
    };
    assert!(
        drive(
            chat.clone(),
            vec![text(
                r#"{"messages": [{"role": "assistant", "content": "hi"}]}"#
            )]
        )
        .1
        .success
    );
    assert!(!drive(chat, vec![text(r#"{"message": "hi"}"#)]).1.success);
    let (_, _, gov) = drive(
        AgentDef {
            max_retries: 1,
            ..def(None)
        },
        vec![ModelResponse {
            reasoning: Some("hmm".into()),
            ..ModelResponse::default()
        }],
    );
    assert_eq!(gov.attempts()[0].slugs, [FailureSlug::ReasoningOnly]);
}

#[test]
fn turns_exhausted_without_report_is_final_report_missing() {
    let d = AgentDef {
        max_turns: 2,
        ..def(None)
    };
    let (reqs, r, _) = drive(d, vec![good_call("a"), good_call("b"), text("late")]);
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        (r.slug, r.synthetic),
        (Some(FailureSlug::FinalReportMissing), true)
    );
}

#[test]
fn limits_only_shrink() {
    let mut gov = Governor::new(AgentDef {
        max_turns: 10,
        ..def(None)
    })
    .unwrap();
    gov.collapse_remaining_turns(50);
    assert_eq!(gov.max_turns(), 10);
    gov.collapse_remaining_turns(1);
    assert_eq!(gov.max_turns(), 2);
    gov.collapse_remaining_turns(5);
    assert_eq!(gov.max_turns(), 2);
}

#[test]
fn sub_agents_count_their_own_steps() {
    let scenario = scenario::parse(include_str!("../scenarios/nested_subagents.json")).unwrap();
    let t = scenario::run(&scenario).unwrap();
    assert_eq!(t["expectations"]["met"], true, "{t:#}");
    assert_eq!(t["steps_used"], 2);
    assert_eq!(t["subagents"][0]["transcript"]["steps_used"], 3);
}

/// Captures the governor's events for one closure.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<CapturedEvent>>>);

/// (level, target, fields) of one event.
type CapturedEvent = (tracing::Level, String, HashMap<String, String>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct V(HashMap<String, String>);
        impl tracing::field::Visit for V {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.insert(f.name().into(), format!("{v:?}"));
            }
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                self.0.insert(f.name().into(), v.into());
            }
            fn record_bool(&mut self, f: &tracing::field::Field, v: bool) {
                self.0.insert(f.name().into(), v.to_string());
            }
        }
        let mut v = V(HashMap::new());
        event.record(&mut v);
        self.0.lock().unwrap().push((
            *event.metadata().level(),
            event.metadata().target().into(),
            v.0,
        ));
    }
}

fn capture(f: impl FnOnce()) -> Vec<CapturedEvent> {
    use tracing_subscriber::layer::SubscriberExt as _;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    tracing::subscriber::with_default(subscriber, f);
    captured.0.lock().unwrap().clone()
}

#[test]
fn one_warning_per_failed_attempt_and_one_error_per_failed_session() {
    let events = capture(|| {
        drive(
            AgentDef {
                max_retries: 3,
                ..def(None)
            },
            vec![
                calls(vec![call("u", "nope", json!({}))]),
                ModelResponse::default(),
                text(""),
            ],
        );
    });
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e.0 == tracing::Level::WARN)
        .collect();
    let errors: Vec<_> = events
        .iter()
        .filter(|e| e.0 == tracing::Level::ERROR)
        .collect();
    assert_eq!(warnings.len(), 3);
    assert_eq!(errors.len(), 1);
    assert_eq!(
        warnings
            .iter()
            .map(|w| w.2["slugs"].as_str())
            .collect::<Vec<_>>(),
        ["unknown_tool", "empty_response", "empty_response"]
    );
    assert!(
        warnings
            .iter()
            .all(|w| w.1 == "stepguard_governor::attempt" && w.2["truncated"] == "false")
    );
    assert!(warnings[0].2["response"].contains("\"name\":\"nope\""));
    assert_eq!(errors[0].2["slug"], "retries_exhausted");
    // A successful session logs no warning or error.
    let events = capture(|| {
        drive(def(None), vec![good_call("a"), text("done")]);
    });
    assert!(events.iter().all(|e| e.0 > tracing::Level::WARN));
}

#[test]
fn logged_responses_are_capped_at_128_kib() {
    let huge = ModelResponse {
        text: Some("é".repeat(100_000)),
        ..ModelResponse::default()
    };
    let (json, truncated) = events::capped_response(&huge);
    assert!(truncated);
    assert!(json.len() <= governor::MAX_LOGGED_RESPONSE);
    let events = capture(|| {
        let schema = json!({"type": "object"});
        drive(
            AgentDef {
                final_report: ReportFormat::Json { schema },
                max_retries: 1,
                ..def(None)
            },
            vec![huge.clone()],
        );
    });
    let w = events.iter().find(|e| e.0 == tracing::Level::WARN).unwrap();
    assert_eq!(w.2["truncated"], "true");
    assert!(w.2["response"].len() <= governor::MAX_LOGGED_RESPONSE);
}

/// A scripted model reply drawn at random.
fn any_response() -> impl Strategy<Value = ModelResponse> {
    let one_call = prop_oneof![
        Just(call("x", "read_file", json!({"path": "a"}))),
        Just(call("x", "read_file", json!({"path": 1}))),
        Just(call("x", "nope", json!({}))),
        Just(call("x", "report_progress", json!({}))),
        Just(call("fail", "read_file", json!({"path": "a"}))),
        Just(ToolCall {
            id: "x".into(),
            name: "read_file".into(),
            arguments: Arguments::Raw("{oops".into())
        }),
        Just(call(
            "x",
            "batch",
            json!({"calls": [{"name": "read_file", "arguments": {"path": "b"}}, {"name": "nope"}]})
        )),
    ];
    prop_oneof![
        Just(ModelResponse::default()),
        Just(text("final words")),
        Just(ModelResponse {
            reasoning: Some("thinking".into()),
            ..ModelResponse::default()
        }),
        proptest::collection::vec(one_call, 1..4).prop_map(calls),
    ]
}

proptest! {
    /// Whatever the model does: never more than max_turns × max_retries requests (nor more than
    /// max_steps), and every tool call gets exactly one result.
    #[test]
    fn request_bound_and_every_call_answered(
        max_turns in 1u32..6,
        max_retries in 1u32..5,
        max_steps in proptest::option::of(1u32..12),
        script in proptest::collection::vec(any_response(), 0..40),
    ) {
        let d = AgentDef { max_steps, max_turns, max_retries, tools: tools(), ..AgentDef::default() };
        // Give every call a unique id so answers can be matched.
        let mut n = 0;
        let script: Vec<ModelResponse> = script.into_iter().map(|mut r| {
            for c in &mut r.tool_calls { n += 1; c.id = format!("{}-{n}", c.id); }
            r
        }).collect();
        let (reqs, report, gov) = drive(d, script);
        prop_assert!(reqs.len() as u32 <= max_turns * max_retries);
        if let Some(m) = max_steps { prop_assert!(reqs.len() as u32 <= m); }
        prop_assert_eq!(report.synthetic, !report.success);
        let mut answered: HashMap<&str, usize> = HashMap::new();
        let mut made = Vec::new();
        for m in gov.history() {
            match m {
                Message::Assistant { tool_calls, .. } => made.extend(tool_calls.iter().map(|c| c.id.as_str())),
                Message::Tool { call_id, .. } => *answered.entry(call_id.as_str()).or_default() += 1,
            }
        }
        prop_assert_eq!(answered.len(), made.len());
        for id in made { prop_assert_eq!(answered.get(id), Some(&1)); }
    }
}

#[test]
fn every_scenario_file_meets_its_expectations() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 20, "scenario files: {}", files.len());
    for file in files {
        let scenario = scenario::parse(&std::fs::read_to_string(&file).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            !scenario.expect.is_empty(),
            "{} has no expectations",
            file.display()
        );
        let t = scenario::run(&scenario).unwrap();
        assert_eq!(
            t["expectations"]["met"],
            true,
            "{}: {:#}",
            file.display(),
            t["expectations"]
        );
    }
}
