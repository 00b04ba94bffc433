//! The process-wide reaper: one thread collects every child's exit and tells the run that
//! watches it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::process::WaitOptions;

use crate::ExitStatus;

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

/// Children reaped so far, by this process's reaper.
static REAPED: AtomicU64 = AtomicU64::new(0);

/// How many children the reaper has reaped so far: a count that still moves while a run is
/// being stopped means its processes still fork and exit.
pub(crate) fn reaped() -> u64 {
    REAPED.load(Ordering::Acquire)
}

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
                REAPED.fetch_add(1, Ordering::AcqRel);
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
        // Processes killed at the very end may still be zombies of ours: reap them now, or they
        // would go to an init that may never reap them.
        while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
    }
}
