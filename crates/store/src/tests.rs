use std::collections::BTreeMap;

use stepguard_core::loops::{LoopFound, LoopKind};
use stepguard_core::{FailureSlug, LimitChoice, RunStats, TokenUsage};

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
    record.verdict.exit_code = Some(0);
    record.verdict.child_exit_code = Some(0);
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
            old.source.provider.as_str(),
            old.source.unit.as_deref(),
            old.source.task_type.as_deref(),
            old.step_budget.max_steps
        ),
        ("claude", Some("turn"), Some("review"), Some(10))
    );
    assert_eq!(
        old.invocation.command.as_deref(),
        Some(&["claude".to_owned(), "-p".to_owned()][..])
    );
    assert_eq!(
        (
            old.verdict.outcome.as_str(),
            old.verdict.error_type.as_ref().map(|s| s.as_str()),
            old.verdict.exit_code
        ),
        ("failed", Some("MAX_TURNS"), Some(3))
    );
    assert_eq!(
        (
            old.counts.num_turns_reported,
            old.counts.num_turns_computed,
            old.invocation.duration_ms,
            old.usage.cost_usd
        ),
        (Some(11), Some(10), Some(60000), Some(0.25))
    );
    assert_eq!(
        (old.counts.num_steps_reported, old.counts.num_steps_computed),
        (None, None)
    );
    assert_eq!(
        old.invocation.ended_at.as_deref(),
        Some("2025-01-01T00:01:00Z")
    );
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
            "has schema version 99, newer than this stepguard knows (10); refusing to modify it"
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
        (
            running.verdict.outcome.as_str(),
            running.counts.num_steps_computed
        ),
        ("running", None)
    );
    store.update_progress(id, 7).unwrap();
    assert_eq!(
        store.get(id).unwrap().unwrap().counts.num_steps_computed,
        Some(7)
    );
    let mut fin = finished(
        Outcome::Failed,
        Some(FailureSlug::MaxSteps),
        Some(31),
        Some(1),
    );
    fin.verdict.exit_code = Some(3);
    fin.verdict.terminated_by = Some("budget".parse().unwrap());
    fin.supervision.on_limit_decisions = vec!["allow:2".parse().unwrap(), "stop".parse().unwrap()];
    store.finish_run(id, &fin).unwrap();
    let done = store.get(id).unwrap().unwrap();
    assert_eq!(
        (
            done.verdict.outcome.as_str(),
            done.verdict.error_type.as_ref().map(|s| s.as_str()),
            done.verdict.exit_code
        ),
        ("failed", Some("max_steps"), Some(3))
    );
    assert_eq!(
        (
            done.counts.num_steps_computed,
            done.verdict.terminated_by.map(|t| t.as_str())
        ),
        (Some(31), Some("budget"))
    );
    assert_eq!(
        done.supervision.on_limit_decisions,
        [LimitChoice::Allow(2), LimitChoice::Stop]
    );
    assert!(done.invocation.ended_at.is_some());
    // A finished row takes no more progress updates.
    store.update_progress(id, 99).unwrap();
    assert_eq!(
        store.get(id).unwrap().unwrap().counts.num_steps_computed,
        Some(31)
    );
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
    let outcome = |id| store.get(id).unwrap().unwrap().verdict.outcome.as_str();
    assert_eq!(outcome(live), "running");
    assert_eq!(outcome(dead), "interrupted");
    assert_eq!(outcome(reused), "interrupted");
    assert_eq!(outcome(other_host), "running");
    assert_eq!(
        store
            .get(dead)
            .unwrap()
            .unwrap()
            .verdict
            .error_type
            .as_ref()
            .map(|s| s.as_str()),
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
fn default_location_prefers_flag_then_the_user_data_dir() {
    let data = Path::new("/home/u/.local/share");
    assert_eq!(
        default_location(Some(Path::new("/x.db")), data),
        PathBuf::from("/x.db")
    );
    assert_eq!(
        default_location(None, data),
        PathBuf::from("/home/u/.local/share/stepguard/history.db")
    );
    let cwd = Path::new("/work");
    assert_eq!(
        legacy_location(Some(Path::new("/repo")), cwd),
        PathBuf::from("/repo/.stepguard/history.db")
    );
    assert_eq!(
        legacy_location(None, cwd),
        PathBuf::from("/work/.stepguard/history.db")
    );
}

#[test]
fn runs_filter_by_repository_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("history.db")).unwrap();
    let run = |repo: Option<&str>, cwd: &str| {
        store
            .begin_run(&NewRun {
                provider: "codex".into(),
                repository: repo.map(str::to_owned),
                cwd: Some(cwd.into()),
                ..NewRun::default()
            })
            .unwrap()
    };
    let a = run(Some("git@example.com:team/a.git"), "/src/a");
    let a_sub = run(Some("git@example.com:team/a.git"), "/src/a/sub");
    let b = run(Some("/src/b"), "/src/b");
    let nowhere = run(None, "/tmp");
    let ids = |f: Filter| -> Vec<RunId> {
        store
            .list(&f)
            .unwrap()
            .iter()
            .filter_map(|r| r.id)
            .collect()
    };
    let repo = |r: &str| Filter {
        repository: Some(r.into()),
        ..Filter::default()
    };
    assert_eq!(ids(repo("git@example.com:team/a.git")), vec![a_sub, a]);
    assert_eq!(ids(repo("/src/b")), vec![b]);
    let in_dir = |d: &str| Filter {
        directory: Some(d.into()),
        ..Filter::default()
    };
    assert_eq!(ids(in_dir("/src/a")), vec![a]);
    assert_eq!(ids(in_dir("/tmp")), vec![nowhere]);
    let repository: Option<String> = store
        .conn
        .query_row("SELECT repository FROM runs WHERE id = ?1", [a], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(repository.as_deref(), Some("git@example.com:team/a.git"));
}

