//! The rule of progress: a call's recurrence counts toward a loop only when nothing new happened
//! since its last occurrence, and a program failing the same way again and again is a loop
//! whatever happens in between (`no_progress`).
//!
//! Calls wait for their results by id; each result completes its call, and every judgement is
//! made when a result arrives, in the order results arrive. A result is *new* when its
//! fingerprint was not seen before in the run (since the last reset).

use std::collections::{HashSet, VecDeque};

use super::{Call, CycleItem, LoopFound, LoopKind, LoopSettings, Outcome, find_cycle};

/// Calls waiting for their result, at most: a plugin that never reports the results of some
/// calls does not make the detector grow without bound.
const MAX_PENDING: usize = 256;

/// A call with its result.
#[derive(Clone, Debug)]
struct Done {
    tool: String,
    fingerprint: String,
    /// The program (shell tools) or the tool: what `no_progress` compares.
    program: String,
    result: String,
    failed: bool,
    /// The result was not seen before.
    new: bool,
    step: u64,
}

impl CycleItem for Done {
    fn tool(&self) -> &str {
        &self.tool
    }
    fn key(&self) -> &str {
        &self.fingerprint
    }
    fn step(&self) -> u64 {
        self.step
    }
}

/// The state of the rule of progress.
#[derive(Clone, Debug, Default)]
pub(super) struct Progress {
    /// Calls waiting for their result, oldest first; `true` for exempt ones.
    pending: VecDeque<(Call, bool)>,
    /// Completed calls in the order their results came, the last `keep`.
    done: VecDeque<Done>,
    /// How many to keep in `done`.
    keep: usize,
    /// Every result fingerprint seen.
    seen: HashSet<String>,
}

impl Progress {
    /// A call of an exempt tool: its result is expected, and ignored.
    pub fn exempt(&mut self, call: Call) {
        self.wait_for(call, true);
    }

    /// A call, waiting for its result; `keep` completed calls are remembered.
    pub fn call(&mut self, call: Call, keep: usize) {
        self.keep = keep;
        self.wait_for(call, false);
    }

    fn wait_for(&mut self, call: Call, exempt: bool) {
        if call.id.is_none() {
            return;
        }
        self.pending.push_back((call, exempt));
        if self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
        }
    }

    /// Forgets the completed calls and the results seen; calls waiting stay.
    pub fn reset(&mut self) {
        self.done.clear();
        self.seen.clear();
    }

    /// A result: completes its call and returns the loop that completes, if any.
    pub fn result(&mut self, outcome: &Outcome, settings: &LoopSettings) -> Option<LoopFound> {
        let at = self
            .pending
            .iter()
            .position(|(c, _)| c.id.as_deref() == Some(outcome.call_id.as_str()));
        let Some((call, exempt)) = at.and_then(|i| self.pending.remove(i)) else {
            // A result of no known call: new output is still progress.
            if self.seen.insert(outcome.fingerprint.clone()) {
                self.push(Done {
                    tool: String::new(),
                    fingerprint: format!("\u{0}{}", outcome.call_id),
                    program: String::new(),
                    result: outcome.fingerprint.clone(),
                    failed: outcome.failed,
                    new: true,
                    step: 0,
                });
            }
            return None;
        };
        if exempt {
            return None;
        }
        let new = self.seen.insert(outcome.fingerprint.clone());
        self.push(Done {
            program: call.program.unwrap_or_else(|| call.tool.clone()),
            tool: call.tool,
            fingerprint: call.fingerprint,
            result: outcome.fingerprint.clone(),
            failed: outcome.failed,
            new,
            step: call.step,
        });
        self.repeat(settings)
            .or_else(|| self.cycle(settings))
            .or_else(|| self.no_progress(settings))
    }

    fn push(&mut self, done: Done) {
        self.done.push_back(done);
        while self.done.len() > self.keep.max(1) {
            self.done.pop_front();
        }
    }

    /// The completed calls within the window, oldest first.
    fn window(&self, settings: &LoopSettings) -> impl DoubleEndedIterator<Item = &Done> {
        let skip = self.done.len().saturating_sub(settings.window as usize);
        self.done.iter().skip(skip)
    }

    /// The last call, and its earlier occurrences back to the first after which something
    /// new happened or the result differed: `limit` of them are a repeat.
    fn repeat(&self, settings: &LoopSettings) -> Option<LoopFound> {
        let mut calls = self.window(settings).rev();
        let last = calls.next()?;
        let mut chain = vec![last];
        let mut new_between = false;
        for d in calls {
            if d.fingerprint == last.fingerprint {
                if d.result != last.result || new_between {
                    break;
                }
                chain.push(d);
            } else {
                new_between |= d.new;
            }
        }
        let limit = settings.limit as usize;
        (chain.len() >= limit).then(|| LoopFound {
            tool: last.tool.clone(),
            count: u32::try_from(chain.len()).unwrap_or(u32::MAX),
            kind: LoopKind::Repeat,
            first_step: chain[limit - 1].step,
        })
    }

    /// A cycle of calls, each with the same result each time round (so nothing new after the
    /// first round).
    fn cycle(&self, settings: &LoopSettings) -> Option<LoopFound> {
        let calls: Vec<Done> = self.done.iter().cloned().collect();
        let limit = settings.limit as usize;
        let found = find_cycle(&calls, limit, |a, b| {
            a.fingerprint == b.fingerprint && a.result == b.result
        })?;
        let LoopKind::Cycle { period } = found.kind else {
            return None;
        };
        let span = period as usize * limit;
        let later = &calls[calls.len() - span + period as usize..];
        later.iter().all(|d| !d.new).then_some(found)
    }

    /// The last call's program failing with the same result `limit` times within the window,
    /// with no success of it in between.
    fn no_progress(&self, settings: &LoopSettings) -> Option<LoopFound> {
        let last = self.done.back().filter(|d| d.failed)?;
        let mut same = Vec::new();
        for d in self
            .window(settings)
            .rev()
            .filter(|d| d.program == last.program)
        {
            if !d.failed || d.result != last.result {
                break;
            }
            same.push(d);
        }
        let limit = settings.limit as usize;
        (same.len() >= limit).then(|| LoopFound {
            tool: last.program.clone(),
            count: u32::try_from(same.len()).unwrap_or(u32::MAX),
            kind: LoopKind::NoProgress,
            first_step: same[limit - 1].step,
        })
    }
}
