//! A cgroup v2 of a run's own: every process the agent starts stays in it whatever it does to
//! its session, group or threads, and `cgroup.kill` stops them all at once.

use std::io;
use std::path::{Path, PathBuf};

/// A run's cgroup, removed when dropped (once empty).
#[derive(Debug)]
pub struct RunCgroup {
    dir: PathBuf,
}

/// Returns where the cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        // `… mount-point … - fstype source options`
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

/// Returns this process's cgroup v2 path (the `0::/path` line of `/proc/self/cgroup`).
fn own_cgroup() -> Option<String> {
    let lines = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    lines
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
}

impl RunCgroup {
    /// Creates a cgroup for one run beside this process's own (root, or a delegated subtree);
    /// an error says why a run must do without (no cgroup v2, no permission, no `cgroup.kill`).
    pub fn create() -> io::Result<RunCgroup> {
        let unsupported = |why: &str| io::Error::new(io::ErrorKind::Unsupported, why.to_owned());
        let mount = cgroup2_mount().ok_or_else(|| unsupported("no cgroup v2 mounted"))?;
        let own = own_cgroup().ok_or_else(|| unsupported("not in a cgroup v2"))?;
        let parent = mount.join(own.trim_start_matches('/'));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = parent.join(format!("stepguard-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir)?;
        let cgroup = RunCgroup { dir };
        if !cgroup.dir.join("cgroup.kill").exists() {
            return Err(unsupported("the kernel has no cgroup.kill (Linux 5.14+)"));
        }
        Ok(cgroup)
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves `pid` (the whole process) into the cgroup.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    /// Sends SIGKILL to every process in the cgroup, new forks included.
    pub fn kill(&self) -> io::Result<()> {
        kill_dir(&self.dir)
    }

    /// Returns the pids in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Returns true while any process is in the cgroup.
    pub fn populated(&self) -> bool {
        populated(&self.dir)
    }
}

/// Writes `cgroup.kill` of the cgroup at `dir`.
pub(crate) fn kill_dir(dir: &Path) -> io::Result<()> {
    std::fs::write(dir.join("cgroup.kill"), "1")
}

/// Returns true while the cgroup at `dir` holds a process (`populated 1` in `cgroup.events`).
pub(crate) fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|e| e.lines().any(|l| l.trim() == "populated 1"))
        .unwrap_or(false)
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        // An empty cgroup is removed at once; one still populated (a process that no signal
        // stops) is left for the guardian or an administrator, and that is logged.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        tracing::warn!(cgroup = %self.dir.display(), "cannot remove the run's cgroup");
    }
}