#[test]
fn version_10_fills_the_directory_of_older_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.db");
    {
        let conn = create_at_version(&path, 9).unwrap();
        let mut record = RunRecord::new("codex", Outcome::Success);
        record.invocation.cwd = Some("/old/project".into());
        conn.execute(
            "INSERT INTO runs (started_at, provider, outcome, record) VALUES ('2026-01-01T00:00:00Z', 'codex', 'success', ?1)",
            [serde_json::to_string(&record).unwrap()],
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let found = store
        .list(&Filter {
            directory: Some("/old/project".into()),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(found.len(), 1);
    let repository: Option<String> = store
        .conn
        .query_row("SELECT repository FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(repository, None);
}

/// A project database of the old default location holding two finished runs.
fn project_database(dir: &Path) -> PathBuf {
    let old = dir.join("project/.stepguard/history.db");
    {
        let project = Store::open(&old).unwrap();
        for cwd in ["/p/one", "/p/two"] {
            let id = project
                .begin_run(&NewRun {
                    provider: "claude".into(),
                    cwd: Some(cwd.into()),
                    ..NewRun::default()
                })
                .unwrap();
            let mut done = RunRecord::new("claude", Outcome::Success);
            done.counts.num_steps_computed = Some(3);
            project.finish_run(id, &done).unwrap();
        }
    }
    old
}

#[test]
fn a_project_database_is_imported_once() {
    let dir = tempfile::tempdir().unwrap();
    let old = project_database(dir.path());
    let mut user = Store::open(&dir.path().join("data/stepguard/history.db")).unwrap();
    assert_eq!(user.import_legacy(&old).unwrap(), Some(2));
    assert_eq!(user.import_legacy(&old).unwrap(), None);
    assert!(!old.exists(), "the project database stays where it was");
    assert!(old.with_extension("db.imported").is_file());
    let runs = user.list(&Filter::default()).unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].invocation.cwd.as_deref(), Some("/p/two"));
    assert_eq!(runs[0].counts.num_steps_computed, Some(3));
    assert_eq!(
        user.list(&Filter {
            directory: Some("/p/one".into()),
            ..Filter::default()
        })
        .unwrap()
        .len(),
        1
    );
}

#[test]
fn stepguards_starting_together_import_a_project_database_once() {
    let dir = tempfile::tempdir().unwrap();
    let old = project_database(dir.path());
    let user = dir.path().join("data/stepguard/history.db");
    drop(Store::open(&user).unwrap());
    let barrier = std::sync::Barrier::new(8);
    let imported: Vec<Option<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let mut store = Store::open(&user).unwrap();
                    barrier.wait();
                    store.import_legacy(&old).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        imported.iter().filter(|n| **n == Some(2)).count(),
        1,
        "{imported:?}"
    );
    assert_eq!(imported.iter().filter(|n| n.is_none()).count(), 7);
    let store = Store::open(&user).unwrap();
    assert_eq!(store.list(&Filter::default()).unwrap().len(), 2);
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
    fin.invocation.ended_at = Some("2026-01-01T00:00:01.000Z".into());
    fin.verdict.message = Some("stopped".into());
    fin.verdict.exit_code = Some(3);
    fin.verdict.child_exit_code = None;
    fin.verdict.child_signal = Some(15);
    fin.verdict.terminated_by = Some("budget".parse().unwrap());
    fin.supervision.breached_at_step = Some(6);
    fin.supervision.on_limit_decisions = vec!["allow:1".parse().unwrap(), "stop".parse().unwrap()];
    fin.counts.noise_lines = Some(2);
    fin.counts.unknown_events = Some(3);
    fin.counts.oversized_lines = Some(1);
    fin.counts.truncated_last_line = Some(true);
    fin.usage.tokens = Some(TokenUsage {
        input_tokens: 100,
        output_tokens: 20,
        cached_input_tokens: Some(50),
        reasoning_output_tokens: Some(7),
    });
    fin.usage.cost_usd = Some(0.5);
    fin.sub_agent_steps = Some(BTreeMap::from([("task-1".to_owned(), 4)]));
    fin.source.plugin_source = Some("/opt/plugins/libcodex.so".into());
    fin.supervision.containment = Some("cgroup".parse().unwrap());
    fin.supervision.loops = Some(vec![
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
    fin.verdict.terminated_by = Some("wrap_up".parse().unwrap());
    fin.gateway.final_report = Some("Done: fixed the parser.\nLeft: the CLI flag.\n".into());
    fin.gateway.model_calls = Some(12);
    fin.spend.max_tokens = Some(200_000);
    fin.spend.max_tokens_source = Some("--max-tokens".into());
    fin.spend.max_cost_usd = Some(0.125);
    fin.spend.max_cost_usd_source = Some("task_types.review.max_cost_usd".into());
    fin.sub_agent_tokens = Some(BTreeMap::from([
        (
            "task-1".to_owned(),
            TokenUsage {
                input_tokens: 60,
                output_tokens: 9,
                cached_input_tokens: Some(30),
                reasoning_output_tokens: None,
            },
        ),
        (
            "task-2".to_owned(),
            TokenUsage {
                input_tokens: 5,
                output_tokens: 1,
                ..TokenUsage::default()
            },
        ),
    ]));
    store.finish_run(id, &fin).unwrap();

    let back = store.get(id).unwrap().unwrap();
    let mut want = fin.clone();
    want.id = Some(id);
    want.source.provider = "codex".into();
    want.source.plugin_version = Some("0.1.0".into());
    want.source.unit = Some("item".into());
    want.step_budget.max_steps = Some(5);
    want.step_budget.max_steps_source = Some("--max-steps".into());
    want.invocation.command = Some(vec!["codex".into(), "exec".into()]);
    want.invocation.started_at = Some("2026-01-01T00:00:00.000Z".into());
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
        fin.supervision.loops = loops;
        store.finish_run(id, &fin).unwrap();
        assert_eq!(store.get(id).unwrap().unwrap().supervision.loops, want);
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
        assert_eq!(
            (running.gateway.final_report, running.gateway.model_calls),
            (None, None)
        );
        let mut fin = finished(Outcome::Success, None, Some(1), None);
        fin.gateway.final_report = final_report.clone();
        fin.gateway.model_calls = model_calls;
        store.finish_run(id, &fin).unwrap();
        let back = store.get(id).unwrap().unwrap();
        assert_eq!(
            (back.gateway.final_report, back.gateway.model_calls),
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
            old.verdict.outcome.as_str(),
            old.verdict.terminated_by.map(|t| t.as_str()),
            old.counts.num_steps_computed,
            old.supervision.containment.map(|t| t.as_str())
        ),
        ("failed", Some("loop"), Some(7), Some("cgroup"))
    );
    assert_eq!(
        old.supervision.loops,
        Some(vec![LoopFound {
            tool: "shell".into(),
            count: 3,
            kind: LoopKind::Repeat,
            first_step: 2,
        }])
    );
    assert_eq!(
        (old.gateway.final_report, old.gateway.model_calls),
        (None, None)
    );
    // New rows in the migrated database carry the new columns.
    let id = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    let mut fin = finished(Outcome::Success, None, Some(3), None);
    fin.verdict.terminated_by = Some("wrap_up".parse().unwrap());
    fin.gateway.final_report = Some("all done".into());
    fin.gateway.model_calls = Some(4);
    store.finish_run(id, &fin).unwrap();
    let new = store.get(id).unwrap().unwrap();
    assert_eq!(
        (new.gateway.final_report.as_deref(), new.gateway.model_calls),
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
        (
            old.supervision.containment.map(|t| t.as_str()),
            old.supervision.loops
        ),
        (Some("cgroup"), None)
    );
    assert_eq!(
        (old.gateway.final_report, old.gateway.model_calls),
        (None, None)
    );
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

#[test]
fn budget_fields_are_null_when_unknown_and_kept_when_zero_or_large() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    let usage = |input, output| TokenUsage {
        input_tokens: input,
        output_tokens: output,
        ..TokenUsage::default()
    };
    type Budgets = (
        Option<u64>,
        Option<String>,
        Option<f64>,
        Option<String>,
        Option<BTreeMap<String, TokenUsage>>,
    );
    let cases: [Budgets; 3] = [
        (None, None, None, None, None),
        (
            Some(0),
            Some("--max-tokens".into()),
            Some(0.0),
            Some("--max-cost-usd".into()),
            Some(BTreeMap::new()),
        ),
        (
            Some(u64::from(u32::MAX) + 1),
            Some("profiles.ci.max_tokens".into()),
            Some(1234.56789),
            Some("profiles.ci.max_cost_usd".into()),
            Some(BTreeMap::from([("agent — 完了".to_owned(), usage(7, 3))])),
        ),
    ];
    for (max_tokens, tokens_source, max_cost, cost_source, sub_agents) in cases {
        let id = store
            .begin_run(&NewRun {
                provider: "claude".into(),
                ..NewRun::default()
            })
            .unwrap();
        let running = store.get(id).unwrap().unwrap();
        assert_eq!(
            (
                running.spend.max_tokens,
                running.spend.max_cost_usd,
                running.sub_agent_tokens
            ),
            (None, None, None)
        );
        let mut fin = finished(Outcome::Success, None, Some(1), None);
        fin.spend.max_tokens = max_tokens;
        fin.spend.max_tokens_source = tokens_source.clone();
        fin.spend.max_cost_usd = max_cost;
        fin.spend.max_cost_usd_source = cost_source.clone();
        fin.sub_agent_tokens = sub_agents.clone();
        // Usage without the cached and reasoning details reads back without them, not as zero.
        fin.usage.tokens = Some(usage(10, 2));
        fin.usage.cost_usd = Some(0.0);
        store.finish_run(id, &fin).unwrap();
        let back = store.get(id).unwrap().unwrap();
        assert_eq!(
            (
                back.spend.max_tokens,
                back.spend.max_tokens_source,
                back.spend.max_cost_usd,
                back.spend.max_cost_usd_source,
                back.sub_agent_tokens
            ),
            (max_tokens, tokens_source, max_cost, cost_source, sub_agents)
        );
        assert_eq!(
            (back.usage.tokens, back.usage.cost_usd),
            (Some(usage(10, 2)), Some(0.0))
        );
    }
}

#[test]
fn a_version_6_database_with_rows_migrates_and_old_rows_read_null_budgets() {
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = create_at_version(&path, 6).unwrap();
        conn.execute(
            "INSERT INTO runs (started_at, ended_at, provider, command, outcome, max_steps,
                max_steps_source, num_steps_computed, input_tokens, output_tokens,
                cached_input_tokens, reasoning_output_tokens, cost_usd, sub_agent_steps,
                terminated_by, final_report, model_calls)
             VALUES ('2026-01-01T00:00:00Z', '2026-01-01T00:00:05Z', 'claude', '[\"claude\"]',
                'success', 30, '--max-steps', 7, 1200, 300, 800, 40, 0.0425, '{\"task-1\":2}',
                'wrap_up', 'done', 3)",
            [],
        )
        .unwrap();
        let columns: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN ('max_tokens',
                    'max_tokens_source', 'max_cost_usd', 'max_cost_usd_source', 'sub_agent_tokens')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(columns, 0, "a version 6 database has no budget columns");
    }
    let store = Store::open(&path).unwrap();
    let v: i64 = store
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 10);
    let old = store.get(1).unwrap().unwrap();
    // What the old row knew is intact.
    assert_eq!(
        (
            old.step_budget.max_steps,
            old.step_budget.max_steps_source.as_deref(),
            old.counts.num_steps_computed
        ),
        (Some(30), Some("--max-steps"), Some(7))
    );
    assert_eq!(
        old.usage.tokens,
        Some(TokenUsage {
            input_tokens: 1200,
            output_tokens: 300,
            cached_input_tokens: Some(800),
            reasoning_output_tokens: Some(40),
        })
    );
    assert_eq!(old.usage.cost_usd, Some(0.0425));
    assert_eq!(
        old.sub_agent_steps,
        Some(BTreeMap::from([("task-1".to_owned(), 2)]))
    );
    assert_eq!(
        (old.gateway.final_report.as_deref(), old.gateway.model_calls),
        (Some("done"), Some(3))
    );
    // What it did not know reads null.
    assert_eq!(
        (
            old.spend.max_tokens,
            old.spend.max_tokens_source,
            old.spend.max_cost_usd,
            old.spend.max_cost_usd_source,
            old.sub_agent_tokens
        ),
        (None, None, None, None, None)
    );
    // New rows in the migrated database carry the new columns.
    let id = store
        .begin_run(&NewRun {
            provider: "claude".into(),
            ..NewRun::default()
        })
        .unwrap();
    let mut fin = finished(Outcome::Failed, Some(FailureSlug::MaxCost), Some(3), None);
    fin.spend.max_tokens = Some(50_000);
    fin.spend.max_tokens_source = Some("--max-tokens".into());
    fin.spend.max_cost_usd = Some(0.5);
    fin.spend.max_cost_usd_source = Some("--max-cost-usd".into());
    fin.sub_agent_tokens = Some(BTreeMap::from([(
        "task-1".to_owned(),
        TokenUsage {
            input_tokens: 100,
            output_tokens: 10,
            ..TokenUsage::default()
        },
    )]));
    store.finish_run(id, &fin).unwrap();
    let new = store.get(id).unwrap().unwrap();
    assert_eq!(
        (
            new.verdict.error_type.as_ref().map(|s| s.as_str()),
            new.spend.max_tokens,
            new.spend.max_cost_usd,
            new.spend.max_cost_usd_source.as_deref()
        ),
        (
            Some("max_cost"),
            Some(50_000),
            Some(0.5),
            Some("--max-cost-usd")
        )
    );
    assert_eq!(new.sub_agent_tokens, fin.sub_agent_tokens);
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

