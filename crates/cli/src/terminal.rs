//! The terminal side of `stepguard run`: the live status line, the agent's passthrough that
//! keeps clear of it, and the prompt at the limit (`--on-limit ask`).
//!
//! The status line is drawn by a thread of its own: a progress tick (on the engine's thread)
//! only leaves the latest progress for it, so a paused terminal never holds up the engine.

use std::io::{self, IsTerminal as _, Write as _};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use stepguard_core::budget;
use stepguard_runner::{
    Breach, LimitDecision, LimitPolicy, Progress, Question, RunObserver, RunReport,
};

/// How long the end of a run waits for the status line to be erased before the summary.
const ERASE_WAIT: Duration = Duration::from_millis(200);

/// The live status line on stderr (drawn only when stderr is a terminal).
#[derive(Clone)]
pub(crate) struct StatusLine {
    enabled: bool,
    label: String,
    state: Arc<Mutex<LineState>>,
    /// The drawing thread's mailbox: the latest progress, or the end.
    mailbox: Arc<Mailbox>,
}

/// What the engine leaves for the drawing thread; never locked across a write.
#[derive(Default)]
struct Mailbox {
    slot: Mutex<Slot>,
    posted: Condvar,
}

#[derive(Default)]
struct Slot {
    latest: Option<Progress>,
    ended: bool,
    /// Told when the drawing thread has erased the line and ended.
    erased: Option<mpsc::Sender<()>>,
}

/// What is on the status line's terminal row right now.
#[derive(Default)]
struct LineState {
    /// True while a status line is drawn (it must be cleared before anything else is written).
    drawn: bool,
    /// True while the agent's stderr has written part of a line: drawing would overwrite it.
    agent_mid_line: bool,
    /// True while the prompt at the limit is up: it owns the terminal.
    asking: bool,
}

impl StatusLine {
    /// Creates the status line for `provider (unit)`; `wanted` is false under `--quiet`.
    pub(crate) fn new(wanted: bool, provider: &str, unit: &str) -> Self {
        let mut line = StatusLine {
            enabled: wanted && io::stderr().is_terminal(),
            label: format!("{provider} ({unit})"),
            state: Arc::default(),
            mailbox: Arc::default(),
        };
        if line.enabled {
            let drawer = line.clone();
            let spawned = std::thread::Builder::new()
                .name("stepguard-status".into())
                .spawn(move || drawer.draw_until_the_end());
            // No thread, no line: drawing on the engine's thread could block it.
            line.enabled = spawned.is_ok();
        }
        line
    }

    /// The drawing thread: draws the latest progress until the run ends, then erases the line.
    fn draw_until_the_end(&self) {
        loop {
            let (progress, erased) = {
                let mut slot = self.mailbox.slot.lock().unwrap_or_else(|p| p.into_inner());
                while slot.latest.is_none() && !slot.ended {
                    slot = self
                        .mailbox
                        .posted
                        .wait(slot)
                        .unwrap_or_else(|p| p.into_inner());
                }
                (slot.latest.take(), slot.ended.then(|| slot.erased.take()))
            };
            if let Some(erased) = erased {
                self.clear();
                if let Some(tx) = erased {
                    let _ = tx.send(());
                }
                return;
            }
            if let Some(p) = progress {
                self.draw(&p);
            }
        }
    }

    /// Draws one progress line, unless the agent's stderr is mid-line or the prompt is up.
    fn draw(&self, p: &Progress) {
        let mut state = self.state();
        if state.agent_mid_line || state.asking {
            return;
        }
        let _ = write!(
            io::stderr(),
            "\r\x1b[2Kstepguard: {}/{} steps | {} | {}",
            p.steps,
            p.limit,
            self.label,
            stepguard_core::stats::format_duration_ms(p.elapsed.as_millis() as u64)
        );
        state.drawn = true;
    }

