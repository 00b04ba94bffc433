//! What a run does to its whole process: a real SIGTERM stops it, and once it is over the
//! process's own children are its own again. One test in its own binary: no other run may
//! share the process.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use stepguard_core::{ExitCode, FailureSlug};
use stepguard_runner::Runner;
use support::{Dir, alive, codex, item, spec};

#[test]
fn sigterm_to_the_supervisor_stops_the_tree() {
    let dir = Dir::new();
    let body = format!("echo '{}'\nsleep 30\n", item(0));
    let (mut first, _) = spec(dir.script("agent.sh", &body), codex(), 10);
    first.confinement.forward_signals = true;
    let me = rustix::process::getpid();
    let poke = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        rustix::process::kill_process(me, rustix::process::Signal::TERM).unwrap();
    });
    let report = Runner::new(first).run(&mut []);
    poke.join().unwrap();
    assert_eq!(report.exit_code, ExitCode::Interrupted);
    assert_eq!(report.stats.slug, Some(FailureSlug::Interrupted));
    assert!(!alive(report.pid.unwrap()));
    // The listener ends with the run: a second run in the same process goes as normal.
    let (second, _) = spec(dir.items(2, "0"), codex(), 10);
    assert_eq!(
        Runner::new(second).run(&mut []).exit_code,
        ExitCode::Success
    );
}
