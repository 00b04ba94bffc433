//! Runs an agent CLI as a contained process tree and stops every process of it on demand.
//!
//! Agent CLIs are hard to stop: Codex runs each tool command in its own session (setsid and a
//! pseudo-terminal), outside its process group, and a tool call can run anything (double forks,
//! PID hoppers, a main thread that exits while a worker runs on). This crate therefore:
//!
//! * puts the run in a cgroup v2 of its own when it may create one ([`RunCgroup`]: root, or a
//!   delegated subtree), so that `cgroup.kill` stops every process of the run at once, whatever
//!   it did to its session, group or threads;
//! * makes the supervisor a child subreaper ([`become_subreaper`]) and starts the agent in its
//!   own process group ([`spawn_in_group`]), so that the fallback walk of `/proc` finds every
//!   descendant, orphans included;
//! * stops a run's [`Tree`]: SIGTERM to the group and every process, a grace period, then (the
//!   walk freezing everything it finds with SIGSTOP first) SIGKILL, until several scans in a row
//!   find nothing; a zombie whose threads still run counts as alive;
//! * plays two small programs from the supervisor's own binary: the agent's trampoline
//!   ([`guard::exec_agent`]: `PR_SET_PDEATHSIG`, join the cgroup, exec) and the guardian
//!   ([`guard::guardian_main`]: in a process group of its own, it stops the run when the supervisor is
//!   gone, however it went);
//! * reaps every child it inherits ([`Reaper`], one thread per process however many runs),
//!   reporting each run's agent exit to that run.
//!
//! Linux only (`/proc`, cgroup v2, `PR_SET_CHILD_SUBREAPER`).
//!
//! ```no_run
//! use std::time::Duration;
//! let child = stepguard_supervisor::spawn_in_group(&mut std::process::Command::new("sleep").arg("30")).unwrap();
//! let report = stepguard_supervisor::stop_tree(child.id(), Duration::from_secs(5));
//! assert_eq!(report.survivors, 0);
//! ```
#![forbid(unsafe_code)]

mod cgroup;
pub mod guard;
mod reaper;
mod walk;

use std::collections::HashSet;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

pub use cgroup::RunCgroup;
pub use reaper::Reaper;

/// How often the tree is re-examined while it is being stopped.
const POLL: Duration = Duration::from_millis(5);
/// Empty scans in a row, [`POLL`] apart, before a tree counts as gone: one empty scan can fall
/// between a fork and the parent's exit.
const EMPTY_SCANS: usize = 3;
/// How long the kill phase keeps at it before reporting survivors.
const KILL_FOR: Duration = Duration::from_secs(2);
/// Reads of this process's children in a row, [`SWEEP_PAUSE`] apart, that must find none of the
/// run before a full walk confirms it is gone.
const QUIET_READS: usize = 20;
/// The pause between two quiet reads of this process's children.
const SWEEP_PAUSE: Duration = Duration::from_millis(1);

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

/// Returns every live descendant of `root`, found by walking `/proc` (a zombie whose threads
/// still run is live).
pub fn descendants(root: u32) -> Vec<u32> {
    walk::scan(root).into_iter().map(|p| p.pid).collect()
}

/// How a run's processes are contained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// A cgroup v2 of the run's own, plus the walk.
    Cgroup,
    /// Process group, subreaper and the `/proc` walk only.
    ProcessWalk,
}

impl Mechanism {
    /// Returns the name the run record uses: `cgroup` or `process-walk`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mechanism::Cgroup => "cgroup",
            Mechanism::ProcessWalk => "process-walk",
        }
    }
}

/// What stopping a tree took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Live processes when the stop began.
    pub initial: usize,
    /// True when SIGKILL was needed after the grace period.
    pub killed: bool,
    /// Processes still alive at the end (0 unless something is unkillable).
    pub survivors: usize,
    /// The end could not be confirmed: processes of the run kept appearing until the kill phase
    /// gave up (a PID hopper faster than the walk); some may live on.
    pub unconfirmed: bool,
    /// How long it took.
    pub elapsed: Duration,
}

