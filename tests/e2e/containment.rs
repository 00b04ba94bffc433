//! Containment attacked as a tool call could: a zombie leader, a PID hopper, stepguard killed
//! with SIGKILL (alone, and with its whole process group), a survivor holding stdout under
//! `--timeout`, out-of-range durations. Each runs on the fallback walk and, where this machine
//! lets stepguard create one, on a cgroup of the run's own; each asserts no survivor, the exit
//! code and the slug, within a stated bound.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{STEPGUARD, Sandbox};

/// A Codex item line.
fn item(i: usize) -> String {
    format!(r#"{{"type":"item.started","item":{{"id":"item_{i}","type":"command_execution"}}}}"#)
}

fn script(sb: &Sandbox, name: &str, body: &str) -> String {
    let path = sb.write(name, format!("#!/bin/sh\n{body}\n"));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// Compiles a C helper into the sandbox.
fn compile(sb: &Sandbox, name: &str, source: &str) -> PathBuf {
    let src = sb.write(&format!("{name}.c"), source);
    let bin = sb.root().join(name);
    let out = Command::new("gcc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// The containment modes to test: the walk always, a cgroup where one can be created here.
fn modes() -> Vec<&'static str> {
    let mut modes = vec!["process-walk"];
    if cgroup_available() {
        modes.push("cgroup");
    }
    modes
}

fn cgroup_available() -> bool {
    let sb = Sandbox::new();
    let run = sb.run(&[
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--containment",
        "cgroup",
        "--",
        "echo",
        r#"{"type":"turn.completed"}"#,
    ]);
    run.code == Some(0)
}

/// Fields of `/proc/PID/stat` after the command name: (state, session).
fn stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.first()?.chars().next()?, f.get(3)?.parse().ok()?))
}

/// True while any thread of `pid` runs (a zombie leader with a live thread counts).
fn alive(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_owned))
                .is_some_and(|state| state != "Z" && state != "X")
        })
    })
}

/// Every live process whose session is `sid`.
fn in_session(sid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| stat(p).is_some_and(|(state, s)| s == sid && state != 'Z'))
        .filter(|&p| alive(p))
        .collect()
}

fn read_pid(path: &Path) -> u32 {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no pid in {}", path.display());
}

