//! The engine's clocks: one check per watchdog (deadline, idle, startup, the provider's first
//! event, recognition, a plugin call that does not return, a gateway the agent goes around). Each check says what fired and
//! why; the engine decides what that does to the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stepguard_core::verdict::TerminatedBy;

use crate::event::StreamWatch;

/// A watchdog that fired.
pub(crate) enum Alarm {
    /// `--timeout`.
    Timeout,
    /// The agent stalled (`stalled`, `startup_hang`): stop it unless someone did, with this
    /// message unless the record has one.
    Stall(TerminatedBy, String),
    /// Output keeps coming and none of it is the provider's (stop or warn, as the spec says).
    Unrecognised(String),
    /// A plugin call did not return: stop, and the record says so.
    PluginHung(String),
    /// Steps and no model call through the gateway: stop unless someone did, saying so.
    Bypassed(String),
}

/// What the checks need to know of the run at the moment they look.
pub(crate) struct Moment {
    /// When the checks run.
    pub now: Instant,
    /// Whether the agent is paused at the limit (its silence is ours, not a stall).
    pub asking: bool,
    /// Steps the reader has counted.
    pub steps: u64,
    /// Model calls through the gateway (forwarded or refused), when the run has one that
    /// must see the calls.
    pub gateway_calls: Option<u64>,
}

/// The run's clocks and what they have already said.
pub(crate) struct Watchdogs {
    /// The run's start: the clock the shared watch is read against.
    start: Instant,
    /// `--timeout`.
    pub deadline: Option<Instant>,
    idle: Option<Duration>,
    startup: Option<Duration>,
    first_event: Duration,
    recognition_after: Duration,
    plugin_timeout: Duration,
    provider: String,
    expects: String,
    /// Whether an unrecognised stream was judged (it is judged once).
    pub unrecognised_told: bool,
    /// Whether a plugin call was abandoned.
    abandoned: bool,
}

/// The settings of the watchdogs.
pub(crate) struct Clocks {
    pub timeout: Option<Duration>,
    pub idle: Option<Duration>,
    pub startup: Option<Duration>,
    pub first_event: Duration,
    pub recognition_after: Duration,
    pub plugin_timeout: Duration,
    pub provider: String,
    pub expects: String,
}

impl Watchdogs {
    /// Watchdogs for a run that started at `start`.
    pub fn new(start: Instant, clocks: Clocks) -> Self {
        Watchdogs {
            start,
            deadline: clocks.timeout.and_then(|t| start.checked_add(t)),
            idle: clocks.idle,
            startup: clocks.startup,
            first_event: clocks.first_event,
            recognition_after: clocks.recognition_after,
            plugin_timeout: clocks.plugin_timeout,
            provider: clocks.provider,
            expects: clocks.expects,
            unrecognised_told: false,
            abandoned: false,
        }
    }

