//! The fleet ledger end to end: two "hosts" (sandboxes with their own HOME and history
//! database) share one pool through PostgreSQL named by `STEPGUARD_LEDGER_URL`; an unreachable
//! or malformed ledger refuses the run before the agent starts.
//!
//! The test needing a server is `#[ignore]`d, like every test needing PostgreSQL's binaries: a
//! plain `cargo nextest run` reports it as skipped; `--run-ignored all` (as `.ci/run`) runs it.

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;

use serde_json::Value;
use stepguard_pgserver::PgServer;

use crate::harness::{Sandbox, fixture};

const POOL: &str = "[pools.fleet]\nmax_tokens = 1000\nwindow = \"24h\"\nmatch = \"all\"\n";

/// A host: its own sandbox with the pool declared, and a stand-in agent printing a Codex
/// stream of 480 tokens, which writes the ledger URL it was given (or `unset`) to `seen-url`.
fn host() -> (Sandbox, String) {
    let sb = Sandbox::new();
    sb.write("project/stepguard.toml", POOL);
    let seen = sb.root().join("seen-url");
    let agent = sb.write(
        "agent.sh",
        format!(
            "#!/bin/sh\nprintf '%s' \"${{STEPGUARD_LEDGER_URL-unset}}\" > '{}'\ncat {}\n",
            seen.display(),
            fixture("real/codex/tools3.jsonl")
        ),
    );
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = agent.display().to_string();
    (sb, agent)
}

