//! The end of a run: the watchers are wound down within the drain's bound, the last word on
//! the stream and the gateway's account are taken, and the report is built and shown to the
//! observers.

use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use stepguard_core::verdict::TerminatedBy;
use stepguard_gateway::{Budget, Gateway};
use stepguard_supervisor::Reaper;
use stepguard_supervisor::guard::Guardian;

use crate::event::Event;
use crate::observe::RunObserver;
use crate::passthrough::Passthrough;
use crate::report::{Ending, GatewayEnd, RunReport};
use crate::spec::{Labels, OnUnrecognized};
use crate::supervise::{DRAIN, Engine};

/// Kept after the drain's bound for writing the record (history, summary file, telemetry,
/// the summary line): the exit after a stop is bounded by the drain (2 s) plus this, whatever
/// the terminal, the database, the collector or a stuck plugin do.
pub(crate) const RECORD_RESERVE: Duration = Duration::from_millis(500);

/// However late, the passthrough and the agent's stderr get this long (within the exit bound)
/// to pass on what is already queued.
const LAST_WORDS: Duration = Duration::from_millis(100);

/// The run's helpers that outlive supervision and are wound down at its end.
pub(crate) struct Leftovers<'e> {
    pub events: &'e Receiver<Event>,
    pub reaper: Reaper,
    pub guardian: Option<Guardian>,
    pub signals: Option<signal_hook::iterator::Handle>,
    pub reader: Option<JoinHandle<()>>,
    pub stderr_done: Option<Receiver<()>>,
    pub passthrough: Option<Passthrough>,
}

/// Winds the run down and gathers how it went.
pub(crate) fn wind_down(
    mut engine: Engine<'_>,
    leftovers: Leftovers<'_>,
    pgid: u32,
    start: Instant,
    started_at: SystemTime,
) -> Ending {
    // One bound for every wait from here on: the drain's (set at the stop, or at the agent's
    // exit) for the wind-down, and the reserve after it for the record.
    let drained_by = engine.drain_until.unwrap_or_else(|| Instant::now() + DRAIN);
    let exit_by = drained_by + RECORD_RESERVE;
    release(&engine, leftovers, drained_by, exit_by);
    judge_unrecognised_end(&mut engine);
    let gateway = engine.gateway.take().map(|gw| account(&mut engine, gw));
    let steps_seen = engine.steps();
    let containment = engine.containment();
    let stream_cost_usd = engine.stream_cost_usd();
    let control = engine.control;
    Ending {
        loops_seen: engine.loops_seen,
        tokens_seen: engine.tokens_seen,
        started_at,
        duration: start.elapsed(),
        pid: Some(pgid),
        reader: engine.reader_end,
        child_exit: engine.child_exit,
        terminated_by: control.terminated_by,
        stop: control.stop,
        breached_at: control.breached_at,
        decisions: control.decisions,
        spawn_error: None,
        steps_seen,
        containment: Some(containment),
        why: control.why,
        unrecognized: engine.on_unrecognized,
        gateway,
        spend: engine.spend,
        stream_cost_usd,
        exit_by,
    }
}

/// Lets every helper thread go: the prompt, the reaper, the guardian, the signal listener,
/// the reader, the passthrough and the stderr copier, each within the drain's bound.
fn release(engine: &Engine<'_>, leftovers: Leftovers<'_>, drained_by: Instant, exit_by: Instant) {
    // A withdrawn question: give the prompt a moment to leave the terminal tidy.
    if engine.control.asks() && engine.control.policy_away() {
        let until = drained_by.min(Instant::now() + Duration::from_millis(500));
        while let Ok(event) = leftovers
            .events
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            if matches!(event, Event::Decided(..)) {
                break;
            }
        }
    }
    drop(leftovers.reaper);
    if let Some(g) = leftovers.guardian {
        g.release();
    }
    if let Some(signals) = leftovers.signals {
        // Ends the listener thread. The handlers stay installed (doing nothing) for the
        // life of the process: signal-hook never restores the default actions.
        signals.close();
    }
    // A reader still blocked (a pipe held open, a plugin stuck) is left behind, not joined.
    if let Some(reader) = leftovers.reader.filter(|_| engine.reader_end.is_some()) {
        let _ = reader.join();
    }
    let last_words = || drained_by.max(Instant::now() + LAST_WORDS).min(exit_by);
    // What was counted reaches the output before the summary, unless its reader stopped
    // reading (then it is left behind at the drain's bound, with a warning).
    if let Some(passthrough) = leftovers.passthrough {
        passthrough.finish(last_words());
    }
    // The agent's last words on stderr come before the summary (bounded like the drain).
    if let Some(done) = leftovers.stderr_done {
        let _ = done.recv_timeout(last_words().saturating_duration_since(Instant::now()));
    }
}

