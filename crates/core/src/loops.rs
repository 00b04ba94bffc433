//! Loop detection: the agent that calls the same tool with the same arguments again and again,
//! or goes round a short cycle of calls.
//!
//! The detector sees each tool call as its tool name and a fingerprint of the name and the
//! normalised arguments (computed by the provider plugin), and reports the first loop:
//!
//! * **repeat**: one fingerprint `limit` times within the last `window` calls;
//! * **cycle**: the last `period × limit` calls repeat a sequence of `period` (2 to
//!   [`MAX_CYCLE`]) calls that are not all the same, `limit` times over (A, B, A, B, …).
//!
//! Calls of exempt tools (`ignore_tools`: polling a test result is legitimate) are not seen at
//! all, so they neither count nor break up a cycle.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The longest cycle looked for.
pub const MAX_CYCLE: usize = 4;

/// The loop limit when no flag, environment variable, config file or profile sets one: the
/// same call (or cycle) this many times is a loop. The one place the default is decided.
pub const DEFAULT_LOOP_LIMIT: u32 = 5;

/// What counts as a loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopSettings {
    /// How many times a call (or a cycle) must recur: at least 2.
    pub limit: u32,
    /// How many of the latest calls a repeat is looked for in: at least `limit`.
    pub window: u32,
    /// Tools whose calls are not looked at (exact names).
    pub ignore_tools: Vec<String>,
}

impl LoopSettings {
    /// The default window: the last 20 calls.
    pub const DEFAULT_WINDOW: u32 = 20;

    /// Settings with `limit` and the default window (widened to at least `limit`).
    pub fn with_limit(limit: u32) -> Self {
        LoopSettings {
            limit: limit.max(2),
            window: Self::DEFAULT_WINDOW.max(limit),
            ignore_tools: Vec::new(),
        }
    }
}

/// The kind of loop found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LoopKind {
    /// The same call, `count` times within the window.
    Repeat,
    /// A cycle of `period` calls, repeated `count` times in a row.
    Cycle {
        /// The cycle's length in calls.
        period: u32,
    },
}

/// A loop found in the calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LoopFound {
    /// The tool repeated, or the cycle's tools joined with ` → ` (`read → edit`).
    pub tool: String,
    /// How many times it recurred.
    pub count: u32,
    /// Repeat or cycle.
    #[serde(flatten)]
    pub kind: LoopKind,
    /// The step in which the first of the counted calls was made.
    pub first_step: u64,
}

/// One call as the detector remembers it.
#[derive(Clone, Debug)]
struct Seen {
    tool: String,
    fingerprint: String,
    step: u64,
}

/// Watches a run's tool calls for loops.
#[derive(Clone, Debug)]
pub struct LoopDetector {
    settings: LoopSettings,
    recent: VecDeque<Seen>,
}