/// A finished run with token usage (`input + output` tokens) and a cost.
fn spent(
    outcome: Outcome,
    slug: Option<FailureSlug>,
    tokens: Option<(u64, u64)>,
    cost: Option<f64>,
) -> RunRecord {
    let mut record = finished(outcome, slug, Some(1), None);
    record.usage.tokens = tokens.map(|(input, output)| TokenUsage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: Some(input / 2),
        reasoning_output_tokens: None,
    });
    record.usage.cost_usd = cost;
    record
}

#[test]
fn token_and_cost_spreads_and_suggestions_match_hand_computed_figures() {
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
    // claude/review: 20 successes spending 1000·k + 100·k tokens (k = 1..=20) and $0.0105·k,
    // one token-budget stop at 30000 + 3000 tokens ($0.40), one cost-budget stop at $0.50
    // without token usage.
    for k in 1..=20_u64 {
        add(
            "claude",
            Some("review"),
            spent(
                Outcome::Success,
                None,
                Some((1000 * k, 100 * k)),
                Some(0.0105 * k as f64),
            ),
        );
    }
    add(
        "claude",
        Some("review"),
        spent(
            Outcome::Failed,
            Some(FailureSlug::MaxTokens),
            Some((30_000, 3_000)),
            Some(0.40),
        ),
    );
    add(
        "claude",
        Some("review"),
        spent(
            Outcome::Failed,
            Some(FailureSlug::MaxCost),
            None,
            Some(0.50),
        ),
    );
    // codex/review: tokens but no cost; only one of its two successes reported usage.
    add(
        "codex",
        Some("review"),
        spent(Outcome::Success, None, Some((400, 80)), None),
    );
    add(
        "codex",
        Some("review"),
        spent(Outcome::Success, None, None, None),
    );
    // gemini/review: a success without usage, and a failure with some: no evidence.
    add(
        "gemini",
        Some("review"),
        spent(Outcome::Success, None, None, None),
    );
    add(
        "gemini",
        Some("review"),
        spent(
            Outcome::Failed,
            Some(FailureSlug::ProviderError),
            Some((50, 5)),
            Some(0.001),
        ),
    );

    let report = compute_stats(&store.list(&Filter::default()).unwrap());
    assert_eq!(report.groups.len(), 3);

    let claude = &report.groups[0];
    assert_eq!((claude.runs, claude.successes), (22, 20));
    assert_eq!(
        claude.failure_slugs,
        BTreeMap::from([("max_cost".to_owned(), 1), ("max_tokens".to_owned(), 1)])
    );
    // Tokens 1100·k for k = 1..=20, and 33000: sum 1100 · 210 + 33000 = 264000 over 21 runs;
    // p50 = rank 11 → 12100, p95 = rank ⌈19.95⌉ = 20 → 22000, max 33000.
    assert_eq!(
        claude.tokens,
        Some(Spread {
            runs: 21,
            mean: 12571.43,
            p50: 12100,
            p95: 22000,
            max: 33000
        })
    );
    // Cost 0.0105·k, 0.40 and 0.50: 22 runs; p50 = rank 11 → 0.1155, p95 = rank ⌈20.9⌉ = 21
    // → 0.40, max 0.50; mean (0.0105 · 210 + 0.9) / 22 = 3.105 / 22 = 0.141136…
    let cost = claude.cost_usd.as_ref().unwrap();
    assert_eq!((cost.runs, cost.p95, cost.max), (22, 0.40, 0.50));
    assert!((cost.p50 - 0.1155).abs() < 1e-12, "{cost:?}");
    assert_eq!(cost.mean, 0.141136);
    // Successful runs only: p95 = rank 19 of 20 → 19 · 1100 = 20900 tokens, and 19 · 0.0105 =
    // 0.1995 dollars (stays on the $0.0001 grid despite the float error of the product).
    assert_eq!(claude.suggested_max_tokens, Some(20_900));
    assert_eq!(claude.suggested_max_cost_usd, Some(0.1995));
    assert_eq!(
        claude.suggestions(),
        [
            "max_steps = 1 would have covered 95% of the 20 successful runs",
            "max_tokens = 20900 would have covered 95% of the 20 successful runs",
            "max_cost_usd = 0.1995 would have covered 95% of the 20 successful runs",
        ]
    );

    let codex = &report.groups[1];
    assert_eq!(
        codex.tokens,
        Some(Spread {
            runs: 1,
            mean: 480.0,
            p50: 480,
            p95: 480,
            max: 480
        })
    );
    assert_eq!(codex.cost_usd, None);
    assert_eq!(
        (codex.suggested_max_tokens, codex.suggested_max_cost_usd),
        (Some(480), None)
    );
    assert_eq!(
        codex.token_suggestion().unwrap(),
        "max_tokens = 480 would have covered 95% of the 1 successful run with token usage"
    );
    assert_eq!(codex.cost_suggestion(), None);

    let gemini = &report.groups[2];
    assert!(gemini.tokens.is_some() && gemini.cost_usd.is_some());
    assert_eq!(
        (gemini.suggested_max_tokens, gemini.suggested_max_cost_usd),
        (None, None)
    );
    assert_eq!(gemini.suggestions().len(), 1, "only the step suggestion");

    // The JSON carries the figures, and not the evidence counts behind the text.
    let json = serde_json::to_value(&report).unwrap();
    let claude = &json["groups"][0];
    assert_eq!(claude["suggested_max_tokens"], 20_900);
    assert_eq!(claude["suggested_max_cost_usd"], 0.1995);
    assert_eq!(claude["tokens"]["p95"], 22_000);
    assert_eq!(claude["cost_usd"]["p95"], 0.40);
    assert!(claude.get("successes_with_tokens").is_none());
    assert!(json["groups"][1]["cost_usd"].is_null());
}

