//! Runs an agent CLI as a supervised process tree and stops every descendant on demand.
//!
//! Agent CLIs are hard to stop: Codex runs each tool command in its own session (setsid and a
//! pseudo-terminal), outside its process group, so signalling the group leaves `sleep 300`
//! running. This crate therefore:
//!
//! * makes the supervisor a child subreaper ([`become_subreaper`]), so orphans of the agent are
//!   reparented to it rather than to init and stay findable;
//! * starts the agent in its own process group ([`spawn_in_group`]);
//! * finds every live descendant by walking `/proc` ([`descendants`]);
//! * stops the tree ([`stop_tree`]): SIGTERM to the group and to every descendant, a grace
//!   period, then SIGKILL, repeated until nothing is left;
//! * reaps every child it inherits ([`Reaper`], one thread per process however many runs),
//!   reporting each run's agent exit to that run.
//!
//! Linux only (`/proc`, `PR_SET_CHILD_SUBREAPER`).
//!
//! ```no_run
//! use std::time::Duration;
//! let child = stepguard_supervisor::spawn_in_group(&mut std::process::Command::new("sleep").arg("30")).unwrap();
//! let report = stepguard_supervisor::stop_tree(child.id(), Duration::from_secs(5));
//! assert_eq!(report.survivors, 0);
//! ```
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::sync::mpsc::Sender;
use std::sync::{LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

/// How often the tree is re-examined while it is being stopped.
const POLL: Duration = Duration::from_millis(5);

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

impl ExitStatus {
    /// Returns the shell-style number: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// Makes this process a child subreaper, so orphaned descendants are reparented to it.
pub fn become_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(io::Error::from)
}

/// Spawns `cmd` as the leader of a new process group.
pub fn spawn_in_group(cmd: &mut Command) -> io::Result<Child> {
    cmd.process_group(0).spawn()
}

fn pid(raw: u32) -> Option<Pid> {
    i32::try_from(raw).ok().and_then(Pid::from_raw)
}

/// One line of `/proc/PID/stat`: (pid, state, ppid). The command name may hold spaces and
/// parentheses, so the fields are read after the last `)`.
fn parse_stat(stat: &str) -> Option<(u32, char, u32)> {
    let pid = stat.split_whitespace().next()?.parse().ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((pid, state, ppid))
}

/// Returns every live (non-zombie) descendant of `root`, found by walking `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<u32, Vec<(u32, bool)>> = HashMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{name}/stat")) else {
            continue;
        };
        if let Some((pid, state, ppid)) = parse_stat(&stat) {
            children
                .entry(ppid)
                .or_default()
                .push((pid, state != 'Z' && state != 'X'));
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &(child, alive) in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if alive {
                out.push(child);
            }
            stack.push(child);
        }
    }
    out
}

/// Sends `signal` to the process group `pgid` and to every descendant of this process; returns
/// how many processes were signalled individually.
pub fn signal_tree(pgid: u32, signal: Signal) -> usize {
    if let Some(g) = pid(pgid) {
        // The group may already be gone; individual descendants are handled below.
        let _ = rustix::process::kill_process_group(g, signal);
    }
    let me = std::process::id();
    let mut sent = 0;
    for p in descendants(me) {
        if let Some(p) = pid(p)
            && rustix::process::kill_process(p, signal).is_ok()
        {
            sent += 1;
        }
    }
    sent
}

/// What stopping a tree took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Live descendants when the stop began.
    pub initial: usize,
    /// True when SIGKILL was needed after the grace period.
    pub killed: bool,
    /// Descendants still alive at the end (0 unless something is unkillable).
    pub survivors: usize,
    /// How long it took.
    pub elapsed: Duration,
}

/// Stops every descendant of this process: SIGTERM to the group `pgid` and each descendant,
/// then, after `grace`, SIGKILL, repeated until none is left (or a bounded number of rounds).
///
/// Processes that are stopped (SIGSTOP) are continued after SIGTERM so that they can act on it.
pub fn stop_tree(pgid: u32, grace: Duration) -> StopReport {
    stop_tree_with(pgid, Signal::TERM, grace)
}

/// Like [`stop_tree`], but starts with `first` (e.g. a forwarded SIGINT) instead of SIGTERM.
pub fn stop_tree_with(pgid: u32, first: Signal, grace: Duration) -> StopReport {
    let start = Instant::now();
    let me = std::process::id();
    // Signal the group before anything else: this is the latency users feel. Walking /proc for
    // the descendants outside the group comes right after.
    if let Some(g) = pid(pgid) {
        let _ = rustix::process::kill_process_group(g, first);
    }
    let initial = descendants(me).len();
    signal_tree(pgid, first);
    signal_tree(pgid, Signal::CONT);
    let deadline = start + grace;
    while Instant::now() < deadline {
        if descendants(me).is_empty() {
            return StopReport {
                initial,
                killed: false,
                survivors: 0,
                elapsed: start.elapsed(),
            };
        }
        std::thread::sleep(POLL);
    }
    let mut killed = false;
    for _ in 0..200 {
        if descendants(me).is_empty() {
            break;
        }
        killed = true;
        signal_tree(pgid, Signal::KILL);
        std::thread::sleep(POLL);
    }
    StopReport {
        initial,
        killed,
        survivors: descendants(me).len(),
        elapsed: start.elapsed(),
    }
}

