//! A small harness around the built `stepguard` binary: isolated home, config dir and cwd.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of the binary under test, built by cargo for this integration test.
pub const STEPGUARD: &str = env!("CARGO_BIN_EXE_stepguard");

/// An isolated sandbox: a temp project directory, a temp HOME and XDG dirs, no STEPGUARD_* env.
pub struct Sandbox {
    dir: tempfile::TempDir,
}

/// What one stepguard invocation did.
#[derive(Debug)]
pub struct Run {
    /// Process exit code (None when killed by a signal).
    pub code: Option<i32>,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
}

impl Run {
    /// Parses stdout as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Sandbox {
    /// Creates an empty sandbox.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["project", "home", "xdg-config", "xdg-data"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        Sandbox { dir }
    }

    /// Returns the sandbox root.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Returns the project directory (the cwd of every command).
    pub fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    /// Returns the user config file path as stepguard discovers it.
    pub fn user_config(&self) -> PathBuf {
        self.dir.path().join("xdg-config/stepguard/stepguard.toml")
    }

    /// Writes a file relative to the sandbox root, creating parents.
    pub fn write(&self, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.dir.path().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, contents).expect("write");
        path
    }

    /// Returns a command for the binary under test, isolated from the developer's environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(STEPGUARD);
        cmd.args(args).current_dir(self.project());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("STEPGUARD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.env("HOME", self.root().join("home"))
            .env("XDG_CONFIG_HOME", self.root().join("xdg-config"))
            .env("XDG_DATA_HOME", self.root().join("xdg-data"));
        cmd
    }

    /// Runs the binary with `args` and captures everything.
    pub fn run(&self, args: &[&str]) -> Run {
        self.cmd(args).output().expect("spawn stepguard").into()
    }

    /// Runs the binary with extra environment variables.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = self.cmd(args);
        cmd.envs(env.iter().copied());
        cmd.output().expect("spawn stepguard").into()
    }
}