    /// Ends the drawing thread and waits, at most [`ERASE_WAIT`], for the line to be erased.
    fn end(&self) -> Option<Receiver<()>> {
        let (tx, rx) = mpsc::channel();
        let mut slot = self.mailbox.slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.ended {
            return None;
        }
        slot.ended = true;
        slot.erased = Some(tx);
        drop(slot);
        self.mailbox.posted.notify_one();
        Some(rx)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LineState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Erases the line if it is drawn.
    pub(crate) fn clear(&self) {
        erase(&mut self.state());
    }

    /// Returns where the agent's output goes: stdout, clearing the status line first when both
    /// are the same terminal.
    pub(crate) fn passthrough(&self) -> Box<dyn io::Write + Send> {
        if self.enabled && io::stdout().is_terminal() {
            Box::new(ClearingStdout(self.clone()))
        } else {
            Box::new(io::stdout())
        }
    }

    /// Returns where the agent's stderr goes while the line is drawn: through stepguard, which
    /// clears the line before each write; `None` (inherited) when no line is drawn.
    pub(crate) fn agent_stderr(&self) -> Option<Box<dyn io::Write + Send>> {
        self.enabled
            .then(|| Box::new(ClearingStderr(self.clone())) as Box<dyn io::Write + Send>)
    }
}

fn erase(state: &mut LineState) {
    if state.drawn {
        let _ = io::stderr().write_all(b"\r\x1b[2K");
        state.drawn = false;
    }
}

impl RunObserver for StatusLine {
    /// Leaves the progress for the drawing thread; never waits for the terminal.
    fn tick(&mut self, p: &Progress) {
        if !self.enabled {
            return;
        }
        let mut slot = self.mailbox.slot.lock().unwrap_or_else(|p| p.into_inner());
        slot.latest = Some(*p);
        drop(slot);
        self.mailbox.posted.notify_one();
    }

    /// Erases the line before the summary, waiting for the terminal at most [`ERASE_WAIT`]
    /// (and never past the run's exit bound).
    fn finished(&mut self, report: &mut RunReport) {
        if !self.enabled {
            return;
        }
        if let Some(erased) = self.end() {
            let left = report.exit_by.saturating_duration_since(Instant::now());
            let _ = erased.recv_timeout(left.min(ERASE_WAIT));
        }
    }
}

/// Stdout that erases the status line before each write.
struct ClearingStdout(StatusLine);

impl io::Write for ClearingStdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut state = self.0.state();
        erase(&mut state);
        io::stdout().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush()
    }
}

/// The agent's stderr, written to stepguard's after erasing the status line.
struct ClearingStderr(StatusLine);

