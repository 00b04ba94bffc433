//! The two small programs a run's binary plays besides itself: the agent's trampoline (joins
//! the run's cgroup and asks for SIGKILL when the supervisor dies, then becomes the agent) and
//! the guardian (stops the run's processes when the supervisor is gone, however it went).

use std::ffi::OsString;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::Signal;

/// The first argument that makes a supervisor binary act as the agent's trampoline.
pub const EXEC_ARG: &str = "__stepguard-exec";
/// The first argument that makes a supervisor binary act as the guardian.
pub const GUARDIAN_ARG: &str = "__stepguard-guardian";
/// What the supervisor writes to the guardian when the run ended normally.
pub(crate) const DONE: u8 = b'd';
/// What the supervisor writes before the agent's process group id (then `\n`).
const GROUP: u8 = b'g';

/// The trampoline's arguments, starting with [`EXEC_ARG`]: `PARENT CGROUP|- -- PROGRAM ARGS…`.
pub fn exec_args(parent: u32, cgroup: Option<&Path>, command: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        EXEC_ARG.into(),
        parent.to_string().into(),
        cgroup.map_or_else(|| "-".into(), |p| p.as_os_str().to_owned()),
        "--".into(),
    ];
    args.extend(command.iter().map(OsString::from));
    args
}

/// Runs the trampoline: dies with the supervisor (`PR_SET_PDEATHSIG`), joins the run's cgroup,
/// then executes the agent in place. Returns only when that fails.
pub fn exec_agent(args: &[OsString]) -> std::io::Error {
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_owned());
    let [parent, cgroup, dashes, program, rest @ ..] = args else {
        return bad("usage: __stepguard-exec PARENT CGROUP|- -- PROGRAM [ARGS…]");
    };
    if dashes != "--" {
        return bad("expected `--` before the program");
    }
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        return e.into();
    }
    // The supervisor may have died before the request took effect: then nobody would signal.
    let parent: Option<u32> = parent.to_str().and_then(|p| p.parse().ok());
    let ppid = rustix::process::getppid().map(|p| p.as_raw_pid() as u32);
    if parent.is_none() || ppid != parent {
        return bad("the supervisor is gone");
    }
    if cgroup != "-"
        && let Err(e) = std::fs::write(PathBuf::from(cgroup).join("cgroup.procs"), "0")
    {
        return e;
    }
    Command::new(program).args(rest).exec()
}

/// The guardian's arguments, starting with [`GUARDIAN_ARG`]: `CGROUP|-` and the supervisor's
/// process group (the guardian's own is another from before it runs).
fn guardian_args(cgroup: Option<&Path>) -> Vec<OsString> {
    vec![
        GUARDIAN_ARG.into(),
        cgroup.map_or_else(|| "-".into(), |p| p.as_os_str().to_owned()),
        rustix::process::getpgrp().as_raw_pid().to_string().into(),
    ]
}

/// How a guardian's watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardianEnd {
    /// The supervisor said the run ended: nothing was left to do.
    Released,
    /// The supervisor is gone; every process of the run was stopped and its cgroup removed.
    Stopped,
    /// The supervisor is gone and the run had no cgroup: the agent's group and descendants were
    /// stopped, and the supervisor's own group when only the run was left in it, but processes
    /// that left them were given to another parent when the supervisor died and cannot be found
    /// (a PID hopper in a new session every generation): the end is not confirmed.
    Unconfirmed {
        /// Processes known to be the run's that could not be stopped: members of the
        /// supervisor's group that started after the agent, when someone else shares the group.
        pids: Vec<u32>,
    },
    /// The supervisor is gone and not everything could be stopped within the bound: these
    /// processes are left (e.g. in uninterruptible sleep), and the cgroup, if it could not be
    /// removed.
    Survivors {
        /// Live processes of the run, as last seen.
        pids: Vec<u32>,
        /// The run's cgroup, still there.
        cgroup: Option<PathBuf>,
    },
}