#[test]
fn a_cost_suggestion_is_rounded_up_to_the_next_hundredth_of_a_cent() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    for cost in [0.00001, 0.04213, 0.042] {
        let id = store
            .begin_run(&NewRun {
                provider: "claude".into(),
                task_type: Some(cost.to_string()),
                ..NewRun::default()
            })
            .unwrap();
        store
            .finish_run(id, &spent(Outcome::Success, None, Some((0, 0)), Some(cost)))
            .unwrap();
    }
    let report = compute_stats(&store.list(&Filter::default()).unwrap());
    let suggested: Vec<(Option<&str>, Option<f64>, Option<i64>)> = report
        .groups
        .iter()
        .map(|g| {
            (
                g.task_type.as_deref(),
                g.suggested_max_cost_usd,
                g.suggested_max_tokens,
            )
        })
        .collect();
    assert_eq!(
        suggested,
        [
            // A tiny cost still gets a budget above zero, as zero tokens get 1.
            (Some("0.00001"), Some(0.0001), Some(1)),
            (Some("0.042"), Some(0.042), Some(1)),
            (Some("0.04213"), Some(0.0422), Some(1)),
        ]
    );
}

#[test]
fn stats_count_the_token_and_cost_budget_slugs_like_any_other() {
    let (_dir, path) = db();
    let store = Store::open(&path).unwrap();
    for slug in [
        FailureSlug::MaxTokens,
        FailureSlug::MaxCost,
        FailureSlug::MaxTokens,
        FailureSlug::MaxSteps,
    ] {
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
    let g = &report.groups[0];
    assert_eq!((g.runs, g.successes), (4, 0));
    assert_eq!(
        g.failure_slugs,
        BTreeMap::from([
            ("max_cost".to_owned(), 1),
            ("max_steps".to_owned(), 1),
            ("max_tokens".to_owned(), 2),
        ])
    );
    // No usage at all: no spread, no suggestion.
    assert_eq!((g.tokens.as_ref(), g.cost_usd.as_ref()), (None, None));
    assert!(g.suggestions().is_empty());
}

/// A database stepguard wrote at schema version 7 (one column per field, `tests/fixtures`)
/// migrates to one JSON record per row, and every row reads back byte for byte as the
/// stepguard of version 7 read it; ids go on from where they were.
#[test]
fn a_version_7_database_made_by_the_old_stepguard_migrates_to_json_records_intact() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dump = std::fs::read_to_string(fixtures.join("v7.sql")).unwrap();
    let want = std::fs::read_to_string(fixtures.join("v7.records.jsonl")).unwrap();
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&dump).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, 7);
    }
    let store = Store::open(&path).unwrap();
    let v: i64 = store
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let mut got = String::new();
    for record in store.list(&Filter::default()).unwrap().iter().rev() {
        got.push_str(&serde_json::to_string(record).unwrap());
        got.push('\n');
    }
    assert_eq!(got, want);
    // The table is the new one: the record in one column, the per-field columns gone.
    let columns: Vec<String> = store
        .conn
        .prepare("SELECT name FROM pragma_table_info('runs')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(columns.contains(&"record".to_owned()), "{columns:?}");
    assert!(!columns.contains(&"failure_slug".to_owned()), "{columns:?}");
    // The filters still work on the migrated rows, and a new run gets the next id.
    let failed = store
        .list(&Filter {
            provider: Some("codex".into()),
            failed: true,
            ..Filter::default()
        })
        .unwrap();
    let ids: Vec<i64> = failed.iter().filter_map(|r| r.id).collect();
    assert_eq!(ids, [6, 5, 3, 2]);
    let running = store.get(9).unwrap().unwrap();
    assert_eq!(running.verdict.outcome.as_str(), "running");
    assert_eq!(running.counts.num_steps_computed, Some(7));
    let id = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    assert_eq!(id, 11);
    // The live count and the end of a migrated running row go into its record.
    store.update_progress(9, 12).unwrap();
    assert_eq!(
        store.get(9).unwrap().unwrap().counts.num_steps_computed,
        Some(12)
    );
}