impl io::Write for ClearingStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut state = self.0.state();
        erase(&mut state);
        io::stderr().write_all(buf)?;
        if let Some(last) = buf.last() {
            state.agent_mid_line = *last != b'\n';
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// Asks on the terminal at the limit: stop, allow N more steps, or continue without a limit.
pub(crate) struct AskOnTerminal {
    provider: String,
    status: StatusLine,
    /// The highest limit an answer may reach.
    ceiling: u32,
    /// Whether "continue without a limit" may be chosen (not under a policy ceiling).
    unlimited_ok: bool,
}

impl AskOnTerminal {
    /// Creates the prompt; it clears `status` before asking. `policy_ceiling` is the policy's
    /// `max_steps_ceiling`: no answer may raise the limit past it (or past the 100000 any
    /// budget is held to), nor lift it.
    pub(crate) fn new(provider: &str, status: StatusLine, policy_ceiling: Option<u32>) -> Self {
        AskOnTerminal {
            provider: provider.to_owned(),
            status,
            ceiling: policy_ceiling.unwrap_or(budget::MAX_STEPS_CEILING),
            unlimited_ok: policy_ceiling.is_none(),
        }
    }
}

impl LimitPolicy for AskOnTerminal {
    fn asks(&self) -> bool {
        true
    }

    fn decide(&mut self, breach: &Breach, question: &Question) -> LimitDecision {
        {
            let mut state = self.status.state();
            erase(&mut state);
            state.asking = true;
        }
        let decision = self.ask(breach, question);
        self.status.state().asking = false;
        decision
    }
}

impl AskOnTerminal {
    /// Asks until an answer is valid ([`ASK_TRIES`] tries, then stops saying why), the question
    /// is withdrawn or stdin ends. stderr is never held locked across the wait: the engine's
    /// thread writes to it too.
    fn ask(&self, breach: &Breach, question: &Question) -> LimitDecision {
        let Breach { step, limit } = *breach;
        let room = Room {
            more: self
                .ceiling
                .saturating_sub(limit.get().unwrap_or(self.ceiling)),
            ceiling: self.ceiling,
            unlimited_ok: self.unlimited_ok,
        };
        let within = question
            .deadline()
            .map(|d| {
                // Rounded up: a 5m limit reads "5m", not "4m 59s".
                let left = d.saturating_duration_since(Instant::now());
                let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                format!(
                    " Answer within {}.",
                    humantime::format_duration(Duration::from_secs(secs.max(1)))
                )
            })
            .unwrap_or_default();
        let mut err = io::stderr();
        let _ = writeln!(
            err,
            "stepguard: step budget reached: step {step} began, the budget is {limit} ({}). The agent is paused.{within}",
            self.provider
        );
        for _ in 0..ASK_TRIES {
            let _ = write!(err, "stepguard: {}? ", room.choices());
            let _ = err.flush();
            let Some(answer) = read_answer(question) else {
                // Withdrawn (a signal, the timeout) or the terminal closed: the run is stopped.
                let _ = writeln!(err);
                return LimitDecision::Stop;
            };
            match parse_answer(&answer, &room) {
                Ok(decision) => return decision,
                Err(hint) => {
                    let _ = writeln!(err, "stepguard: {hint}");
                }
            }
        }
        let _ = writeln!(
            err,
            "stepguard: no valid answer in {ASK_TRIES} tries; stopping the agent (as [s]top would)"
        );
        LimitDecision::Stop
    }
}

/// How many answers the prompt at the limit reads before it stops the run.
const ASK_TRIES: usize = 3;

/// How far an answer may raise the limit.
struct Room {
    /// The most steps that may be allowed beyond the current limit.
    more: u32,
    ceiling: u32,
    unlimited_ok: bool,
}

impl Room {
    fn choices(&self) -> String {
        let mut s = String::from("[s]top now");
        if self.more > 0 {
            s.push_str(&format!(", [a N] allow N more steps (1 to {})", self.more));
        }
        if self.unlimited_ok {
            s.push_str(", [c]ontinue without a limit");
        }
        s
    }
}

/// Reads one line of the answer from stdin, polling so that a withdrawn question (or the
/// terminal closing) ends the wait; `None` then.
fn read_answer(question: &Question) -> Option<String> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let stdin = io::stdin();
    let mut line = Vec::new();
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    loop {
        if question.withdrawn() {
            return None;
        }
        let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
        match poll(&mut fds, Some(&tick)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
        let mut buf = [0u8; 256];
        match rustix::io::read(&stdin, &mut buf) {
            Ok(0) => return None,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
            Err(_) => return None,
        }
        if line.contains(&b'\n') {
            return Some(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

/// Reads one answer at the prompt; the error is the hint to show when it is not one.
fn parse_answer(answer: &str, room: &Room) -> Result<LimitDecision, String> {
    let words: Vec<&str> = answer.split_whitespace().collect();
    let allow = |n: &str| -> Result<LimitDecision, String> {
        let range = if room.more == 0 {
            format!(
                "no more steps can be allowed: the budget is at the ceiling of {}",
                room.ceiling
            )
        } else {
            format!(
                "allow 1 to {} more steps (the ceiling is {})",
                room.more, room.ceiling
            )
        };
        match n.parse::<u64>() {
            Ok(n) if n >= 1 && n <= u64::from(room.more) => {
                Ok(LimitDecision::Allow(u32::try_from(n).unwrap_or(room.more)))
            }
            Ok(_) => Err(format!("`{n}` is out of range: {range}")),
            Err(_) => Err(format!("`{n}` is not a number: {range}")),
        }
    };
    match words.as_slice() {
        [] | ["s" | "stop"] => Ok(LimitDecision::Stop),
        ["c" | "continue"] if room.unlimited_ok => Ok(LimitDecision::Unlimited),
        ["c" | "continue"] => Err(format!(
            "the policy's ceiling of {} steps forbids going on without a limit",
            room.ceiling
        )),
        ["a" | "allow", n] => allow(n),
        [n] if n.parse::<i64>().is_ok() => allow(n),
        _ => Err(format!("answer {}", room.choices())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_at_the_prompt() {
        let room = Room {
            more: 99_990,
            ceiling: 100_000,
            unlimited_ok: true,
        };
        assert_eq!(parse_answer("\n", &room), Ok(LimitDecision::Stop));
        assert_eq!(parse_answer("s\n", &room), Ok(LimitDecision::Stop));
        assert_eq!(parse_answer("a 5\n", &room), Ok(LimitDecision::Allow(5)));
        assert_eq!(parse_answer("7", &room), Ok(LimitDecision::Allow(7)));
        assert_eq!(parse_answer("c", &room), Ok(LimitDecision::Unlimited));
        assert!(
            parse_answer("a 0", &room)
                .unwrap_err()
                .contains("1 to 99990")
        );
        assert!(
            parse_answer("a 999999", &room)
                .unwrap_err()
                .contains("`999999` is out of range")
        );
        assert!(parse_answer("maybe", &room).unwrap_err().contains("[s]top"));
    }

    #[test]
    fn a_policy_ceiling_bounds_the_answers() {
        let room = Room {
            more: 3,
            ceiling: 13,
            unlimited_ok: false,
        };
        assert_eq!(parse_answer("a 3", &room), Ok(LimitDecision::Allow(3)));
        assert!(parse_answer("a 4", &room).unwrap_err().contains("1 to 3"));
        assert!(
            parse_answer("c", &room)
                .unwrap_err()
                .contains("ceiling of 13")
        );
        assert!(!room.choices().contains("[c]"));
    }
}
