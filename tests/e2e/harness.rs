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

    /// Returns the history database at its default location, the user's data directory.
    pub fn history_db(&self) -> PathBuf {
        self.dir.path().join("xdg-data/stepguard/history.db")
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

    /// The history id of the run whose `--summary-file` record is `record`. A run whose
    /// database did not answer within its exit bound (a loaded disk) spools its record, says
    /// so, and carries no id; the next command imports it, so the id is then the newest row's.
    pub fn recorded_id(&self, record: &serde_json::Value, stderr: &str) -> String {
        if let Some(id) = record["id"].as_i64() {
            return id.to_string();
        }
        assert!(
            stderr.contains("the next stepguard to open the database adds it"),
            "a record without an id must say where it is kept: {stderr}"
        );
        let newest = self.run(&["history", "--json", "--last", "1"]).json();
        newest[0]["id"]
            .as_i64()
            .expect("the spooled record was imported")
            .to_string()
    }

    /// Runs the binary with extra environment variables.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = self.cmd(args);
        cmd.envs(env.iter().copied());
        cmd.output().expect("spawn stepguard").into()
    }
}

/// A pseudo-terminal: stepguard's stdin and stderr on its slave side, the test on the master.
pub struct Pty {
    master: std::fs::File,
    slave: std::fs::File,
    /// Everything read from the terminal so far.
    pub seen: String,
    from: usize,
}

impl Pty {
    /// Opens a new pseudo-terminal.
    pub fn open() -> Self {
        use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
        grantpt(&master).expect("grantpt");
        unlockpt(&master).expect("unlockpt");
        let slave_path = ptsname(&master, Vec::new()).expect("ptsname");
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(slave_path.to_str().expect("utf-8 pts path"))
            .expect("open the pty's slave");
        Pty {
            master: std::fs::File::from(master),
            slave,
            seen: String::new(),
            from: 0,
        }
    }

    /// Starts `cmd` with its stdin and stderr on the terminal, stdout piped.
    pub fn spawn(&self, cmd: &mut Command) -> std::process::Child {
        use std::process::Stdio;
        cmd.stdin(Stdio::from(self.slave.try_clone().expect("dup")))
            .stderr(Stdio::from(self.slave.try_clone().expect("dup")))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn stepguard")
    }

    /// Reads the terminal until `needle` appears after the previous match (10 s at most).
    pub fn wait_for(&mut self, needle: &str) {
        use std::io::Read as _;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        loop {
            if let Some(at) = self.seen[self.from..].find(needle) {
                self.from += at + needle.len();
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no `{needle}` in: {}",
                self.seen
            );
            // Never block past the deadline: wait for output at most 100 ms at a time.
            let mut fds = [rustix::event::PollFd::new(
                &self.master,
                rustix::event::PollFlags::IN,
            )];
            let tick = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            if rustix::event::poll(&mut fds, Some(&tick)).unwrap_or(0) == 0 {
                continue;
            }
            let n = self.master.read(&mut buf).expect("read the pty");
            self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }

    /// Types `text` on the terminal.
    pub fn type_text(&mut self, text: &str) {
        use std::io::Write as _;
        self.master
            .write_all(text.as_bytes())
            .expect("write the pty");
    }
}

/// The path of a file under `tests/fixtures`, as an argument.
pub fn fixture(rel: &str) -> String {
    workspace()
        .join("tests/fixtures")
        .join(rel)
        .display()
        .to_string()
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// The cargo target directory the tests were built in (`CARGO_TARGET_DIR`, else `target/` in
/// the workspace): everything the tests build or install goes under it, never into the
/// workspace's own `target/` when the target directory is elsewhere. Cargo tells integration
/// tests its `tmp/` directory (`CARGO_TARGET_TMPDIR`); the target directory is its parent.
pub fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

/// Directories of plugin files built for the tests.
pub struct PluginDirs {
    /// Plugins that load: fixture, fixture-old, fixture-panic, the codex override, opencode.
    pub good: PathBuf,
    /// Files that must not load: not a plugin, ABI generation 2, protocol 2.0.
    pub bad: PathBuf,
    /// The built-in codex provider crate built as a cdylib plugin.
    pub builtin_as_plugin: PathBuf,
    /// Just the OpenCode example plugin.
    pub opencode: PathBuf,
}

/// Builds (once per machine state; cargo skips what is fresh) the plugin variants the tests load,
/// each in the shared `fixture-plugins` directory of the target directory ([`target_dir`]), under a file lock so that parallel
/// test processes do not race.
pub fn plugin_dirs() -> &'static PluginDirs {
    static DIRS: std::sync::OnceLock<PluginDirs> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let root = target_dir().join("fixture-plugins");
        std::fs::create_dir_all(&root).expect("mkdir");
        let lock = std::fs::File::create(root.join(".lock")).expect("lock file");
        lock.lock().expect("lock");
        let dirs = PluginDirs {
            good: root.join("out/good"),
            bad: root.join("out/bad"),
            builtin_as_plugin: root.join("out/builtin"),
            opencode: root.join("out/opencode"),
        };
        for d in [
            &dirs.good,
            &dirs.bad,
            &dirs.builtin_as_plugin,
            &dirs.opencode,
        ] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let ext = std::env::consts::DLL_EXTENSION;
        let variants: &[(&str, &str, &PathBuf, &str)] = &[
            ("stepguard-fixture-plugin", "", &dirs.good, "fixture"),
            (
                "stepguard-fixture-plugin",
                "protocol_old",
                &dirs.good,
                "fixture_old",
            ),
            (
                "stepguard-fixture-plugin",
                "panic",
                &dirs.good,
                "fixture_panic",
            ),
            (
                "stepguard-fixture-plugin",
                "override_codex",
                &dirs.good,
                "codex_override",
            ),
            ("stepguard-plugin-opencode", "", &dirs.good, "opencode"),
            ("stepguard-plugin-opencode", "", &dirs.opencode, "opencode"),
            (
                "stepguard-fixture-plugin",
                "no_export",
                &dirs.bad,
                "not_a_plugin",
            ),
            (
                "stepguard-fixture-plugin",
                "abi2",
                &dirs.bad,
                "fixture_abi2",
            ),
            (
                "stepguard-fixture-plugin",
                "protocol_new",
                &dirs.bad,
                "fixture_new",
            ),
            (
                "stepguard-provider-codex",
                "plugin",
                &dirs.builtin_as_plugin,
                "codex",
            ),
        ];
        for (package, features, out, name) in variants {
            let built = build_cdylib(&root, package, features);
            // Other test processes may be loading the previous copy: replace it atomically.
            let dest = out.join(format!("lib{name}.{ext}"));
            let tmp = out.join(format!(".lib{name}.{}.tmp", std::process::id()));
            std::fs::copy(&built, &tmp).expect("copy plugin");
            std::fs::rename(&tmp, &dest).expect("install plugin");
        }
        drop(lock);
        dirs
    })
}

fn build_cdylib(target_dir: &Path, package: &str, features: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace())
        .args([
            "build",
            "--quiet",
            "--message-format=json",
            "-p",
            package,
            "--target-dir",
        ])
        .arg(target_dir);
    if !features.is_empty() {
        cmd.args(["--features", features]);
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "building {package} [{features}] failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let target = package.replace('-', "_");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == target.as_str())
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| {
            f.extension()
                .is_some_and(|e| e == std::env::consts::DLL_EXTENSION)
        })
        .unwrap_or_else(|| panic!("no cdylib artifact for {package} [{features}]"))
}
