//! Running git, isolated from the user's hooks, signing and prompts, bounded by a deadline.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stepguard_supervisor::{ExitStatus, Reaper};

use crate::error::CheckpointError;

/// The name and address every checkpoint commit is written with.
pub(crate) const AUTHOR: (&str, &str) = ("stepguard", "stepguard@localhost");

/// `-c` settings on every call: no hooks, no signing, no file-system monitor, no automatic
/// housekeeping, no pager, no colour.
const ISOLATION: &[&str] = &[
    "core.hooksPath=/dev/null",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "core.fsmonitor=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "core.pager=cat",
    "color.ui=false",
    "advice.addEmbeddedRepo=false",
];

/// A git program run in one directory, every call bounded by one deadline.
#[derive(Clone, Debug)]
pub(crate) struct Git {
    program: OsString,
    dir: PathBuf,
    index: Option<PathBuf>,
    deadline: Instant,
    bound: Duration,
}

impl Git {
    /// git (`program`) run in `dir`; every call must end by `deadline` (`bound` after start).
    pub(crate) fn new(program: OsString, dir: &Path, bound: Duration, deadline: Instant) -> Self {
        Git {
            program,
            dir: dir.to_path_buf(),
            index: None,
            deadline,
            bound,
        }
    }

    /// The same git with `GIT_INDEX_FILE` pointing at `index` (never the user's).
    pub(crate) fn with_index(&self, index: &Path) -> Git {
        Git {
            index: Some(index.to_path_buf()),
            ..self.clone()
        }
    }

    /// Runs `git ARGS` with `input` on its stdin; its stdout on success, else its stderr as
    /// the error. A call that is not done by the deadline is killed (with whatever it
    /// started: it runs in a process group of its own).
    pub(crate) fn run(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
    ) -> Result<Vec<u8>, CheckpointError> {
        let step = args.first().copied().unwrap_or_default().to_owned();
        let mut child = self.spawn(args, input.is_some())?;
        let feeder = input.map(|bytes| {
            let mut stdin = child.stdin.take();
            let bytes = bytes.to_vec();
            std::thread::spawn(move || {
                if let Some(s) = stdin.as_mut() {
                    let _ = s.write_all(&bytes);
                }
            })
        });
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        let status = self.wait(&child, &step)?;
        if let Some(f) = feeder {
            let _ = f.join();
        }
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let status = match status {
            ExitStatus::Code(0) => return Ok(stdout),
            ExitStatus::Code(code) => format!("exit status {code}"),
            ExitStatus::Signal(signal) => format!("killed by signal {signal}"),
        };
        Err(CheckpointError::Git {
            step,
            status,
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
        })
    }

    /// Like [`Git::run`], the output as trimmed text.
    pub(crate) fn text(&self, args: &[&str]) -> Result<String, CheckpointError> {
        let out = self.run(args, None)?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    fn spawn(&self, args: &[&str], stdin: bool) -> Result<Child, CheckpointError> {
        use std::os::unix::process::CommandExt as _;
        let mut cmd = Command::new(&self.program);
        for setting in ISOLATION {
            cmd.args(["-c", setting]);
        }
        cmd.args(args)
            .current_dir(&self.dir)
            .env_remove("GIT_INDEX_FILE")
            .env("GIT_AUTHOR_NAME", AUTHOR.0)
            .env("GIT_AUTHOR_EMAIL", AUTHOR.1)
            .env("GIT_COMMITTER_NAME", AUTHOR.0)
            .env("GIT_COMMITTER_EMAIL", AUTHOR.1)
            // Never refresh the user's index as a side effect of a read (`git status`).
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_EDITOR", "true")
            .env("LC_ALL", "C")
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(index) = &self.index {
            cmd.env("GIT_INDEX_FILE", index);
        }
        cmd.spawn().map_err(|source| CheckpointError::GitMissing {
            git: self.program.to_string_lossy().into_owned(),
            source,
        })
    }

    /// Waits for git through the process's one reaper ([`Reaper`]): during a run every child
    /// of stepguard is reaped by it, so a wait of our own would find none.
    fn wait(&self, child: &Child, step: &str) -> Result<ExitStatus, CheckpointError> {
        let (tx, rx) = mpsc::channel();
        let _watch = Reaper::start(child.id(), tx, |status| status);
        let left = self.deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left).map_err(|_| {
            kill_group(child);
            CheckpointError::TimedOut {
                after: self.bound,
                step: step.to_owned(),
            }
        })
    }
}

/// Kills a git call and every process it started (its process group); the reaper reaps them.
fn kill_group(child: &Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Reads a pipe to its end on a thread of its own (a full pipe never stalls git).
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut bytes);
        }
        bytes
    })
}

impl Git {
    /// The git program.
    pub(crate) fn program(&self) -> &std::ffi::OsStr {
        &self.program
    }
}
