//! A stalled world (#26 items 1 and 11): counting never waits for whoever reads stepguard's
//! output (a pipe that is never read, a terminal paused with XOFF), and the exit after a stop
//! has one bound whatever the database and the collector do. Real processes; only generous
//! time bounds.

use std::io::Read as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::harness::Sandbox;
use crate::run_cmd::{script, summary};

/// A Codex-style agent: `noise` KiB of recognised lines that begin no step first (more than any pipe
/// holds), then one step every 10 ms for ever, each step's number appended to `steps.log` as it begins.
fn flooding_agent(sb: &Sandbox, noise_kib: u32) -> String {
    let log = sb.root().join("steps.log");
    script(
        sb,
        "agent.sh",
        &format!(
            r#"pad=$(head -c 1000 /dev/zero | tr '\0' x)
echo '{{"type":"thread.started","thread_id":"t"}}'
echo '{{"type":"turn.started"}}'
for i in $(seq 1 {noise_kib}); do
  echo '{{"type":"item.updated","item":{{"id":"r0","type":"reasoning","text":"'$pad'"}}}}'
done
i=0
while true; do
  i=$((i+1))
  echo $i >> {log}
  echo '{{"type":"item.started","item":{{"id":"c'$i'","type":"command_execution","command":"echo '$i'","aggregated_output":"","exit_code":null,"status":"in_progress"}}}}'
  sleep 0.01
done"#,
            log = log.display()
        ),
    )
}

/// Steps the agent began (its own account).
fn agent_steps(sb: &Sandbox) -> usize {
    std::fs::read_to_string(sb.root().join("steps.log"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Waits for `child` at most `limit`; kills it past that. Returns its exit code (None: killed).
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_pipe_that_is_never_read_does_not_stall_counting() {
    let sb = Sandbox::new();
    // 512 KiB before the first step: far more than the pipe to the consumer holds.
    let agent = flooding_agent(&sb, 512);
    let file = sb.root().join("summary.json").display().to_string();
    let mut child = sb
        .cmd(&[
            "run",
            "--summary-file",
            &file,
            "-p",
            "codex",
            "--max-steps",
            "5",
            "--",
            &agent,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stepguard");
    // The consumer never reads stdout: the pipe's read end stays open, unread.
    let _unread = child.stdout.take();
    let mut stderr = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let code = wait_at_most(&mut child, Duration::from_secs(30));
    let took = started.elapsed();
    assert_eq!(
        code,
        Some(3),
        "stopped at the budget, not by the test ({took:?})"
    );
    let stderr = err.join().unwrap();
    assert!(took < Duration::from_secs(15), "took {took:?}: {stderr}");
    let s = summary(&sb);
    assert_eq!(
        (
            s["error_type"].as_str(),
            s["breached_at_step"].as_u64(),
            s["num_steps_computed"].as_u64()
        ),
        (Some("max_steps"), Some(6), Some(6)),
        "{stderr}"
    );
    // The agent was stopped at the breach, not after a stalled reader let it run on.
    let made = agent_steps(&sb);
    assert!((6..=12).contains(&made), "the agent made {made} steps");
    assert!(
        stderr.contains("not passed through"),
        "the undelivered output is reported: {stderr}"
    );
}

#[test]
fn a_terminal_paused_with_xoff_keeps_the_timeout() {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let sb = Sandbox::new();
    let agent = flooding_agent(&sb, 256);
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let slave_path = ptsname(&master, Vec::new()).expect("ptsname");
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(slave_path.to_str().expect("utf-8 pts path"))
        .expect("open the pty's slave");
    // Ctrl-S: the terminal stops taking output (and the test never reads it either).
    rustix::termios::tcflow(&slave, rustix::termios::Action::OOff).expect("XOFF");
    let file = sb.root().join("summary.json").display().to_string();
    let mut child = sb
        .cmd(&[
            "run",
            "--summary-file",
            &file,
            "-p",
            "codex",
            "--max-steps",
            "100000",
            "--timeout",
            "3s",
            "--",
            &agent,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave.try_clone().expect("dup")))
        .spawn()
        .expect("spawn stepguard");
    let started = Instant::now();
    let code = wait_at_most(&mut child, Duration::from_secs(40));
    let took = started.elapsed();
    let s = summary(&sb);
    assert_eq!(code, Some(124), "ended by its timeout ({took:?}): {s}");
    // 3 s, the stop, the drain's bound, the summary's: far less than the 20 s once seen.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(
        (s["error_type"].as_str(), s["terminated_by"].as_str()),
        (Some("timeout"), Some("timeout"))
    );
    // Counting went on while the terminal was paused.
    assert!(s["num_steps_computed"].as_u64().unwrap() >= 10, "{s}");
    drop(master);
}

#[test]
fn one_bound_on_the_exit_whatever_the_database_and_the_collector_do() {
    let sb = Sandbox::new();
    let db = sb.root().join("history.db");
    let db_arg = db.display().to_string();
    let hello = script(
        &sb,
        "hello.sh",
        r#"echo '{"type":"thread.started","thread_id":"t"}'"#,
    );
    sb.run(&["run", "--db", &db_arg, "-p", "codex", "--", &hello]);
    assert!(db.is_file(), "the history database exists");
    // The database locked by another process for the whole run.
    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE;").unwrap();
    // A collector that accepts and never answers, given 5 s to flush.
    let collector = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = collector.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in collector.incoming() {
            held.push(conn);
        }
    });
    sb.write(
        "xdg-config/stepguard/stepguard.toml",
        format!("[telemetry]\nendpoint = \"http://127.0.0.1:{port}\"\nflush_timeout = \"5s\"\n"),
    );
    // An agent that ignores SIGTERM: the whole grace is used.
    let agent = script(
        &sb,
        "agent.sh",
        "trap '' TERM\necho '{\"type\":\"thread.started\",\"thread_id\":\"t\"}'\nwhile true; do sleep 0.1; done",
    );
    let file = sb.root().join("summary.json").display().to_string();
    let started = Instant::now();
    let mut child = sb
        .cmd(&[
            "run",
            "--db",
            &db_arg,
            "--summary-file",
            &file,
            "-p",
            "codex",
            "--timeout",
            "3s",
            "--grace",
            "1s",
            "--",
            &agent,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stepguard");
    let mut stderr = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let code = wait_at_most(&mut child, Duration::from_secs(40));
    let took = started.elapsed();
    let stderr = err.join().unwrap();
    assert_eq!(code, Some(124), "{stderr}");
    // The bound: the timeout, the grace, then 2.5 s for everything after the stop (0.1 s more
    // for the summary line). Seen before: 11 s here (history 2 s + telemetry 5 s on top).
    assert!(
        took < Duration::from_secs(8),
        "took {took:?} (3 s + 1 s + 2.6 s at most): {stderr}"
    );
    assert_eq!(summary(&sb)["error_type"], "timeout");
    assert!(stderr.contains("telemetry"), "{stderr}");
    drop(lock);
}
