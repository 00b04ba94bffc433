//! Start-up cost of a run: `stepguard run -p codex -- true` (the agent does nothing) timed N
//! times, beside `true` alone, with the wall time each took and the CPU time of every process
//! it started (the trampoline and the guardian included).
//!
//! CPU is read from a cgroup the benchmark moves itself into (cgroup v1 `cpuacct.usage`, or v2
//! `cpu.stat`'s `usage_usec`): every process started from here is counted, whichever process
//! reaps it, to the microsecond. Without a cgroup it can write to, the CPU of the reaped
//! children (`/proc/self/stat`, clock ticks) gives the mean only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Where CPU time is read from.
enum CpuClock {
    /// A cgroup this process was moved into, and the file that counts its CPU.
    Cgroup {
        dir: PathBuf,
        origin: PathBuf,
        v2: bool,
    },
    /// `/proc/self/stat`'s children times: clock ticks (10 ms), summed over every run.
    Ticks,
}

impl CpuClock {
    /// Moves this process into a new cgroup (v1 `cpuacct`, else v2 at the root), or falls back
    /// to clock ticks.
    fn new() -> CpuClock {
        let name = format!("stepguard-bench-{}", std::process::id());
        let candidates = [
            (Path::new("/sys/fs/cgroup/cpuacct"), false),
            (Path::new("/sys/fs/cgroup"), true),
        ];
        for (root, v2) in candidates {
            let counter = if v2 { "cpu.stat" } else { "cpuacct.usage" };
            if !root.join(counter).is_file() && !root.join("cgroup.procs").is_file() {
                continue;
            }
            let dir = root.join(&name);
            let pid = std::process::id().to_string();
            let moved = std::fs::create_dir(&dir)
                .and_then(|()| std::fs::write(dir.join("cgroup.procs"), &pid));
            if moved.is_ok() && dir.join(counter).is_file() {
                return CpuClock::Cgroup {
                    dir,
                    origin: root.to_path_buf(),
                    v2,
                };
            }
            let _ = std::fs::remove_dir(&dir);
        }
        CpuClock::Ticks
    }

    /// CPU time used so far by this process's cgroup, or its reaped children.
    fn now(&self) -> anyhow::Result<Duration> {
        match self {
            CpuClock::Cgroup { dir, v2: false, .. } => {
                let ns: u64 = std::fs::read_to_string(dir.join("cpuacct.usage"))?
                    .trim()
                    .parse()?;
                Ok(Duration::from_nanos(ns))
            }
            CpuClock::Cgroup { dir, v2: true, .. } => {
                let stat = std::fs::read_to_string(dir.join("cpu.stat"))?;
                let us = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .context("cpu.stat has no usage_usec")?
                    .trim()
                    .parse()?;
                Ok(Duration::from_micros(us))
            }
            CpuClock::Ticks => {
                let stat = std::fs::read_to_string("/proc/self/stat")?;
                let fields: Vec<&str> = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect();
                // cutime and cstime: fields 16 and 17, counted from the state (field 3).
                let ticks: u64 = fields[13].parse::<u64>()? + fields[14].parse::<u64>()?;
                Ok(Duration::from_millis(ticks * 10))
            }
        }
    }

    /// Whether one run's CPU can be told apart (else only the mean over all runs).
    fn per_run(&self) -> bool {
        matches!(self, CpuClock::Cgroup { .. })
    }
}

