//! Pools end to end: admission at the start (spent, full, waiting), many concurrent runs against
//! one pool, a run killed while holding a slot, a policy pool a project cannot loosen, and the
//! faults (an unknown pool, an unreachable ledger).

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Sandbox, fixture};

/// A stand-in agent printing a Codex stream of 4 steps and 480 tokens, then sleeping `sleep`
/// seconds.
fn agent(sb: &Sandbox, name: &str, sleep: u32) -> String {
    let path = sb.write(
        name,
        format!(
            "#!/bin/sh\ncat {}\nsleep {sleep}\n",
            fixture("real/codex/tools3.jsonl")
        ),
    );
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn history(sb: &Sandbox) -> Vec<Value> {
    let out = sb.run(&["history", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.json().as_array().unwrap().clone()
}

fn pool_status(sb: &Sandbox, env: &[(&str, &str)]) -> Vec<Value> {
    let out = sb.run_env(&["pools", "--json"], env);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.json().as_array().unwrap().clone()
}

/// Waits until the pool's first entry shows `n` runs in it.
fn wait_running(sb: &Sandbox, n: u64, env: &[(&str, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool_status(sb, env)[0]["running"] != n {
        assert!(
            Instant::now() < deadline,
            "the pool never showed {n} running"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spawn_run(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Child {
    sb.cmd(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_spent_pool_refuses_at_the_start_naming_the_pool() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.daily]\nmax_tokens = 1000\nwindow = \"24h\"\nmatch = \"all\"\n",
    );
    let ok = agent(&sb, "ok.sh", 0);
    let codes: Vec<Option<i32>> = (0..4)
        .map(|_| sb.run(&["run", "-q", "-p", "codex", "--", &ok]).code)
        .collect();
    // 480 + 480 fit; the third gets the 40 left as its token budget and is stopped; the fourth
    // finds the pool spent.
    assert_eq!(codes, [Some(0), Some(0), Some(3), Some(3)]);
    let refused = sb.run(&["run", "-p", "codex", "--", &ok]);
    assert_eq!(refused.code, Some(3));
    assert!(
        refused.stderr.contains("pool_exhausted: pool `daily` is spent: 1440 tokens of 1000 tokens (max_tokens); the window frees enough at "),
        "{}",
        refused.stderr
    );
    let runs = history(&sb);
    assert_eq!(runs.len(), 5);
    assert_eq!(runs[0]["error_type"], "pool_exhausted");
    assert_eq!(runs[0]["exit_code"], 3);
    assert!(
        runs[0]["message"]
            .as_str()
            .unwrap()
            .contains("pool `daily`")
    );
    assert_eq!(runs[2]["error_type"], "max_tokens");
    assert_eq!(runs[2]["max_tokens"], 40);
    assert_eq!(runs[2]["max_tokens_source"], "pool daily");
    assert_eq!(runs[4]["pools"], serde_json::json!(["daily"]));
    let show = sb.run(&["show", &runs[2]["id"].to_string()]);
    assert!(
        show.stdout.contains("Pools: daily; ended by pool daily"),
        "{}",
        show.stdout
    );
    let show = sb.run(&["show", &runs[0]["id"].to_string()]);
    assert!(
        show.stdout.contains("refused at the start by a pool"),
        "{}",
        show.stdout
    );
    let status = pool_status(&sb, &[]);
    assert_eq!(status[0]["name"], "daily");
    assert_eq!(status[0]["limits"][0]["limit"], "max_tokens");
    assert_eq!(status[0]["limits"][0]["spent"], 1440.0);
    assert_eq!(status[0]["limits"][0]["left"], 0.0);
    assert_eq!(status[0]["running"], 0);
    // `stats` per pool: five runs, three ended by it (the third out of its share, the last two
    // refused at the start), the 1440 tokens the first three spent.
    let stats = sb.run(&["stats", "--json"]);
    assert_eq!(stats.code, Some(0), "{}", stats.stderr);
    let pools = stats.json()["pools"].clone();
    assert_eq!(pools.as_array().map(Vec::len), Some(1), "{pools}");
    let daily = &pools[0];
    assert_eq!(
        (
            &daily["pool"],
            &daily["runs"],
            &daily["ended_by_pool"],
            &daily["refused_at_start"],
            &daily["tokens"]
        ),
        (
            &Value::from("daily"),
            &Value::from(5),
            &Value::from(3),
            &Value::from(2),
            &Value::from(1440)
        ),
        "{daily}"
    );
    let text = sb.run(&["stats"]);
    assert!(
        text.stdout.contains(
            "\npool daily: 5 runs, 3 ended by the pool (2 refused at the start), spent 1440 tokens, $"
        ),
        "{}",
        text.stdout
    );
}

/// 50 `stepguard run`s at once against a pool of 10 runs: exactly 10 start, the 40 others are
/// refused, and every one has its record.
#[test]
fn fifty_concurrent_runs_start_exactly_what_the_pool_allows() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.ten]\nmax_runs = 10\nwindow = \"none\"\nmatch = { provider = \"codex\" }\n",
    );
    let ok = agent(&sb, "ok.sh", 0);
    // The ledger's tables made first: this test is about admission, not 50 first opens at once
    // (in one full loaded run 4 of 50 exited 2 here; the stderr of any such run is now shown).
    let made = sb.run(&["pools"]);
    assert_eq!(made.code, Some(0), "{}", made.stderr);
    let children: Vec<Child> = (0..50)
        .map(|_| spawn_run(&sb, &["run", "-q", "-p", "codex", "--", &ok], &[]))
        .collect();
    let outs: Vec<(i32, String)> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            (out.status.code().unwrap(), err)
        })
        .collect();
    let odd: Vec<&String> = outs
        .iter()
        .filter(|(c, _)| *c != 0 && *c != 3)
        .map(|(_, e)| e)
        .collect();
    assert!(odd.is_empty(), "{odd:?}");
    let mut codes: Vec<i32> = outs.iter().map(|(c, _)| *c).collect();
    codes.sort_unstable();
    assert_eq!(codes.iter().filter(|&&c| c == 0).count(), 10, "{codes:?}");
    assert_eq!(codes.iter().filter(|&&c| c == 3).count(), 40, "{codes:?}");
    let runs = history(&sb);
    assert_eq!(runs.len(), 50);
    let refused = runs
        .iter()
        .filter(|r| r["error_type"] == "pool_exhausted")
        .count();
    assert_eq!(refused, 40);
    assert_eq!(pool_status(&sb, &[])[0]["limits"][0]["spent"], 10.0);
}

#[test]
fn a_full_pool_refuses_or_waits_for_a_slot() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.one]\nmax_concurrent_runs = 1\nmatch = \"all\"\n",
    );
    let slow = agent(&sb, "slow.sh", 3);
    let ok = agent(&sb, "ok.sh", 0);
    let first = spawn_run(&sb, &["run", "-q", "-p", "codex", "--", &slow], &[]);
    wait_running(&sb, 1, &[]);
    let busy = sb.run(&["run", "-q", "-p", "codex", "--", &ok]);
    assert_eq!(busy.code, Some(3));
    assert!(
        busy.stderr
            .contains("pool_busy: pool `one` is full: 1 of 1 concurrent runs"),
        "{}",
        busy.stderr
    );
    let waited = sb.run(&[
        "run",
        "-q",
        "-p",
        "codex",
        "--wait-for-pool",
        "30s",
        "--",
        &ok,
    ]);
    assert_eq!(waited.code, Some(0), "{}", waited.stderr);
    assert!(first.wait_with_output().unwrap().status.success());
    // In any order: a record the database could not take at once (a loaded disk) is spooled
    // and added by the next command, after the others.
    let mut slugs: Vec<String> = history(&sb)
        .iter()
        .map(|r| r["error_type"].to_string())
        .collect();
    slugs.sort();
    assert_eq!(slugs, ["\"pool_busy\"", "null", "null"]);
}

