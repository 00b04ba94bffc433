use std::collections::BTreeMap;

use stepguard_core::loops::{LoopFound, LoopKind};
use stepguard_core::{FailureSlug, RunStats};

use super::*;

fn db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/history.db");
    (dir, path)
}

fn finished(
    outcome: Outcome,
    slug: Option<FailureSlug>,
    steps: Option<u64>,
    turns: Option<u64>,
) -> RunRecord {
    let mut record = RunRecord::new("ignored", outcome);
    record.set_stats(&RunStats {
        num_steps_computed: steps,
        num_turns_computed: turns,
        slug,
        duration_ms: Some(1000),
        ..RunStats::new(outcome)
    });
    record.exit_code = Some(0);
    record.child_exit_code = Some(0);
    record
}

#[test]
fn a_version_1_database_with_rows_migrates_with_every_value_intact() {
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = create_at_version(&path, 1).unwrap();
        conn.execute(
            "INSERT INTO runs (started_at, ended_at, provider, unit, task_type, max_steps, command, outcome,
                failure_slug, exit_code, duration_ms, num_turns_reported, num_turns_computed, cost_usd)
             VALUES ('2025-01-01T00:00:00Z', '2025-01-01T00:01:00Z', 'claude', 'turn', 'review', 10,
                '[\"claude\",\"-p\"]', 'failed', 'MAX_TURNS', 3, 60000, 11, 10, 0.25)",
            [],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO runs (started_at, provider, command, outcome, num_turns_reported)
             VALUES ('2025-01-02T00:00:00Z', 'gemini', '[]', 'success', 4)",
            [],
        )
        .unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, 1);
    }
    let store = Store::open(&path).unwrap();
    let v: i64 = store
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let old = store.get(1).unwrap().unwrap();
    assert_eq!(
        (
            old.provider.as_str(),
            old.unit.as_deref(),
            old.task_type.as_deref(),
            old.max_steps
        ),
        ("claude", Some("turn"), Some("review"), Some(10))
    );
    assert_eq!(
        old.command.as_deref(),
        Some(&["claude".to_owned(), "-p".to_owned()][..])
    );
    assert_eq!(
        (
            old.outcome.as_str(),
            old.error_type.as_deref(),
            old.exit_code
        ),
        ("failed", Some("MAX_TURNS"), Some(3))
    );
    assert_eq!(
        (
            old.num_turns_reported,
            old.num_turns_computed,
            old.duration_ms,
            old.cost_usd
        ),
        (Some(11), Some(10), Some(60000), Some(0.25))
    );
    assert_eq!(
        (old.num_steps_reported, old.num_steps_computed),
        (None, None)
    );
    assert_eq!(old.ended_at.as_deref(), Some("2025-01-01T00:01:00Z"));
    // Turn-only rows say what they are; the legacy slug is readable and shown as stored.
    assert_eq!(
        old.summary_line(),
        "Turns: 11 | failed: MAX_TURNS (legacy name of max_steps) | 1m00s | cost: $0.2500"
    );
    assert_eq!(
        store.get(2).unwrap().unwrap().summary_line(),
        "Turns: 4 | success"
    );
    // Opening again is a no-op.
    drop(store);
    assert_eq!(
        Store::open(&path)
            .unwrap()
            .list(&Filter::default())
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_newer_database_is_refused_and_left_untouched() {
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE runs (id INTEGER PRIMARY KEY, future TEXT); INSERT INTO runs VALUES (1, 'x'); PRAGMA user_version = 99;").unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(&path).err().expect("must refuse");
    assert!(matches!(err, StoreError::NewerSchema { found: 99, .. }));
    assert!(
        err.to_string().contains(
            "has schema version 99, newer than this stepguard knows (6); refusing to modify it"
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!path.with_extension("db-wal").exists());
}

#[test]
fn a_database_one_version_ahead_is_refused_too() {
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = create_at_version(&path, SCHEMA_VERSION).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(&path).err().expect("must refuse");
    assert!(
        matches!(err, StoreError::NewerSchema { found, known, .. }
            if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn lifecycle_running_progress_finished() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    let id = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            unit: Some("item".into()),
            max_steps: Some(30),
            max_steps_source: Some("--max-steps".into()),
            command: vec!["codex".into(), "exec".into()],
            ..NewRun::default()
        })
        .unwrap();
    let running = store.get(id).unwrap().unwrap();
    assert_eq!(
        (running.outcome.as_str(), running.num_steps_computed),
        ("running", None)
    );
    store.update_progress(id, 7).unwrap();
    assert_eq!(store.get(id).unwrap().unwrap().num_steps_computed, Some(7));
    let mut fin = finished(
        Outcome::Failed,
        Some(FailureSlug::MaxSteps),
        Some(31),
        Some(1),
    );
    fin.exit_code = Some(3);
    fin.terminated_by = Some("budget".into());
    fin.on_limit_decisions = vec!["allow:2".into(), "stop".into()];
    store.finish_run(id, &fin).unwrap();
    let done = store.get(id).unwrap().unwrap();
    assert_eq!(
        (
            done.outcome.as_str(),
            done.error_type.as_deref(),
            done.exit_code
        ),
        ("failed", Some("max_steps"), Some(3))
    );
    assert_eq!(
        (done.num_steps_computed, done.terminated_by.as_deref()),
        (Some(31), Some("budget"))
    );
    assert_eq!(done.on_limit_decisions, ["allow:2", "stop"]);
    assert!(done.ended_at.is_some());
    // A finished row takes no more progress updates.
    store.update_progress(id, 99).unwrap();
    assert_eq!(store.get(id).unwrap().unwrap().num_steps_computed, Some(31));
}

#[test]
fn runs_of_dead_supervisors_are_marked_interrupted_live_ones_are_not() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    let live = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    let dead = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    let reused = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    let other_host = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    // A pid that cannot exist, a pid now used by a process that started at another time, and a
    // row from another machine.
    store
        .conn
        .execute(
            "UPDATE runs SET supervisor_pid = 2147483000 WHERE id = ?1",
            [dead],
        )
        .unwrap();
    store
        .conn
        .execute(
            "UPDATE runs SET supervisor_start_ticks = supervisor_start_ticks + 1 WHERE id = ?1",
            [reused],
        )
        .unwrap();
    store.conn.execute("UPDATE runs SET supervisor_host = 'elsewhere', supervisor_pid = 2147483000 WHERE id = ?1", [other_host]).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    let outcome = |id| store.get(id).unwrap().unwrap().outcome.as_str();
    assert_eq!(outcome(live), "running");
    assert_eq!(outcome(dead), "interrupted");
    assert_eq!(outcome(reused), "interrupted");
    assert_eq!(outcome(other_host), "running");
    assert_eq!(
        store.get(dead).unwrap().unwrap().error_type.as_deref(),
        Some("interrupted")
    );
}

#[test]
fn list_filters_and_orders_newest_first() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    for (provider, task, outcome) in [
        ("codex", "a", Outcome::Success),
        ("claude", "a", Outcome::Failed),
        ("codex", "b", Outcome::Failed),
    ] {
        let id = store
            .begin_run(&NewRun {
                provider: provider.into(),
                task_type: Some(task.into()),
                ..NewRun::default()
            })
            .unwrap();
        let slug = (outcome == Outcome::Failed).then_some(FailureSlug::ProviderError);
        store
            .finish_run(id, &finished(outcome, slug, Some(1), None))
            .unwrap();
    }
    let ids = |f: Filter| {
        store
            .list(&f)
            .unwrap()
            .iter()
            .filter_map(|r| r.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(Filter::default()), [3, 2, 1]);
    assert_eq!(
        ids(Filter {
            provider: Some("codex".into()),
            ..Filter::default()
        }),
        [3, 1]
    );
    assert_eq!(
        ids(Filter {
            task_type: Some("a".into()),
            ..Filter::default()
        }),
        [2, 1]
    );
    assert_eq!(
        ids(Filter {
            failed: true,
            ..Filter::default()
        }),
        [3, 2]
    );
    assert_eq!(
        ids(Filter {
            last: Some(1),
            ..Filter::default()
        }),
        [3]
    );
}

#[test]
fn percentiles_by_nearest_rank() {
    let v: Vec<i64> = (1..=20).collect();
    assert_eq!(percentile(&v, 50.0), Some(10));
    assert_eq!(percentile(&v, 95.0), Some(19));
    assert_eq!(percentile(&v, 100.0), Some(20));
    assert_eq!(percentile(&[7], 95.0), Some(7));
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[1, 2, 3], 50.0), Some(2));
}