/// Varied finished runs: every outcome, slug, missing and present figures, token sums past
/// `i64::MAX`, costs with ties, runs without a task type, and running rows.
fn varied_records(n: u64) -> Vec<RunRecord> {
    let outcomes = [
        Outcome::Success,
        Outcome::Success,
        Outcome::Failed,
        Outcome::Running,
    ];
    let slugs = [
        None,
        Some(FailureSlug::MaxSteps),
        Some(FailureSlug::MaxTokens),
        Some(FailureSlug::Timeout),
    ];
    (0..n)
        .map(|i| {
            let outcome = outcomes[(i % 4) as usize];
            let slug = if outcome == Outcome::Failed {
                slugs[(i / 4 % 4) as usize]
            } else {
                None
            };
            let steps = (i % 5 != 0).then_some(i * 7 % 31);
            let turns = (i % 3 == 0).then_some(i % 11);
            let mut r = finished(outcome, slug, steps, turns);
            r.source.provider = ["codex", "claude", "gemini"][(i % 3) as usize].into();
            r.source.task_type = [None, Some("review".to_owned())][(i / 3 % 2) as usize].clone();
            r.usage.tokens = match i % 6 {
                0 => None,
                1 => Some(TokenUsage {
                    input_tokens: u64::MAX - 3,
                    output_tokens: 10,
                    ..TokenUsage::default()
                }),
                _ => Some(TokenUsage {
                    input_tokens: i * 13 % 1000,
                    output_tokens: i % 97,
                    ..TokenUsage::default()
                }),
            };
            r.usage.cost_usd = (i % 7 != 0).then_some((i % 9) as f64 * 0.0123);
            // Notices: none known, none given, one given.
            r.gateway.notices = match i % 5 {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(vec![stepguard_core::BudgetNotice {
                    limit: stepguard_core::NoticeLimit::Steps,
                    threshold: 0.8,
                    at_step: 8,
                    model_call: 9,
                    text: "system notice: 2 of 10 steps left.".into(),
                }]),
            };
            r.invocation.started_at = Some(format!("2026-11-{:02}T00:00:00.000Z", 1 + i % 28));
            r.spend.pools = match i % 5 {
                0 => None,
                1 => Some(vec!["daily".into()]),
                2 => Some(vec!["daily".into(), "team".into()]),
                3 => Some(vec![]),
                _ => Some(vec!["team".into()]),
            };
            if i % 10 == 2 {
                r.spend.max_tokens_source = Some("pool daily".into());
            }
            r
        })
        .collect()
}

fn in_pools(pools: &[&str], slug: Option<FailureSlug>, tokens: u64, cost: f64) -> RunRecord {
    let outcome = if slug.is_some() {
        Outcome::Failed
    } else {
        Outcome::Success
    };
    let mut r = finished(outcome, slug, Some(3), None);
    r.source.provider = "codex".into();
    r.spend.pools = Some(pools.iter().map(|p| (*p).to_owned()).collect());
    r.usage.tokens = Some(TokenUsage {
        input_tokens: tokens,
        output_tokens: 1,
        ..TokenUsage::default()
    });
    r.usage.cost_usd = Some(cost);
    r
}

