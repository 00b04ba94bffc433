//! Stop-to-exit time of a run with `--checkpoint git` on a 10,000-file repository, against the
//! same run with `--checkpoint none`: the agent edits, creates and deletes files, notes the
//! time (`date +%s%N`) just before it writes the line that breaks its budget, then sleeps until
//! stopped; the benchmark notes the time `stepguard run` exited. Runs alternate between the two
//! modes; the work tree is reset between runs (untimed).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};

/// git in `dir`, its output, or the error with what git said.
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(["-c", "commit.gpgSign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .context("run git")?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A committed repository of `files` files of about 1 KiB in 100 directories.
fn repository(dir: &Path, files: usize) -> anyhow::Result<()> {
    git(dir, &["init", "-q", "-b", "main"])?;
    for i in 0..files {
        let sub = dir.join(format!("d{:02}", i % 100));
        std::fs::create_dir_all(&sub)?;
        let body = format!("file {i}\n").repeat(100);
        std::fs::write(sub.join(format!("f{i}.txt")), body)?;
    }
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-qm", "files"])?;
    Ok(())
}

/// The agent: a Codex stream breaking a budget of 2 steps after editing the work tree.
fn agent(root: &Path) -> anyhow::Result<std::path::PathBuf> {
    let item = |i: usize| {
        format!(
            "echo '{{\"type\":\"item.started\",\"item\":{{\"id\":\"item_{i}\",\"type\":\"command_execution\",\"command\":\"echo {i}\"}}}}'\n"
        )
    };
    let mut body = String::from("#!/bin/sh\nsleep 0.5\n");
    body.push_str("for i in 1 2 3 4 5 6 7 8 9; do echo edit >> d0$i/f$i.txt; echo new > d0$i/new$i.txt; rm -f d0$i/f1$i.txt; done\n");
    body.push_str(&item(1));
    body.push_str(&item(2));
    body.push_str("date +%s%N > \"$BENCH_STOP\"\n");
    body.push_str(&item(3));
    body.push_str("exec sleep 60\n");
    let path = root.join("agent.sh");
    std::fs::write(&path, body)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(path)
}

/// One run: the time from the breaching line to stepguard's exit.
fn one(stepguard: &Path, repo: &Path, agent: &Path, mode: &str) -> anyhow::Result<Duration> {
    let stop_file = repo.parent().context("parent")?.join("stop-at");
    let status = Command::new(stepguard)
        .args(["run", "--no-record", "-p", "codex", "--max-steps", "2"])
        .args(["--checkpoint", mode, "--"])
        .arg(agent)
        .env("BENCH_STOP", &stop_file)
        .current_dir(repo)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("run stepguard")?;
    let exited = SystemTime::now().duration_since(UNIX_EPOCH)?;
    if status.code() != Some(3) {
        bail!("stepguard exited {status}, not 3 (the budget)");
    }
    let stop: u64 = std::fs::read_to_string(&stop_file)?.trim().parse()?;
    Ok(exited.saturating_sub(Duration::from_nanos(stop)))
}

/// Runs the benchmark: `runs` timed runs of each mode, alternating.
pub(crate) fn run(stepguard: &Path, runs: usize, files: usize) -> anyhow::Result<()> {
    let stepguard = std::fs::canonicalize(stepguard)
        .with_context(|| format!("build it first: {}", stepguard.display()))?;
    let root = tempfile::tempdir()?;
    let repo = root.path().join("repo");
    std::fs::create_dir(&repo)?;
    repository(&repo, files)?;
    let agent = agent(root.path())?;
    let (mut none, mut with) = (Vec::new(), Vec::new());
    for i in 0..runs + 2 {
        for (mode, times) in [("none", &mut none), ("git", &mut with)] {
            let took = one(&stepguard, &repo, &agent, mode)?;
            if i >= 2 {
                times.push(took);
            }
            git(&repo, &["reset", "-q", "--hard"])?;
            git(&repo, &["clean", "-qfd"])?;
        }
    }
    let refs = git(&repo, &["for-each-ref", "refs/stepguard/runs"])?;
    if refs.lines().count() != runs + 2 {
        bail!(
            "expected {} checkpoints, found {}",
            runs + 2,
            refs.lines().count()
        );
    }
    println!("stop-to-exit, {files} files, {runs} runs each (after 2 of warm-up):");
    for (mode, times) in [
        ("--checkpoint none", &mut none),
        ("--checkpoint git ", &mut with),
    ] {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "  {mode}  median {:>7.1} ms  p90 {:>7.1} ms  max {:>7.1} ms",
            ms(at(0.5)),
            ms(at(0.9)),
            ms(at(1.0))
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