impl Drop for CpuClock {
    fn drop(&mut self) {
        if let CpuClock::Cgroup { dir, origin, .. } = self {
            let _ = std::fs::write(origin.join("cgroup.procs"), std::process::id().to_string());
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Wall and CPU time of each run of one command.
struct Sample {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
    /// CPU over all runs (for the mean when runs cannot be told apart).
    cpu_total: Duration,
}

/// Runs `argv` `runs` times after `warm` unmeasured runs; each run's wall time ends when
/// `argv`'s process exits, its CPU when every process it started has exited (reaped here as
/// the child subreaper).
fn sample(argv: &[String], runs: usize, warm: usize, clock: &CpuClock) -> anyhow::Result<Sample> {
    let mut s = Sample {
        wall: Vec::new(),
        cpu: Vec::new(),
        cpu_total: Duration::ZERO,
    };
    for i in 0..warm + runs {
        let cpu0 = clock.now()?;
        let start = Instant::now();
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot run {}", argv[0]))?;
        let wall = reap_all(child.id(), start)?;
        let cpu = clock.now()?.saturating_sub(cpu0);
        if i >= warm {
            s.wall.push(wall);
            s.cpu.push(cpu);
            s.cpu_total += cpu;
        }
    }
    Ok(s)
}

/// Reaps every child (the run's guardian outlives stepguard and is reparented here) and
/// returns when `pid` exited, measured from `start`.
fn reap_all(pid: u32, start: Instant) -> anyhow::Result<Duration> {
    let mut wall = None;
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((reaped, _))) => {
                if reaped.as_raw_nonzero().get() as u32 == pid {
                    wall = Some(start.elapsed());
                }
            }
            Ok(None) => {}
            Err(rustix::io::Errno::CHILD) => break,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    wall.context("the command's process was never reaped")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Mean, p50 and p99 (nearest rank) in ms.
fn spread(v: &[Duration]) -> (f64, f64, f64) {
    let mut sorted = v.to_vec();
    sorted.sort();
    let at = |p: f64| {
        let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
        ms(sorted[rank.min(sorted.len()) - 1])
    };
    let mean = ms(sorted.iter().sum::<Duration>()) / sorted.len() as f64;
    (mean, at(50.0), at(99.0))
}

fn row(name: &str, s: &Sample, per_run: bool) {
    let (wm, w50, w99) = spread(&s.wall);
    let cpu = if per_run {
        let (cm, c50, c99) = spread(&s.cpu);
        format!("{cm:.2} | {c50:.2} | {c99:.2}")
    } else {
        format!(
            "{:.2} | - | -",
            ms(s.cpu_total) / s.wall.len().max(1) as f64
        )
    };
    println!("| `{name}` | {wm:.2} | {w50:.2} | {w99:.2} | {cpu} |");
}

/// Times `stepguard run -p codex -- true` against `true`, `runs` times each (after 5 of
/// warm-up), recording into a fresh history database unless `no_record`.
pub(crate) fn run(stepguard: &Path, runs: usize, no_record: bool) -> anyhow::Result<()> {
    if !stepguard.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p stepguard-cli`",
            stepguard.display()
        );
    }
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    let clock = CpuClock::new();
    if !clock.per_run() {
        println!("no writable cgroup: CPU is the mean over all runs, from clock ticks");
    }
    let dir = std::env::temp_dir().join(format!("stepguard-bench-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("history.db");
    let truth = Command::new("sh")
        .args(["-c", "command -v true"])
        .output()?;
    let true_bin = String::from_utf8_lossy(&truth.stdout).trim().to_owned();
    let mut argv = vec![stepguard.display().to_string()];
    if !no_record {
        argv.push(format!("--db={}", db.display()));
    }
    argv.extend(["run", "-p", "codex", "--quiet"].map(String::from));
    if no_record {
        argv.push("--no-record".into());
    }
    argv.extend(["--".to_owned(), true_bin.clone()]);
    let result = (|| {
        let sg = sample(&argv, runs, 5, &clock)?;
        let alone = sample(std::slice::from_ref(&true_bin), runs, 5, &clock)?;
        println!(
            "{runs} runs each; times in ms (wall: to the command's exit; CPU: every process it started)"
        );
        println!("| command | wall mean | wall p50 | wall p99 | CPU mean | CPU p50 | CPU p99 |");
        println!("|---|---|---|---|---|---|---|");
        row(&argv[1..].join(" "), &sg, clock.per_run());
        row("true", &alone, clock.per_run());
        let (sw, _, _) = spread(&sg.wall);
        let (tw, _, _) = spread(&alone.wall);
        let cpu = |s: &Sample| ms(s.cpu_total) / s.wall.len().max(1) as f64;
        println!(
            "stepguard adds {:.2} ms of wall time and {:.2} ms of CPU per run",
            sw - tw,
            cpu(&sg) - cpu(&alone)
        );
        anyhow::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
