//! PID hoppers against the process walk (no cgroup), #26 item 7: a tool that forks and exits
//! without pause, each generation a new pid, either inside stepguard's own process group (which
//! stepguard cannot signal as a group) or in a new session every generation (so no group
//! outlives its pid). Each must be gone when stepguard has exited.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::Sandbox;

/// A hopper: the agent's tool returns at once; the hopper ignores SIGTERM and forks and exits
/// until its stop file (`argv[3]`) exists, or for 60 s at most. `own-group` first joins
/// stepguard's process group (found up its parents); `new-session` makes a new session in every
/// generation. A hopper that nothing stopped cannot be caught from outside (each generation
/// lives for a fork; on a host whose init does not reap, its dead pile up as zombies), so the
/// tests end it with its stop file, whatever they found.
const HOPPER: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static int stepguard_pgid(void) {
    int pid = getppid();
    while (pid > 1) {
        char path[64], comm[64] = {0}, stat[512];
        snprintf(path, sizeof path, "/proc/%d/comm", pid);
        FILE *f = fopen(path, "r"); if (!f) return -1;
        fgets(comm, sizeof comm, f); fclose(f);
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        f = fopen(path, "r"); if (!f) return -1;
        size_t n = fread(stat, 1, sizeof stat - 1, f); fclose(f); stat[n] = 0;
        int ppid, pgid; char state;
        if (sscanf(strrchr(stat, ')') + 2, "%c %d %d", &state, &ppid, &pgid) != 3) return -1;
        if (strncmp(comm, "stepguard", 9) == 0) return pgid;
        pid = ppid;
    }
    return -1;
}
int main(int argc, char **argv) {
    int own_group = strcmp(argv[1], "own-group") == 0;
    int group = own_group ? stepguard_pgid() : 0;
    if (own_group && group <= 0) { fprintf(stderr, "no stepguard above\n"); return 1; }
    if (fork() != 0) return 0;
    if (own_group && setpgid(0, group) != 0) { perror("setpgid"); return 1; }
    signal(SIGTERM, SIG_IGN);
    FILE *f = fopen(argv[2], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
    time_t end = time(NULL) + 60;
    for (;;) {
        if (access(argv[3], F_OK) == 0 || time(NULL) > end) _exit(0);
        if (fork() != 0) _exit(0);
        if (!own_group) setsid();
    }
}
"#;

/// Compiles the hopper into the sandbox under `name` (its command name, found in `/proc`).
fn compile(sb: &Sandbox, name: &str) -> PathBuf {
    let src = sb.write("hopper.c", HOPPER);
    let bin = sb.root().join(name);
    let out = Command::new("gcc")
        .args(["-O1", "-o"])
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

/// Live processes whose command name is `name`.
fn named(name: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s.rfind(')')
                    .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_owned))
                    .is_some_and(|state| state != "Z" && state != "X")
            })
        })
        .collect()
}

/// The file that ends every hopper of the sandbox.
fn stop_file(sb: &Sandbox) -> PathBuf {
    sb.root().join("hoppers.stop")
}

/// Ends the sandbox's hoppers (their stop file) and kills whatever named `name` survived (the
/// test must not leave a hopper behind).
fn clean_up(sb: &Sandbox, name: &str) {
    std::fs::write(stop_file(sb), "").unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut quiet = 0;
    while quiet < 200 && Instant::now() < until {
        let found = named(name);
        if found.is_empty() {
            quiet += 1;
        } else {
            quiet = 0;
        }
        for p in found {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(p as i32).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
    }
    assert!(named(name).is_empty(), "a {name} hopper outlived its test");
}

/// Runs, under a budget of 2 on the process walk, an agent that starts the hopper and breaches;
/// returns the exit code and stderr.
fn breach_with_hopper(sb: &Sandbox, hopper: &Path, kind: &str) -> (Option<i32>, String) {
    let pidfile = sb.root().join(format!("{kind}.pid"));
    let items: Vec<String> = (0..4)
        .map(|i| {
            format!(
                r#"echo '{{"type":"item.started","item":{{"id":"item_{i}","type":"command_execution"}}}}'"#
            )
        })
        .collect();
    let body = format!(
        "#!/bin/sh\n{} {kind} {} {} || exit 9\nsleep 0.3\n{}\nsleep 30\n",
        hopper.display(),
        pidfile.display(),
        stop_file(sb).display(),
        items.join("\n")
    );
    let agent = sb.write(&format!("{kind}.sh"), body);
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = agent.display().to_string();
    let err_path = sb.root().join("stepguard.err");
    let mut cmd = sb.cmd(&[
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
        "process-walk",
        "--",
        &agent,
    ]);
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&err_path).unwrap_or_default())
}

