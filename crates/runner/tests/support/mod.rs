//! Shared helpers of the runner's tests: agents as shell scripts, counters, a captured output.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stepguard_core::StepLimit;
use stepguard_plugin_api::host::{Counter, Provider};
use stepguard_plugin_api::{CounterRequest, ProviderBox};
use stepguard_runner::{Clocks, Io, RunSpec, StdinMode};

/// One Codex item line (unit `item` counts each as a step).
pub fn item(i: usize) -> String {
    format!(r#"{{"type":"item.started","item":{{"id":"item_{i}","type":"command_execution"}}}}"#)
}

/// Codex's terminal success event.
pub const TURN_COMPLETED: &str =
    r#"{"type":"turn.completed","usage":{"input_tokens":10,"output_tokens":2}}"#;

/// A directory holding the test's agent scripts.
pub struct Dir(tempfile::TempDir);

impl Dir {
    pub fn new() -> Self {
        Dir(tempfile::tempdir().unwrap())
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes an executable `sh` script and returns the command that runs it.
    pub fn script(&self, name: &str, body: &str) -> Vec<String> {
        let path = self.0.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        vec![path.display().to_string()]
    }

    /// An agent printing `n` Codex items (`pause` seconds apart), then success.
    pub fn items(&self, n: usize, pause: &str) -> Vec<String> {
        let mut body = String::new();
        for i in 0..n {
            body.push_str(&format!("echo '{}'\nsleep {pause}\n", item(i)));
        }
        body.push_str(&format!("echo '{TURN_COMPLETED}'\n"));
        self.script("items.sh", &body)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// Opens a counter of `provider` for `unit`.
pub fn counter_of(provider: ProviderBox, unit: &str) -> Counter {
    Provider::new(provider)
        .unwrap()
        .open_counter(&CounterRequest::new(unit))
        .unwrap()
}

/// A Codex counter (unit `item`).
pub fn codex() -> Counter {
    counter_of(stepguard_provider_codex::provider(), "item")
}

/// What the agent passed through, captured.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A spec for `command` under `budget` with output captured, stdin null, signals not forwarded
/// and a short grace.
pub fn spec(command: Vec<String>, counter: Counter, budget: u32) -> (RunSpec, Captured) {
    let out = Captured::default();
    let spec = RunSpec::builder(command, counter)
        .budget(StepLimit::Limited(budget), "default")
        .io(Io {
            stdin: StdinMode::Null,
            output: Box::new(out.clone()),
            ..Io::default()
        })
        .clocks(Clocks {
            grace: Duration::from_millis(500),
            ..Clocks::default()
        })
        .build();
    (spec, out)
}

/// True while a process with this pid exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Reads a pid an agent wrote to `path`.
pub fn read_pid(path: &Path) -> u32 {
    for _ in 0..200 {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(pid) = s.trim().parse()
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no pid in {}", path.display());
}
