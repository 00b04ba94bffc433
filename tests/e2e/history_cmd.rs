//! The run history end to end: recording by `run`, `history`, `show`, `stats`, concurrency, crashes.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Sandbox, fixture, workspace};

fn agent(sb: &Sandbox, name: &str, body: &str) -> String {
    let path = sb.write(name, format!("#!/usr/bin/env bash\n{body}\n"));
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path.display().to_string()
}

/// Replaces what changes from run to run (times, durations, paths) so JSON can be snapshotted.
fn redact(v: &mut Value, sb: &Sandbox) {
    let root = sb.root().display().to_string();
    let fixtures = workspace().join("tests/fixtures").display().to_string();
    match v {
        Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                match k.as_str() {
                    "started_at" | "ended_at" if !x.is_null() => *x = "[time]".into(),
                    "duration_ms" if !x.is_null() => *x = "[ms]".into(),
                    // `cgroup` where stepguard may create one, else `process-walk`.
                    "containment" if !x.is_null() => *x = "[containment]".into(),
                    _ => redact(x, sb),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| redact(x, sb)),
        Value::String(s) => {
            *s = s
                .replace(&fixtures, "[fixtures]")
                .replace(&root, "[sandbox]")
        }
        _ => {}
    }
}

/// Three runs: a success, a budget stop, a rate-limited failure, recorded in the project's db.
fn three_runs(sb: &Sandbox) {
    sb.write(
        "project/stepguard.toml",
        "[task_types.review]\nmax_steps = 10\n",
    );
    let ok = agent(
        sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    let long = agent(
        sb,
        "long.sh",
        &format!("cat {}\nsleep 30", fixture("streams/codex/long_run.jsonl")),
    );
    let limited = agent(
        sb,
        "limited.sh",
        &format!("cat {}\nexit 1", fixture("real/codex/error429.jsonl")),
    );
    assert_eq!(
        sb.run(&["run", "-p", "codex", "--task-type", "review", "--", &ok])
            .code,
        Some(0)
    );
    assert_eq!(
        sb.run(&["run", "-p", "codex", "--task-type", "review", "--", &long])
            .code,
        Some(3)
    );
    assert_eq!(
        sb.run(&["run", "-p", "codex", "--unit", "tool", "--", &limited])
            .code,
        Some(1)
    );
}

#[test]
fn every_run_is_recorded_in_the_user_history_with_counts_and_slugs() {
    let sb = Sandbox::new();
    three_runs(&sb);
    assert!(sb.history_db().is_file());
    assert!(
        !sb.project().join(".stepguard").exists(),
        "the history is not written into the agent's repository"
    );
    let list = sb.run(&["history", "--json"]).json();
    type Row<'a> = (i64, &'a str, Option<&'a str>, Option<i64>, Option<i64>);
    let rows: Vec<Row<'_>> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["outcome"].as_str().unwrap(),
                r["error_type"].as_str(),
                r["num_steps_computed"].as_i64(),
                r["exit_code"].as_i64(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (3, "failed", Some("rate_limited"), Some(1), Some(1)),
            (2, "failed", Some("max_steps"), Some(11), Some(3)),
            (1, "success", None, Some(4), Some(0))
        ]
    );
    let human = sb.run(&["history"]);
    let lines: Vec<&str> = human.stdout.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines[1].starts_with("#2 ")
            && lines[1]
                .contains(" codex/item review: Steps: 11 (legacy turns: 1) | failed: max_steps | "),
        "{}",
        lines[1]
    );
    let filtered = sb
        .run(&["history", "--json", "--failed", "--task-type", "review"])
        .json();
    assert_eq!(filtered.as_array().unwrap().len(), 1);
    assert_eq!(
        sb.run(&["history", "--json", "--last", "1"]).json()[0]["id"],
        3
    );
    let show = sb.run(&["show", "2"]);
    assert!(
        show.stdout.contains("  Step Limit: 11 / 10\n"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("  Terminated by: budget\n"),
        "{}",
        show.stdout
    );
    // No gateway, no wrap-up: neither figure is shown.
    assert!(!show.stdout.contains("Model calls"), "{}", show.stdout);
    assert!(!show.stdout.contains("Final report"), "{}", show.stdout);
    assert_eq!(sb.run(&["show", "9"]).code, Some(2));
}