/// A run killed with SIGKILL while it holds the only slot frees it within the lease.
#[test]
fn a_killed_run_frees_its_slot_within_the_lease() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.one]\nmax_concurrent_runs = 1\nmatch = \"all\"\n",
    );
    let lease = [("STEPGUARD_POOL_LEASE", "2s")];
    let stuck = agent(&sb, "stuck.sh", 60);
    let ok = agent(&sb, "ok.sh", 0);
    let mut victim = spawn_run(&sb, &["run", "-q", "-p", "codex", "--", &stuck], &lease);
    wait_running(&sb, 1, &lease);
    let killed = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim.id() as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    victim.wait().unwrap();
    let next = sb.run_env(
        &[
            "run",
            "-q",
            "-p",
            "codex",
            "--wait-for-pool",
            "20s",
            "--",
            &ok,
        ],
        &lease,
    );
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "the slot came free after {took:?}"
    );
}

#[test]
fn a_project_file_cannot_loosen_a_policy_pool() {
    let sb = Sandbox::new();
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        "[pools.team]\nmax_runs = 1\nwindow = \"day\"\nmatch = \"all\"\n",
    );
    sb.write(
        "project/stepguard.toml",
        "[pools.team]\nmax_runs = 100\nwindow = \"none\"\nmatch = { task_type = \"never\" }\n",
    );
    let ok = agent(&sb, "ok.sh", 0);
    let first = sb.run(&["run", "-q", "-p", "codex", "--", &ok]);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    for key in [
        "pools.team.max_runs",
        "pools.team.window",
        "pools.team.match",
    ] {
        assert!(
            first.stderr.contains(key) && first.stderr.contains("would loosen pool `team`"),
            "{key}: {}",
            first.stderr
        );
    }
    let second = sb.run(&["run", "-q", "-p", "codex", "--", &ok]);
    assert_eq!(second.code, Some(3), "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("pool `team` is spent: 1 runs of 1 runs"),
        "{}",
        second.stderr
    );
    let config = sb.run(&["config", "--json", "--provider", "codex"]).json();
    assert_eq!(config["pools"][0]["name"], "team");
    assert_eq!(config["pools"][0]["max_runs"], 1);
    assert_eq!(config["pools"][0]["joins_by"], "match");
    assert_eq!(
        config["pools"][0]["declared_in"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn an_unknown_pool_and_an_unreachable_ledger_are_refused_before_the_agent_starts() {
    let sb = Sandbox::new();
    sb.write(
        "project/stepguard.toml",
        "[pools.alpha]\nmax_concurrent_runs = 2\n[pools.beta]\nmax_concurrent_runs = 2\n",
    );
    let marker = sb.root().join("started");
    let touch = sb.write(
        "touch.sh",
        format!("#!/bin/sh\ntouch {}\n", marker.display()),
    );
    std::fs::set_permissions(&touch, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let touch = touch.display().to_string();
    let unknown = sb.run(&["run", "-p", "codex", "--pool", "gamma", "--", &touch]);
    assert_eq!(unknown.code, Some(2));
    assert!(
        unknown
            .stderr
            .contains("--pool gamma: no such pool; the pools are: alpha, beta"),
        "{}",
        unknown.stderr
    );
    // A history path that is a directory: the ledger cannot be opened there.
    let dir = sb.root().join("not-a-file");
    std::fs::create_dir_all(&dir).unwrap();
    let down = sb.run(&[
        "run",
        "-p",
        "codex",
        "--db",
        dir.to_str().unwrap(),
        "--pool",
        "alpha",
        "--",
        &touch,
    ]);
    assert_eq!(down.code, Some(2), "{}", down.stderr);
    assert!(
        down.stderr.contains("reach the ledger at"),
        "{}",
        down.stderr
    );
    assert!(!marker.exists(), "the agent started");
}