    /// Every watchdog but the deadline, in the order they win.
    pub fn check(
        &mut self,
        at: &Moment,
        watch: &StreamWatch,
        feeding_since: &AtomicU64,
    ) -> Vec<Alarm> {
        let elapsed_ms = ms(at.now.saturating_duration_since(self.start));
        [
            self.check_idle(at, watch, elapsed_ms),
            self.check_startup(watch, elapsed_ms),
            self.check_first_event(watch, elapsed_ms),
            self.check_recognition(watch, elapsed_ms),
            self.check_plugin(feeding_since, elapsed_ms),
            self.check_bypass(at),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// `--timeout`.
    pub fn check_deadline(&self, now: Instant) -> Option<Alarm> {
        self.deadline
            .is_some_and(|d| now >= d)
            .then_some(Alarm::Timeout)
    }

    /// Stalls: nothing at all on stdout for the idle timeout.
    fn check_idle(&self, at: &Moment, watch: &StreamWatch, elapsed_ms: u64) -> Option<Alarm> {
        let idle = self.idle.filter(|_| !at.asking)?;
        let last = watch.last_output.load(Ordering::Relaxed).saturating_sub(1);
        (elapsed_ms.saturating_sub(last) >= ms(idle)).then(|| {
            Alarm::Stall(
                TerminatedBy::Idle,
                format!(
                    "no output from the agent for {}; stopped",
                    humantime::format_duration(idle)
                ),
            )
        })
    }

    /// Nothing recognised for the startup timeout.
    fn check_startup(&self, watch: &StreamWatch, elapsed_ms: u64) -> Option<Alarm> {
        let startup = self.startup?;
        if watch.recognised.load(Ordering::Relaxed) || elapsed_ms < ms(startup) {
            return None;
        }
        let what = if self.provider.is_empty() {
            "recognised".to_owned()
        } else {
            format!("recognised {}", self.provider)
        };
        Some(Alarm::Stall(
            TerminatedBy::Startup,
            format!(
                "no {what} event from the agent within {} of the start; stopped",
                humantime::format_duration(startup)
            ),
        ))
    }

    /// No recognised event within the time the provider's CLI takes to print its first one,
    /// output or not (silence is no stream: a CLI in a text mode prints nothing until it
    /// ends): judged once, like an unrecognised stream.
    fn check_first_event(&mut self, watch: &StreamWatch, elapsed_ms: u64) -> Option<Alarm> {
        if self.unrecognised_told
            || watch.recognised.load(Ordering::Relaxed)
            || elapsed_ms < ms(self.first_event)
        {
            return None;
        }
        self.unrecognised_told = true;
        let seen = if watch.first_output.load(Ordering::Relaxed) == 0 {
            "nothing on stdout"
        } else {
            "output, none of it an event of its"
        };
        Some(Alarm::Unrecognised(format!(
            "no {provider} event within {within} of the start ({seen}), and the {provider} CLI \
             prints its first event within that: a CLI that prints no stream (a text mode, a \
             forgotten `--json` or `--output-format`, a wrapper that swallows it) cannot be \
             counted; stopped. Expected {expected}. Check the agent's command and `--provider` \
             (`--unrecognized warn` lets it run uncounted)",
            provider = self.provider,
            within = humantime::format_duration(self.first_event),
            expected = self.expected(),
        )))
    }

    /// Output keeps coming and none of it is the provider's: judged once.
    fn check_recognition(&mut self, watch: &StreamWatch, elapsed_ms: u64) -> Option<Alarm> {
        let first = watch.first_output.load(Ordering::Relaxed);
        if self.unrecognised_told
            || first == 0
            || watch.recognised.load(Ordering::Relaxed)
            || elapsed_ms < first + ms(self.recognition_after)
        {
            return None;
        }
        self.unrecognised_told = true;
        Some(Alarm::Unrecognised(unrecognised(
            &self.provider,
            &self.expects,
            0,
            Some(self.recognition_after),
        )))
    }

    /// A plugin call that does not return is abandoned: fail closed.
    fn check_plugin(&mut self, feeding_since: &AtomicU64, elapsed_ms: u64) -> Option<Alarm> {
        let since = feeding_since.load(Ordering::Relaxed);
        if since == 0 || self.abandoned || elapsed_ms <= since + ms(self.plugin_timeout) {
            return None;
        }
        let why = format!(
            "the provider plugin did not return from a call within {}; abandoned it",
            humantime::format_duration(self.plugin_timeout)
        );
        tracing::error!("{why}");
        self.abandoned = true;
        Some(Alarm::PluginHung(why))
    }

    /// Steps in the stream and not one model call through the gateway: the CLI reaches its
    /// model some other way, so nothing can wrap it up.
    fn check_bypass(&self, at: &Moment) -> Option<Alarm> {
        if at.steps < 2 || at.gateway_calls != Some(0) {
            return None;
        }
        Some(Alarm::Bypassed(self.bypassed(at.steps, "; stopped")))
    }

    /// Says that `steps` steps came with no model call through the gateway, and `then` what
    /// stepguard did about it (`; stopped`, or nothing when the agent had ended).
    pub fn bypassed(&self, steps: u64, then: &str) -> String {
        let steps = if steps == 1 {
            "1 step".to_owned()
        } else {
            format!("{steps} steps")
        };
        format!(
            "{steps} and no model call through the model gateway: the {} CLI takes its model \
             URL from somewhere stepguard did not set (a config file?), so nothing could wrap it \
             up{then}. Give the model URL on the command line or in the environment, or run \
             without --wrap-up",
            self.provider
        )
    }

    /// The reader saw `lines` lines and none was the provider's: judged once.
    pub fn unrecognised_lines(&mut self, lines: u64) -> Option<String> {
        (!self.unrecognised_told).then(|| {
            self.unrecognised_told = true;
            unrecognised(&self.provider, &self.expects, lines, None)
        })
    }

    /// The agent exited 0 having printed nothing on stdout, and nothing was said.
    pub fn silent_at_end(&self) -> Option<String> {
        (!self.unrecognised_told).then(|| {
            format!(
                "the agent printed nothing on stdout and exited 0: there was no {} stream to \
                 count, so the run is not a success; expected {}. Check the agent's command (a \
                 missing stream file, a CLI that crashed quietly, output sent elsewhere)",
                self.provider,
                self.expected()
            )
        })
    }

    /// What the provider's stream looks like, for messages.
    fn expected(&self) -> String {
        expected(&self.provider, &self.expects)
    }

    /// The stream ended before the window closed, none of it recognised, and nothing was said.
    pub fn unrecognised_at_end(&self, lines: u64) -> Option<String> {
        (!self.unrecognised_told).then(|| unrecognised(&self.provider, &self.expects, lines, None))
    }
}

/// Whole milliseconds, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
    let expected = expected(provider, expects);
    format!(
        "none of the agent's {seen} was recognised as a {provider} stream, so no step could be counted; expected {expected}. Check the agent's command (a missing `--json` or `--output-format`?) and `--provider`"
    )
}

/// What the provider's stream looks like: its manifest's `expects`, else a plain description.
fn expected(provider: &str, expects: &str) -> String {
    if expects.is_empty() {
        format!("the {provider} plugin's event stream")
    } else {
        expects.to_owned()
    }
}
