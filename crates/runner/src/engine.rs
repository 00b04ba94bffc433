//! The engine: start the agent, then own every decision until the run ends.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use stepguard_core::loops::{LoopFound, LoopKind};
use stepguard_core::verdict::TerminatedBy;
use stepguard_core::{StepLedger, StepLimit};
use stepguard_gateway::{Budget, Dialect, Gateway, GatewayConfig, GatewayEvent, Pace};
use stepguard_supervisor::guard::{self, Guardian};
use stepguard_supervisor::{ExitStatus, Reaper, RunCgroup, StopReport, Tree};

use crate::reader::{ReaderEnd, Resume, StreamReader, StreamWatch};
use crate::report::{Ending, GatewayEnd, RunReport};
use crate::spec::{
    Breach, Containment, LimitDecision, LimitPolicy, OnUnrecognized, Progress, Question,
    RunObserver, RunSpec, RunStarted, StdinMode, WrapUp,
};
use crate::stream::{LoopWatch, Recognition};

/// Held for the whole of a run: runs in one process take turns (see the crate docs).
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How long the run may take to wind down once its tree is stopped.
const DRAIN: Duration = Duration::from_secs(2);

/// How often the engine wakes when nothing happens (deadline checks, progress ticks).
const TICK: Duration = Duration::from_millis(200);

/// What the other threads tell the engine.
pub(crate) enum Event {
    /// The reader stopped right after the line whose step exceeded the budget.
    Breach { step: u64 },
    /// The reader reached the end of the agent's output (or gave up).
    ReaderDone(Box<ReaderEnd>),
    /// The agent process exited.
    ChildExited(ExitStatus),
    /// A signal arrived (or an [`Interrupter`] was used): stop the run, starting with it.
    Interrupt(i32),
    /// This many lines came and none was recognised as the provider's stream.
    Unrecognized { lines: u64 },
    /// The policy that asks has answered (and is handed back for the next breach).
    Decided(LimitDecision, Box<dyn LimitPolicy>),
    /// The agent's tool calls went round a loop.
    Loop(LoopFound),
    /// The model gateway forwarded, refused or failed a model call.
    Gateway(GatewayEvent),
    /// A chunk of the stream reported this much more token usage.
    StreamUsage(stepguard_plugin_api::Tokens),
}

/// Stops a run from another thread as a signal to stepguard would (slug `interrupted`).
#[derive(Clone)]
pub struct Interrupter(Sender<Event>);

impl Interrupter {
    /// Stops the run, sending `signal` (e.g. `libc::SIGINT`'s number) to the tree first; false
    /// when the run is over.
    pub fn interrupt(&self, signal: i32) -> bool {
        self.0.send(Event::Interrupt(signal)).is_ok()
    }
}

/// One run, ready to start.
pub struct Runner {
    spec: RunSpec,
    events_tx: Sender<Event>,
    events: Receiver<Event>,
}

impl Runner {
    /// Prepares a run of `spec`.
    pub fn new(spec: RunSpec) -> Self {
        let (events_tx, events) = mpsc::channel();
        Runner {
            spec,
            events_tx,
            events,
        }
    }