/// One run's processes: the agent's process group, every descendant of this process (it is
/// their subreaper) and, when there is one, the run's cgroup. Processes in `spared` (the
/// guardian) are never signalled.
#[derive(Debug)]
pub struct Tree {
    pgid: u32,
    /// Whose descendants are the run's: this process (their subreaper), or for a guardian whose
    /// supervisor is gone, the agent.
    root: u32,
    /// Groups known to be the run's though their members are not descendants of `root` (a
    /// guardian's finding): signalled as groups whoever else is in them.
    adopted: HashSet<u32>,
    cgroup: Option<RunCgroup>,
    spared: Vec<u32>,
    /// Process groups the run's processes were seen in (the agent's, and every group or
    /// session a descendant created; never one with a member outside the run): signalled as
    /// groups until they are empty, because a PID hopper keeps its group while its pid changes
    /// faster than `/proc` can be read.
    groups: std::cell::RefCell<HashSet<u32>>,
}

impl Tree {
    /// The tree of the agent leading process group `pgid`, contained by `cgroup` if any.
    pub fn new(pgid: u32, cgroup: Option<RunCgroup>) -> Self {
        Tree {
            pgid,
            root: std::process::id(),
            adopted: HashSet::new(),
            cgroup,
            spared: Vec::new(),
            groups: std::cell::RefCell::new(HashSet::from([pgid])),
        }
    }

    /// The tree of the agent leading `pgid` once its supervisor is gone, as a guardian sees it:
    /// the agent's descendants and group (its orphans were given to someone else), and the
    /// groups [`Tree::adopt_group`] adds.
    pub(crate) fn orphaned(pgid: u32) -> Self {
        Tree {
            root: pgid,
            ..Tree::new(pgid, None)
        }
    }

    /// Counts `group` as the run's, to be signalled as a group until it is empty (the caller
    /// knows that no one outside the run is in it).
    pub(crate) fn adopt_group(&mut self, group: u32) {
        self.adopted.insert(group);
        self.groups.borrow_mut().insert(group);
    }

    /// Never signals `pid` (a helper of the supervisor's own, such as the guardian).
    pub fn spare(&mut self, pid: u32) {
        self.spared.push(pid);
    }

    /// The run's cgroup, when it has one.
    pub fn cgroup(&self) -> Option<&RunCgroup> {
        self.cgroup.as_ref()
    }

    /// How the tree is contained.
    pub fn mechanism(&self) -> Mechanism {
        if self.cgroup.is_some() {
            Mechanism::Cgroup
        } else {
            Mechanism::ProcessWalk
        }
    }

    /// Every live process of the run: descendants of this process and the cgroup's members.
    fn members(&self) -> Vec<walk::Proc> {
        self.scan().descendants
    }

    /// Walks `/proc` for the run's processes (spared ones left out, cgroup members added).
    fn scan(&self) -> walk::Scan {
        let mut scan = walk::scan_all(self.root);
        scan.descendants.retain(|p| !self.spared.contains(&p.pid));
        let own_group = rustix::process::getpgrp().as_raw_pid() as u32;
        self.groups
            .borrow_mut()
            .extend(scan.groups.iter().filter(|g| {
                **g != own_group && !scan.foreign_groups.contains(g) && !self.spared.contains(g)
            }));
        scan.foreign_groups.retain(|g| !self.adopted.contains(g));
        let found = &mut scan.descendants;
        if let Some(cg) = &self.cgroup {
            for pid in cg.pids() {
                if !found.iter().any(|p| p.pid == pid) {
                    let pgid = walk::pgid_of(pid).unwrap_or(0);
                    found.push(walk::Proc { pid, pgid });
                }
            }
        }
        scan
    }

