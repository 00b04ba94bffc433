//! Staged budget notices: the model sees its budget coming.
//!
//! When a run has spent a threshold's share (by default 50%, 80% and 95%) of one of its limits
//! (steps, tokens, cost, a pool's share, the time before its timeout), the next main model call
//! that goes out as usual carries one ephemeral `system notice:` saying what is left, in that
//! limit's own words ("15 of 30 steps left", "$0.40 of $2.00 left", "about 4 minutes left").
//! Each threshold of each limit is told at most once: a call that crosses several at once tells
//! the highest, and the lower ones are passed. The notice rides like the loop notice (one user
//! text at the end of the conversation, no cache marker, [`crate::Dialect::add_notice`]), so it
//! is in that call only: the CLI never sends it back.

use std::time::{Duration, Instant};

use crate::{Budget, Pace, Tally};

/// The run's staged notices: at which shares of its limits they are given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Staged {
    /// The shares of a limit spent at which a notice is given, ascending, each in (0, 1);
    /// empty: no staged notices.
    pub thresholds: Vec<f64>,
    /// The run's timeout and when it began, for notices of the time left.
    pub deadline: Option<Deadline>,
}

/// When a run began and how long it may take (`--timeout`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deadline {
    /// When the run began.
    pub started: Instant,
    /// How long it may take.
    pub timeout: Duration,
}

/// Which limit a staged notice told of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoticeLimit {
    /// The step budget.
    Steps,
    /// The token budget.
    Tokens,
    /// The cost budget.
    Cost,
    /// The share of a pool (a budget shared with other runs).
    Pool,
    /// The time left before the timeout.
    Time,
}

impl NoticeLimit {
    const ALL: [NoticeLimit; 5] = [
        NoticeLimit::Steps,
        NoticeLimit::Tokens,
        NoticeLimit::Cost,
        NoticeLimit::Pool,
        NoticeLimit::Time,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// One staged notice the gateway sent.
#[derive(Clone, Debug, PartialEq)]
pub struct SentNotice {
    /// The limit it told of.
    pub limit: NoticeLimit,
    /// The threshold crossed (the highest, when one call crossed several).
    pub threshold: f64,
    /// The steps the run had taken when it went out.
    pub at_step: u64,
    /// The main model call that carried it (numbered from 1, as [`crate::GatewayEvent::Forwarded`]).
    pub model_call: u64,
    /// The notice's whole text, as the model got it.
    pub text: String,
}

/// What is left of the run's share of a pool, as the pool last answered a reservation.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolLeft {
    /// The pool.
    pub pool: String,
    /// The measure: [`Budget::Tokens`] (tokens) or [`Budget::Cost`] (dollars).
    pub budget: Budget,
    /// What is left, in the measure's unit.
    pub left: f64,
    /// The pool's cap, in the same unit.
    pub cap: f64,
}

/// How far one limit is spent, and its words for what is left.
struct Standing {
    limit: NoticeLimit,
    used: f64,
    words: String,
}

/// The thresholds of each limit already told (or passed), per [`NoticeLimit`].
#[derive(Debug, Default)]
pub(crate) struct Told {
    passed: [usize; 5],
    /// The notices sent, in order.
    pub(crate) sent: Vec<SentNotice>,
    /// The run's pool share as last reported.
    pub(crate) pool: Option<PoolLeft>,
}

impl Tally {
    /// The steps the run has taken, as the pace counts them for its budget.
    pub(crate) fn steps_spent(&self, pace: &Pace) -> u64 {
        if pace.count_requests {
            self.forwarded
        } else {
            pace.steps
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(self.forwarded.saturating_mul(pace.reply_cost))
        }
    }