/// A run the model gateway wrapped up, as the history stores it: its model calls and the
/// model's final report reach `show`, `show --json`, `history --json` and `history export`.
#[test]
fn a_wrapped_up_runs_model_calls_and_final_report_are_shown_and_exported() {
    let sb = Sandbox::new();
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    assert_eq!(sb.run(&["run", "-p", "codex", "--", &ok]).code, Some(0));
    assert_eq!(sb.run(&["run", "-p", "codex", "--", &ok]).code, Some(0));
    let report = "Done: the parser handles CRLF.\n\nLeft:\n- the CLI flag\n";
    {
        let conn = rusqlite::Connection::open(sb.history_db()).unwrap();
        conn.execute(
            "UPDATE runs SET record = json_set(record, '$.terminated_by', 'wrap_up',
                '$.final_report', ?1, '$.model_calls', 9)
             WHERE id = 2",
            [report],
        )
        .unwrap();
    }

    let show = sb.run(&["show", "2"]);
    assert_eq!(show.code, Some(0), "{}", show.stderr);
    assert!(
        show.stdout
            .contains("  Terminated by: wrap_up\n  Model calls: 9\n"),
        "{}",
        show.stdout
    );
    // The report comes last, indented under its heading.
    assert!(
        show.stdout.ends_with(
            "  Final report:\n    Done: the parser handles CRLF.\n\n    Left:\n    - the CLI flag\n"
        ),
        "{}",
        show.stdout
    );

    let json = sb.run(&["show", "2", "--json"]).json();
    assert_eq!(
        (&json["final_report"], &json["model_calls"]),
        (&Value::from(report), &Value::from(9))
    );
    let list = sb.run(&["history", "--json"]).json();
    assert_eq!(list[0]["id"], 2);
    assert_eq!(list[0], json);
    assert_eq!(
        (&list[1]["final_report"], &list[1]["model_calls"]),
        (&Value::Null, &Value::Null)
    );
    let export = sb.run(&["history", "export"]);
    assert_eq!(export.code, Some(0), "{}", export.stderr);
    let lines: Vec<Value> = export
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1], json, "oldest first");
    assert!(lines[0]["final_report"].is_null() && lines[0]["model_calls"].is_null());
}

