//! Staged budget notices (#29): with `--wrap-up`, the model call after the run crosses 50%, 80%
//! and 95% of a limit carries one `system notice:` saying what is left, once per threshold.
//! A stand-in agent calls the scripted model server through the gateway; the assertions are on
//! what the server received, the record, `show` and `stats`.

use std::process::Command;

use serde_json::Value;
use stepguard_modelserver::{ModelServer, RecordedRequest, Script};

use crate::harness::{Run, Sandbox, fixture};
use crate::pool_calls::CALL_LOOP;

/// Whether the stand-in agent can run here (it needs python3).
fn python() -> bool {
    Command::new("python3").arg("--version").output().is_ok()
}

/// The staged notice texts of each main request the server saw (`None`: no staged notice; the
/// wrap-up notice of the last call is not a staged one).
fn staged(main: &[RecordedRequest]) -> Vec<Option<String>> {
    main.iter()
        .map(|r| {
            let messages = r.body["messages"].as_array()?;
            let content = messages.last()?["content"].as_array()?;
            content
                .iter()
                .filter_map(|b| b["text"].as_str())
                .find(|t| {
                    t.starts_with("system notice: ") && t.contains(". Plan the rest of the work")
                })
                .map(str::to_owned)
        })
        .collect()
}

/// Runs the stand-in agent under `stepguard run --wrap-up --unit request` with `args`, against
/// a server offering tool rounds without end; returns the run, its record and what the server
/// saw of main requests.
fn run_calls(
    sb: &Sandbox,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Run, Value, Vec<RecordedRequest>) {
    let server = ModelServer::start(Script::tool_rounds(1000).final_answer("Done: 9; left: 1."))
        .expect("a model server");
    let agent = sb.write("calls.py", CALL_LOOP).display().to_string();
    let stream = fixture("streams/claude/success_multi_tool.jsonl");
    let summary = sb.root().join("summary.json");
    let summary_arg = summary.display().to_string();
    let mut all = vec![
        "run",
        "-q",
        "-p",
        "claude",
        "--wrap-up",
        "--unit",
        "request",
        "--no-native-limit",
        "--summary-file",
        &summary_arg,
    ];
    all.extend_from_slice(args);
    all.extend(["--", "python3", &agent, &stream]);
    let mut cmd = sb.cmd(&all);
    cmd.env("ANTHROPIC_BASE_URL", server.url());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run: Run = cmd.output().expect("spawn stepguard").into();
    let record = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (run, record, server.main_requests())
}