fn fleet_pool(sb: &Sandbox, url: &str) -> Value {
    let out = sb.run_env(&["pools", "--json"], &[("STEPGUARD_LEDGER_URL", url)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.json()[0].clone()
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn two_hosts_share_one_pool_through_postgresql() {
    let server = PgServer::start(&crate::harness::target_dir().join("tmp"))
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL server: {e}"));
    let url = server.url();
    let env = [("STEPGUARD_LEDGER_URL", url.as_str())];
    let (a, agent_a) = host();
    let (b, agent_b) = host();
    // 480 tokens on host A, 480 on host B: both fit in the shared 1000.
    let first = a.run_env(&["run", "-q", "-p", "codex", "--", &agent_a], &env);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    // The ledger's URL (with its password) is stepguard's: the agent never gets it.
    assert_eq!(
        std::fs::read_to_string(a.root().join("seen-url")).unwrap(),
        "unset"
    );
    let second = b.run_env(&["run", "-q", "-p", "codex", "--", &agent_b], &env);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    // Host B sees host A's spend: the pool holds 960.
    let pool = fleet_pool(&b, &url);
    let tokens = &pool["limits"][0];
    assert_eq!(
        (tokens["limit"].as_str(), tokens["spent"].as_f64()),
        (Some("max_tokens"), Some(960.0)),
        "{pool}"
    );
    // Host A's next run gets the 40 left as its budget and is stopped; then the pool is spent
    // for both hosts.
    let third = a.run_env(&["run", "-q", "-p", "codex", "--", &agent_a], &env);
    assert_eq!(third.code, Some(3), "{}", third.stderr);
    let refused = b.run_env(&["run", "-p", "codex", "--", &agent_b], &env);
    assert_eq!(refused.code, Some(3), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("pool_exhausted: pool `fleet` is spent"),
        "{}",
        refused.stderr
    );
    // The runs kept their pools in the fleet ledger only: host B's local ledger saw nothing.
    let local = b.run(&["pools", "--json"]);
    assert_eq!(local.code, Some(0), "{}", local.stderr);
    assert_eq!(
        local.json()[0]["limits"][0]["spent"].as_f64(),
        Some(0.0),
        "{}",
        local.stdout
    );
}

#[test]
fn an_unreachable_or_malformed_fleet_ledger_refuses_the_run_before_the_agent_starts() {
    let (sb, _) = host();
    let marker = sb.root().join("started");
    let touch = sb.write(
        "touch.sh",
        format!("#!/bin/sh\ntouch {}\n", marker.display()),
    );
    std::fs::set_permissions(&touch, std::fs::Permissions::from_mode(0o755)).unwrap();
    let touch = touch.display().to_string();
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!("postgres://fleet:hunter2@127.0.0.1:{port}/ledger?sslmode=disable");
    let out = sb.run_env(
        &["run", "-p", "codex", "--", &touch],
        &[("STEPGUARD_LEDGER_URL", &down)],
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "reach the ledger at postgres://fleet@127.0.0.1:{port}/ledger"
        )) && out.stderr.contains("check that the server is up"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("hunter2"),
        "the password was shown: {}",
        out.stderr
    );
    let bad = sb.run_env(
        &["run", "-p", "codex", "--", &touch],
        &[("STEPGUARD_LEDGER_URL", "mysql://u:hunter2@h/db")],
    );
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("must start with postgres://") && !bad.stderr.contains("hunter2"),
        "{}",
        bad.stderr
    );
    assert!(!marker.exists(), "the agent started");
}

/// A port nothing listens on: a fleet ledger there is unreachable at once.
fn closed_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_ledger_comes_from_the_flag_the_variable_or_the_users_file_never_the_projects() {
    let (sb, _) = host();
    let user = "postgres://fleet:hunter2@user.example:5432/l?sslmode=disable";
    std::fs::create_dir_all(sb.user_config().parent().unwrap()).unwrap();
    std::fs::write(
        sb.user_config(),
        format!("[ledger]\nurl = \"{user}\"\non_ledger_error = \"local\"\n"),
    )
    .unwrap();
    sb.write(
        "project/stepguard.toml",
        format!("{POOL}[ledger]\nurl = \"postgres://evil.example/x\"\n"),
    );
    let config = sb.run(&["config", "--json"]);
    assert_eq!(config.code, Some(0), "{}", config.stderr);
    let report = config.json();
    let ledger = &report["ledger"];
    assert_eq!(ledger["kind"], "fleet", "{report}");
    assert_eq!(
        ledger["url"],
        "postgres://fleet@user.example:5432/l?sslmode=disable"
    );
    let file = sb.user_config().display().to_string();
    assert_eq!(ledger["source"], format!("{file}: ledger.url"));
    assert_eq!(ledger["on_ledger_error"], "local");
    assert_eq!(
        ledger["on_ledger_error_source"],
        format!("{file}: ledger.on_ledger_error")
    );
    assert!(
        report["warnings"]
            .to_string()
            .contains("[ledger] in a project file is ignored"),
        "{report}"
    );
    assert!(!config.stdout.contains("hunter2") && !config.stdout.contains("evil"));
    // The variable beats the file, the flag beats both.
    let env = [("STEPGUARD_LEDGER_URL", "postgres://u:pw@env.example/l")];
    let by_env = sb.run_env(&["config", "--json"], &env).json();
    assert_eq!(by_env["ledger"]["url"], "postgres://u@env.example/l");
    assert_eq!(by_env["ledger"]["source"], "env STEPGUARD_LEDGER_URL");
    let by_flag = sb
        .run_env(
            &[
                "config",
                "--json",
                "--ledger",
                "postgres://u:pw@flag.example/l",
            ],
            &env,
        )
        .json();
    assert_eq!(by_flag["ledger"]["url"], "postgres://u@flag.example/l");
    assert_eq!(by_flag["ledger"]["source"], "--ledger");
    let text = sb.run(&["config"]);
    assert!(
        text.stdout.contains(&format!(
            "ledger: fleet postgres://fleet@user.example:5432/l?sslmode=disable (from {file}: ledger.url)"
        )) && text.stdout.contains("on_ledger_error: local (from "),
        "{}",
        text.stdout
    );
    // The commands that answer for this host alone refuse the flag rather than seem to answer
    // for the fleet.
    for cmd in [&["history"][..], &["show", "1"], &["stats"]] {
        let out = sb.run(&[cmd, &["--ledger", "postgres://u@db/l"]].concat());
        assert_eq!(out.code, Some(2), "{cmd:?}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("--ledger: only `run`, `pools`, `config` and `validate`"),
            "{cmd:?}: {}",
            out.stderr
        );
    }
    // Without any, the local ledger, refusing by default.
    let (plain, _) = host();
    let local = plain.run(&["config", "--json"]).json();
    assert_eq!(local["ledger"]["kind"], "local");
    assert!(local["ledger"]["url"].is_null());
    assert_eq!(local["ledger"]["on_ledger_error"], "refuse");
}

#[test]
fn an_unreachable_fleet_ledger_with_on_ledger_error_local_runs_on_the_local_ledger_marked() {
    let (sb, agent) = host();
    let port = closed_port();
    let down = format!("postgres://fleet:hunter2@127.0.0.1:{port}/ledger?sslmode=disable");
    // `pools` never falls back: it would show another ledger's figures. Its --json error is
    // of kind `ledger`, exit 2.
    let pools = sb.run(&["pools", "--json", "--ledger", &down]);
    assert_eq!(pools.code, Some(2), "{}", pools.stderr);
    assert_eq!(pools.json()["error"]["kind"], "ledger", "{}", pools.stdout);
    // Refused by default, with the flag as with the variable.
    let refused = sb.run(&["run", "-p", "codex", "--ledger", &down, "--", &agent]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("check that the server is up"),
        "{}",
        refused.stderr
    );
    std::fs::create_dir_all(sb.user_config().parent().unwrap()).unwrap();
    std::fs::write(
        sb.user_config(),
        format!("[ledger]\nurl = \"{down}\"\non_ledger_error = \"local\"\n"),
    )
    .unwrap();
    let summary = sb.root().join("record.json");
    let summary_arg = summary.display().to_string();
    let out = sb.run(&[
        "run",
        "-p",
        "codex",
        "--summary-file",
        &summary_arg,
        "--",
        &agent,
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("on_ledger_error = \"local\"")
            && out.stderr.contains("keeps its pools in the local ledger")
            && !out.stderr.contains("hunter2"),
        "{}",
        out.stderr
    );
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(
        record["ledger"],
        serde_json::json!({"kind": "local", "fallback": true}),
        "{record}"
    );
    assert_eq!(record["pools"], serde_json::json!(["fleet"]));
    // `--ledger` in libpq's key=value form (no URL to spot) is hidden from stepguard's command
    // line too: no process the agent can see holds the password.
    let found = sb.root().join("found");
    let peek = sb.write(
        "peek.sh",
        format!(
            "#!/bin/sh\ncat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c 'hunte[r]2' > '{}'\ncat {}\n",
            found.display(),
            fixture("real/codex/tools3.jsonl")
        ),
    );
    std::fs::set_permissions(&peek, std::fs::Permissions::from_mode(0o755)).unwrap();
    let keyvalue =
        format!("host=127.0.0.1 port={port} user=fleet password=hunter2 dbname=l sslmode=disable");
    let peeked = sb.run(&[
        "run",
        "-p",
        "codex",
        "--ledger",
        &keyvalue,
        "--",
        &peek.display().to_string(),
    ]);
    assert_eq!(peeked.code, Some(0), "{}", peeked.stderr);
    assert!(!peeked.stderr.contains("hunter2"), "{}", peeked.stderr);
    assert_eq!(std::fs::read_to_string(&found).unwrap().trim(), "0");
    // Its spend is in the local ledger (two runs of 480 tokens).
    std::fs::remove_file(sb.user_config()).unwrap();
    let local = sb.run(&["pools", "--json"]);
    assert_eq!(
        local.json()[0]["limits"][0]["spent"].as_f64(),
        Some(960.0),
        "{}",
        local.stdout
    );
    // The history keeps the mark.
    let shown = sb.run(&["history", "--json", "--last", "1"]).json();
    assert_eq!(shown[0]["ledger"]["fallback"], true, "{shown}");
    let id = shown[0]["id"].to_string();
    let show = sb.run(&["show", &id]);
    assert!(
        show.stdout.contains(
            "Pools: fleet (in the local ledger: the fleet ledger was unreachable at the start)"
        ),
        "{}",
        show.stdout
    );
}

/// An agent that says it started (`started`), then waits for `go` before printing its stream.
fn waiting_agent(sb: &Sandbox) -> String {
    let (started, go) = (sb.root().join("started"), sb.root().join("go"));
    let agent = sb.write(
        "wait.sh",
        format!(
            "#!/bin/sh\ntouch '{}'\nwhile [ ! -f '{}' ]; do sleep 0.05; done\ncat {}\n",
            started.display(),
            go.display(),
            fixture("real/codex/tools3.jsonl")
        ),
    );
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent.display().to_string()
}

/// Runs the waiting agent against `url` in the background, calls `meanwhile` once it started,
/// lets it go, and returns its output.
fn run_waiting(sb: &Sandbox, url: &str, meanwhile: impl FnOnce()) -> crate::harness::Run {
    let agent = waiting_agent(sb);
    let _ = std::fs::remove_file(sb.root().join("started"));
    let _ = std::fs::remove_file(sb.root().join("go"));
    let mut cmd = sb.cmd(&["run", "-p", "codex", "--ledger", url, "--", &agent]);
    cmd.env("STEPGUARD_POOL_LEASE", "3s")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sb.root().join("started").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    meanwhile();
    std::fs::write(sb.root().join("go"), "").unwrap();
    child.wait_with_output().unwrap().into()
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn a_ledger_lost_mid_run_is_charged_once_when_it_is_back_or_by_the_next_stepguard() {
    let mut server = PgServer::start(&crate::harness::target_dir().join("tmp"))
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL server: {e}"));
    let url = server.url();
    let (sb, _) = host();
    let spent = |sb: &Sandbox| {
        let out = sb.run(&["pools", "--json", "--ledger", &url]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        (out.json()[0]["limits"][0]["spent"].as_f64(), out.stderr)
    };
    // Lost and back before the run ends: the run goes on, says so, and is charged once.
    let first = run_waiting(&sb, &url, || {
        server.stop().unwrap();
        // Past a renewal (a third of the 3 s lease).
        std::thread::sleep(std::time::Duration::from_millis(2500));
        server.start_again().unwrap();
    });
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert!(
        first
            .stderr
            .contains("cannot renew this run's place in its pools")
            && first
                .stderr
                .contains("the pools' ledger is back: this run's spend (480 tokens"),
        "{}",
        first.stderr
    );
    assert_eq!(spent(&sb).0, Some(480.0));
    let history = sb.run(&["history", "--json", "--last", "1"]).json();
    assert_eq!(
        history[0]["ledger"],
        serde_json::json!({"kind": "fleet", "fallback": false}),
        "{history}"
    );
    // Lost until after the run: its charge is kept beside the history and charged, once, by the
    // next stepguard that reaches the ledger.
    let second = run_waiting(&sb, &url, || server.stop().unwrap());
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    assert!(
        second.stderr.contains("its spend (480 tokens")
            && second
                .stderr
                .contains("the next stepguard to reach the ledger charges it, once"),
        "{}",
        second.stderr
    );
    let outbox = sb.root().join("xdg-data/stepguard/history.db.pool-charges");
    // The end charge, and a live charge whose answer never came when the stream's spend was
    // charged while the ledger was away: each under its own key.
    let kept = std::fs::read_dir(&outbox).unwrap().count();
    assert!((1..=2).contains(&kept), "{kept} files kept");
    server.start_again().unwrap();
    let (after, said) = spent(&sb);
    assert_eq!(after, Some(960.0), "{said}");
    assert!(
        said.contains("charged 1 earlier run(s) to their pools"),
        "{said}"
    );
    assert_eq!(std::fs::read_dir(&outbox).unwrap().count(), 0);
    let (again, said) = spent(&sb);
    assert_eq!(again, Some(960.0), "charged twice: {said}");
    assert!(!said.contains("charged"), "{said}");
}