    /// Signals the agent's group, then each of `procs` and each of their process groups (a PID
    /// hopper keeps its group while its pid changes), never a group that has a member outside
    /// the run (this process's own, or a shell's a descendant joined).
    fn signal(&self, procs: &[walk::Proc], foreign: &HashSet<u32>, signal: Signal) {
        let own_group = rustix::process::getpgrp().as_raw_pid() as u32;
        let known = self.groups.borrow().clone();
        let mut groups: HashSet<u32> = HashSet::new();
        for p in procs {
            if let Some(pid) = pid(p.pid) {
                let _ = rustix::process::kill_process(pid, signal);
            }
            if !foreign.contains(&p.pgid) {
                groups.insert(p.pgid);
            }
        }
        // Groups the run was seen in are signalled whoever is in them now, unless someone
        // outside the run is in them (a reused id, a shell a descendant joined).
        groups.extend(known.into_iter().filter(|g| !foreign.contains(g)));
        for g in groups {
            if g != own_group
                && g != 0
                && !self.spared.contains(&g)
                && let Some(g) = pid(g)
            {
                let _ = rustix::process::kill_process_group(g, signal);
            }
        }
    }

    /// Scans and signals everything found; returns what was found.
    fn signal_all(&self, signal: Signal) -> Vec<walk::Proc> {
        let scan = self.scan();
        self.signal(&scan.descendants, &scan.foreign_groups, signal);
        scan.descendants
    }

    /// Returns true when [`EMPTY_SCANS`] scans in a row find no process of the run (neither by
    /// the walk nor among this process's children), no group the run created has a member
    /// left, and no child of this process was reaped meanwhile.
    fn gone(&self) -> bool {
        let reaped = reaper::reaped();
        for i in 0..EMPTY_SCANS {
            let populated = self.cgroup.as_ref().is_some_and(RunCgroup::populated);
            if populated
                || !self.children().is_empty()
                || !self.members().is_empty()
                || self.groups_left()
            {
                return false;
            }
            if i + 1 < EMPTY_SCANS {
                std::thread::sleep(POLL);
            }
        }
        // Children still exiting meanwhile: something of the run forks and exits (a PID hopper
        // whose every generation was read a moment too late).
        reaper::reaped() == reaped
    }

    /// This process's live children that belong to the run (all but the spared).
    fn children(&self) -> Vec<u32> {
        let mut kids = walk::live_children().unwrap_or_default();
        kids.retain(|p| !self.spared.contains(p));
        kids
    }

