//! The terminal side of `stepguard run`: the live status line, the agent's passthrough that
//! keeps clear of it, and the prompt at the limit (`--on-limit ask`).

use std::io::{self, IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex};

use stepguard_runner::{Breach, LimitDecision, LimitPolicy, Progress, RunObserver, RunReport};

/// The live status line on stderr (drawn only when stderr is a terminal).
#[derive(Clone)]
pub struct StatusLine {
    enabled: bool,
    label: String,
    /// True while a line is drawn (it must be cleared before the agent's output or a prompt).
    drawn: Arc<Mutex<bool>>,
}

impl StatusLine {
    /// Creates the status line for `provider (unit)`; `wanted` is false under `--quiet`.
    pub fn new(wanted: bool, provider: &str, unit: &str) -> Self {
        StatusLine {
            enabled: wanted && io::stderr().is_terminal(),
            label: format!("{provider} ({unit})"),
            drawn: Arc::new(Mutex::new(false)),
        }
    }

    /// Erases the line if it is drawn.
    pub fn clear(&self) {
        let mut drawn = self.drawn.lock().unwrap_or_else(|p| p.into_inner());
        if *drawn {
            let _ = io::stderr().write_all(b"\r\x1b[2K");
            *drawn = false;
        }
    }

    /// Returns where the agent's output goes: stdout, clearing the status line first when both
    /// are the same terminal.
    pub fn passthrough(&self) -> Box<dyn io::Write + Send> {
        if self.enabled && io::stdout().is_terminal() {
            Box::new(ClearingStdout(self.clone()))
        } else {
            Box::new(io::stdout())
        }
    }
}

impl RunObserver for StatusLine {
    fn tick(&mut self, p: &Progress) {
        if !self.enabled {
            return;
        }
        let mut drawn = self.drawn.lock().unwrap_or_else(|p| p.into_inner());
        let _ = write!(
            io::stderr(),
            "\r\x1b[2Kstepguard: {}/{} steps | {} | {}",
            p.steps,
            p.limit,
            self.label,
            stepguard_core::stats::format_duration_ms(p.elapsed.as_millis() as u64)
        );
        *drawn = true;
    }

    fn finished(&mut self, _report: &mut RunReport) {
        self.clear();
    }
}

/// Stdout that erases the status line before each write.
struct ClearingStdout(StatusLine);

impl io::Write for ClearingStdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.clear();
        io::stdout().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush()
    }
}

/// Asks on the terminal at the limit: stop, allow N more steps, or continue without a limit.
pub struct AskOnTerminal {
    provider: String,
    status: StatusLine,
}

impl AskOnTerminal {
    /// Creates the prompt; it clears `status` before asking.
    pub fn new(provider: &str, status: StatusLine) -> Self {
        AskOnTerminal {
            provider: provider.to_owned(),
            status,
        }
    }
}

impl LimitPolicy for AskOnTerminal {
    fn asks(&self) -> bool {
        true
    }

    fn decide(&mut self, breach: &Breach) -> LimitDecision {
        self.status.clear();
        let Breach { step, limit } = *breach;
        let mut err = io::stderr().lock();
        let _ = writeln!(
            err,
            "stepguard: step budget reached: step {step} began, the budget is {limit} ({}). The agent is paused.",
            self.provider
        );
        for _ in 0..3 {
            let _ = write!(
                err,
                "stepguard: [s]top now, [a N] allow N more steps, [c]ontinue without a limit? "
            );
            let _ = err.flush();
            let mut answer = String::new();
            match io::stdin().read_line(&mut answer) {
                Ok(0) | Err(_) => return LimitDecision::Stop,
                Ok(_) => {}
            }
            if let Some(decision) = parse_answer(&answer) {
                return decision;
            }
            let _ = writeln!(err, "stepguard: answer `s`, `a 5` (any number) or `c`.");
        }
        LimitDecision::Stop
    }
}

/// Reads one answer at the prompt; `None` when it is not one.
fn parse_answer(answer: &str) -> Option<LimitDecision> {
    let words: Vec<&str> = answer.split_whitespace().collect();
    match words.as_slice() {
        [] | ["s" | "stop"] => Some(LimitDecision::Stop),
        ["c" | "continue"] => Some(LimitDecision::Unlimited),
        ["a" | "allow", n] | [n] => n
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .map(LimitDecision::Allow),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_at_the_prompt() {
        assert_eq!(parse_answer("\n"), Some(LimitDecision::Stop));
        assert_eq!(parse_answer("s\n"), Some(LimitDecision::Stop));
        assert_eq!(parse_answer("a 5\n"), Some(LimitDecision::Allow(5)));
        assert_eq!(parse_answer("7"), Some(LimitDecision::Allow(7)));
        assert_eq!(parse_answer("c"), Some(LimitDecision::Unlimited));
        assert_eq!(parse_answer("a 0"), None);
        assert_eq!(parse_answer("maybe"), None);
    }
}