/// Sends SIGTERM to the process group only: the fastest first move, safe from any thread; a
/// full [`stop_tree`] should follow.
pub fn term_group(pgid: u32) {
    if let Some(g) = pid(pgid) {
        let _ = rustix::process::kill_process_group(g, Signal::TERM);
    }
}

/// Pauses (SIGSTOP) or resumes (SIGCONT) the whole tree.
pub fn pause_tree(pgid: u32, pause: bool) {
    signal_tree(pgid, if pause { Signal::STOP } else { Signal::CONT });
}

/// What the process-wide reaper knows: who waits for which child, and exits nobody claimed yet.
#[derive(Default)]
struct Reaping {
    /// Exit callbacks of the children runs are watching, by pid.
    watched: HashMap<u32, Box<dyn FnOnce(ExitStatus) + Send>>,
    /// Recent exits of children nobody watched (yet): a child may exit before its run registers.
    unclaimed: VecDeque<(u32, ExitStatus)>,
    /// Live [`Reaper`]s; the thread ends when none is left.
    active: usize,
    /// The reaping thread, while it runs.
    thread: Option<JoinHandle<()>>,
}

/// How many unclaimed exits are remembered (orphans of finished runs mostly).
const UNCLAIMED: usize = 1024;

static REAPING: LazyLock<Mutex<Reaping>> = LazyLock::new(Mutex::default);

fn reaping() -> std::sync::MutexGuard<'static, Reaping> {
    REAPING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reports the exit of one child while one thread per process reaps every child (orphans
/// reparented to a subreaper included), so that two reapers never take each other's exits.
///
/// From the first `Reaper`'s start until the last one is dropped (which waits for the thread to
/// end), every child of the process is reaped by it: a host that also spawns and waits for its
/// own children should not do so meanwhile.
pub struct Reaper {
    watched: u32,
}

impl Reaper {
    /// Starts watching `watched`; sends `on_exit(status)` once when it exits.
    pub fn start<T: Send + 'static>(
        watched: u32,
        events: Sender<T>,
        on_exit: fn(ExitStatus) -> T,
    ) -> Self {
        let notify = move |status| {
            let _ = events.send(on_exit(status));
        };
        let mut state = reaping();
        state.active += 1;
        let early = state.unclaimed.iter().rposition(|(p, _)| *p == watched);
        match early.and_then(|i| state.unclaimed.remove(i)) {
            // It exited (and was reaped) before it was watched: its pid is free. An entry for a
            // pid that is alive belonged to an earlier process that had the same pid.
            Some((_, status)) if !std::path::Path::new(&format!("/proc/{watched}")).exists() => {
                notify(status);
            }
            _ => {
                state.watched.insert(watched, Box::new(notify));
            }
        }
        if state.thread.is_none() {
            state.thread = std::thread::Builder::new()
                .name("stepguard-reaper".into())
                .spawn(reap)
                .ok();
        }
        Reaper { watched }
    }
}

/// The reaping thread: collects every exit, tells whoever watches it, ends with the last Reaper.
fn reap() {
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((p, status))) => {
                let status = match (status.exit_status(), status.terminating_signal()) {
                    (Some(code), _) => ExitStatus::Code(code),
                    (None, Some(sig)) => ExitStatus::Signal(sig),
                    (None, None) => continue,
                };
                let pid = p.as_raw_pid() as u32;
                let mut state = reaping();
                match state.watched.remove(&pid) {
                    Some(notify) => {
                        drop(state);
                        notify(status);
                    }
                    None => {
                        tracing::debug!(pid, ?status, "reaped a descendant");
                        if state.unclaimed.len() == UNCLAIMED {
                            state.unclaimed.pop_front();
                        }
                        state.unclaimed.push_back((pid, status));
                    }
                }
            }
            // Nothing to reap right now (or no children at all yet/any more). Exit detection is
            // not on the enforcement path, so a few ms is plenty.
            Ok(None) | Err(_) => {
                let state = reaping();
                if state.active == 0 {
                    return;
                }
                drop(state);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

impl Drop for Reaper {
    /// Stops watching; the last one also ends the thread (waiting for it) and forgets the exits
    /// nobody claimed, so nothing is reaped behind the host's back once no run goes on.
    fn drop(&mut self) {
        let mut state = reaping();
        state.active = state.active.saturating_sub(1);
        state.watched.remove(&self.watched);
        if state.active > 0 {
            return;
        }
        state.unclaimed.clear();
        let thread = state.thread.take();
        drop(state);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names() {
        assert_eq!(parse_stat("42 (sleep) S 7 42 42 0"), Some((42, 'S', 7)));
        assert_eq!(parse_stat("43 (a) b (c) Z 9 1"), Some((43, 'Z', 9)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn exit_status_shell_codes() {
        assert_eq!(ExitStatus::Code(3).shell_code(), 3);
        assert_eq!(ExitStatus::Signal(15).shell_code(), 143);
    }
}