/// Runs stepguard with its output in files (a survivor holding a pipe must not hang the test)
/// and a hard bound; returns the exit code and stderr.
fn run_bounded(sb: &Sandbox, args: &[&str], bound: Duration) -> (Option<i32>, String) {
    let err_path = sb.root().join("stepguard.err");
    let mut cmd = sb.cmd(args);
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().unwrap();
    let until = Instant::now() + bound;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() >= until {
            let g = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
            let _ = rustix::process::kill_process_group(g, rustix::process::Signal::KILL);
            let _ = child.wait();
            panic!("stepguard {args:?} did not exit within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&err_path).unwrap_or_default())
}

/// Waits up to `bound` for `check` to hold.
fn eventually(bound: Duration, check: impl Fn() -> bool) -> bool {
    let until = Instant::now() + bound;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

const ZOMBIE_LEADER: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static void *work(void *arg) { (void)arg; for (;;) sleep(1); return 0; }
int main(int argc, char **argv) {
    if (fork() != 0) return 0;             /* the agent's tool returns at once */
    setsid();
    signal(SIGTERM, SIG_IGN);
    FILE *f = fopen(argv[1], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
    pthread_t t; pthread_create(&t, 0, work, 0);
    pthread_exit(0);                       /* the leader is a zombie; the worker runs on */
}
"#;

/// Runs, under a budget of 2 in `mode`, an agent that starts `helper FILE` (an attack that
/// writes a pid to FILE), then breaches; asserts exit 3 within 10 s and returns the pid.
fn breach_after(sb: &Sandbox, helper: &Path, name: &str, mode: &str) -> u32 {
    let pidfile = sb.root().join(format!("{name}-{mode}.pid"));
    let items: Vec<String> = (0..4).map(|i| format!("echo '{}'", item(i))).collect();
    let body = format!(
        "{} {}\nsleep 0.3\n{}\nsleep 30",
        helper.display(),
        pidfile.display(),
        items.join("\n")
    );
    let agent = script(sb, &format!("{name}-{mode}.sh"), &body);
    let started = Instant::now();
    let args = [
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--max-steps",
        "2",
        "--grace",
        "300ms",
        "--containment",
        mode,
        "--",
        &agent,
    ];
    let (code, stderr) = run_bounded(sb, &args, Duration::from_secs(20));
    assert_eq!(code, Some(3), "{mode}: {stderr}");
    assert!(stderr.contains("failed: max_steps"), "{mode}: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "{mode}");
    read_pid(&pidfile)
}

#[test]
fn a_zombie_leader_with_a_live_thread_is_stopped() {
    let sb = Sandbox::new();
    let helper = compile(&sb, "zombie", ZOMBIE_LEADER);
    for mode in modes() {
        let pid = breach_after(&sb, &helper, "zombie", mode);
        assert!(
            eventually(Duration::from_secs(2), || !alive(pid)),
            "{mode}: the zombie leader's worker thread survived"
        );
    }
}

const PID_HOPPER: &str = r#"
#include <stdio.h>
#include <signal.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (fork() != 0) return 0;
    setsid();
    signal(SIGTERM, SIG_IGN);
    FILE *f = fopen(argv[1], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
    for (;;) {                              /* a new pid every few hundred microseconds */
        if (fork() != 0) _exit(0);
        usleep(500);
    }
}
"#;

#[test]
fn a_pid_hopper_is_stopped() {
    let sb = Sandbox::new();
    let helper = compile(&sb, "hopper", PID_HOPPER);
    for mode in modes() {
        let sid = breach_after(&sb, &helper, "hopper", mode);
        // A hopper's pid changes faster than /proc is read, but its group stays: probe it
        // (zombies answer the probe too, so a live member must also be seen in a scan).
        let g = rustix::process::Pid::from_raw(sid as i32).unwrap();
        let survived = rustix::process::test_kill_process_group(g).is_ok()
            && (0..20).any(|_| !in_session(sid).is_empty());
        if survived {
            let _ = rustix::process::kill_process_group(g, rustix::process::Signal::KILL);
            panic!("{mode}: the PID hopper survived the stop");
        }
    }
}

/// Starts `stepguard run` on an agent that leaves a process of its own session behind and one
/// in its group, then kills stepguard with SIGKILL (or its whole process group); returns the
/// pids that must not survive.
fn kill_stepguard_mid_run(
    sb: &Sandbox,
    mode: &str,
    whole_group: bool,
    signal: rustix::process::Signal,
) -> Vec<u32> {
    let tag = format!("{mode}-{whole_group}-{}", signal.as_raw());
    let grouped = sb.root().join(format!("grouped-{tag}.pid"));
    let escaped = sb.root().join(format!("escaped-{tag}.pid"));
    let agent_pid = sb.root().join(format!("agent-{tag}.pid"));
    let body = format!(
        "echo $$ > {}\nsleep 300 &\necho $! > {}\nsetsid sh -c 'echo $$ > {}; exec sleep 300' &\necho '{}'\nsleep 300",
        agent_pid.display(),
        grouped.display(),
        escaped.display(),
        item(0)
    );
    let agent = script(sb, &format!("victim-{tag}.sh"), &body);
    let mut cmd = Command::new(STEPGUARD);
    cmd.args([
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--containment",
        mode,
        "--",
        &agent,
    ])
    .current_dir(sb.project())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut stepguard = cmd.spawn().unwrap();
    let mut pids = vec![read_pid(&agent_pid), read_pid(&grouped)];
    let escaped = read_pid(&escaped);
    if mode == "cgroup" {
        pids.push(escaped);
    } else {
        // Documented: without a cgroup, a process that left the agent's group outlives a
        // killed stepguard, so it is not asserted on, and the test does not leave it behind.
        if let Some(p) = rustix::process::Pid::from_raw(escaped as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    let sg = rustix::process::Pid::from_raw(stepguard.id() as i32).unwrap();
    if whole_group {
        rustix::process::kill_process_group(sg, signal).unwrap();
    } else {
        rustix::process::kill_process(sg, signal).unwrap();
    }
    let _ = stepguard.wait();
    pids
}

/// Kills stepguard mid-run with `signal` and asserts the run's processes are gone within 3 s.
fn assert_the_run_dies_with_stepguard(
    mode: &str,
    whole_group: bool,
    signal: rustix::process::Signal,
) {
    let sb = Sandbox::new();
    let pids = kill_stepguard_mid_run(&sb, mode, whole_group, signal);
    assert!(
        eventually(Duration::from_secs(3), || pids.iter().all(|&p| !alive(p))),
        "{mode}, whole group {whole_group}, {signal:?}: survivors {:?}",
        pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
}

#[test]
fn the_agent_dies_with_stepguard_killed_by_sigkill() {
    for mode in modes() {
        for whole_group in [false, true] {
            assert_the_run_dies_with_stepguard(mode, whole_group, rustix::process::Signal::KILL);
        }
    }
}

#[test]
fn the_agent_dies_with_stepguard_ended_by_a_signal_it_does_not_handle() {
    use rustix::process::Signal;
    // SIGABRT is also how a plugin's abort() or a panic=abort ends stepguard.
    for mode in modes() {
        for signal in [Signal::ABORT, Signal::QUIT, Signal::USR1, Signal::ALARM] {
            assert_the_run_dies_with_stepguard(mode, false, signal);
        }
    }
}

#[test]
fn a_survivor_holding_stdout_does_not_outlast_the_timeout() {
    let sb = Sandbox::new();
    for mode in modes() {
        let pidfile = sb.root().join(format!("holder-{mode}.pid"));
        // The agent exits at once; its child ignores SIGTERM and keeps stdout open.
        let body = format!(
            "sh -c 'trap \"\" TERM; echo $$ > {p}; while :; do sleep 1; done' &\nwhile [ ! -s {p} ]; do sleep 0.01; done\necho '{}'\nexit 0",
            item(0),
            p = pidfile.display(),
        );
        let agent = script(&sb, &format!("holder-{mode}.sh"), &body);
        let started = Instant::now();
        let (code, stderr) = run_bounded(
            &sb,
            &[
                "run",
                "-q",
                "--no-record",
                "-p",
                "codex",
                "--timeout",
                "1s",
                "--grace",
                "300ms",
                "--containment",
                mode,
                "--",
                &agent,
            ],
            Duration::from_secs(20),
        );
        let took = started.elapsed();
        assert!(took < Duration::from_secs(8), "{mode}: took {took:?}");
        assert!(
            matches!(code, Some(0 | 1 | 124)),
            "{mode}: {:?} {}",
            code,
            stderr
        );
        let pid = read_pid(&pidfile);
        assert!(
            eventually(Duration::from_secs(1), || !alive(pid)),
            "{mode}: holder survived"
        );
    }
}

#[test]
fn out_of_range_durations_are_refused_before_anything_starts() {
    let sb = Sandbox::new();
    let marker = sb.root().join("started");
    let agent = script(&sb, "never.sh", &format!("touch {}", marker.display()));
    for (flag, value, words) in [
        (
            "--timeout",
            "18446744073709551615s",
            "`18446744073709551615s`",
        ),
        (
            "--grace",
            "18446744073709551615s",
            "`18446744073709551615s`",
        ),
        ("--timeout", "0s", "is zero"),
        ("--grace", "2h", "longer than the maximum of 1h"),
        ("--timeout", "abc", "`abc` is not a duration"),
    ] {
        let run = sb.run(&["run", "-p", "codex", flag, value, "--", &agent]);
        assert_eq!(run.code, Some(2), "{flag} {value}: {}", run.stderr);
        assert!(run.stderr.contains(words), "{flag} {value}: {}", run.stderr);
        assert!(!marker.exists(), "{flag} {value}: the agent started");
    }
}

#[test]
fn the_run_record_names_the_containment_used() {
    let sb = Sandbox::new();
    let agent = script(&sb, "ok.sh", "echo '{\"type\":\"turn.completed\"}'");
    let file = sb.root().join("summary.json");
    for mode in modes() {
        let run = sb.run(&[
            "run",
            "-q",
            "--summary-file",
            file.to_str().unwrap(),
            "-p",
            "codex",
            "--containment",
            mode,
            "--",
            &agent,
        ]);
        assert_eq!(run.code, Some(0), "{mode}: {}", run.stderr);
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(record["containment"], mode);
    }
}

#[test]
fn a_write_locked_history_database_does_not_delay_the_stop_or_the_exit() {
    let sb = Sandbox::new();
    let db = sb.root().join("history.db");
    // Create the database, then hold its write lock as a `sqlite3` shell or a backup would.
    let created = sb.run(&[
        "run",
        "-q",
        "--db",
        db.to_str().unwrap(),
        "-p",
        "codex",
        "--",
        "echo",
        r#"{"type":"turn.completed"}"#,
    ]);
    assert_eq!(created.code, Some(0), "{}", created.stderr);
    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE; INSERT INTO runs (started_at, provider, outcome, record) VALUES ('x', 'lock', 'running', '{}');").unwrap();
    let body = format!(
        "{}\nsleep 30",
        (0..4)
            .map(|i| format!("echo '{}'", item(i)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let agent = script(&sb, "breach.sh", &body);
    let started = Instant::now();
    let (code, stderr) = run_bounded(
        &sb,
        &[
            "run",
            "-q",
            "--db",
            db.to_str().unwrap(),
            "-p",
            "codex",
            "--max-steps",
            "2",
            "--",
            &agent,
        ],
        Duration::from_secs(25),
    );
    let took = started.elapsed();
    // The busy timeout is 30 s: the stop and the exit do not wait for it.
    assert_eq!(code, Some(3), "{stderr}");
    assert!(took < Duration::from_secs(6), "took {took:?}: {stderr}");
    assert!(stderr.contains("did not answer within 2s"), "{stderr}");
    let (code, stderr) = run_bounded(
        &sb,
        &[
            "run",
            "-q",
            "--db",
            db.to_str().unwrap(),
            "-p",
            "codex",
            "--timeout",
            "1s",
            "--",
            "sleep",
            "30",
        ],
        Duration::from_secs(25),
    );
    assert_eq!(code, Some(124), "{stderr}");
    drop(lock);
}

/// The cgroup v2 directory of `pid` (from `/proc/PID/cgroup` and the mount of cgroup2).
fn cgroup_dir_of(pid: u32) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mount_point = left.split_whitespace().nth(4)?;
        (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
    })?;
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

#[test]
fn the_guardian_stops_a_zombie_leader_of_a_killed_stepguard_and_removes_its_cgroup() {
    // cgroup.kill does not reach the live threads of a zombie thread-group leader on every
    // kernel: the guardian of a SIGKILLed stepguard must stop them itself, say so only when the
    // cgroup is empty, and remove it.
    if !cgroup_available() {
        eprintln!("SKIPPED: no cgroup v2 with cgroup.kill that this user may create under");
        return;
    }
    let sb = Sandbox::new();
    let helper = compile(&sb, "zombie", ZOMBIE_LEADER);
    let pidfile = sb.root().join("zombie-guardian.pid");
    let agent = script(
        &sb,
        "victim.sh",
        &format!(
            "{} {}\necho '{}'\nsleep 300",
            helper.display(),
            pidfile.display(),
            item(0)
        ),
    );
    let err_path = sb.root().join("stepguard.err");
    let mut cmd = sb.cmd(&[
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--containment",
        "cgroup",
        "--",
        &agent,
    ]);
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut stepguard = cmd.spawn().unwrap();
    let zombie = read_pid(&pidfile);
    assert!(
        eventually(Duration::from_secs(2), || stat(zombie)
            .is_some_and(|(state, _)| state == 'Z')
            && alive(zombie)),
        "the helper did not become a zombie leader with a live thread"
    );
    let cgroup = cgroup_dir_of(zombie).expect("the run's cgroup");
    assert!(
        cgroup.to_string_lossy().contains("stepguard-"),
        "{}",
        cgroup.display()
    );
    let sg = rustix::process::Pid::from_raw(stepguard.id() as i32).unwrap();
    rustix::process::kill_process(sg, rustix::process::Signal::KILL).unwrap();
    let _ = stepguard.wait();
    let stopped = eventually(Duration::from_secs(5), || !alive(zombie));
    if !stopped && let Some(p) = rustix::process::Pid::from_raw(zombie as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
    assert!(stopped, "the zombie leader's thread outlived the guardian");
    assert!(
        eventually(Duration::from_secs(5), || !cgroup.exists()),
        "the guardian left {} behind",
        cgroup.display()
    );
    let said = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(said.contains("were stopped"), "{said}");
}