#[test]
fn stats_match_hand_computed_figures() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    let add = |provider: &str, task: Option<&str>, fin: RunRecord| {
        let id = store
            .begin_run(&NewRun {
                provider: provider.into(),
                task_type: task.map(Into::into),
                ..NewRun::default()
            })
            .unwrap();
        store.finish_run(id, &fin).unwrap();
    };
    // codex/review: 20 successes with 1..=20 steps, 2 budget failures with 31 steps, 1 rate limit.
    for steps in 1..=20 {
        add(
            "codex",
            Some("review"),
            finished(Outcome::Success, None, Some(steps), Some(1)),
        );
    }
    for _ in 0..2 {
        add(
            "codex",
            Some("review"),
            finished(
                Outcome::Failed,
                Some(FailureSlug::MaxSteps),
                Some(31),
                Some(1),
            ),
        );
    }
    add(
        "codex",
        Some("review"),
        finished(
            Outcome::Failed,
            Some(FailureSlug::RateLimited),
            Some(4),
            Some(1),
        ),
    );
    // claude, no task type: a turn-only success (6 turns) and a stepped failure.
    add(
        "claude",
        None,
        finished(Outcome::Success, None, None, Some(6)),
    );
    add(
        "claude",
        None,
        finished(
            Outcome::Failed,
            Some(FailureSlug::ProviderError),
            Some(2),
            Some(3),
        ),
    );
    // A running row is left out.
    store
        .begin_run(&NewRun {
            provider: "codex".into(),
            task_type: Some("review".into()),
            ..NewRun::default()
        })
        .unwrap();

    let report = compute_stats(&store.list(&Filter::default()).unwrap());
    assert_eq!(report.groups.len(), 2);
    let claude = &report.groups[0];
    assert_eq!(
        (
            claude.provider.as_str(),
            claude.task_type.as_deref(),
            claude.runs,
            claude.successes
        ),
        ("claude", None, 2, 1)
    );
    assert_eq!(claude.success_rate, 0.5);
    assert_eq!(
        claude.steps,
        Some(Spread {
            runs: 1,
            mean: 2.0,
            p50: 2,
            p95: 2,
            max: 2
        })
    );
    // Turn-only rows count in the turn columns: turns 6 and 3.
    assert_eq!(
        claude.turns,
        Some(Spread {
            runs: 2,
            mean: 4.5,
            p50: 3,
            p95: 6,
            max: 6
        })
    );
    // The only success has no step metric: no evidence for a suggestion.
    assert_eq!(claude.suggested_max_steps, None);

    let codex = &report.groups[1];
    assert_eq!((codex.runs, codex.successes), (23, 20));
    assert_eq!(codex.success_rate, 0.8696);
    assert_eq!(
        codex.failure_slugs,
        BTreeMap::from([("max_steps".to_owned(), 2), ("rate_limited".to_owned(), 1)])
    );
    // Steps: 1..=20, 31, 31, 4 → sum 210 + 62 + 4 = 276 over 23 runs = 12.0; sorted ranks:
    // p50 = rank 12 → 11 (1,2,3,4,4,5,…), p95 = rank 22 → 31, max 31.
    assert_eq!(
        codex.steps,
        Some(Spread {
            runs: 23,
            mean: 12.0,
            p50: 11,
            p95: 31,
            max: 31
        })
    );
    // Successful runs' p95 (rank 19 of 1..=20) is 19.
    assert_eq!(codex.suggested_max_steps, Some(19));
    assert_eq!(
        codex.suggestion().unwrap(),
        "max_steps = 19 would have covered 95% of the 20 successful runs"
    );
}