    /// The staged notice call `call` carries, if it crosses a threshold not told yet; recorded.
    pub(crate) fn staged_notice(
        &mut self,
        pace: &Pace,
        staged: &Staged,
        at_step: u64,
        call: u64,
    ) -> Option<String> {
        if staged.thresholds.is_empty() {
            return None;
        }
        let mut crossed = Vec::new();
        for s in self.standings(pace, staged, at_step, Instant::now()) {
            let reached = staged.thresholds.iter().filter(|t| s.used >= **t).count();
            let passed = &mut self.told.passed[s.limit.index()];
            if reached > *passed {
                *passed = reached;
                crossed.push((s, staged.thresholds[reached - 1]));
            }
        }
        if crossed.is_empty() {
            return None;
        }
        let words: Vec<&str> = crossed.iter().map(|(s, _)| s.words.as_str()).collect();
        let text = format!(
            "system notice: {}. Plan the rest of the work to fit, and leave a status summary \
             (what was done, what is left) before it runs out.",
            words.join("; ")
        );
        for (s, threshold) in crossed {
            self.told.sent.push(SentNotice {
                limit: s.limit,
                threshold,
                at_step,
                model_call: call,
                text: text.clone(),
            });
        }
        Some(text)
    }

    /// Every limit the run has, how far it is spent and what is left, in [`NoticeLimit`] order.
    fn standings(&self, pace: &Pace, staged: &Staged, steps: u64, now: Instant) -> Vec<Standing> {
        let mut out = Vec::new();
        for limit in NoticeLimit::ALL {
            let standing = match limit {
                NoticeLimit::Steps => pace.limit.filter(|l| *l > 0).map(|l| Standing {
                    limit,
                    used: steps as f64 / l as f64,
                    words: format!("{} of {l} steps left", l.saturating_sub(steps)),
                }),
                NoticeLimit::Tokens => pace.max_tokens.filter(|m| *m > 0).map(|m| {
                    let spent = self.usage.total();
                    Standing {
                        limit,
                        used: spent as f64 / m as f64,
                        words: format!("{} of {m} tokens left", m.saturating_sub(spent)),
                    }
                }),
                NoticeLimit::Cost => match (pace.max_cost_usd, self.cost) {
                    (Some(m), Some(spent)) if m > 0.0 => Some(Standing {
                        limit,
                        used: spent / m,
                        words: format!("${:.2} of ${m:.2} left", (m - spent).max(0.0)),
                    }),
                    _ => None,
                },
                NoticeLimit::Pool => self.told.pool.as_ref().and_then(pool_standing),
                NoticeLimit::Time => staged.deadline.and_then(|d| time_standing(d, now)),
            };
            out.extend(standing);
        }
        out
    }
}

fn pool_standing(p: &PoolLeft) -> Option<Standing> {
    if p.cap <= 0.0 {
        return None;
    }
    let left = p.left.clamp(0.0, p.cap);
    let words = match p.budget {
        Budget::Cost => format!(
            "${left:.2} of ${:.2} left in the shared budget `{}`",
            p.cap, p.pool
        ),
        Budget::Tokens | Budget::Steps => format!(
            "{} of {} tokens left in the shared budget `{}`",
            left as u64, p.cap as u64, p.pool
        ),
    };
    Some(Standing {
        limit: NoticeLimit::Pool,
        used: 1.0 - left / p.cap,
        words,
    })
}

fn time_standing(d: Deadline, now: Instant) -> Option<Standing> {
    let total = d.timeout.as_secs_f64();
    if total <= 0.0 {
        return None;
    }
    let elapsed = now.saturating_duration_since(d.started);
    let left = d.timeout.saturating_sub(elapsed);
    Some(Standing {
        limit: NoticeLimit::Time,
        used: elapsed.as_secs_f64() / total,
        words: format!("about {} left", about(left)),
    })
}

/// A duration in round words: seconds under two minutes, minutes under three hours, hours.
pub(crate) fn about(left: Duration) -> String {
    let secs = left.as_secs_f64();
    let (n, unit) = if secs < 120.0 {
        (secs.round(), "second")
    } else if secs < 3.0 * 3600.0 {
        ((secs / 60.0).round(), "minute")
    } else {
        ((secs / 3600.0).round(), "hour")
    };
    let n = n as u64;
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn pace(limit: Option<u64>) -> Pace {
        Pace {
            limit,
            steps: Arc::default(),
            reply_cost: 1,
            count_requests: true,
            max_tokens: None,
            max_cost_usd: None,
            price: None,
        }
    }

    fn staged() -> Staged {
        Staged {
            thresholds: vec![0.5, 0.8, 0.95],
            deadline: None,
        }
    }

    /// The calls (numbered from 1) that carry a notice, over `calls` calls of a step budget.
    fn noticed_calls(limit: u64, calls: u64) -> Vec<(u64, String)> {
        let (pace, staged) = (pace(Some(limit)), staged());
        let mut t = Tally::default();
        let mut out = Vec::new();
        for call in 1..=calls {
            let spent = t.steps_spent(&pace);
            if let Some(text) = t.staged_notice(&pace, &staged, spent, call) {
                out.push((call, text));
            }
            t.forwarded += 1;
        }
        out
    }

    #[test]
    fn each_threshold_of_the_step_budget_is_told_once_in_its_own_words() {
        let got = noticed_calls(100, 99);
        let calls: Vec<u64> = got.iter().map(|(c, _)| *c).collect();
        assert_eq!(calls, [51, 81, 96]);
        assert!(got[0].1.starts_with("system notice: 50 of 100 steps left."));
        assert!(got[1].1.starts_with("system notice: 20 of 100 steps left."));
        assert!(got[2].1.starts_with("system notice: 5 of 100 steps left."));
    }

    #[test]
    fn a_jump_over_several_thresholds_tells_the_highest_only() {
        let (pace, staged) = (pace(Some(10)), staged());
        let mut t = Tally::default();
        let text = t.staged_notice(&pace, &staged, 9, 1).unwrap();
        assert!(text.contains("1 of 10 steps left"), "{text}");
        assert_eq!(t.told.sent.len(), 1);
        assert_eq!(t.told.sent[0].threshold, 0.8);
        assert_eq!(
            t.staged_notice(&pace, &staged, 9, 2),
            None,
            "never repeated"
        );
    }

    #[test]
    fn tokens_cost_and_time_speak_their_own_words_and_share_one_notice() {
        let mut p = pace(None);
        p.max_tokens = Some(1000);
        p.max_cost_usd = Some(2.0);
        let st = Staged {
            thresholds: vec![0.5],
            deadline: Some(Deadline {
                started: Instant::now() - Duration::from_secs(360),
                timeout: Duration::from_secs(600),
            }),
        };
        let mut t = Tally::default();
        t.usage.input = 700;
        t.cost = Some(1.6);
        let text = t.staged_notice(&p, &st, 3, 4).unwrap();
        assert!(
            text.starts_with(
                "system notice: 300 of 1000 tokens left; $0.40 of $2.00 left; about 4 minutes left."
            ),
            "{text}"
        );
        let limits: Vec<NoticeLimit> = t.told.sent.iter().map(|s| s.limit).collect();
        assert_eq!(
            limits,
            [NoticeLimit::Tokens, NoticeLimit::Cost, NoticeLimit::Time]
        );
        assert!(
            t.told
                .sent
                .iter()
                .all(|s| s.at_step == 3 && s.model_call == 4)
        );
    }

    #[test]
    fn a_pool_share_is_told_naming_the_pool() {
        let p = pace(None);
        let mut t = Tally::default();
        t.told.pool = Some(PoolLeft {
            pool: "team".into(),
            budget: Budget::Tokens,
            left: 150.0,
            cap: 1000.0,
        });
        let text = t.staged_notice(&p, &staged(), 0, 1).unwrap();
        assert!(
            text.contains("150 of 1000 tokens left in the shared budget `team`"),
            "{text}"
        );
        assert_eq!(t.told.sent[0].threshold, 0.8);
    }

    #[test]
    fn no_thresholds_or_no_limits_mean_no_notice() {
        let mut t = Tally::default();
        let off = Staged::default();
        assert_eq!(t.staged_notice(&pace(Some(2)), &off, 2, 1), None);
        assert_eq!(t.staged_notice(&pace(None), &staged(), 2, 1), None);
        assert!(t.told.sent.is_empty());
    }

    #[test]
    fn durations_read_in_round_words() {
        for (secs, words) in [
            (1, "1 second"),
            (45, "45 seconds"),
            (119, "119 seconds"),
            (240, "4 minutes"),
            (269, "4 minutes"),
            (3600, "60 minutes"),
            (4 * 3600, "4 hours"),
        ] {
            assert_eq!(about(Duration::from_secs(secs)), words);
        }
    }
}