    /// Returns a handle that stops the run as a forwarded signal would.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(self.events_tx.clone())
    }

    /// Runs the agent to its end and reports the run; `observers` see its start, progress and
    /// end. Never panics on the agent's behaviour: every way a run can go is in the report.
    /// A second run started meanwhile in the same process waits for this one to end, so never
    /// start a run from an observer or a policy (it would wait for itself).
    pub fn run(self, observers: &mut [&mut dyn RunObserver]) -> RunReport {
        let Runner {
            spec,
            events_tx,
            events,
        } = self;
        // A poisoned lock only means an earlier run panicked; this one starts clean.
        let _turn = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let RunSpec {
            command,
            counter,
            budget,
            budget_source,
            meta,
            grace,
            timeout,
            stdin,
            on_limit,
            output,
            forward_signals,
            containment,
            trampoline,
            plugin_timeout,
            expects,
            on_unrecognized,
            recognition,
            ask_timeout,
            stderr,
            loops,
            idle_timeout,
            startup_timeout,
            env,
            wrap_up,
            spend,
        } = spec;
        let plugin_timeout_ms = u64::try_from(plugin_timeout.as_millis()).unwrap_or(u64::MAX);
        let spec = Labels {
            command,
            budget,
            budget_source,
            meta,
        };
        if let Err(e) = stepguard_supervisor::become_subreaper() {
            tracing::warn!(
                "cannot become a child subreaper ({e}); orphaned agent processes may escape"
            );
        }
        let start = Instant::now();
        let started_at = SystemTime::now();
        let Some(program) = spec.command.first() else {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command");
            return finish(spec, Ending::not_started(e, start, started_at), observers);
        };
        let cgroup = match containment {
            Containment::ProcessWalk => None,
            Containment::Auto | Containment::Cgroup => match RunCgroup::create() {
                Ok(cg) => Some(cg),
                Err(e) if containment == Containment::Cgroup => {
                    let e = std::io::Error::other(format!("no cgroup for the run ({e})"));
                    return finish(spec, Ending::not_started(e, start, started_at), observers);
                }
                Err(e) => {
                    tracing::info!("no cgroup for the run ({e}); containing it by process walk");
                    None
                }
            },
        };
        let steps = Arc::new(AtomicU64::new(0));
        let counts_requests = counter.counts_model_calls();
        // The gateway comes up before the agent, which is pointed at it.
        let mut command = spec.command.clone();
        let mut env = env;
        let gateway = match wrap_up {
            Some(w) => {
                let limit = spec.budget.get().map(u64::from);
                // Where the CLI would have gone is found first: the gateway forwards there.
                let started = point_at(&w, &command, &env, "http://127.0.0.1:1/probe")
                    .map_err(std::io::Error::other)
                    .and_then(|p| {
                        let pace = Pace {
                            limit,
                            steps: Arc::clone(&steps),
                            reply_cost: w.reply_cost,
                            count_requests: counts_requests,
                            max_tokens: spend.max_tokens,
                            max_cost_usd: spend.max_cost_usd,
                            price: spend.price.clone(),
                        };
                        start_gateway(&w, p.upstream, pace, &events_tx)
                    });
                match started {
                    Ok(gw) => match point_at(&w, &command, &env, gw.url()) {
                        Ok(pointing) => {
                            tracing::info!(
                                gateway = %gw.addr(),
                                upstream = %pointing.upstream,
                                from = %pointing.upstream_source,
                                "model gateway started"
                            );
                            command = pointing.command;
                            let bypass = no_proxy_for_loopback(&env);
                            env.extend(pointing.env.into_iter().map(|(k, v)| (k.into(), v.into())));
                            env.extend(bypass);
                            Some(gw)
                        }
                        Err(e) => {
                            let e = std::io::Error::other(e);
                            return finish(
                                spec,
                                Ending::not_started(e, start, started_at),
                                observers,
                            );
                        }
                    },
                    Err(e) => {
                        return finish(spec, Ending::not_started(e, start, started_at), observers);
                    }
                }
            }
            None => None,
        };
        let mut cmd = match &trampoline {
            // The trampoline joins the cgroup and asks for SIGKILL on our death before it
            // becomes the agent: nothing the agent forks can start outside.
            Some(binary) => {
                if let Err(e) = resolve(program) {
                    return finish(spec, Ending::not_started(e, start, started_at), observers);
                }
                let mut cmd = Command::new(binary);
                cmd.args(guard::exec_args(
                    std::process::id(),
                    cgroup.as_ref().map(RunCgroup::path),
                    &command,
                ));
                cmd
            }
            None => {
                let mut cmd = Command::new(program);
                cmd.args(&command[1..]);
                cmd
            }
        };
        cmd.envs(env);
        cmd.stdout(Stdio::piped())
            .stderr(if stderr.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .stdin(match stdin {
                StdinMode::Inherit => Stdio::inherit(),
                StdinMode::Null => Stdio::null(),
            });
        // The guardian comes first, so that however early stepguard dies, something stops what
        // the agent started (the trampoline joins the cgroup before the agent runs).
        let mut guardian = trampoline.as_deref().and_then(|binary| {
            match Guardian::spawn(binary, cgroup.as_ref().map(RunCgroup::path)) {
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
                return finish(spec, Ending::not_started(e, start, started_at), observers);
            }
        };
        let cgroup = match cgroup {
            Some(cg) if trampoline.is_none() => match cg.add(child.id()) {
                Ok(()) => Some(cg),
                Err(e) => {
                    // Not in it, so not contained by it: the record must say the walk.
                    tracing::warn!(
                        "cannot move the agent into its cgroup ({e}); using the process walk"
                    );
                    None
                }
            },
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
        let asks = on_limit.asks();
        let mut on_limit = Some(on_limit);
        let stderr_done = match (stderr, child.stderr.take()) {
            (Some(writer), Some(pipe)) => forward_stderr(pipe, writer),
            _ => None,
        };
        let watch = Arc::new(StreamWatch::default());
        let (resume_tx, resume) = mpsc::channel();
        let feeding_since = Arc::new(AtomicU64::new(0));
        let reaper = Reaper::start(pgid, events_tx.clone(), Event::ChildExited);
        let signals = forward_signals
            .then(|| listen_for_signals(events_tx.clone()))
            .flatten();
        let stdout = child.stdout.take();
        let reader = StreamReader {
            counter,
            ledger: StepLedger::new(spec.budget),
            output,
            events: events_tx.clone(),
            resume,
            steps: Arc::clone(&steps),
            feeding_since: Arc::clone(&feeding_since),
            started: start,
            // Nobody will be asked: the reader may signal the group at once.
            term_on_breach: (!asks).then_some(pgid),
            watch: Arc::clone(&watch),
            recognition_lines: recognition.lines,
            loops: loops.map(LoopWatch::new),
            // With a gateway its usage keeps the budgets; the stream's is only the fallback.
            usage: spend.stream_usage
                && gateway.is_none()
                && (spend.max_tokens.is_some() || spend.max_cost_usd.is_some()),
        };
        let reader = std::thread::Builder::new()
            .name("stepguard-reader".into())
            .spawn(move || {
                let events = reader.events.clone();
                let end = match stdout {
                    Some(pipe) => reader.read(pipe),
                    None => reader.read(std::io::empty()),
                };
                let _ = events.send(Event::ReaderDone(Box::new(end)));
            });
        let (reader, reader_failed) = match reader {
            Ok(handle) => (Some(handle), false),
            Err(e) => {
                // Without a reader nothing is counted: fail closed (the tree is stopped below).
                tracing::error!("cannot start the stream reader: {e}");
                let _ = events_tx.send(Event::ReaderDone(Box::new(ReaderEnd {
                    stats: None,
                    ledger: StepLedger::new(spec.budget),
                    oversized_lines: 0,
                    truncated_last_line: false,
                    plugin_error: None,
                    recognition: Recognition::default(),
                    loops: None,
                })));
                (None, true)
            }
        };
        // The thread that asks at the limit answers through the same channel.
        let events_tx_for_ask = events_tx;
        for o in observers.iter_mut() {
            o.started(&RunStarted {
                pid: pgid,
                command: &spec.command,
                started_at,
                budget: spec.budget,
                budget_source: &spec.budget_source,
                meta: &spec.meta,
            });
        }

        let mut run = Supervision {
            tree: &tree,
            grace,
            limit: spec.budget,
            terminated_by: None,
            stop: None,
            breached_at: None,
            decisions: Vec::new(),
            why: None,
            asking: None,
            resume: resume_tx,
        };
        if reader_failed {
            run.stop(TerminatedBy::Plugin, Signal::TERM);
        }
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let mut child_exit: Option<ExitStatus> = None;
        let mut reader_end: Option<ReaderEnd> = None;
        // Once the tree is stopped (or the agent is gone and its leftovers too), the rest of the
        // run may take this long: a pipe a survivor holds or a stuck plugin never keeps
        // stepguard from exiting.
        let mut drain_until: Option<Instant> = None;
        let mut abandoned = false;
        let mut unrecognised_told = false;
        // The loop ladder with a gateway: a notice at the first loop, the wrap-up at the second.
        let mut loops_noticed = 0u32;
        let mut loop_wrapping = false;
        let model_calls = AtomicU64::new(0);
        // Usage the stream reported so far (kept against the budgets without a gateway).
        let mut stream_usage = stepguard_gateway::CallUsage::default();
        while child_exit.is_none() || reader_end.is_none() {
            if run.stop.is_some() {
                // Stopped: the agent's exit and the reader's end have this long to arrive.
                drain_until.get_or_insert(Instant::now() + DRAIN);
            }
            if drain_until.is_some_and(|d| Instant::now() >= d) {
                tracing::warn!(
                    agent_exited = child_exit.is_some(),
                    reader_done = reader_end.is_some(),
                    "the run did not wind down after the stop; not waiting any longer"
                );
                break;
            }
            let now = Instant::now();
            let ask_until = run.asking.as_ref().and_then(|(q, _)| q.deadline());
            let wait = [deadline, drain_until, ask_until]
                .into_iter()
                .flatten()
                .map(|d| d.saturating_duration_since(now))
                .fold(TICK, Duration::min);
            match events.recv_timeout(wait) {
                Ok(Event::Breach { step }) => {
                    run.breached_at.get_or_insert(step);
                    match on_limit.take() {
                        Some(mut policy) if asks => {
                            tree.pause(true);
                            let question =
                                Question::new(ask_timeout.and_then(|t| now.checked_add(t)));
                            let breach = Breach {
                                step,
                                limit: run.limit,
                            };
                            let events = events_tx_for_ask.clone();
                            let asked = question.clone();
                            let spawned = std::thread::Builder::new()
                                .name("stepguard-ask".into())
                                .spawn(move || {
                                    let d = policy.decide(&breach, &asked);
                                    let _ = events.send(Event::Decided(d, policy));
                                });
                            match spawned {
                                Ok(_) => run.asking = Some((question, step)),
                                Err(e) => {
                                    tracing::error!("cannot ask at the limit ({e}); stopping");
                                    run.decide(LimitDecision::Stop, step);
                                }
                            }
                        }
                        policy => {
                            on_limit = policy;
                            run.decide(LimitDecision::Stop, step);
                        }
                    }
                }
                Ok(Event::Decided(decision, policy)) => {
                    on_limit = Some(policy);
                    if let Some((question, step)) = run.asking.take()
                        && !question.withdrawn()
                    {
                        run.decisions.push(decision);
                        run.decide(decision, step);
                        // The pause was ours: the idle clock starts again.
                        let now = start.elapsed().as_millis() as u64 + 1;
                        watch.last_output.store(now, Ordering::Relaxed);
                    }
                }
                Ok(Event::ChildExited(exit)) => {
                    child_exit = Some(exit);
                    run.withdraw_question();
                    // Nothing the agent started may outlive it; this also closes stdout pipes
                    // that leftover descendants still hold.
                    let report = tree.stop(Signal::TERM, grace);
                    if report.initial > 0 {
                        tracing::info!(
                            processes = report.initial,
                            "stopped processes the agent left behind"
                        );
                    }
                    drain_until.get_or_insert(Instant::now() + DRAIN);
                }
                Ok(Event::ReaderDone(end)) => {
                    if end.plugin_error.is_some() {
                        run.stop(TerminatedBy::Plugin, Signal::TERM);
                    }
                    reader_end = Some(*end);
                }
                Ok(Event::Interrupt(sig)) => {
                    let first = Signal::from_named_raw(sig).unwrap_or(Signal::TERM);
                    run.stop(TerminatedBy::Signal, first);
                }
                Ok(Event::Loop(found)) => {
                    if run.terminated_by.is_none() {
                        let why = loop_message(&found);
                        match &gateway {
                            // First rung: the model is told, once, on its next call.
                            Some(gw) if loops_noticed == 0 => {
                                loops_noticed += 1;
                                tracing::info!("{why}; telling the model");
                                gw.push_notice(&loop_notice(&found));
                            }
                            // Second rung: its next call is its last, without tools.
                            Some(gw) if !loop_wrapping => {
                                loop_wrapping = true;
                                tracing::info!("{why}; the next model call is the last");
                                run.why.get_or_insert(
                                    why.replace("stopped as a loop", "wrapped up as a loop"),
                                );
                                gw.force_last();
                            }
                            _ => {
                                tracing::info!("{why}");
                                run.why.get_or_insert(why);
                                run.stop(TerminatedBy::Loop, Signal::TERM);
                            }
                        }
                    }
                }
                Ok(Event::StreamUsage(delta)) => {
                    stream_usage.add(&stepguard_gateway::CallUsage {
                        input: delta.input_tokens,
                        cached_input: delta.cached_input_tokens.unwrap_or(0),
                        output: delta.output_tokens,
                    });
                    if run.terminated_by.is_none()
                        && let Some(why) = spend_crossed(&spend, &stream_usage)
                    {
                        tracing::info!("{}", why.1);
                        run.why.get_or_insert(why.1);
                        run.stop(why.0, Signal::TERM);
                    }
                }
                Ok(Event::Gateway(event)) => match event {
                    GatewayEvent::Forwarded { number, .. } => {
                        model_calls.store(number, Ordering::Relaxed);
                    }
                    // A call past the last one, answered by the gateway with a final text that
                    // ends the CLI cleanly. A second one means it did not end: the backstop.
                    GatewayEvent::Refused { count } => {
                        let reason = gateway.as_ref().and_then(Gateway::reason);
                        if loop_wrapping {
                            run.stop(TerminatedBy::Loop, Signal::TERM);
                        } else if count >= 2 {
                            match reason {
                                Some(Budget::Tokens) => {
                                    run.stop(TerminatedBy::Tokens, Signal::TERM);
                                }
                                Some(Budget::Cost) => run.stop(TerminatedBy::Cost, Signal::TERM),
                                _ => {
                                    let step = model_calls.load(Ordering::Relaxed) + count;
                                    run.breached_at.get_or_insert(step);
                                    run.decide(LimitDecision::Stop, step);
                                }
                            }
                        }
                    }
                    GatewayEvent::Usage { .. } => {}
                    GatewayEvent::Unreadable { why } => {
                        if run.terminated_by.is_none() {
                            tracing::error!("{why}");
                            run.why = Some(why);
                            run.stop(TerminatedBy::Bypassed, Signal::TERM);
                        }
                    }
                    GatewayEvent::Unpriced { model } => {
                        if run.terminated_by.is_none() {
                            let why = format!(
                                "a cost budget is set and the model `{model}` has no price: the \
                                 call was not made; add the model to a price file (--prices FILE) \
                                 or run without --max-cost-usd"
                            );
                            tracing::error!("{why}");
                            run.why = Some(why);
                            run.stop(TerminatedBy::Unpriced, Signal::TERM);
                        }
                    }
                    GatewayEvent::UpstreamFailed { error } => {
                        if run.terminated_by.is_none() {
                            run.why.get_or_insert(error);
                            run.stop(TerminatedBy::Upstream, Signal::TERM);
                        }
                    }
                },
                Ok(Event::Unrecognized { lines }) => {
                    if !unrecognised_told {
                        unrecognised_told = true;
                        let why = unrecognised(&spec.meta.provider, &expects, lines, None);
                        run.unrecognised(on_unrecognized, why);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        run.stop(TerminatedBy::Timeout, Signal::TERM);
                    }
                    if let Some((question, step)) = &run.asking
                        && question.deadline().is_some_and(|d| Instant::now() >= d)
                    {
                        let step = *step;
                        let waited = ask_timeout.unwrap_or_default();
                        run.why = Some(format!(
                            "no answer at the limit within {}; stopped",
                            humantime::format_duration(waited)
                        ));
                        tracing::info!(
                            "no answer at the limit within {}; stopping the agent",
                            humantime::format_duration(waited)
                        );
                        run.withdraw_question();
                        run.decisions.push(LimitDecision::Stop);
                        run.decide(LimitDecision::Stop, step);
                    }
                    // Stalls: nothing at all for the idle timeout; nothing recognised for the
                    // startup timeout.
                    let elapsed_ms = start.elapsed().as_millis() as u64;
                    // While the agent is paused at the limit, silence is ours, not a stall.
                    if let Some(idle) = idle_timeout.filter(|_| run.asking.is_none()) {
                        let last = watch.last_output.load(Ordering::Relaxed).saturating_sub(1);
                        if elapsed_ms.saturating_sub(last) >= idle.as_millis() as u64
                            && run.terminated_by.is_none()
                        {
                            run.why.get_or_insert(format!(
                                "no output from the agent for {}; stopped",
                                humantime::format_duration(idle)
                            ));
                            run.stop(TerminatedBy::Idle, Signal::TERM);
                        }
                    }
                    if let Some(startup) = startup_timeout
                        && !watch.recognised.load(Ordering::Relaxed)
                        && elapsed_ms >= startup.as_millis() as u64
                        && run.terminated_by.is_none()
                    {
                        let what = if spec.meta.provider.is_empty() {
                            "recognised".to_owned()
                        } else {
                            format!("recognised {}", spec.meta.provider)
                        };
                        run.why.get_or_insert(format!(
                            "no {what} event from the agent within {} of the start; stopped",
                            humantime::format_duration(startup)
                        ));
                        run.stop(TerminatedBy::Startup, Signal::TERM);
                    }
                    // Output keeps coming and none of it is the provider's: judged once.
                    let first = watch.first_output.load(Ordering::Relaxed);
                    if !unrecognised_told
                        && first > 0
                        && !watch.recognised.load(Ordering::Relaxed)
                        && start.elapsed().as_millis() as u64
                            >= first + recognition.after.as_millis() as u64
                    {
                        unrecognised_told = true;
                        let why =
                            unrecognised(&spec.meta.provider, &expects, 0, Some(recognition.after));
                        run.unrecognised(on_unrecognized, why);
                    }
                    // A plugin call that does not return is abandoned: fail closed.
                    let since = feeding_since.load(Ordering::Relaxed);
                    if since > 0
                        && !abandoned
                        && start.elapsed().as_millis() as u64 > since + plugin_timeout_ms
                    {
                        let why = format!(
                            "the provider plugin did not return from a call within {}; abandoned it",
                            humantime::format_duration(plugin_timeout)
                        );
                        tracing::error!("{why}");
                        abandoned = true;
                        run.why = Some(why);
                        run.stop(TerminatedBy::Plugin, Signal::TERM);
                    }
                    // Steps in the stream and not one model call through the gateway: the CLI
                    // reaches its model some other way, so nothing can wrap it up.
                    if let Some(gw) = &gateway
                        && !counts_requests
                        && run.terminated_by.is_none()
                        && steps.load(Ordering::Relaxed) >= 2
                        && gw.forwarded() == 0
                        && gw.refused() == 0
                    {
                        let why = format!(
                            "{} steps and no model call through the model gateway: the {} CLI \
                             takes its model URL from somewhere stepguard did not set (a config \
                             file?); stopped. Give the model URL on the command line or in the \
                             environment, or run without --wrap-up",
                            steps.load(Ordering::Relaxed),
                            spec.meta.provider
                        );
                        tracing::error!("{why}");
                        run.why = Some(why);
                        run.stop(TerminatedBy::Bypassed, Signal::TERM);
                    }
                    let progress = Progress {
                        steps: if counts_requests {
                            model_calls.load(Ordering::Relaxed)
                        } else {
                            steps.load(Ordering::Relaxed)
                        },
                        limit: run.limit,
                        elapsed: start.elapsed(),
                    };
                    for o in observers.iter_mut() {
                        o.tick(&progress);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if run.stop.is_some() {
            drain_until.get_or_insert(Instant::now());
        }
        // A withdrawn question: give the prompt a moment to leave the terminal tidy.
        if asks && on_limit.is_none() {
            let until = Instant::now() + Duration::from_millis(500);
            while let Ok(event) =
                events.recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                if matches!(event, Event::Decided(..)) {
                    break;
                }
            }
        }
        drop(reaper);
        if let Some(g) = guardian {
            g.release();
        }
        if let Some(signals) = signals {
            // Ends the listener thread. The handlers stay installed (doing nothing) for the
            // life of the process: signal-hook never restores the default actions.
            signals.close();
        }
        // A reader still blocked (a pipe held open, a plugin stuck) is left behind, not joined.
        if let Some(reader) = reader.filter(|_| reader_end.is_some()) {
            let _ = reader.join();
        }
        // The agent's last words on stderr come before the summary (bounded like the drain).
        if let Some(done) = stderr_done {
            let _ = done.recv_timeout(
                drain_until.map_or(DRAIN, |d| d.saturating_duration_since(Instant::now())),
            );
        }
        // Output that ended before the window closed, none of it recognised.
        if let Some(end) = reader_end.as_ref().filter(|e| e.recognition.failed())
            && !unrecognised_told
            && run.terminated_by.is_none()
        {
            let why = unrecognised(&spec.meta.provider, &expects, end.recognition.lines, None);
            match on_unrecognized {
                OnUnrecognized::Stop => run.why = Some(why),
                OnUnrecognized::Warn => tracing::warn!("{why}"),
            }
        }
        // The gateway's account: an agent that ended by itself after its last call went out
        // tool-less was ended by the budget (or the loop), gracefully.
        let gateway = gateway.map(|gw| {
            let wrapped = gw.wrapped_up();
            if wrapped && run.terminated_by.is_none() {
                run.terminated_by = Some(if loop_wrapping {
                    TerminatedBy::Loop
                } else {
                    TerminatedBy::WrapUp
                });
            }
            // A budget spent without a wrap-up (a call that would itself have crossed it was
            // answered by the gateway): the agent ended on that answer, and the budget ended it.
            if !wrapped && gw.refused_any() && run.terminated_by.is_none() {
                run.terminated_by = Some(match gw.reason() {
                    Some(Budget::Tokens) => TerminatedBy::Tokens,
                    Some(Budget::Cost) => TerminatedBy::Cost,
                    _ => TerminatedBy::Budget,
                });
            }
            let end = GatewayEnd {
                model_calls: gw.forwarded(),
                final_report: gw.final_text().filter(|_| wrapped),
                counts_steps: counts_requests,
                usage: gw.usage(),
                cost_usd: gw.cost_usd(),
                reason: gw.reason(),
            };
            gw.stop();
            end
        });
        let containment_used = tree.mechanism();
        let ending = Ending {
            started_at,
            duration: start.elapsed(),
            pid: Some(pgid),
            reader: reader_end,
            child_exit,
            terminated_by: run.terminated_by,
            stop: run.stop,
            breached_at: run.breached_at,
            decisions: run.decisions,
            spawn_error: None,
            steps_seen: steps.load(Ordering::Relaxed),
            containment: Some(containment_used.as_str()),
            why: run.why,
            unrecognized: on_unrecognized,
            gateway,
            spend,
        };
        // Removes the run's cgroup (empty by now).
        drop(tree);
        finish(spec, ending, observers)
    }
}

/// The engine's decisions so far.
struct Supervision<'t> {
    tree: &'t Tree,
    grace: Duration,
    limit: StepLimit,
    terminated_by: Option<TerminatedBy>,
    stop: Option<StopReport>,
    breached_at: Option<u64>,
    decisions: Vec<LimitDecision>,
    /// What the record's message says about how the run ended, when the engine knows best.
    why: Option<String>,
    /// The question at the limit, while it is open, and the step that raised it.
    asking: Option<(Question, u64)>,
    /// Tells the reader, which waits after a breach, how to go on.
    resume: Sender<Resume>,
}

impl Supervision<'_> {
    /// Carries out the decision at the breach of `step`: stop, or raise the limit and resume.
    fn decide(&mut self, decision: LimitDecision, step: u64) {
        let resume = match decision {
            LimitDecision::Stop => {
                let _ = self.resume.send(Resume::Stop);
                self.stop(TerminatedBy::Budget, Signal::TERM);
                return;
            }
            LimitDecision::Allow(n) => {
                let raised = self.limit.get().unwrap_or(0).saturating_add(n);
                let at_least = u32::try_from(step).unwrap_or(u32::MAX);
                self.limit = StepLimit::Limited(raised.max(at_least));
                Resume::Continue(self.limit)
            }
            LimitDecision::Unlimited => {
                self.limit = StepLimit::Unlimited;
                Resume::Continue(self.limit)
            }
        };
        let _ = self.resume.send(resume);
        self.tree.pause(false);
    }

    /// Withdraws the open question, if any, and lets the waiting reader stop.
    fn withdraw_question(&mut self) {
        if let Some((question, _)) = self.asking.take() {
            question.withdraw();
            let _ = self.resume.send(Resume::Stop);
        }
    }

    /// Acts on output none of which was recognised: stop, or warn.
    fn unrecognised(&mut self, on: OnUnrecognized, why: String) {
        match on {
            OnUnrecognized::Stop => {
                tracing::info!("{why}");
                self.why.get_or_insert(why);
                self.stop(TerminatedBy::Unrecognized, Signal::TERM);
            }
            OnUnrecognized::Warn => tracing::warn!("{why}"),
        }
    }

    /// Stops the tree once, for the first reason that asked.
    fn stop(&mut self, why: TerminatedBy, first: Signal) {
        self.withdraw_question();
        if self.terminated_by.is_some() {
            return;
        }
        self.terminated_by = Some(why);
        tracing::info!(reason = why.as_str(), "stopping the agent's process tree");
        let report = self.tree.stop(first, self.grace);
        tracing::debug!(?report, "process tree stopped");
        if report.survivors > 0 {
            tracing::warn!(
                survivors = report.survivors,
                "processes of the run survived SIGKILL (unkillable, e.g. in uninterruptible sleep)"
            );
        }
        self.stop = Some(report);
    }
}

/// What the report needs of the spec once the run is under way.
pub(crate) struct Labels {
    pub command: Vec<String>,
    pub budget: StepLimit,
    pub budget_source: String,
    pub meta: crate::spec::RunMeta,
}

/// Builds the report and lets the observers see it.
fn finish(spec: Labels, ending: Ending, observers: &mut [&mut dyn RunObserver]) -> RunReport {
    let mut report = RunReport::new(&spec, ending);
    for o in observers.iter_mut() {
        o.finished(&mut report);
    }
    report
}

/// Whether the stream's usage so far has crossed a budget: which, and why, for the record.
fn spend_crossed(
    spend: &crate::spec::SpendLimits,
    used: &stepguard_gateway::CallUsage,
) -> Option<(TerminatedBy, String)> {
    if let Some(max) = spend.max_tokens
        && used.total() > max
    {
        return Some((
            TerminatedBy::Tokens,
            format!(
                "the stream reported {} tokens, over the token budget of {max}; stopped",
                used.total()
            ),
        ));
    }
    let max = spend.max_cost_usd?;
    let model = spend.model.as_deref()?;
    let cost = (spend.price.as_ref()?.0)(model, used)?;
    (cost > max + 1e-9).then(|| {
        (
            TerminatedBy::Cost,
            format!("the stream's usage costs ${cost:.4} as {model}, over the cost budget of ${max:.2}; stopped"),
        )
    })
}

/// The first rung of the loop ladder: what the model is told on its next call.
fn loop_notice(found: &LoopFound) -> String {
    format!(
        "system notice: you have called {} with the same arguments {} times; change approach or \
         summarise and stop",
        found.tool, found.count
    )
}

/// Starts the run's model gateway; its events reach the engine's channel.
fn start_gateway(
    w: &WrapUp,
    upstream: String,
    pace: Pace,
    events: &Sender<Event>,
) -> std::io::Result<Gateway> {
    let dialect: Dialect = w.endpoint.dialect.parse().map_err(std::io::Error::other)?;
    let events = Mutex::new(events.clone());
    let config = GatewayConfig {
        dialect,
        upstream,
        pace,
        notices: w.notices,
        record_requests: w.record_requests.clone(),
        on_event: Box::new(move |e| {
            let events = events.lock().unwrap_or_else(|p| p.into_inner());
            let _ = events.send(Event::Gateway(e));
        }),
        connect_timeout: Duration::from_secs(10),
    };
    Gateway::start(config).map_err(std::io::Error::other)
}

/// `NO_PROXY` and `no_proxy` with 127.0.0.1 added, so that an agent CLI honouring a proxy
/// setting still calls the gateway on loopback directly.
fn no_proxy_for_loopback(
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let current = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .or_else(|| std::env::var(name).ok())
            .unwrap_or_default()
    };
    ["NO_PROXY", "no_proxy"]
        .into_iter()
        .map(|name| {
            let value = current(name);
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

/// Points the agent's command at `url` as the provider declares; the agent's environment is
/// the spec's additions over stepguard's own.
fn point_at(
    w: &WrapUp,
    command: &[String],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    url: &str,
) -> Result<stepguard_gateway::Pointing, stepguard_gateway::PointError> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .or_else(|| std::env::var(name).ok())
    };
    let cwd = std::env::current_dir().unwrap_or_default();
    stepguard_gateway::point(&w.endpoint, command, &lookup, &cwd, url)
}

/// Says what loop stopped the run, e.g. "the agent called `shell` with the same arguments 3
/// times (since step 2)".
fn loop_message(found: &LoopFound) -> String {
    match found.kind {
        LoopKind::Repeat => format!(
            "the agent called `{}` with the same arguments {} times (since step {}); stopped as a loop",
            found.tool, found.count, found.first_step
        ),
        LoopKind::Cycle { .. } => format!(
            "the agent went round the same calls `{}` {} times (since step {}); stopped as a loop",
            found.tool, found.count, found.first_step
        ),
    }
}

/// Says that none of the agent's output was recognised, after `lines` lines or `after` of it.
fn unrecognised(provider: &str, expects: &str, lines: u64, after: Option<Duration>) -> String {
    let seen = match after {
        Some(t) => format!(
            "output in the {} since its first line",
            humantime::format_duration(t)
        ),
        None if lines == 1 => "output (1 line)".to_owned(),
        None => format!("output ({lines} lines)"),
    };
    let expected = if expects.is_empty() {
        format!("the {provider} plugin's event stream")
    } else {
        expects.to_owned()
    };
    format!(
        "none of the agent's {seen} was recognised as a {provider} stream, so no step could be counted; expected {expected}. Check the agent's command (a missing `--json` or `--output-format`?) and `--provider`"
    )
}

/// Copies the agent's stderr to `writer` on a thread of its own; the receiver hears when the
/// pipe closes.
fn forward_stderr(
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
fn listen_for_signals(events: Sender<Event>) -> Option<signal_hook::iterator::Handle> {
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

/// Finds `program` as `exec` would (a path, or a name on `PATH`), so that a missing agent is
/// `spawn_failed` even when a trampoline runs it.
fn resolve(program: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        let path = std::path::Path::new(program);
        if path.exists() && !runnable(path) {
            return Err(std::io::ErrorKind::PermissionDenied.into());
        }
        runnable(path)
    } else {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| runnable(&dir.join(program)))
        })
    };
    if found {
        Ok(())
    } else {
        Err(std::io::ErrorKind::NotFound.into())
    }
}