#[test]
fn default_location_prefers_flag_then_config_dir_then_cwd() {
    let cwd = Path::new("/work");
    assert_eq!(
        default_location(Some(Path::new("/x.db")), Some(Path::new("/repo")), cwd),
        PathBuf::from("/x.db")
    );
    assert_eq!(
        default_location(None, Some(Path::new("/repo")), cwd),
        PathBuf::from("/repo/.stepguard/history.db")
    );
    assert_eq!(
        default_location(None, None, cwd),
        PathBuf::from("/work/.stepguard/history.db")
    );
}

#[test]
fn every_field_of_a_run_record_survives_the_round_trip() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    let id = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            plugin_version: Some("0.1.0".into()),
            unit: Some("item".into()),
            max_steps: Some(5),
            max_steps_source: Some("--max-steps".into()),
            command: vec!["codex".into(), "exec".into()],
            started_at: Some("2026-01-01T00:00:00.000Z".into()),
            ..NewRun::default()
        })
        .unwrap();
    let mut fin = finished(
        Outcome::Failed,
        Some(FailureSlug::MaxSteps),
        Some(6),
        Some(1),
    );
    fin.ended_at = Some("2026-01-01T00:00:01.000Z".into());
    fin.message = Some("stopped".into());
    fin.exit_code = Some(3);
    fin.child_exit_code = None;
    fin.child_signal = Some(15);
    fin.terminated_by = Some("budget".into());
    fin.breached_at_step = Some(6);
    fin.on_limit_decisions = vec!["allow:1".into(), "stop".into()];
    fin.noise_lines = Some(2);
    fin.unknown_events = Some(3);
    fin.oversized_lines = Some(1);
    fin.truncated_last_line = Some(true);
    fin.tokens = Some(TokenUsage {
        input_tokens: 100,
        output_tokens: 20,
        cached_input_tokens: Some(50),
        reasoning_output_tokens: Some(7),
    });
    fin.cost_usd = Some(0.5);
    fin.sub_agent_steps = Some(BTreeMap::from([("task-1".to_owned(), 4)]));
    fin.plugin_source = Some("/opt/plugins/libcodex.so".into());
    fin.containment = Some("cgroup".into());
    fin.loops = Some(vec![
        LoopFound {
            tool: "shell".into(),
            count: 3,
            kind: LoopKind::Repeat,
            first_step: 2,
        },
        LoopFound {
            tool: "read → edit".into(),
            count: 3,
            kind: LoopKind::Cycle { period: 2 },
            first_step: 5,
        },
    ]);
    fin.terminated_by = Some("wrap_up".into());
    fin.final_report = Some("Done: fixed the parser.\nLeft: the CLI flag.\n".into());
    fin.model_calls = Some(12);
    store.finish_run(id, &fin).unwrap();

    let back = store.get(id).unwrap().unwrap();
    let mut want = fin.clone();
    want.id = Some(id);
    want.provider = "codex".into();
    want.plugin_version = Some("0.1.0".into());
    want.unit = Some("item".into());
    want.max_steps = Some(5);
    want.max_steps_source = Some("--max-steps".into());
    want.command = Some(vec!["codex".into(), "exec".into()]);
    want.started_at = Some("2026-01-01T00:00:00.000Z".into());
    assert_eq!(back, want);
}

