//! The two small programs a run's binary plays besides itself: the agent's trampoline (joins
//! the run's cgroup and asks for SIGKILL when the supervisor dies, then becomes the agent) and
//! the guardian (stops the run's processes when the supervisor is gone, however it went).

use std::ffi::OsString;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

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

/// The guardian's arguments, starting with [`GUARDIAN_ARG`]: `CGROUP|-`.
fn guardian_args(cgroup: Option<&Path>) -> Vec<OsString> {
    vec![
        GUARDIAN_ARG.into(),
        cgroup.map_or_else(|| "-".into(), |p| p.as_os_str().to_owned()),
    ]
}

/// Runs the guardian: in a session of its own, it waits on standard input (a pipe only the
/// supervisor writes to: the agent's process group once it exists, then "done"). End of input
/// without "done" means the supervisor is gone: SIGKILL to the run's cgroup and the agent's
/// process group. Returns true when it had to stop the run (the caller says so: the supervisor
/// no longer can).
pub fn guardian_main(args: &[OsString]) -> bool {
    let [cgroup] = args else {
        return false;
    };
    // Out of the supervisor's session and group: killing those must not take the guardian.
    let _ = rustix::process::setsid();
    let cgroup = (cgroup != "-").then(|| PathBuf::from(cgroup));
    let mut pgid: Option<u32> = None;
    let mut message = Vec::new();
    let mut byte = [0u8; 1];
    let done = loop {
        match std::io::stdin().read(&mut byte) {
            Ok(0) => break false,
            Ok(_) if message.is_empty() && byte[0] == DONE => break true,
            Ok(_) if byte[0] == b'\n' => {
                if let Some(digits) = message.strip_prefix(&[GROUP]) {
                    pgid = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| d.parse().ok());
                }
                message.clear();
            }
            Ok(_) => message.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if done {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(dir) = &cgroup {
            let _ = crate::cgroup::kill_dir(dir);
        }
        if let Some(g) = pgid
            .and_then(|g| i32::try_from(g).ok())
            .and_then(Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(g, Signal::KILL);
        }
        let populated = cgroup.as_deref().is_some_and(crate::cgroup::populated);
        if !populated || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(dir) = &cgroup {
        let _ = std::fs::remove_dir(dir);
    }
    true
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