/// `stats` per pool: the runs that joined it, those it ended (refused at the start, naming it;
/// out of the share that was their budget) and their spend; runs without pools, a budget of
/// the run's own, a refusal by another pool and running rows do not count for it.
#[test]
fn stats_count_runs_endings_and_spend_per_pool() {
    let (_dir, path) = db();
    let mut store = Store::open(&path).unwrap();
    let mut out_of_daily = in_pools(&["daily", "team"], Some(FailureSlug::MaxTokens), 99, 0.25);
    out_of_daily.spend.max_tokens_source = Some("pool daily".into());
    // A refused run joined nothing: its pools are null, its message names the pool.
    let mut refused = in_pools(&[], Some(FailureSlug::PoolExhausted), 0, 0.0);
    refused.spend.pools = None;
    refused.usage.tokens = None;
    refused.usage.cost_usd = None;
    refused.verdict.message =
        Some("pool `team` is spent: 10.00 of 10.00 (max_cost_usd); it frees at 12:00".into());
    let mut out_of_team = in_pools(&["team"], Some(FailureSlug::MaxCost), 9, 1.5);
    out_of_team.spend.max_cost_usd_source = Some("pool team".into());
    let mut own_budget = in_pools(&["team"], Some(FailureSlug::MaxTokens), 19, 0.5);
    own_budget.spend.max_tokens_source = Some("--max-tokens".into());
    let mut running = in_pools(&["daily"], None, 1_000, 9.0);
    running.verdict.outcome = Outcome::Running;
    // Stopped when other runs spent the pool it was in (the live keeper's message).
    let mut spent_by_others = in_pools(&["daily"], Some(FailureSlug::MaxTokens), 29, 0.0);
    spent_by_others.spend.max_tokens_source = Some("--max-tokens".into());
    spent_by_others.verdict.message = Some(
        "pool `daily` is spent: nothing is left of its max_tokens, spent by the runs in it; \
         stopped"
            .into(),
    );
    let records = vec![
        spent_by_others,
        in_pools(&["daily"], None, 49, 0.125),
        out_of_daily,
        refused,
        out_of_team,
        own_budget,
        running,
        in_pools(&[], None, 5, 1.0),
        finished(Outcome::Success, None, Some(1), None),
    ];
    assert_eq!(
        store.insert_records(records.clone()).unwrap(),
        records.len()
    );
    let report = store.stats(None).unwrap();
    let by_name = |name: &str| {
        report
            .pools
            .iter()
            .find(|p| p.pool == name)
            .cloned()
            .unwrap_or_else(|| panic!("no pool {name} in {:?}", report.pools))
    };
    assert_eq!(report.pools.len(), 2, "{:?}", report.pools);
    assert_eq!(
        by_name("daily"),
        PoolStats {
            pool: "daily".into(),
            runs: 3,
            ended_by_pool: 2,
            refused_at_start: 0,
            tokens: 50 + 100 + 30,
            cost_usd: 0.375,
        }
    );
    assert_eq!(
        by_name("team"),
        PoolStats {
            pool: "team".into(),
            runs: 4,
            ended_by_pool: 2,
            refused_at_start: 1,
            tokens: 100 + 10 + 20,
            cost_usd: 2.25,
        }
    );
    assert_eq!(
        report,
        compute_stats(&store.list(&Filter::default()).unwrap())
    );
    assert!(store.stats(Some("claude")).unwrap().pools.is_empty());
}

/// `stats` computed in the database gives the very figures the records give in memory, for
/// every group, with or without a provider filter, and nothing for an empty database.
#[test]
fn stats_in_sql_match_the_figures_computed_in_memory() {
    let (_dir, path) = db();
    let mut store = Store::open(&path).unwrap();
    assert_eq!(
        store.stats(None).unwrap(),
        StatsReport {
            groups: vec![],
            pools: vec![]
        }
    );
    assert_eq!(store.insert_records(varied_records(500)).unwrap(), 500);
    let all = store.list(&Filter::default()).unwrap();
    assert_eq!(all.len(), 500);
    let want = compute_stats(&all);
    assert_eq!(want.groups.len(), 6);
    assert_eq!(store.stats(None).unwrap(), want);
    assert_eq!(want.pools.len(), 2, "{:?}", want.pools);
    assert!(want.pools.iter().all(|p| p.runs > 0));
    assert!(
        want.pools
            .iter()
            .any(|p| p.pool == "daily" && p.ended_by_pool > 0)
    );
    let codex = store
        .list(&Filter {
            provider: Some("codex".into()),
            ..Filter::default()
        })
        .unwrap();
    let got = store.stats(Some("codex")).unwrap();
    assert_eq!(got, compute_stats(&codex));
    assert_eq!(got.groups.len(), 2);
    assert!(store.stats(Some("nobody")).unwrap().groups.is_empty());
    // The runs told of their budget are counted, and how they ended.
    let noticed: usize = want.groups.iter().map(|g| g.after_notice.runs).sum();
    let ok: usize = want.groups.iter().map(|g| g.after_notice.successes).sum();
    let hit: usize = want.groups.iter().map(|g| g.after_notice.hit_limit).sum();
    let finished = all.iter().filter(|r| r.verdict.outcome != Outcome::Running);
    let with = |f: &dyn Fn(&RunRecord) -> bool| {
        finished
            .clone()
            .filter(|r| r.gateway.notices.as_ref().is_some_and(|n| !n.is_empty()) && f(r))
            .count()
    };
    assert_eq!(noticed, with(&|_| true));
    assert_eq!(ok, with(&|r| r.verdict.outcome == Outcome::Success));
    assert_eq!(hit, with(&|r| r.verdict.error_type.is_some()));
    assert!(noticed > 0 && ok > 0 && hit > 0 && ok + hit <= noticed);
    // The saturated token sums are there: the largest is i64::MAX, as in memory.
    let g = &want.groups[0];
    assert_eq!(g.tokens.as_ref().map(|t| t.max), Some(i64::MAX));
}