impl LoopDetector {
    /// A detector for `settings` (a limit below 2 is taken as 2, a window below the limit as
    /// the limit).
    pub fn new(mut settings: LoopSettings) -> Self {
        settings.limit = settings.limit.max(2);
        settings.window = settings.window.max(settings.limit);
        LoopDetector {
            settings,
            recent: VecDeque::new(),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &LoopSettings {
        &self.settings
    }

    /// Sees one call of `tool` (made in step `step`); returns the loop it completes, if any.
    pub fn observe(&mut self, tool: &str, fingerprint: &str, step: u64) -> Option<LoopFound> {
        if self.settings.ignore_tools.iter().any(|t| t == tool) {
            return None;
        }
        let keep = (self.settings.window as usize).max(MAX_CYCLE * self.settings.limit as usize);
        self.recent.push_back(Seen {
            tool: tool.to_owned(),
            fingerprint: fingerprint.to_owned(),
            step,
        });
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        self.repeat().or_else(|| self.cycle())
    }

    /// Forgets the calls seen so far (after a loop was acted on, to look for the next one).
    pub fn reset(&mut self) {
        self.recent.clear();
    }

    fn repeat(&self) -> Option<LoopFound> {
        let last = self.recent.back()?;
        let window = self.settings.window as usize;
        let skip = self.recent.len().saturating_sub(window);
        let same: Vec<&Seen> = self
            .recent
            .iter()
            .skip(skip)
            .filter(|s| s.fingerprint == last.fingerprint)
            .collect();
        let count = u32::try_from(same.len()).unwrap_or(u32::MAX);
        (count >= self.settings.limit).then(|| LoopFound {
            tool: last.tool.clone(),
            count,
            kind: LoopKind::Repeat,
            first_step: same[same.len() - self.settings.limit as usize].step,
        })
    }

    fn cycle(&self) -> Option<LoopFound> {
        let limit = self.settings.limit as usize;
        let calls: Vec<&Seen> = self.recent.iter().collect();
        (2..=MAX_CYCLE).find_map(|period| {
            let span = period * limit;
            if calls.len() < span {
                return None;
            }
            let tail = &calls[calls.len() - span..];
            let periodic =
                (period..span).all(|i| tail[i].fingerprint == tail[i - period].fingerprint);
            let distinct = tail[..period]
                .iter()
                .any(|s| s.fingerprint != tail[0].fingerprint);
            (periodic && distinct).then(|| LoopFound {
                tool: tail[..period]
                    .iter()
                    .map(|s| s.tool.as_str())
                    .collect::<Vec<_>>()
                    .join(" → "),
                count: self.settings.limit,
                kind: LoopKind::Cycle {
                    period: u32::try_from(period).unwrap_or(u32::MAX),
                },
                first_step: tail[0].step,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(d: &mut LoopDetector, calls: &[(&str, &str)]) -> Option<LoopFound> {
        let mut found = None;
        for (i, (tool, fp)) in calls.iter().enumerate() {
            found = d.observe(tool, fp, i as u64 + 1);
            if found.is_some() {
                break;
            }
        }
        found
    }

    #[test]
    fn the_same_call_limit_times_within_the_window_is_a_repeat() {
        let mut d = LoopDetector::new(LoopSettings::with_limit(3));
        let found = feed(
            &mut d,
            &[
                ("shell", "a"),
                ("read", "b"),
                ("shell", "a"),
                ("edit", "c"),
                ("shell", "a"),
            ],
        )
        .unwrap();
        assert_eq!(
            found,
            LoopFound {
                tool: "shell".into(),
                count: 3,
                kind: LoopKind::Repeat,
                first_step: 1
            }
        );
    }

    #[test]
    fn different_arguments_or_calls_outside_the_window_are_not_a_repeat() {
        let mut d = LoopDetector::new(LoopSettings {
            limit: 3,
            window: 4,
            ignore_tools: Vec::new(),
        });
        // `a` three times, but never three within any 4 consecutive calls.
        let calls = [
            ("shell", "a"),
            ("x", "1"),
            ("y", "2"),
            ("shell", "a"),
            ("z", "3"),
            ("w", "4"),
            ("shell", "a"),
            ("shell", "b"),
        ];
        assert_eq!(feed(&mut d, &calls), None);
    }

    #[test]
    fn a_short_cycle_repeated_limit_times_is_a_loop() {
        let mut d = LoopDetector::new(LoopSettings::with_limit(3));
        let calls = [
            ("read", "r"),
            ("edit", "e"),
            ("read", "r"),
            ("edit", "e"),
            ("read", "r"),
            ("edit", "e"),
        ];
        // The repeat rule would also fire at the 5th call (`r` three times in the window);
        // with a limit of 3 and period 2 the cycle needs 6 calls, so the repeat comes first.
        let found = feed(&mut d, &calls).unwrap();
        assert_eq!(found.kind, LoopKind::Repeat);
        let mut d = LoopDetector::new(LoopSettings {
            limit: 3,
            window: 4,
            ignore_tools: Vec::new(),
        });
        let found = feed(
            &mut d,
            &[
                ("a", "1"),
                ("b", "2"),
                ("c", "3"),
                ("a", "1"),
                ("b", "2"),
                ("c", "3"),
                ("a", "1"),
                ("b", "2"),
                ("c", "3"),
            ],
        )
        .unwrap();
        assert_eq!(found.kind, LoopKind::Cycle { period: 3 });
        assert_eq!((found.tool.as_str(), found.count), ("a → b → c", 3));
        assert_eq!(found.first_step, 1);
    }

    #[test]
    fn exempt_tools_are_not_seen() {
        let mut d = LoopDetector::new(LoopSettings {
            ignore_tools: vec!["read".into()],
            ..LoopSettings::with_limit(3)
        });
        let calls = [("read", "r"); 10];
        assert_eq!(feed(&mut d, &calls), None);
        // Nor do they break up a repeat of another tool.
        let found = feed(
            &mut d,
            &[
                ("shell", "s"),
                ("read", "r"),
                ("shell", "s"),
                ("read", "r"),
                ("shell", "s"),
            ],
        );
        assert_eq!(found.map(|f| f.tool), Some("shell".to_owned()));
    }

    #[test]
    fn a_limit_below_two_is_two() {
        let mut d = LoopDetector::new(LoopSettings {
            limit: 0,
            window: 0,
            ignore_tools: Vec::new(),
        });
        assert_eq!(d.settings().limit, 2);
        assert_eq!(d.observe("t", "f", 1), None);
        assert_eq!(d.observe("t", "f", 2).map(|f| f.count), Some(2));
    }
}