#[test]
fn the_upstream_sees_a_notice_exactly_at_each_threshold_and_the_record_lists_them() {
    if !python() {
        eprintln!("SKIPPED: python3 is not installed; the stand-in agent needs it");
        return;
    }
    let sb = Sandbox::new();
    let (run, rec, main) = run_calls(&sb, &["--max-steps", "10"], &[]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(main.len(), 10, "the budget's calls, the last tool-less");
    let notices = staged(&main);
    let at: Vec<usize> = (0..notices.len())
        .filter(|i| notices[*i].is_some())
        .collect();
    // 50% after 5 calls, 80% after 8; 95% would be after 10, where the wrap-up comes instead.
    assert_eq!(at, [5, 8], "{notices:?}");
    assert!(
        notices[5]
            .as_deref()
            .unwrap()
            .starts_with("system notice: 5 of 10 steps left.")
    );
    assert!(
        notices[8]
            .as_deref()
            .unwrap()
            .starts_with("system notice: 2 of 10 steps left.")
    );
    assert!(main[9].tools_disabled && main[9].notices == 1);
    assert!(
        main.iter()
            .enumerate()
            .all(|(i, r)| r.notices == usize::from(i == 5 || i == 8 || i == 9)),
        "one notice per call at most, and only there"
    );
    let listed: Vec<(String, f64, u64, u64)> = rec["notices"]
        .as_array()
        .unwrap_or_else(|| panic!("notices in the record: {rec}"))
        .iter()
        .map(|n| {
            (
                n["limit"].as_str().unwrap().to_owned(),
                n["threshold"].as_f64().unwrap(),
                n["at_step"].as_u64().unwrap(),
                n["model_call"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("steps".into(), 0.5, 5, 6), ("steps".into(), 0.8, 8, 9)],
        "{rec}"
    );
    assert_eq!(rec["notices"][0]["text"], notices[5].as_deref().unwrap());
    // `show` lists them; `stats` counts the run as one that hit its limit after a notice.
    let id = sb.recorded_id(&rec, &run.stderr);
    let show = sb.run(&["show", &id]);
    assert!(
        show.stdout.contains(
            "Notice: steps 50% at step 5 (model call 6): system notice: 5 of 10 steps left."
        ),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains("Notice: steps 80% at step 8 (model call 9)")
    );
    let stats = sb.run(&["stats", "--json"]).json();
    assert_eq!(
        stats["groups"][0]["after_notice"],
        serde_json::json!({"runs": 1, "successes": 0, "hit_limit": 1})
    );
    let text = sb.run(&["stats"]);
    assert!(
        text.stdout.contains(
            "after a budget notice: 1 run, 0 ended by themselves (0.0%), 1 hit the limit"
        ),
        "{}",
        text.stdout
    );
}

#[test]
fn a_token_budget_is_told_in_tokens_and_off_means_none() {
    if !python() {
        eprintln!("SKIPPED: python3 is not installed; the stand-in agent needs it");
        return;
    }
    let sb = Sandbox::new();
    // 120 tokens a call: half of 1200 is spent after 5 calls.
    let (run, rec, main) = run_calls(
        &sb,
        &[
            "--max-steps",
            "100",
            "--max-tokens",
            "1200",
            "--notices",
            "0.5",
        ],
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let notices = staged(&main);
    let at: Vec<usize> = (0..notices.len())
        .filter(|i| notices[*i].is_some())
        .collect();
    assert_eq!(at, [5], "{notices:?}");
    assert!(
        notices[5]
            .as_deref()
            .unwrap()
            .starts_with("system notice: 600 of 1200 tokens left."),
        "{notices:?}"
    );
    assert_eq!(rec["notices"][0]["limit"], "tokens", "{rec}");
    // Off: by flag, by the environment, by the config; nothing but the wrap-up notice.
    for (args, env, config) in [
        (&["--notices", "off"][..], &[][..], None),
        (&[][..], &[("STEPGUARD_NOTICES", "off")][..], None),
        (&[][..], &[][..], Some("[run]\nnotices = []\n")),
    ] {
        let sb = Sandbox::new();
        if let Some(c) = config {
            sb.write("project/stepguard.toml", c);
        }
        let mut all = vec!["--max-steps", "10"];
        all.extend_from_slice(args);
        let (run, rec, main) = run_calls(&sb, &all, env);
        assert_eq!(run.code, Some(3), "{}", run.stderr);
        assert!(
            staged(&main).iter().all(Option::is_none),
            "{args:?} {env:?}"
        );
        assert_eq!(rec["notices"], serde_json::json!([]), "{rec}");
    }
    // The flag beats the environment, which beats the config.
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", "[run]\nnotices = \"off\"\n");
    let (_, _, main) = run_calls(&sb, &["--max-steps", "10"], &[("STEPGUARD_NOTICES", "0.8")]);
    let at: Vec<usize> = staged(&main)
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.as_ref().map(|_| i))
        .collect();
    assert_eq!(at, [8]);
    let (_, _, main) = run_calls(
        &sb,
        &["--max-steps", "10", "--notices", "0.5"],
        &[("STEPGUARD_NOTICES", "0.8")],
    );
    assert!(staged(&main)[5].is_some() && staged(&main)[8].is_none());
}

#[test]
fn bad_thresholds_are_refused_naming_the_key_and_the_fix() {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", "[run]\nnotices = [0.8, 0.5]\n");
    let file = sb.project().join("stepguard.toml").display().to_string();
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!(
            "error: {file}: run.notices: 0.5 does not come after 0.8; expected thresholds ascending"
        )),
        "{}",
        run.stdout
    );
    let run = sb.run(&["run", "-p", "claude", "--wrap-up", "--", "true"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("run.notices"), "{}", run.stderr);
    sb.write("project/stepguard.toml", "[run]\nnotices = 0.5\n");
    let run = sb.run(&["validate"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stdout.contains("run.notices: found float"),
        "{}",
        run.stdout
    );

    let sb = Sandbox::new();
    for bad in ["1.5", "0,0.5", "0.5,x", "0.9,0.5"] {
        let run = sb.run(&[
            "run",
            "-p",
            "claude",
            "--wrap-up",
            "--notices",
            bad,
            "--",
            "true",
        ]);
        assert_eq!(run.code, Some(2), "{bad}: {}", run.stderr);
        assert!(
            run.stderr.contains("--notices") && run.stderr.contains("e.g. 0.5,0.8,0.95"),
            "{bad}: {}",
            run.stderr
        );
    }
    let run = sb
        .cmd(&["run", "-p", "claude", "--wrap-up", "--", "true"])
        .env("STEPGUARD_NOTICES", "0.5,2")
        .output()
        .map(Run::from)
        .unwrap();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("STEPGUARD_NOTICES=0.5,2: 2 is not between 0 and 1"),
        "{}",
        run.stderr
    );
    // Notices need the gateway.
    let run = sb.run(&["run", "-p", "claude", "--notices", "0.5", "--", "true"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("need the model gateway"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_pool_share_is_told_naming_the_pool() {
    if !python() {
        eprintln!("SKIPPED: python3 is not installed; the stand-in agent needs it");
        return;
    }
    let sb = Sandbox::new();
    // Ten calls' tokens (120 each) in the pool; the run's only budget is its share.
    sb.write(
        "project/stepguard.toml",
        "[pools.calls]\nmax_tokens = 1200\nwindow = \"none\"\nmatch = { provider = \"claude\" }\n",
    );
    let (run, rec, main) = run_calls(&sb, &["--max-steps", "100", "--notices", "0.5"], &[]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let pool: Vec<(usize, String)> = staged(&main)
        .into_iter()
        .enumerate()
        .filter_map(|(i, n)| {
            n.filter(|t| t.contains("shared budget `calls`"))
                .map(|t| (i, t))
        })
        .collect();
    assert_eq!(pool.len(), 1, "{pool:?} {rec}");
    // The 5th call's reservation leaves half of the pool (4 settled, its own reserved).
    assert_eq!(pool[0].0, 4, "{pool:?}");
    assert!(
        pool[0]
            .1
            .contains("600 of 1200 tokens left in the shared budget `calls`"),
        "{pool:?}"
    );
    let limits: Vec<&str> = rec["notices"]
        .as_array()
        .unwrap_or_else(|| panic!("{rec}"))
        .iter()
        .map(|n| n["limit"].as_str().unwrap())
        .collect();
    assert!(limits.contains(&"pool"), "{rec}");
}