#[test]
fn loops_are_null_when_unknown_and_an_empty_list_when_none_was_found() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    for (loops, want) in [(None, None), (Some(Vec::new()), Some(Vec::new()))] {
        let id = store
            .begin_run(&NewRun {
                provider: "codex".into(),
                ..NewRun::default()
            })
            .unwrap();
        let mut fin = finished(Outcome::Success, None, Some(1), None);
        fin.loops = loops;
        store.finish_run(id, &fin).unwrap();
        assert_eq!(store.get(id).unwrap().unwrap().loops, want);
    }
}

#[test]
fn gateway_fields_are_null_when_unknown_and_kept_when_empty_or_zero() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    for (final_report, model_calls) in [
        (None, None),
        (Some(String::new()), Some(0)),
        (
            Some("résumé — 完了".to_owned()),
            Some(u64::from(u32::MAX) + 1),
        ),
    ] {
        let id = store
            .begin_run(&NewRun {
                provider: "codex".into(),
                ..NewRun::default()
            })
            .unwrap();
        let running = store.get(id).unwrap().unwrap();
        assert_eq!((running.final_report, running.model_calls), (None, None));
        let mut fin = finished(Outcome::Success, None, Some(1), None);
        fin.final_report = final_report.clone();
        fin.model_calls = model_calls;
        store.finish_run(id, &fin).unwrap();
        let back = store.get(id).unwrap().unwrap();
        assert_eq!(
            (back.final_report, back.model_calls),
            (final_report, model_calls)
        );
    }
}

