//! Launch: everything between a spec and a running agent. The run's cgroup, the model
//! gateway (started first, the agent pointed at it), the command (through the trampoline when
//! there is one), the guardian, the agent in a process group of its own, and the threads that
//! watch it (stderr, the reaper, the signal listener).

use std::ffi::OsString;
use std::process::{ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use stepguard_gateway::{Deadline, Dialect, Gateway, GatewayConfig, Pace, Staged};
use stepguard_supervisor::guard::{self, Guardian};
use stepguard_supervisor::{RunCgroup, Tree};

use crate::event::Event;
use crate::spec::{Containment, StdinMode, WrapUp};

/// The agent's environment: the spec's additions over stepguard's own.
pub(crate) type Env = Vec<(OsString, OsString)>;

/// The run's cgroup, when it may have one; `Err` when one was required and none could be made.
pub(crate) fn cgroup_for(containment: Containment) -> std::io::Result<Option<RunCgroup>> {
    match containment {
        Containment::ProcessWalk => Ok(None),
        Containment::Auto | Containment::Cgroup => match RunCgroup::create() {
            Ok(cg) => Ok(Some(cg)),
            Err(e) if containment == Containment::Cgroup => Err(std::io::Error::other(format!(
                "no cgroup for the run ({e})"
            ))),
            Err(e) => {
                tracing::info!("no cgroup for the run ({e}); containing it by process walk");
                Ok(None)
            }
        },
    }
}

/// Starts the run's model gateway, forwarding where the CLI would have gone, and points the
/// command and its environment at it.
pub(crate) fn start_gateway(
    w: &WrapUp,
    pace: Pace,
    timeout: Option<Duration>,
    command: &mut Vec<String>,
    env: &mut Env,
    events: &Sender<Event>,
) -> std::io::Result<Gateway> {
    // Where the CLI would have gone is found first: the gateway forwards there.
    let probe =
        point_at(w, command, env, "http://127.0.0.1:1/probe").map_err(std::io::Error::other)?;
    // The variables that hold the CLI's real key: the gateway keeps them, the agent gets
    // per-run keys in their place.
    let held: Vec<(String, String)> = probe
        .keys
        .iter()
        .filter_map(|name| {
            let value = lookup(env, name).filter(|v| !v.trim().is_empty())?;
            Some((name.clone(), value))
        })
        .collect();
    let real = held.iter().map(|(_, v)| v.clone()).collect();
    let staged = Staged {
        thresholds: w.notice_thresholds.clone(),
        // Started a moment before the agent and its clock: the time left is never overstated.
        deadline: timeout.map(|timeout| Deadline {
            started: std::time::Instant::now(),
            timeout,
        }),
    };
    let gw = gateway(w, probe.upstream, real, (pace, staged), events)?;
    let pointing = point_at(w, command, env, gw.url()).map_err(std::io::Error::other)?;
    tracing::info!(
        gateway = %gw.addr(),
        upstream = %pointing.upstream,
        from = %pointing.upstream_source,
        keys = held.len(),
        "model gateway started"
    );
    *command = pointing.command;
    let bypass = no_proxy_for_loopback(env);
    env.extend(pointing.env.into_iter().map(|(k, v)| (k.into(), v.into())));
    env.extend(bypass);
    let per_run = held.into_iter().zip(gw.run_keys());
    env.extend(per_run.map(|((name, _), key)| (name.into(), key.into())));
    Ok(gw)
}

/// `arg` with every `http://…` and `https://…` in it shown as `<hidden>`: where the upstream is
/// stays out of what stepguard records of a run with the gateway.
pub(crate) fn hide_urls(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(at) = ["http://", "https://"]
        .iter()
        .filter_map(|scheme| rest.find(scheme))
        .min()
    {
        out.push_str(&rest[..at]);
        out.push_str("<hidden>");
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || "\"',}]".contains(c))
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Starts a gateway forwarding to `upstream`; its events reach the engine's channel.
fn gateway(
    w: &WrapUp,
    upstream: String,
    api_keys: Vec<String>,
    (pace, staged): (Pace, Staged),
    events: &Sender<Event>,
) -> std::io::Result<Gateway> {
    let dialect: Dialect = w.endpoint.dialect.parse().map_err(std::io::Error::other)?;
    let events = Mutex::new(events.clone());
    let config = GatewayConfig {
        dialect,
        upstream,
        pace,
        notices: w.notices,
        staged,
        record_requests: w.record_requests.clone(),
        on_event: Box::new(move |e| {
            let events = events.lock().unwrap_or_else(|p| p.into_inner());
            let _ = events.send(Event::Gateway(e));
        }),
        connect_timeout: Duration::from_secs(10),
        body_memory: stepguard_gateway::DEFAULT_BODY_MEMORY,
        api_keys,
        shared_budget: w.shared_budget.clone(),
    };
    Gateway::start(config).map_err(std::io::Error::other)
}

/// How the agent's process is set up.
pub(crate) struct Launch<'a> {
    pub command: &'a [String],
    pub env: Env,
    pub trampoline: Option<&'a std::path::Path>,
    pub cgroup: Option<RunCgroup>,
    pub stdin: StdinMode,
    /// Whether stderr is piped to a writer (else inherited).
    pub pipe_stderr: bool,
}

/// The agent, started.
pub(crate) struct Agent {
    /// Its process group (its pid).
    pub pgid: u32,
    /// Its whole tree, for stops.
    pub tree: Tree,
    /// What stops the tree if stepguard dies.
    pub guardian: Option<Guardian>,
    /// Its stdout, for the reader.
    pub stdout: Option<ChildStdout>,
    /// Its stderr, when piped.
    pub stderr: Option<std::process::ChildStderr>,
}

impl Launch<'_> {
    /// Starts the agent in a process group of its own, guarded and contained.
    pub fn spawn(self) -> std::io::Result<Agent> {
        let mut cmd = self.command()?;
        // The guardian comes first, so that however early stepguard dies, something stops
        // what the agent started (the trampoline joins the cgroup before the agent runs).
        let mut guardian = self.trampoline.and_then(|binary| {
            match Guardian::spawn(binary, self.cgroup.as_ref().map(RunCgroup::path)) {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::warn!("no guardian for the run ({e}): if stepguard is killed, processes the agent started may outlive it");
                    None
                }
            }
        });
        let mut child = match stepguard_supervisor::spawn_in_group(&mut cmd) {
            Ok(child) => child,
            Err(e) => {
                if let Some(g) = guardian {
                    g.release();
                }
                return Err(e);
            }
        };
        let cgroup = match self.cgroup {
            Some(cg) if self.trampoline.is_none() => join_late(cg, child.id()),
            other => other,
        };
        let pgid = child.id();
        if let Some(g) = guardian.as_mut() {
            g.guard_group(pgid);
        }
        let mut tree = Tree::new(pgid, cgroup);
        if let Some(g) = &guardian {
            tree.spare(g.pid());
        }
        tracing::info!(containment = tree.mechanism().as_str(), "agent started");
        Ok(Agent {
            pgid,
            tree,
            guardian,
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
        })
    }

    /// The command that starts the agent: through the trampoline when there is one.
    fn command(&self) -> std::io::Result<Command> {
        let Some(program) = self.command.first() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "empty command",
            ));
        };
        // What exec would refuse is refused here, with its fix: through the trampoline it
        // would look like the agent's own failure.
        crate::program::resolve(program)?;
        let mut cmd = match self.trampoline {
            // The trampoline joins the cgroup and asks for SIGKILL on our death before it
            // becomes the agent: nothing the agent forks can start outside.
            Some(binary) => {
                let mut cmd = Command::new(binary);
                cmd.args(guard::exec_args(
                    std::process::id(),
                    self.cgroup.as_ref().map(RunCgroup::path),
                    self.command,
                ));
                cmd
            }
            None => {
                let mut cmd = Command::new(program);
                cmd.args(&self.command[1..]);
                cmd
            }
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdout(Stdio::piped())
            .stderr(if self.pipe_stderr {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .stdin(match self.stdin {
                StdinMode::Inherit => Stdio::inherit(),
                StdinMode::Null => Stdio::null(),
            });
        Ok(cmd)
    }
}

/// Moves an agent started without the trampoline into its cgroup.
fn join_late(cg: RunCgroup, pid: u32) -> Option<RunCgroup> {
    match cg.add(pid) {
        Ok(()) => Some(cg),
        Err(e) => {
            // Not in it, so not contained by it: the record must say the walk.
            tracing::warn!("cannot move the agent into its cgroup ({e}); using the process walk");
            None
        }
    }
}

/// `NO_PROXY` and `no_proxy` with 127.0.0.1 added, so that an agent CLI honouring a proxy
/// setting still calls the gateway on loopback directly.
fn no_proxy_for_loopback(env: &[(OsString, OsString)]) -> Env {
    ["NO_PROXY", "no_proxy"]
        .into_iter()
        .map(|name| {
            let value = lookup(env, name).unwrap_or_default();
            let listed = value.split(',').any(|h| h.trim() == "127.0.0.1");
            let value = match (value.trim().is_empty(), listed) {
                (true, _) => "127.0.0.1".to_owned(),
                (false, true) => value,
                (false, false) => format!("{value},127.0.0.1"),
            };
            (name.into(), value.into())
        })
        .collect()
}

/// A variable of the agent's environment: the spec's additions over stepguard's own.
fn lookup(env: &[(OsString, OsString)], name: &str) -> Option<String> {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .or_else(|| std::env::var(name).ok())
}

/// Points the agent's command at `url` as the provider declares.
fn point_at(
    w: &WrapUp,
    command: &[String],
    env: &[(OsString, OsString)],
    url: &str,
) -> Result<stepguard_gateway::Pointing, stepguard_gateway::PointError> {
    let cwd = std::env::current_dir().unwrap_or_default();
    stepguard_gateway::point(&w.endpoint, command, &|name| lookup(env, name), &cwd, url)
}

/// Copies the agent's stderr to `writer` on a thread of its own; the receiver hears when the
/// pipe closes.
pub(crate) fn forward_stderr(
    mut pipe: std::process::ChildStderr,
    mut writer: Box<dyn std::io::Write + Send>,
) -> Option<Receiver<()>> {
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name("stepguard-stderr".into())
        .spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match std::io::Read::read(&mut pipe, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let _ = writer.write_all(&buf[..n]).and_then(|()| writer.flush());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done_tx.send(());
        })
        .ok()?;
    Some(done)
}

/// Turns SIGINT, SIGTERM and SIGHUP into interrupts of the run.
pub(crate) fn listen_for_signals(events: Sender<Event>) -> Option<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).ok()?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("stepguard-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if events.send(Event::Interrupt(sig)).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    Some(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_hidden_wherever_they_are_in_an_argument() {
        assert_eq!(
            hide_urls(r#"model_providers.m={name="m", base_url="http://127.0.0.1:5/v1", x=1}"#),
            r#"model_providers.m={name="m", base_url="<hidden>", x=1}"#
        );
        assert_eq!(
            hide_urls("openai_base_url=https://llm.example/v1"),
            "openai_base_url=<hidden>"
        );
        assert_eq!(
            hide_urls("see http://a/b and 'https://c'"),
            "see <hidden> and '<hidden>'"
        );
        assert_eq!(hide_urls("exec"), "exec");
        assert_eq!(hide_urls(""), "");
    }
}