/// Output that ended before the recognition window closed, none of it recognised; a
/// recognised stream whose output was mostly not the provider's, which the reader could not
/// see (unknown events after the start are only in the counter's totals); or no output at
/// all from an agent that exited 0 (silence is no stream).
fn judge_unrecognised_end(engine: &mut Engine<'_>) {
    let Some(end) = engine.reader_end.as_ref() else {
        return;
    };
    if engine.control.terminated_by.is_some() {
        return;
    }
    let why = if end.recognition.recognised {
        let mut settled = end.recognition;
        if let Some(stats) = &end.stats {
            let mut stats = stats.clone();
            stats.noise_lines += end.oversized_lines;
            settled.settle(&stats);
        }
        // Told while it ran (the reader saw it): said once.
        if !settled.mostly_unrecognised() || end.recognition.mostly_unrecognised() {
            return;
        }
        Some(settled.mostly_unrecognised_message())
    } else if end.recognition.failed() {
        engine.dogs.unrecognised_at_end(end.recognition.lines)
    } else if end.recognition.silent()
        && engine.child_exit == Some(stepguard_supervisor::ExitStatus::Code(0))
    {
        engine.dogs.silent_at_end()
    } else {
        None
    };
    let Some(why) = why else {
        return;
    };
    match engine.on_unrecognized {
        OnUnrecognized::Stop => engine.control.why = Some(why),
        OnUnrecognized::Warn => tracing::warn!("{why}"),
    }
}

/// The gateway's account: an agent that ended by itself after its last call went out
/// tool-less was ended by the budget (or the loop), gracefully.
fn account(engine: &mut Engine<'_>, gw: Gateway) -> GatewayEnd {
    judge_bypass(engine, &gw);
    let wrapped = gw.wrapped_up();
    let loop_wrapping = engine.loop_wrapping();
    let control = &mut engine.control;
    if wrapped && control.terminated_by.is_none() {
        control.terminated_by = Some(if loop_wrapping {
            TerminatedBy::Loop
        } else {
            TerminatedBy::WrapUp
        });
    }
    // A budget spent without a wrap-up (a call that would itself have crossed it was answered
    // by the gateway): the agent ended on that answer, and the budget ended it.
    if !wrapped && gw.refused_any() && control.terminated_by.is_none() {
        control.terminated_by = Some(match gw.reason() {
            Some(Budget::Tokens) => TerminatedBy::Tokens,
            Some(Budget::Cost) => TerminatedBy::Cost,
            _ => TerminatedBy::Budget,
        });
    }
    // Calls that together spent more than a token or cost budget: never a success.
    if control.terminated_by.is_none() {
        match gw.overspent() {
            Some(Budget::Tokens) => control.terminated_by = Some(TerminatedBy::Tokens),
            Some(Budget::Cost) => control.terminated_by = Some(TerminatedBy::Cost),
            _ => {}
        }
    }
    let end = GatewayEnd {
        model_calls: gw.forwarded(),
        final_report: gw.final_text().filter(|_| wrapped),
        counts_steps: engine.counts_requests,
        usage: gw.usage(),
        cost_usd: gw.cost_usd(),
        reason: gw.reason(),
        notices: gw.notices(),
    };
    gw.stop();
    end
}

/// Steps in the stream and not one model call through the gateway, on the final counts: the
/// CLI reached its model some other way, so nothing could wrap it up. This overrides any other
/// ending (a run that ended too soon for the watchdog to look included): its budgets were not
/// kept by the gateway the user asked for.
fn judge_bypass(engine: &mut Engine<'_>, gw: &Gateway) {
    let steps = engine.steps();
    let calls = gw.forwarded().saturating_add(gw.refused());
    let control = &mut engine.control;
    if engine.counts_requests
        || steps == 0
        || calls > 0
        || control.terminated_by == Some(TerminatedBy::Bypassed)
    {
        return;
    }
    control.terminated_by = Some(TerminatedBy::Bypassed);
    control.why = Some(engine.dogs.bypassed(steps, ""));
}

/// Builds the report and lets the observers see it.
pub(crate) fn finish(
    labels: Labels,
    ending: Ending,
    observers: &mut [&mut dyn RunObserver],
) -> RunReport {
    let mut report = RunReport::new(&labels, ending);
    for o in observers.iter_mut() {
        o.finished(&mut report);
    }
    report
}