fn hopper_is_stopped(kind: &str, name: &str) {
    let sb = Sandbox::new();
    let hopper = compile(&sb, name);
    let (code, stderr) = breach_with_hopper(&sb, &hopper, kind);
    // The hopper really ran: it wrote its first pid before the agent went on.
    let pids = std::fs::read_to_string(sb.root().join(format!("{kind}.pid"))).unwrap_or_default();
    // Looked for over 200 ms: a hopper's pid changes faster than /proc is read.
    let survived = (0..20).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        !named(name).is_empty()
    });
    clean_up(&sb, name);
    assert!(
        !pids.trim().is_empty(),
        "{kind}: the hopper never started; {stderr}"
    );
    assert!(
        !survived,
        "{kind}: the PID hopper survived the stop; {stderr}"
    );
    assert_eq!(code, Some(3), "{kind}: {stderr}");
    assert!(stderr.contains("failed: max_steps"), "{kind}: {stderr}");
    assert!(!stderr.contains("could not confirm"), "{kind}: {stderr}");
}

#[test]
fn a_hopper_in_stepguards_own_group_is_stopped() {
    hopper_is_stopped("own-group", "sghop-group");
}

#[test]
fn a_hopper_making_a_new_session_every_generation_is_stopped() {
    hopper_is_stopped("new-session", "sghop-session");
}

/// Starts a run on the process walk whose agent starts the hopper, SIGKILLs stepguard once the
/// hopper runs, and returns what stepguard and its guardian wrote (the guardian's message
/// waited for).
fn kill_stepguard_with_hopper(sb: &Sandbox, hopper: &Path, kind: &str) -> String {
    let pidfile = sb.root().join(format!("{kind}-killed.pid"));
    let body = format!(
        "#!/bin/sh\n{} {kind} {} {} || exit 9\necho '{{\"type\":\"thread.started\",\"thread_id\":\"t\"}}'\nsleep 30\n",
        hopper.display(),
        pidfile.display(),
        stop_file(sb).display(),
    );
    let agent = sb.write(&format!("{kind}-killed.sh"), body);
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = agent.display().to_string();
    let err_path = sb.root().join("killed.err");
    let mut cmd = sb.cmd(&[
        "run",
        "-q",
        "--no-record",
        "-p",
        "codex",
        "--containment",
        "process-walk",
        "--",
        &agent,
    ]);
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    // Its own group, as a command started from a shell has: the own-group hopper joins it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&pidfile)
        .unwrap_or_default()
        .trim()
        .is_empty()
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(&err_path).unwrap_or_default();
        if text.contains("guardian:") || Instant::now() >= until {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_guardian_of_a_sigkilled_stepguard_stops_a_hopper_in_its_group() {
    let sb = Sandbox::new();
    let hopper = compile(&sb, "sghop-gkill");
    let stderr = kill_stepguard_with_hopper(&sb, &hopper, "own-group");
    let started =
        std::fs::read_to_string(sb.root().join("own-group-killed.pid")).unwrap_or_default();
    let survived = (0..20).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        !named("sghop-gkill").is_empty()
    });
    clean_up(&sb, "sghop-gkill");
    assert!(
        !started.trim().is_empty(),
        "the hopper never started; {stderr}"
    );
    assert!(
        !survived,
        "the hopper in stepguard's group survived the guardian; {stderr}"
    );
    // What it cannot see is not claimed: without a cgroup the end is not confirmed.
    assert!(stderr.contains("the end is not confirmed"), "{stderr}");
    assert!(!stderr.contains("survived (pids"), "{stderr}");
}

#[test]
fn the_guardian_of_a_sigkilled_stepguard_says_a_new_session_hopper_is_not_confirmed_gone() {
    let sb = Sandbox::new();
    let hopper = compile(&sb, "sghop-skill");
    let stderr = kill_stepguard_with_hopper(&sb, &hopper, "new-session");
    let started =
        std::fs::read_to_string(sb.root().join("new-session-killed.pid")).unwrap_or_default();
    clean_up(&sb, "sghop-skill");
    assert!(
        !started.trim().is_empty(),
        "the hopper never started; {stderr}"
    );
    // A hopper in a new session every generation, given to another parent when stepguard
    // died, cannot be found without a cgroup: the guardian says so instead of "stopped".
    assert!(stderr.contains("the end is not confirmed"), "{stderr}");
    assert!(!stderr.contains("processes were stopped"), "{stderr}");
}