/// Four Claude review runs with token and cost budgets, written through the store as `run`
/// writes them: a success with sub-agents, a token-budget stop, a cost-budget stop, and a
/// success without budgets. Returns the database path.
fn budgeted_runs(sb: &Sandbox) -> String {
    use stepguard_core::{Outcome, RunRecord, TokenUsage};
    use stepguard_store::{NewRun, Store};

    let db = sb.root().join("budgets.db");
    let store = Store::open(&db).unwrap();
    let usage = |input, cached, output, reasoning| TokenUsage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        reasoning_output_tokens: reasoning,
    };
    type Run = (
        Outcome,
        Option<&'static str>,
        u64,
        TokenUsage,
        f64,
        Option<(u64, &'static str)>,
        Option<(f64, &'static str)>,
    );
    let runs: [Run; 4] = [
        (
            Outcome::Success,
            None,
            5,
            usage(1000, Some(600), 200, Some(50)),
            0.05,
            Some((5000, "--max-tokens")),
            Some((0.5, "profiles.ci.max_cost_usd")),
        ),
        (
            Outcome::Failed,
            Some("max_tokens"),
            8,
            usage(4800, None, 300, None),
            0.2,
            Some((5000, "--max-tokens")),
            None,
        ),
        (
            Outcome::Failed,
            Some("max_cost"),
            6,
            usage(2000, None, 100, None),
            0.525,
            None,
            Some((0.5, "--max-cost-usd")),
        ),
        (
            Outcome::Success,
            None,
            3,
            usage(3000, None, 400, None),
            0.125,
            None,
            None,
        ),
    ];
    for (outcome, slug, steps, tokens, cost, max_tokens, max_cost) in runs {
        let id = store
            .begin_run(&NewRun {
                provider: "claude".into(),
                unit: Some("tool_use".into()),
                task_type: Some("review".into()),
                command: vec!["claude".into(), "-p".into()],
                ..NewRun::default()
            })
            .unwrap();
        let mut fin = RunRecord::new("claude", outcome);
        fin.verdict.error_type = slug.map(Into::into);
        fin.verdict.exit_code = Some(if slug.is_some() { 3 } else { 0 });
        fin.verdict.terminated_by = slug.map(|s| {
            if s == "max_tokens" { "tokens" } else { "cost" }
                .parse()
                .unwrap()
        });
        fin.invocation.duration_ms = Some(1000);
        fin.counts.num_steps_computed = Some(steps);
        fin.usage.tokens = Some(tokens);
        fin.usage.cost_usd = Some(cost);
        fin.spend.max_tokens = max_tokens.map(|(n, _)| n);
        fin.spend.max_tokens_source = max_tokens.map(|(_, s)| s.into());
        fin.spend.max_cost_usd = max_cost.map(|(usd, _)| usd);
        fin.spend.max_cost_usd_source = max_cost.map(|(_, s)| s.into());
        if id == 1 {
            fin.sub_agent_tokens = Some(
                [
                    ("task-1".to_owned(), usage(300, Some(100), 40, None)),
                    ("task-2".to_owned(), usage(50, None, 5, None)),
                ]
                .into(),
            );
        }
        store.finish_run(id, &fin).unwrap();
    }
    db.display().to_string()
}

#[test]
fn show_prints_token_and_cost_budgets_usage_and_sub_agents() {
    let sb = Sandbox::new();
    let db = budgeted_runs(&sb);
    let show = |id: &str| {
        let run = sb.run(&["--db", &db, "show", id]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        run.stdout
    };

    let first = show("1");
    assert!(
        first.contains(
            "  Budget: unlimited (from -)\n  Token budget: 5000 (from --max-tokens)\n  Cost budget: $0.50 (from profiles.ci.max_cost_usd)\n"
        ),
        "{first}"
    );
    assert!(
        first.contains(
            "  Tokens: 1000 in (600 cached) / 200 out (50 reasoning), 1200 total, cost $0.0500\n  Sub-agent task-1: 300 in (100 cached) / 40 out\n  Sub-agent task-2: 50 in / 5 out\n  Message: -\n"
        ),
        "{first}"
    );
    assert!(!first.contains("Limit:"), "{first}");

    let tokens = show("2");
    assert!(
        tokens.contains("  Failure: max_tokens\n  Token Limit: 5100 / 5000\n"),
        "{tokens}"
    );
    assert!(
        tokens.contains("  Token budget: 5000 (from --max-tokens)\n  Steps:"),
        "{tokens}"
    );
    assert!(tokens.contains("  Terminated by: tokens\n"), "{tokens}");
    assert!(!tokens.contains("Step Limit"), "{tokens}");

    let cost = show("3");
    assert!(
        cost.contains("  Failure: max_cost\n  Cost Limit: $0.5250 / $0.50\n"),
        "{cost}"
    );
    assert!(
        cost.contains("  Cost budget: $0.50 (from --max-cost-usd)\n"),
        "{cost}"
    );
    assert!(!cost.contains("Token budget"), "{cost}");

    // No budget, no sub-agents: only the usage line.
    let plain = show("4");
    for absent in ["Token budget", "Cost budget", "Sub-agent", "Limit:"] {
        assert!(!plain.contains(absent), "{absent}: {plain}");
    }
    assert!(
        plain.contains("  Tokens: 3000 in / 400 out, 3400 total, cost $0.1250\n"),
        "{plain}"
    );

    // The JSON carries the same, and `history --json` reads the same record.
    let json = sb.run(&["--db", &db, "show", "1", "--json"]).json();
    assert_eq!(
        (
            &json["max_tokens"],
            &json["max_tokens_source"],
            &json["max_cost_usd"],
            &json["max_cost_usd_source"]
        ),
        (
            &Value::from(5000),
            &Value::from("--max-tokens"),
            &Value::from(0.5),
            &Value::from("profiles.ci.max_cost_usd")
        )
    );
    assert_eq!(
        json["sub_agent_tokens"],
        serde_json::json!({
            "task-1": {"input_tokens": 300, "output_tokens": 40, "cached_input_tokens": 100},
            "task-2": {"input_tokens": 50, "output_tokens": 5},
        })
    );
    assert_eq!(
        json["tokens"],
        serde_json::json!({"input_tokens": 1000, "output_tokens": 200,
            "cached_input_tokens": 600, "reasoning_output_tokens": 50})
    );
    let list = sb.run(&["--db", &db, "history", "--json"]).json();
    assert_eq!(list[3], json);
    let plain = &list[0];
    for key in [
        "max_tokens",
        "max_tokens_source",
        "max_cost_usd",
        "max_cost_usd_source",
        "sub_agent_tokens",
    ] {
        assert!(plain[key].is_null(), "{key}: {plain}");
    }

    // The list keeps its one line per run; the slug names the budget that ran out.
    let history = sb.run(&["--db", &db, "history"]);
    let lines: Vec<&str> = history.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", history.stdout);
    assert!(
        lines[2].ends_with(
            " claude/tool_use review: Steps: 8 | failed: max_tokens | 1.0s | tokens: 4800 in / 300 out | cost: $0.2000"
        ),
        "{}",
        lines[2]
    );
}

#[test]
fn stats_give_token_and_cost_percentiles_and_budget_suggestions() {
    let sb = Sandbox::new();
    let db = budgeted_runs(&sb);
    let run = sb.run(&["--db", &db, "stats"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Tokens 1200, 5100, 2100, 3400; cost $0.05, $0.20, $0.525, $0.125. The suggestions are the
    // successful runs' p95 (nearest rank): steps 3 and 5, tokens 1200 and 3400, cost $0.05 and
    // $0.125.
    assert_eq!(
        run.stdout,
        "claude / review: 4 runs, 50.0% success\n  failures: max_cost 1, max_tokens 1\n  steps per run: mean 5.5, p50 5, p95 8, max 8 (4 runs)\n  tokens per run: mean 2950.0, p50 2100, p95 5100, max 5100 (4 runs)\n  cost per run: mean $0.2250, p50 $0.1250, p95 $0.5250, max $0.5250 (4 runs)\n  suggestion: max_steps = 5 would have covered 95% of the 2 successful runs\n  suggestion: max_tokens = 3400 would have covered 95% of the 2 successful runs\n  suggestion: max_cost_usd = 0.125 would have covered 95% of the 2 successful runs\n"
    );
    let json = sb.run(&["--db", &db, "stats", "--json"]).json();
    let group = &json["groups"][0];
    assert_eq!(
        group["failure_slugs"],
        serde_json::json!({"max_cost": 1, "max_tokens": 1})
    );
    assert_eq!(
        group["tokens"],
        serde_json::json!({"runs": 4, "mean": 2950.0, "p50": 2100, "p95": 5100, "max": 5100})
    );
    assert_eq!(
        group["cost_usd"],
        serde_json::json!({"runs": 4, "mean": 0.225, "p50": 0.125, "p95": 0.525, "max": 0.525})
    );
    assert_eq!(group["suggested_max_tokens"], 3400);
    assert_eq!(group["suggested_max_cost_usd"], 0.125);
    assert_eq!(group["suggested_max_steps"], 5);
}

#[test]
fn json_outputs_are_snapshotted() {
    let sb = Sandbox::new();
    three_runs(&sb);
    for (name, args) in [
        ("history_json", vec!["history", "--json"]),
        ("show_json", vec!["show", "2", "--json"]),
        ("stats_json", vec!["stats", "--json"]),
    ] {
        let mut v = sb.run(&args).json();
        redact(&mut v, &sb);
        insta::assert_json_snapshot!(name, v);
    }
}

#[test]
fn stats_text_has_rates_spreads_and_a_suggestion() {
    let sb = Sandbox::new();
    three_runs(&sb);
    let run = sb.run(&["stats"]);
    assert_eq!(
        run.stdout,
        "codex / (no task type): 1 run, 0.0% success\n  failures: rate_limited 1\n  steps per run: mean 1.0, p50 1, p95 1, max 1 (1 run)\n  turns per run: mean 1.0, p50 1, p95 1, max 1 (1 run)\n\
         codex / review: 2 runs, 50.0% success\n  failures: max_steps 1\n  steps per run: mean 7.5, p50 4, p95 11, max 11 (2 runs)\n  turns per run: mean 1.0, p50 1, p95 1, max 1 (2 runs)\n  tokens per run: mean 480.0, p50 480, p95 480, max 480 (1 run)\n  suggestion: max_steps = 4 would have covered 95% of the 1 successful run\n  suggestion: max_tokens = 480 would have covered 95% of the 1 successful run\n"
    );
}

#[test]
fn twenty_concurrent_runs_all_land() {
    let sb = Sandbox::new();
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    let db = sb.root().join("shared.db").display().to_string();
    let children: Vec<_> = (0..20)
        .map(|_| {
            sb.cmd(&["--db", &db, "run", "-p", "codex", "--", &ok])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("not recording"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let list = sb
        .run_env(&["history", "--json"], &[("STEPGUARD_DB", &db)])
        .json();
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 20);
    assert!(
        rows.iter()
            .all(|r| r["outcome"] == "success" && r["num_steps_computed"] == 4)
    );
}

#[test]
fn a_killed_stepguard_leaves_a_row_the_next_open_marks_interrupted() {
    let sb = Sandbox::new();
    let pid_file = sb.root().join("agent.pid");
    let slow = agent(
        &sb,
        "slow.sh",
        &format!(
            "echo $$ > {}\necho '{{\"type\":\"turn.started\"}}'\nsleep 60",
            pid_file.display()
        ),
    );
    let mut sg = sb
        .cmd(&["run", "-p", "codex", "--", &slow])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let run = sb.run(&["history", "--json"]);
        if run.code == Some(0) && run.json()[0]["outcome"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "no running row: {}", run.stderr);
        std::thread::sleep(Duration::from_millis(20));
    }
    sg.kill().unwrap();
    sg.wait().unwrap();
    let row = &sb.run(&["history", "--json"]).json()[0];
    assert_eq!(
        (row["outcome"].as_str(), row["error_type"].as_str()),
        (Some("interrupted"), Some("interrupted"))
    );
    assert!(row["ended_at"].is_string());
    // The orphaned agent is not ours to wait for any more; clean it up.
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    }
}

#[test]
fn no_record_db_flag_and_env() {
    let sb = Sandbox::new();
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    assert_eq!(
        sb.run(&["run", "--no-record", "-p", "codex", "--", &ok])
            .code,
        Some(0)
    );
    assert!(!sb.project().join(".stepguard").exists());
    assert!(!sb.history_db().exists(), "--no-record wrote the history");
    let history = sb.run(&["history"]);
    assert_eq!(history.code, Some(0), "{}", history.stderr);
    assert!(
        history.stderr.contains("no runs recorded yet"),
        "{}",
        history.stderr
    );
    let missing = sb.root().join("dbs/missing.db").display().to_string();
    let named = sb.run(&["history", "--db", &missing]);
    assert_eq!(named.code, Some(2), "{}", named.stderr);
    assert!(
        named.stderr.contains("no history database at "),
        "{}",
        named.stderr
    );
    // A named database is created in a directory that exists (never with folders of its own).
    std::fs::create_dir_all(sb.root().join("dbs")).unwrap();
    let custom = sb.root().join("dbs/custom.db").display().to_string();
    sb.run(&["run", "--db", &custom, "-p", "codex", "--", &ok]);
    sb.run_env(
        &["run", "-p", "codex", "--", &ok],
        &[("STEPGUARD_DB", &custom)],
    );
    assert_eq!(
        sb.run(&["history", "--json", "--db", &custom])
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_newer_database_is_refused_and_the_run_still_enforces() {
    let sb = Sandbox::new();
    let db = sb.root().join("future.db");
    let conn = rusqlite_free_newer_db(&db);
    drop(conn);
    let before = std::fs::read(&db).unwrap();
    let history = sb.run(&["history", "--db", db.to_str().unwrap()]);
    assert_eq!(history.code, Some(2));
    assert!(
        history
            .stderr
            .contains("has schema version 11, newer than this stepguard knows"),
        "{}",
        history.stderr
    );
    let long = agent(
        &sb,
        "long.sh",
        &format!("cat {}\nsleep 30", fixture("streams/codex/long_run.jsonl")),
    );
    let run = sb.run(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "-p",
        "codex",
        "--max-steps",
        "3",
        "--",
        &long,
    ]);
    assert_eq!(run.code, Some(3));
    assert!(
        run.stderr
            .contains("stepguard: warning: not recording this run: history database"),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read(&db).unwrap(), before);
    // The record is not lost: it waits in the spool for a stepguard that knows the database.
    assert!(
        run.stderr.contains("this run's record is kept in"),
        "{}",
        run.stderr
    );
}

/// Makes a SQLite file with `user_version = 11` using the sqlite3 file format directly: a valid
/// empty database whose header says version 11 (bytes 60..64, big endian), one past the newest
/// this stepguard knows (9).
fn rusqlite_free_newer_db(path: &std::path::Path) -> std::fs::File {
    // An empty database made by SQLite is 4096 bytes of header + empty schema page; build it by
    // asking stepguard's store to create one, then patch the version field.
    let sb = Sandbox::new();
    let fresh = sb.root().join("fresh.db");
    let ok = agent(&sb, "ok.sh", "true");
    sb.run(&[
        "run",
        "--db",
        fresh.to_str().unwrap(),
        "-p",
        "codex",
        "--",
        &ok,
    ]);
    // Whatever is still in the write-ahead log (a loaded machine may end the run before the
    // history writer's last checkpoint) goes into the file itself before it is copied.
    let conn = rusqlite::Connection::open(&fresh).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    drop(conn);
    let mut bytes = std::fs::read(&fresh).unwrap();
    bytes[60..64].copy_from_slice(&11u32.to_be_bytes());
    std::fs::write(path, &bytes).unwrap();
    std::fs::File::open(path).unwrap()
}

#[test]
fn escape_sequences_from_a_run_are_never_printed_raw() {
    // A command argument (as a stream's tool name or message could be) holding an escape
    // sequence that clears the screen: the summary line, `history` and `show` print it escaped;
    // the record keeps it as it was.
    let sb = Sandbox::new();
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    let hostile = "title\u{1b}[2J\u{1b}]0;owned\u{7}";
    let run = sb.run(&["run", "-p", "codex", "--", &ok, hostile]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stderr.contains('\u{1b}'), "{:?}", run.stderr);
    for args in [&["history"][..], &["show", "1"][..]] {
        let out = sb.run(args);
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
        let printed = format!("{}{}", out.stdout, out.stderr);
        assert!(
            !printed.contains('\u{1b}') && !printed.contains('\u{7}'),
            "{args:?} printed a raw control character: {printed:?}"
        );
    }
    let show = sb.run(&["show", "1"]);
    assert!(
        show.stdout.contains("title\\u{1b}[2J\\u{1b}]0;owned\\u{7}"),
        "{}",
        show.stdout
    );
    let json = sb.run(&["show", "1", "--json"]).json();
    assert_eq!(json["command"][1], hostile, "the record keeps what ran");
}

#[test]
fn history_filters_may_come_before_or_after_export() {
    let sb = Sandbox::new();
    let ok = agent(
        &sb,
        "ok.sh",
        &format!("cat {}", fixture("real/codex/tools3.jsonl")),
    );
    for _ in 0..3 {
        assert_eq!(sb.run(&["run", "-p", "codex", "--", &ok]).code, Some(0));
    }
    let lines = |args: &[&str]| {
        let out = sb.run(args);
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
        out.stdout.lines().count()
    };
    assert_eq!(lines(&["history", "export"]), 3);
    assert_eq!(lines(&["history", "--last", "2", "export"]), 2);
    assert_eq!(lines(&["history", "export", "--last", "2"]), 2);
    assert_eq!(lines(&["history", "export", "--failed"]), 0);
    assert_eq!(lines(&["history", "export", "--provider", "claude"]), 0);
}

#[test]
fn a_named_database_in_a_missing_directory_is_refused_before_the_agent_starts() {
    // A mistyped --db must not record the run in folders nobody will look in.
    let sb = Sandbox::new();
    let marker = sb.root().join("started");
    let ok = agent(
        &sb,
        "ok.sh",
        &format!(
            "touch {}\ncat {}",
            marker.display(),
            fixture("real/codex/tools3.jsonl")
        ),
    );
    let typo = sb.root().join("hisotry/runs.db");
    let db = typo.display().to_string();
    let run = sb.run(&["--db", &db, "run", "-p", "codex", "--", &ok]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("does not exist"), "{}", run.stderr);
    assert!(!marker.exists(), "the agent started");
    assert!(!typo.parent().unwrap().exists(), "the folder was created");
    // The same through the environment; a new file in a directory that exists is created.
    let env = sb.run_env(&["run", "-p", "codex", "--", &ok], &[("STEPGUARD_DB", &db)]);
    assert_eq!(env.code, Some(2), "{}", env.stderr);
    let fresh = sb.root().join("fresh.db").display().to_string();
    let run = sb.run(&["--db", &fresh, "run", "-p", "codex", "--", &ok]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        sb.run(&["--db", &fresh, "history", "--json"]).json()[0]["outcome"],
        "success"
    );
    // With --no-record there is nothing to refuse.
    let run = sb.run(&["--db", &db, "run", "--no-record", "-p", "codex", "--", &ok]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

/// Each line of `history export` is, byte for byte, what `show ID --json` prints for that run
/// (the record as read and serialized), for runs with budgets, sub-agents and control
/// characters in their text, and one whose stored record lacks a key (an older stepguard's).
#[test]
fn history_export_lines_are_the_records_show_json_prints() {
    let sb = Sandbox::new();
    let db = budgeted_runs(&sb);
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute(
            "UPDATE runs SET record = json_set(record, '$.message', 'bell \u{7} esc \u{1b}[2J c1 \u{85} 済') WHERE id = 2",
            [],
        )
        .unwrap();
        conn.execute(
            "UPDATE runs SET record = json_remove(record, '$.sub_agent_steps') WHERE id = 3",
            [],
        )
        .unwrap();
    }
    let export = sb.run(&["--db", &db, "history", "export"]);
    assert_eq!(export.code, Some(0), "{}", export.stderr);
    let lines: Vec<&str> = export.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", export.stdout);
    for (i, line) in lines.iter().enumerate() {
        let show = sb.run(&["--db", &db, "show", &(i + 1).to_string(), "--json"]);
        assert_eq!(show.code, Some(0), "{}", show.stderr);
        assert_eq!(*line, show.stdout.trim_end_matches('\n'));
    }
    // Control characters are escaped as in every printed line; the key the row lacked is null.
    assert!(
        lines[1].contains(r"bell \u0007 esc \u001b[2J c1 \u{85} 済"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].ends_with(r#""sub_agent_steps":null,"checkpoint":null}"#),
        "{}",
        lines[2]
    );
}