/// Runs the guardian: in a process group of its own (given before it runs, so that a kill of
/// the supervisor's group never takes it, however early), it waits on standard input (a pipe only the
/// supervisor writes to: the agent's process group once it exists, then "done"). End of input
/// without "done" means the supervisor is gone: the run is stopped as the engine stops it
/// (see [`GuardianEnd`]; the caller says how it went: the supervisor no longer can).
pub fn guardian_main(args: &[OsString]) -> GuardianEnd {
    let [cgroup, group] = args else {
        return GuardianEnd::Released;
    };
    // The supervisor's group: a process of the run may hide there.
    let Some(supervisor_group) = group.to_str().and_then(|g| g.parse::<u32>().ok()) else {
        return GuardianEnd::Released;
    };
    let cgroup = (cgroup != "-").then(|| PathBuf::from(cgroup));
    let agent = match watch_supervisor() {
        None => return GuardianEnd::Released,
        Some(agent) => agent,
    };
    match (cgroup, agent) {
        (None, Some(agent)) => stop_walked(&agent, supervisor_group),
        (cgroup, agent) => stop_everything(
            cgroup.as_deref(),
            agent.map(|a| a.pgid),
            Duration::from_secs(5),
        ),
    }
}

/// Stops a run without a cgroup whose supervisor is gone, with the supervisor's own stop
/// ([`crate::Tree::stop`]) on the agent's tree as it is now: its group, its descendants, every
/// group they made. The supervisor's group is the run's too when everyone left in it started
/// after the agent (the supervisor led it, and a process of the run joined it: a PID hopper
/// there keeps the group while its pid changes); with someone else in it, they are only named.
fn stop_walked(agent: &Agent, supervisor_group: u32) -> GuardianEnd {
    let mut tree = crate::Tree::orphaned(agent.pgid);
    // Started in a later clock tick than the agent: of the run (the supervisor's group was
    // made before the agent, and nothing but the run joins it after).
    let of_run = |since: u64| crate::walk::group_members(supervisor_group, since + 1);
    let late = match agent.started {
        Some(since) if supervisor_group != agent.pgid => {
            let (late, early) = of_run(since);
            if early == 0 {
                tree.adopt_group(supervisor_group);
            }
            late
        }
        _ => Vec::new(),
    };
    for id in &late {
        kill(*id);
    }
    tree.stop(Signal::KILL, Duration::ZERO);
    // A hopper's pid changes faster than `/proc` is read: looked for over a while.
    let pids = match agent.started {
        Some(since) if !late.is_empty() => (0..20)
            .find_map(|_| {
                let left = of_run(since).0;
                std::thread::sleep(Duration::from_millis(10));
                (!left.is_empty()).then_some(left)
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    GuardianEnd::Unconfirmed { pids }
}

/// The agent as the supervisor told it: its process group, and when its leader started (clock
/// ticks since boot, read when told).
#[derive(Clone, Copy, Debug)]
struct Agent {
    pgid: u32,
    started: Option<u64>,
}

/// Reads the supervisor's pipe to its end: `None` when it said "done", else the agent, when it
/// was told.
fn watch_supervisor() -> Option<Option<Agent>> {
    let mut pgid: Option<Agent> = None;
    let mut message = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match std::io::stdin().read(&mut byte) {
            Ok(0) => return Some(pgid),
            Ok(_) if message.is_empty() && byte[0] == DONE => return None,
            Ok(_) if byte[0] == b'\n' => {
                if let Some(digits) = message.strip_prefix(&[GROUP]) {
                    pgid = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| d.parse().ok())
                        .map(|pgid| Agent {
                            pgid,
                            started: crate::walk::start_time(pgid),
                        });
                }
                message.clear();
            }
            Ok(_) => message.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Some(pgid),
        }
    }
}

/// SIGKILLs everything of the run until nothing is left or `bound` has passed: the cgroup
/// (`cgroup.kill`, and every process and thread it lists, each signalled itself: on some
/// kernels `cgroup.kill` does not reach the live threads of a zombie thread-group leader), the
/// agent's group, and every descendant of the agent found in `/proc`. Then removes the cgroup.
fn stop_everything(cgroup: Option<&Path>, pgid: Option<u32>, bound: Duration) -> GuardianEnd {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(dir) = cgroup {
            let _ = crate::cgroup::kill_dir(dir);
            for id in listed(dir, "cgroup.threads").chain(listed(dir, "cgroup.procs")) {
                kill(id);
            }
        }
        if let Some(g) = pgid.and_then(crate::pid) {
            let _ = rustix::process::kill_process_group(g, Signal::KILL);
            let _ = rustix::process::kill_process(g, Signal::KILL);
        }
        let walked = pgid.map(crate::walk::scan).unwrap_or_default();
        for p in &walked {
            kill(p.pid);
        }
        let populated = cgroup.is_some_and(crate::cgroup::populated);
        if !populated && walked.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let mut pids: Vec<u32> = cgroup
                .map(|dir| listed(dir, "cgroup.procs").collect())
                .unwrap_or_default();
            pids.extend(walked.iter().map(|p| p.pid));
            pids.sort_unstable();
            pids.dedup();
            return GuardianEnd::Survivors {
                pids,
                cgroup: cgroup.map(Path::to_path_buf),
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match cgroup {
        Some(dir) if !remove(dir) => GuardianEnd::Survivors {
            pids: Vec::new(),
            cgroup: Some(dir.to_path_buf()),
        },
        _ => GuardianEnd::Stopped,
    }
}

/// The ids a cgroup file lists, one a line.
fn listed(dir: &Path, file: &str) -> impl Iterator<Item = u32> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect::<Vec<u32>>()
        .into_iter()
}

/// SIGKILL to one process (a thread's id reaches its whole thread group).
fn kill(id: u32) {
    if let Some(p) = crate::pid(id) {
        let _ = rustix::process::kill_process(p, Signal::KILL);
    }
}

/// Removes an empty cgroup, retrying briefly while the kernel lets go of it.
fn remove(dir: &Path) -> bool {
    for _ in 0..50 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A running guardian. Dropping it without [`Guardian::release`] (a panic, an early return)
/// closes its pipe: the guardian then stops the run at once, as it does when this process dies.
#[derive(Debug)]
pub struct Guardian {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
}

impl Guardian {
    /// Starts `binary` (a program that runs [`guardian_main`] when given [`GUARDIAN_ARG`]) to
    /// guard the cgroup at `cgroup`, before the agent starts: nothing the agent does can come
    /// before its guardian. [`Guardian::guard_group`] adds the agent's group once it exists.
    pub fn spawn(binary: &Path, cgroup: Option<&Path>) -> std::io::Result<Guardian> {
        let mut child = Command::new(binary)
            .args(guardian_args(cgroup))
            // Its own group from the fork on: a kill of the supervisor's group (a CI runner
            // cancelling a job) must not take the guardian before it could leave.
            .process_group(0)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Guardian { child, stdin })
    }

    /// The guardian's pid (never to be signalled by the run's stop).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells the guardian the agent's process group, to kill as well if this process dies.
    pub fn guard_group(&mut self, pgid: u32) {
        if let Some(stdin) = self.stdin.as_mut() {
            let message = format!("{}{pgid}\n", GROUP as char);
            let _ = std::io::Write::write_all(stdin, message.as_bytes());
        }
    }

    /// Tells the guardian the run ended normally: it exits without touching anything.
    pub fn release(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = std::io::Write::write_all(&mut stdin, &[DONE]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_it_cannot_remove_is_reported_not_claimed() {
        // Not a cgroup: nothing to kill, nothing populated, and a directory that will not go
        // (it holds a file): the guardian says the directory is left, not that all is well.
        let dir = std::env::temp_dir().join(format!("stepguard-guard-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep"), "x").unwrap();
        let end = stop_everything(Some(&dir), None, Duration::from_millis(50));
        assert_eq!(
            end,
            GuardianEnd::Survivors {
                pids: Vec::new(),
                cgroup: Some(dir.clone())
            }
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            stop_everything(None, None, Duration::from_millis(50)),
            GuardianEnd::Stopped
        );
    }

    #[test]
    fn a_process_of_the_group_is_stopped_and_the_end_is_told() {
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        assert_eq!(
            stop_everything(None, Some(pgid), Duration::from_secs(5)),
            GuardianEnd::Stopped
        );
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }
}