#[test]
fn a_version_5_database_with_rows_migrates_and_old_rows_read_null_gateway_fields() {
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = create_at_version(&path, 5).unwrap();
        conn.execute(
            "INSERT INTO runs (started_at, ended_at, provider, command, outcome, terminated_by,
                num_steps_computed, containment, loops)
             VALUES ('2026-01-01T00:00:00Z', '2026-01-01T00:00:05Z', 'codex', '[\"codex\"]',
                'failed', 'loop', 7, 'cgroup',
                '[{\"tool\":\"shell\",\"count\":3,\"kind\":\"repeat\",\"first_step\":2}]')",
            [],
        )
        .unwrap();
        let columns: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN ('final_report', 'model_calls')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(columns, 0, "a version 5 database has no gateway columns");
    }
    let store = Store::open(&path).unwrap();
    let v: i64 = store
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let old = store.get(1).unwrap().unwrap();
    assert_eq!(
        (
            old.outcome.as_str(),
            old.terminated_by.as_deref(),
            old.num_steps_computed,
            old.containment.as_deref()
        ),
        ("failed", Some("loop"), Some(7), Some("cgroup"))
    );
    assert_eq!(
        old.loops,
        Some(vec![LoopFound {
            tool: "shell".into(),
            count: 3,
            kind: LoopKind::Repeat,
            first_step: 2,
        }])
    );
    assert_eq!((old.final_report, old.model_calls), (None, None));
    // New rows in the migrated database carry the new columns.
    let id = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    let mut fin = finished(Outcome::Success, None, Some(3), None);
    fin.terminated_by = Some("wrap_up".into());
    fin.final_report = Some("all done".into());
    fin.model_calls = Some(4);
    store.finish_run(id, &fin).unwrap();
    let new = store.get(id).unwrap().unwrap();
    assert_eq!(
        (new.final_report.as_deref(), new.model_calls),
        (Some("all done"), Some(4))
    );
    // Opening again is a no-op.
    drop(store);
    assert_eq!(
        Store::open(&path)
            .unwrap()
            .list(&Filter::default())
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_version_4_database_gains_the_loops_column_and_old_rows_read_null() {
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = create_at_version(&path, 4).unwrap();
        conn.execute(
            "INSERT INTO runs (started_at, provider, command, outcome, containment)
             VALUES ('2026-01-01T00:00:00Z', 'codex', '[]', 'success', 'cgroup')",
            [],
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let old = store.get(1).unwrap().unwrap();
    assert_eq!(
        (old.containment.as_deref(), old.loops),
        (Some("cgroup"), None)
    );
    assert_eq!((old.final_report, old.model_calls), (None, None));
}

#[test]
fn stats_count_the_loop_and_stall_slugs_like_any_other() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    let slugs = [
        FailureSlug::LoopDetected,
        FailureSlug::LoopDetected,
        FailureSlug::Stalled,
        FailureSlug::StartupHang,
    ];
    for slug in slugs {
        let id = store
            .begin_run(&NewRun {
                provider: "codex".into(),
                ..NewRun::default()
            })
            .unwrap();
        store
            .finish_run(id, &finished(Outcome::Failed, Some(slug), Some(2), None))
            .unwrap();
    }
    let report = compute_stats(&store.list(&Filter::default()).unwrap());
    assert_eq!(report.groups.len(), 1);
    let g = &report.groups[0];
    assert_eq!((g.runs, g.successes), (4, 0));
    assert_eq!(
        g.failure_slugs,
        BTreeMap::from([
            ("loop_detected".to_owned(), 2),
            ("stalled".to_owned(), 1),
            ("startup_hang".to_owned(), 1),
        ])
    );
}