    /// Kills the run's processes among this process's children until [`QUIET_READS`] reads in a
    /// row find none and a full walk agrees; false when `until` comes first. Orphans are given to
    /// this process (a subreaper), so a PID hopper, in whatever group or session, is its child
    /// nearly all the time, and one read of the children lists is far faster than a hop; a
    /// killed process cannot fork again.
    fn sweep(&self, until: Instant) -> bool {
        let mut quiet = 0;
        while Instant::now() < until {
            let kids = self.children();
            if !kids.is_empty() {
                quiet = 0;
                for pid in kids.into_iter().filter_map(pid) {
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
                continue;
            }
            quiet += 1;
            if quiet >= QUIET_READS {
                if self.gone() {
                    return true;
                }
                self.signal_all(Signal::KILL);
                quiet = 0;
            }
            std::thread::sleep(SWEEP_PAUSE);
        }
        false
    }

    /// Returns true while a group the run created still has a live member.
    fn groups_left(&self) -> bool {
        let own_group = rustix::process::getpgrp().as_raw_pid() as u32;
        // A group found empty is forgotten at once: its id may be reused by someone else's.
        self.groups.borrow_mut().retain(|&g| {
            g != own_group
                && pid(g).is_some_and(|g| rustix::process::test_kill_process_group(g).is_ok())
        });
        let left = self.groups.borrow();
        if !left.is_empty() {
            tracing::trace!(left = ?*left, "groups of the run still answer");
        }
        !left.is_empty()
    }

    /// Pauses (SIGSTOP) or resumes (SIGCONT) every process of the run.
    pub fn pause(&self, pause: bool) {
        self.signal_all(if pause { Signal::STOP } else { Signal::CONT });
    }

    /// Stops every process of the run: `first` (SIGTERM, or a forwarded signal) and SIGCONT to
    /// all, `grace` to exit, then SIGKILL (the cgroup at once; the walk freezing all it finds
    /// with SIGSTOP first, until a scan finds nothing new), repeated until the run is gone.
    pub fn stop(&self, first: Signal, grace: Duration) -> StopReport {
        let start = Instant::now();
        // Signal the group before anything else: this is the latency users feel.
        term_or(self.pgid, first);
        let scan = self.scan();
        let initial = scan.descendants.len();
        self.signal(&scan.descendants, &scan.foreign_groups, first);
        self.signal(&scan.descendants, &scan.foreign_groups, Signal::CONT);
        let mut told: HashSet<u32> = scan.descendants.iter().map(|p| p.pid).collect();
        let deadline = start + grace;
        while Instant::now() < deadline {
            if self.gone() {
                return StopReport {
                    initial,
                    killed: false,
                    survivors: 0,
                    unconfirmed: false,
                    elapsed: start.elapsed(),
                };
            }
            // Processes that appeared since are told once too.
            let scan = self.scan();
            let late: Vec<walk::Proc> = scan
                .descendants
                .into_iter()
                .filter(|p| told.insert(p.pid))
                .collect();
            self.signal(&late, &scan.foreign_groups, first);
            self.signal(&late, &scan.foreign_groups, Signal::CONT);
            std::thread::sleep(POLL);
        }
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill();
        }
        // Freeze: nothing stopped can fork, so repeated scans converge.
        let mut frozen: HashSet<u32> = HashSet::new();
        for _ in 0..50 {
            let scan = self.scan();
            let fresh: Vec<walk::Proc> = scan
                .descendants
                .into_iter()
                .filter(|p| !frozen.contains(&p.pid))
                .collect();
            if fresh.is_empty() {
                break;
            }
            self.signal(&fresh, &scan.foreign_groups, Signal::STOP);
            frozen.extend(fresh.iter().map(|p| p.pid));
        }
        let kill_until = Instant::now() + KILL_FOR;
        loop {
            self.signal_all(Signal::KILL);
            if let Some(cg) = &self.cgroup {
                let _ = cg.kill();
            }
            if self.gone() || Instant::now() >= kill_until {
                break;
            }
            std::thread::sleep(POLL);
        }
        // The walk may have missed a process that changes its pid faster than `/proc` is read:
        // the end is confirmed only by reads of this process's children that stay empty.
        let unconfirmed = !self.sweep(Instant::now() + KILL_FOR);
        StopReport {
            initial,
            killed: true,
            survivors: self.members().len(),
            unconfirmed,
            elapsed: start.elapsed(),
        }
    }
}

fn term_or(pgid: u32, signal: Signal) {
    if let Some(g) = pid(pgid) {
        let _ = rustix::process::kill_process_group(g, signal);
    }
}

/// Stops every descendant of this process and the group `pgid` (no cgroup): see [`Tree::stop`].
pub fn stop_tree(pgid: u32, grace: Duration) -> StopReport {
    stop_tree_with(pgid, Signal::TERM, grace)
}

/// Like [`stop_tree`], but starts with `first` (e.g. a forwarded SIGINT) instead of SIGTERM.
pub fn stop_tree_with(pgid: u32, first: Signal, grace: Duration) -> StopReport {
    Tree::new(pgid, None).stop(first, grace)
}

/// Sends SIGTERM to the process group only: the fastest first move, safe from any thread; a
/// full stop should follow.
pub fn term_group(pgid: u32) {
    term_or(pgid, Signal::TERM);
}

/// Pauses (SIGSTOP) or resumes (SIGCONT) the group `pgid` and every descendant.
pub fn pause_tree(pgid: u32, pause: bool) {
    Tree::new(pgid, None).pause(pause);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_shell_codes() {
        assert_eq!(ExitStatus::Code(3).shell_code(), 3);
        assert_eq!(ExitStatus::Signal(15).shell_code(), 143);
    }
}