/// The plan SQLite makes for `sql`, one line per step.
fn plan(store: &Store, sql: &str, args: &[&dyn rusqlite::ToSql]) -> String {
    let mut stmt = store
        .conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap();
    let rows = stmt
        .query_map(args, |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    rows.join("\n")
}

/// Every query the commands make uses an index (or the primary key in id order, stopping at
/// `--last`): no full scan of the table, no sort of all the rows.
#[test]
fn every_query_of_the_commands_uses_an_index() {
    let (_dir, path) = db();
    let mut store = Store::open(&path).unwrap();
    store.insert_records(varied_records(300)).unwrap();
    store.conn.execute_batch("ANALYZE").unwrap();
    let host: &dyn rusqlite::ToSql = &"vm";
    let p = plan(&store, RUNNING_ROWS, &[host]);
    assert!(p.contains("USING INDEX runs_running"), "{p}");
    let p = plan(&store, "SELECT id, record FROM runs WHERE id = ?1", &[&1]);
    assert!(p.contains("USING INTEGER PRIMARY KEY"), "{p}");
    let filters = [
        (Filter::default(), "SCAN runs"),
        (
            Filter {
                provider: Some("codex".into()),
                ..Filter::default()
            },
            "USING INDEX runs_by_provider ",
        ),
        (
            Filter {
                provider: Some("codex".into()),
                task_type: Some("review".into()),
                failed: true,
                ..Filter::default()
            },
            "USING INDEX runs_by_group",
        ),
        (
            Filter {
                task_type: Some("review".into()),
                ..Filter::default()
            },
            "USING INDEX runs_by_task_type",
        ),
        (
            Filter {
                repository: Some("/src/app".into()),
                ..Filter::default()
            },
            "USING INDEX runs_by_repository",
        ),
        (
            Filter {
                directory: Some("/src/app".into()),
                ..Filter::default()
            },
            "USING INDEX runs_by_directory",
        ),
    ];
    for (filter, want) in filters {
        for order in [Order::NewestFirst, Order::OldestFirst] {
            let (sql, args) = list_sql(
                &Filter {
                    last: Some(20),
                    ..filter.clone()
                },
                order,
            );
            let args: Vec<&dyn rusqlite::ToSql> =
                args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
            let p = plan(&store, &sql, &args);
            assert!(p.contains(want), "{filter:?}: {p}");
            // Rows come in id order from the index; only the ≤ 20 rows kept are re-sorted.
            let sorts = p.matches("TEMP B-TREE").count();
            let allowed = usize::from(order == Order::OldestFirst);
            assert_eq!(sorts, allowed, "{filter:?} {order:?}: {p}");
            // Without `--last` (an export), no sort at all: the index order is the output order.
            let (sql, args) = list_sql(&filter, order);
            let args: Vec<&dyn rusqlite::ToSql> =
                args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
            let p = plan(&store, &sql, &args);
            assert!(
                p.contains(want) && !p.contains("TEMP B-TREE"),
                "{filter:?}: {p}"
            );
        }
    }
    // `stats` reads the records once (all of them, or one provider's by its index), then reads
    // the figures table once per query: the groups, and each figure sorted by group and value.
    let p = plan(
        &store,
        "SELECT * FROM runs WHERE outcome != 'running' AND provider = ?1",
        &[&"codex"],
    );
    assert!(
        p.contains("USING INDEX runs_by_provider ") || p.contains("USING INDEX runs_by_group "),
        "{p}"
    );
    store.conn.execute_batch("BEGIN").unwrap();
    store.conn.execute(&stats::figures_sql(false), []).unwrap();
    for sql in [stats::GROUPS_SQL.to_owned(), stats::sorted_sql("cost")] {
        let p = plan(&store, &sql, &[]);
        assert_eq!(p.matches("SCAN temp.stats_figures").count(), 1, "{p}");
        assert!(!p.contains("SEARCH"), "{p}");
    }
    store.conn.execute_batch("ROLLBACK").unwrap();
}

/// `each` gives one record at a time, oldest first for an export, and `--last N` keeps the
/// newest N; an error of the callback stops the walk and comes back.
#[test]
fn each_streams_in_either_order_and_stops_at_the_first_error() {
    let (_dir, path) = db();
    let mut store = Store::open(&path).unwrap();
    store.insert_records(varied_records(10)).unwrap();
    let mut ids = Vec::new();
    let last3 = Filter {
        last: Some(3),
        ..Filter::default()
    };
    store
        .each(&last3, Order::OldestFirst, |r| {
            ids.push(r.id.unwrap());
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(ids, [8, 9, 10]);
    let mut seen = 0;
    let stopped = store
        .each(&Filter::default(), Order::NewestFirst, |r| {
            seen += 1;
            if r.id == Some(7) { Err("stop") } else { Ok(()) }
        })
        .unwrap();
    assert_eq!((stopped, seen), (Err("stop"), 4));
}

/// A database of schema version 8 (`tests/fixtures/v8.sql`, as the stepguard of version 8
/// left it) gains the indexes of version 9 with every row as it was.
#[test]
fn a_version_8_database_gains_the_indexes_with_every_row_intact() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dump = std::fs::read_to_string(fixtures.join("v8.sql")).unwrap();
    let want = std::fs::read_to_string(fixtures.join("v7.records.jsonl")).unwrap();
    let (_dir, path) = db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    Connection::open(&path)
        .unwrap()
        .execute_batch(&dump)
        .unwrap();
    let store = Store::open(&path).unwrap();
    let v: i64 = store
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let mut got = String::new();
    for record in store.list(&Filter::default()).unwrap().iter().rev() {
        got.push_str(&serde_json::to_string(record).unwrap());
        got.push('\n');
    }
    assert_eq!(got, want);
    let mut indexes: Vec<String> = store
        .conn
        .prepare("SELECT name || ': ' || sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    indexes
        .iter_mut()
        .for_each(|i| *i = i.split_whitespace().collect::<Vec<_>>().join(" "));
    assert_eq!(
        indexes,
        [
            "runs_by_directory: CREATE INDEX runs_by_directory ON runs (directory)",
            "runs_by_group: CREATE INDEX runs_by_group ON runs (provider, task_type)",
            "runs_by_provider: CREATE INDEX runs_by_provider ON runs (provider)",
            "runs_by_repository: CREATE INDEX runs_by_repository ON runs (repository)",
            "runs_by_supervisor: CREATE INDEX runs_by_supervisor ON runs (supervisor_pid, supervisor_start_ticks)",
            "runs_by_task_type: CREATE INDEX runs_by_task_type ON runs (task_type)",
            "runs_running: CREATE INDEX runs_running ON runs (supervisor_host) WHERE outcome = 'running'",
        ]
    );
    // The running row of another host is still running; the filters answer as before.
    assert_eq!(
        store.get(9).unwrap().unwrap().verdict.outcome.as_str(),
        "running"
    );
    assert_eq!(
        store.stats(None).unwrap(),
        compute_stats(&store.list(&Filter::default()).unwrap())
    );
}

/// A run spooled because the database did not take it is imported by the next open, exactly
/// once: into its `running` (or since `interrupted`) row when its begin got in, as a new row when
/// not even that did; a second import of the same file (two stepguards at once) changes nothing,
/// and a finished row is never overwritten. A file that is not a spooled run is set aside.
#[test]
fn spooled_runs_are_imported_once_into_their_row_or_a_new_one() {
    let (_dir, path) = db();
    let mut record = finished(Outcome::Success, None, Some(12), None);
    record.source.provider = "codex".into();
    record.invocation.started_at = Some("2026-11-25T10:00:00.000Z".into());
    // Not even the begin got in: a new row, with this process as its supervisor.
    let file = spool::write(&path, &record).unwrap();
    assert!(file.starts_with(spool::dir(&path)), "{}", file.display());
    let copy = std::fs::read(&file).unwrap();
    let store = Store::open(&path).unwrap();
    assert!(!file.exists(), "imported files are removed");
    let rows = store.list(&Filter::default()).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].verdict.outcome, Outcome::Success);
    assert_eq!(rows[0].counts.num_steps_computed, Some(12));
    assert!(rows[0].invocation.ended_at.is_some());
    // The same file again (another stepguard read it before this one removed it): no new row.
    std::fs::write(&file, &copy).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.list(&Filter::default()).unwrap().len(), 1);
    assert!(!file.exists());
    // The begin got in and the row was marked interrupted since: the record completes it.
    let id = store
        .begin_run(&NewRun {
            provider: "claude".into(),
            ..NewRun::default()
        })
        .unwrap();
    store
        .conn
        .execute(
            "UPDATE runs SET outcome = 'interrupted' WHERE id = ?1",
            [id],
        )
        .unwrap();
    // This process ran both: the spooled identity now names the first row (finished) and the
    // second; aim the first away so that the second is the one found.
    store
        .conn
        .execute("UPDATE runs SET supervisor_pid = -1 WHERE id = 1", [])
        .unwrap();
    let mut end = finished(Outcome::Failed, Some(FailureSlug::MaxSteps), Some(5), None);
    end.source.provider = "claude".into();
    spool::write(&path, &end).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    let rows = store.list(&Filter::default()).unwrap();
    assert_eq!(rows.len(), 2);
    let got = store.get(id).unwrap().unwrap();
    assert_eq!(got.verdict.outcome, Outcome::Failed);
    assert_eq!(got.counts.num_steps_computed, Some(5));
    // A finished row is never overwritten by a late spool file.
    spool::write(&path, &finished(Outcome::Success, None, Some(99), None)).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.list(&Filter::default()).unwrap().len(), 2);
    assert_eq!(
        store.get(id).unwrap().unwrap().counts.num_steps_computed,
        Some(5)
    );
    // Garbage is set aside, and the open goes on.
    let bad = spool::dir(&path).join("1-2.json");
    std::fs::write(&bad, "not json").unwrap();
    drop(store);
    Store::open(&path).unwrap();
    assert!(!bad.exists());
    assert!(bad.with_extension("unreadable").exists());
}

