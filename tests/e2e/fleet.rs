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