/// `export` writes every row exactly as reading it and serializing the record writes it (byte
/// for byte, id included), for every kind of row a database holds: rows written whole, a
/// running row with its live step count (`json_set`), a row marked interrupted at open, text
/// with quotes, escapes, control characters and non-ASCII, extreme numbers, a row as an older
/// stepguard wrote it (a key missing) and one with a key this stepguard does not know.
#[test]
fn export_writes_each_record_as_reading_and_serializing_it_would() {
    let (_dir, path) = db();
    let mut store = Store::open(&path).unwrap();
    let mut records = varied_records(12);
    records[1].verdict.message =
        Some("quote \" back \\ nl \n tab \t esc \u{1b}[2J c1 \u{85} — 済 🙂".into());
    records[2].invocation.command = Some(vec![
        "sh".into(),
        "-c".into(),
        "echo \"}\" ,\"cost_usd\":1".into(),
    ]);
    records[3].usage.cost_usd = Some(1e-12);
    records[4].gateway.final_report = Some(String::new());
    records[5].sub_agent_tokens = Some(BTreeMap::from([(
        "cost_usd".to_owned(),
        TokenUsage {
            input_tokens: u64::MAX,
            output_tokens: 0,
            ..TokenUsage::default()
        },
    )]));
    store.insert_records(records).unwrap();
    let running = store
        .begin_run(&NewRun {
            provider: "codex".into(),
            ..NewRun::default()
        })
        .unwrap();
    store.update_progress(running, 17).unwrap();
    let dead = store
        .begin_run(&NewRun {
            provider: "claude".into(),
            ..NewRun::default()
        })
        .unwrap();
    store
        .conn
        .execute(
            "UPDATE runs SET supervisor_pid = 2147483000 WHERE id = ?1",
            [dead],
        )
        .unwrap();
    // An older stepguard's record (no `sub_agent_steps` yet) and a newer one's (a key more).
    let older = store
        .insert_records([RunRecord::new("gemini", Outcome::Success)])
        .map(|_| store.conn.last_insert_rowid())
        .unwrap();
    store
        .conn
        .execute(
            "UPDATE runs SET record = json_remove(record, '$.sub_agent_steps') WHERE id = ?1",
            [older],
        )
        .unwrap();
    let newer = store
        .insert_records([RunRecord::new("gemini", Outcome::Failed)])
        .map(|_| store.conn.last_insert_rowid())
        .unwrap();
    store
        .conn
        .execute(
            "UPDATE runs SET record = json_set(record, '$.later', 1) WHERE id = ?1",
            [newer],
        )
        .unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();

    let mut lines = Vec::new();
    store
        .export(&Filter::default(), Order::OldestFirst, |line| {
            lines.push(line.to_owned());
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    let mut expected = Vec::new();
    store
        .each(&Filter::default(), Order::OldestFirst, |r| {
            expected.push(serde_json::to_string(&r).unwrap());
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(lines.len(), 16);
    for (line, want) in lines.iter().zip(&expected) {
        assert_eq!(line, want);
    }
    let at =
        |id: i64| -> serde_json::Value { serde_json::from_str(&lines[id as usize - 1]).unwrap() };
    assert_eq!(at(2)["id"], 2);
    assert_eq!(
        at(2)["message"],
        "quote \" back \\ nl \n tab \t esc \u{1b}[2J c1 \u{85} — 済 🙂"
    );
    assert_eq!(at(4)["cost_usd"], 1e-12);
    assert_eq!(at(running)["num_steps_computed"], 17);
    assert_eq!(at(dead)["outcome"], "interrupted");
    assert_eq!(at(older)["sub_agent_steps"], serde_json::Value::Null);
    assert!(
        at(older)
            .as_object()
            .unwrap()
            .contains_key("sub_agent_steps")
    );
    assert!(!at(newer).as_object().unwrap().contains_key("later"));

    // Filters and `--last` as `each` has them, and the first error of the writer ends it.
    let mut ids = Vec::new();
    let filter = Filter {
        provider: Some("codex".into()),
        last: Some(2),
        ..Filter::default()
    };
    store
        .export(&filter, Order::OldestFirst, |line| {
            ids.push(
                serde_json::from_str::<serde_json::Value>(line).unwrap()["id"]
                    .as_i64()
                    .unwrap(),
            );
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(ids, [10, running]);
    let mut seen = 0;
    let stopped = store
        .export(&Filter::default(), Order::NewestFirst, |_| {
            seen += 1;
            if seen == 3 { Err("stop") } else { Ok(()) }
        })
        .unwrap();
    assert_eq!((stopped, seen), (Err("stop"), 3));
}

/// A stored record that is not JSON fails the export with the store's error, as reading it does.
#[test]
fn export_of_a_broken_record_is_an_error_not_a_line() {
    let (_dir, path) = db();
    let mut store = Store::open(&path).unwrap();
    store.insert_records(varied_records(2)).unwrap();
    store
        .conn
        .execute(
            "UPDATE runs SET record = '{\"schema_version\":1,\"id\":null,\"file\":' WHERE id = 2",
            [],
        )
        .unwrap();
    let mut lines = 0;
    let err = store
        .export(&Filter::default(), Order::OldestFirst, |_| {
            lines += 1;
            Ok::<_, ()>(())
        })
        .unwrap_err();
    assert_eq!(lines, 1);
    assert!(err.to_string().contains("history.db"), "{err}");
}
