//! Loop detection: the agent that goes round without getting anywhere.
//!
//! The detector sees each tool call as its tool name and a fingerprint of the name and the
//! normalised arguments (computed by the provider plugin, protocol 1.3) and, when the plugin
//! reports them (protocol 1.6), each call's result as a fingerprint of its normalised output
//! and status. It reports the first loop:
//!
//! * **repeat**: one call `limit` times within the last `window` calls;
//! * **cycle**: the last `period × limit` calls repeat a sequence of `period` (2 to
//!   [`MAX_CYCLE`]) calls that are not all the same, `limit` times over (A, B, A, B, …);
//! * **no_progress** (results only): the same program (for shell tools; else the same tool)
//!   failing with the same error `limit` times within the last `window` calls, whatever the
//!   agent did in between and whatever its arguments.
//!
//! With results, a repeat or a cycle is judged by progress: a recurrence counts
//! only when nothing new happened since the call's last occurrence, that is it returned the same
//! result as then, and no call in between returned a result not seen before. Re-running the
//! tests after each edit, with fewer failures each time, is therefore no loop; re-running them
//! with the same failure is. Without results (older plugins, and until the first result of a
//! run is seen) the rule of identical calls applies: a recurrence always counts.
//!
//! Calls of exempt tools (`ignore_tools`: polling a test result is legitimate) are not seen at
//! all, so they neither count nor break up a cycle, and their results are no progress.

mod progress;

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
    /// The same call, `count` times within the window (with results: each time with the same
    /// result and nothing new in between).
    Repeat,
    /// A cycle of `period` calls, repeated `count` times in a row.
    Cycle {
        /// The cycle's length in calls.
        period: u32,
    },
    /// The same program (or tool) failing with the same error `count` times within the
    /// window, whatever the agent did in between and whatever the arguments.
    NoProgress,
}

/// A loop found in the calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LoopFound {
    /// The tool repeated, the cycle's tools joined with ` → ` (`read → edit`), or the program
    /// (or tool) failing without progress (`cargo`).
    pub tool: String,
    /// How many times it recurred.
    pub count: u32,
    /// Repeat or cycle.
    #[serde(flatten)]
    pub kind: LoopKind,
    /// The step in which the first of the counted calls was made.
    pub first_step: u64,
}

/// One tool call, as the detector is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The tool's name.
    pub tool: String,
    /// The fingerprint of the tool and its normalised arguments.
    pub fingerprint: String,
    /// For a shell tool, the program the command runs.
    pub program: Option<String>,
    /// The provider's id of the call, which its result names.
    pub id: Option<String>,
    /// The step in which the call was made.
    pub step: u64,
}

impl Call {
    /// A call of `tool` with arguments of `fingerprint`, made in `step`, without id or program.
    pub fn new(tool: &str, fingerprint: &str, step: u64) -> Self {
        Call {
            tool: tool.to_owned(),
            fingerprint: fingerprint.to_owned(),
            program: None,
            id: None,
            step,
        }
    }
}

/// The result of one tool call, as the detector is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The id of the call it answers.
    pub call_id: String,
    /// The fingerprint of its status and normalised output.
    pub fingerprint: String,
    /// Whether the call failed.
    pub failed: bool,
}

/// One call as the rule of identical calls remembers it.
#[derive(Clone, Debug)]
struct Seen {
    tool: String,
    fingerprint: String,
    step: u64,
}

/// Watches a run's tool calls (and their results) for loops.
#[derive(Clone, Debug)]
pub struct LoopDetector {
    settings: LoopSettings,
    /// The calls for the rule of identical calls.
    recent: VecDeque<Seen>,
    /// The calls and results for the rule of progress.
    progress: progress::Progress,
    /// Whether loops are judged by progress: from the first result on.
    by_progress: bool,
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
            progress: progress::Progress::default(),
            by_progress: false,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &LoopSettings {
        &self.settings
    }

    /// Sees one call of `tool` (made in step `step`) by the rule of identical calls; returns
    /// the loop it completes, if any.
    pub fn observe(&mut self, tool: &str, fingerprint: &str, step: u64) -> Option<LoopFound> {
        self.call(Call::new(tool, fingerprint, step))
    }

    /// Judges loops by progress from now on (the plugin reports results): a call no longer
    /// completes a loop, its result does. Done by the first [`LoopDetector::result`] anyway;
    /// call it first when results of calls seen at the same time are to follow.
    pub fn judge_by_progress(&mut self) {
        self.by_progress = true;
    }

    /// Sees one call; returns the loop it completes, if any (only by the rule of identical
    /// calls: by progress, the call's result completes a loop).
    pub fn call(&mut self, call: Call) -> Option<LoopFound> {
        if self.exempt(&call.tool) {
            self.progress.exempt(call);
            return None;
        }
        let keep = (self.settings.window as usize).max(MAX_CYCLE * self.settings.limit as usize);
        if self.by_progress {
            self.progress.call(call, keep);
            return None;
        }
        self.recent.push_back(Seen {
            tool: call.tool.clone(),
            fingerprint: call.fingerprint.clone(),
            step: call.step,
        });
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        self.progress.call(call, keep);
        self.repeat().or_else(|| self.cycle())
    }

    /// Sees one call's result; returns the loop it completes, if any, judged by progress.
    pub fn result(&mut self, outcome: &Outcome) -> Option<LoopFound> {
        self.by_progress = true;
        self.progress.result(outcome, &self.settings)
    }

    /// Forgets the calls seen so far (after a loop was acted on, to look for the next one);
    /// calls still waiting for their result are kept.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.progress.reset();
    }

    fn exempt(&self, tool: &str) -> bool {
        self.settings.ignore_tools.iter().any(|t| t == tool)
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
        let calls: Vec<(&str, &str, u64)> = self
            .recent
            .iter()
            .map(|s| (s.tool.as_str(), s.fingerprint.as_str(), s.step))
            .collect();
        find_cycle(&calls, self.settings.limit as usize, |a, b| a.1 == b.1)
    }
}

/// The cycle at the end of `calls` (tool, key, step), periods 2 to [`MAX_CYCLE`], `limit` times
/// over, calls compared by `same`.
fn find_cycle<T>(calls: &[T], limit: usize, same: impl Fn(&T, &T) -> bool) -> Option<LoopFound>
where
    T: CycleItem,
{
    (2..=MAX_CYCLE).find_map(|period| {
        let span = period * limit;
        if calls.len() < span {
            return None;
        }
        let tail = &calls[calls.len() - span..];
        let periodic = (period..span).all(|i| same(&tail[i], &tail[i - period]));
        let distinct = tail[..period].iter().any(|s| s.key() != tail[0].key());
        (periodic && distinct).then(|| LoopFound {
            tool: tail[..period]
                .iter()
                .map(|s| s.tool())
                .collect::<Vec<_>>()
                .join(" → "),
            count: u32::try_from(limit).unwrap_or(u32::MAX),
            kind: LoopKind::Cycle {
                period: u32::try_from(period).unwrap_or(u32::MAX),
            },
            first_step: tail[0].step(),
        })
    })
}

/// What a cycle is made of: a call with its tool, its key (the call's fingerprint) and step.
trait CycleItem {
    fn tool(&self) -> &str;
    fn key(&self) -> &str;
    fn step(&self) -> u64;
}

impl CycleItem for (&str, &str, u64) {
    fn tool(&self) -> &str {
        self.0
    }
    fn key(&self) -> &str {
        self.1
    }
    fn step(&self) -> u64 {
        self.2
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

    /// Feeds `script` by progress: `("call", tool, args, program)` and results
    /// `("result", call index, output, failed)` written as tuples of the helper below.
    enum Ev<'a> {
        /// A call: tool, arguments, program.
        C(&'a str, &'a str, Option<&'a str>),
        /// The result of the call before: output, failed.
        R(&'a str, bool),
    }

    /// Feeds calls and their results (each result answers the latest call), the n-th call in
    /// step n; returns the first loop.
    fn run(settings: LoopSettings, script: &[Ev]) -> Option<LoopFound> {
        let mut d = LoopDetector::new(settings);
        d.judge_by_progress();
        let mut n = 0;
        for ev in script {
            let found = match ev {
                Ev::C(tool, args, program) => {
                    n += 1;
                    d.call(Call {
                        program: program.map(str::to_owned),
                        id: Some(format!("c{n}")),
                        ..Call::new(tool, args, n)
                    })
                }
                Ev::R(output, failed) => d.result(&Outcome {
                    call_id: format!("c{n}"),
                    fingerprint: (*output).to_owned(),
                    failed: *failed,
                }),
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    use Ev::{C, R};

    #[test]
    fn tests_rerun_after_each_edit_with_new_results_are_no_loop() {
        // Five runs of the same test command within 20 calls: a loop by identical calls, not
        // by progress, since each run fails differently (fewer failures each time).
        let mut script = Vec::new();
        let outputs = [
            "5 failed", "4 failed", "3 failed", "2 failed", "1 failed", "ok",
        ];
        let edits = ["e1", "e2", "e3", "e4", "e5", "e6"];
        for (out, edit) in outputs.iter().zip(edits) {
            script.push(C("Edit", edit, None));
            script.push(R("edited", false));
            script.push(C("Bash", "cargo test", Some("cargo")));
            script.push(R(out, *out != "ok"));
        }
        assert_eq!(run(LoopSettings::with_limit(5), &script), None);
        // By identical calls it is one.
        let mut d = LoopDetector::new(LoopSettings::with_limit(5));
        let found = script.iter().enumerate().find_map(|(i, ev)| match ev {
            C(tool, args, _) => d.observe(tool, args, i as u64),
            R(..) => None,
        });
        assert_eq!(found.map(|f| f.kind), Some(LoopKind::Repeat));
    }

    #[test]
    fn the_same_result_with_nothing_new_in_between_is_a_repeat() {
        let mut script = vec![C("Read", "notes", None), R("notes text", false)];
        for _ in 0..5 {
            script.push(C("Bash", "cargo test", Some("cargo")));
            script.push(R("1 failed", true));
            script.push(C("Read", "notes", None));
            script.push(R("notes text", false));
        }
        let found = run(LoopSettings::with_limit(5), &script).unwrap();
        // Results repeat and nothing new comes after the first round: the fifth run of the
        // tests (call 10) completes the repeat, before the cycle Bash → Read (call 11).
        assert_eq!(found.kind, LoopKind::Repeat);
        assert_eq!(
            (found.tool.as_str(), found.count, found.first_step),
            ("Bash", 5, 2)
        );
    }

    #[test]
    fn a_new_result_in_between_breaks_a_repeat() {
        // Polling a build while it advances: the poll's result changes each time.
        let mut script = Vec::new();
        for pct in ["10%", "30%", "50%", "70%", "90%", "done"] {
            script.push(C("Bash", "sleep 30 && tail build.log", Some("sleep")));
            script.push(R(pct, false));
        }
        assert_eq!(run(LoopSettings::with_limit(3), &script), None);
        // The same poll with the same answer each time, though another call returns
        // something new each time: the poll's repeat is broken, but its result never changed.
        let mut script = Vec::new();
        for i in 0..6 {
            script.push(C("Bash", "cat status", Some("cat")));
            script.push(R("pending", false));
            script.push(C("Write", ["a", "b", "c", "d", "e", "f"][i], None));
            script.push(R(["1", "2", "3", "4", "5", "6"][i], false));
        }
        assert_eq!(run(LoopSettings::with_limit(3), &script), None);
    }

    #[test]
    fn the_same_program_failing_alike_under_other_arguments_is_no_progress() {
        let mut script = Vec::new();
        for (i, edit) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            script.push(C("Edit", edit, None));
            script.push(R(["x1", "x2", "x3", "x4", "x5"][i], false));
            script.push(C(
                "Bash",
                [
                    "cargo build",
                    "cargo build -q",
                    "cargo b",
                    "cargo build -j2",
                    "cargo build --all",
                ][i],
                Some("cargo"),
            ));
            script.push(R("error[E0425]: cannot find value `x`", true));
        }
        let found = run(LoopSettings::with_limit(5), &script).unwrap();
        assert_eq!(
            found,
            LoopFound {
                tool: "cargo".into(),
                count: 5,
                kind: LoopKind::NoProgress,
                first_step: 2
            }
        );
        // A success of the program in between, or another error, starts afresh.
        let mut script = Vec::new();
        let targets = ["a", "b", "c", "d", "e", "f", "g", "h"];
        for (out, target) in ["E1", "E1", "ok", "E1", "E1", "E2", "E1", "E1"]
            .iter()
            .zip(targets)
        {
            script.push(C("Bash", target, Some("make")));
            script.push(R(out, *out != "ok"));
        }
        assert_eq!(run(LoopSettings::with_limit(3), &script), None);
    }

    #[test]
    fn a_cycle_with_the_same_results_each_round_is_a_loop_by_progress() {
        let mut script = Vec::new();
        for _ in 0..3 {
            script.push(C("Edit", "x", None));
            script.push(R("old_string not found", true));
            script.push(C("Read", "f", None));
            script.push(R("text", false));
        }
        let found = run(
            LoopSettings {
                window: 4,
                ..LoopSettings::with_limit(3)
            },
            &script,
        )
        .unwrap();
        assert_eq!(found.kind, LoopKind::Cycle { period: 2 });
        assert_eq!(found.first_step, 1);
    }

    #[test]
    fn results_of_exempt_or_unknown_calls_do_not_count() {
        let settings = LoopSettings {
            ignore_tools: vec!["poll".into()],
            ..LoopSettings::with_limit(3)
        };
        let mut script = Vec::new();
        for i in 0..3 {
            script.push(C("Bash", "pytest", Some("pytest")));
            script.push(R("1 failed", true));
            // The exempt poll returns something new each time: no progress either.
            script.push(C("poll", ["1", "2", "3"][i], None));
            script.push(R(["p1", "p2", "p3"][i], false));
        }
        assert_eq!(
            run(settings, &script).map(|f| (f.kind, f.count)),
            Some((LoopKind::Repeat, 3))
        );
        // A result naming no known call is only news.
        let mut d = LoopDetector::new(LoopSettings::with_limit(2));
        let outcome = |id: &str| Outcome {
            call_id: id.into(),
            fingerprint: "same".into(),
            failed: true,
        };
        assert_eq!(d.result(&outcome("nobody")), None);
        assert_eq!(d.result(&outcome("nobody")), None);
    }

    #[test]
    fn a_loop_by_progress_is_found_alike_whatever_order_calls_and_results_cross_in() {
        // Live, calls and their results alternate; from one read of a recorded stream, a
        // chunk's calls all come before its results. The loop and its first step agree.
        let calls: Vec<Call> = (1..=7)
            .map(|n| Call {
                id: Some(format!("c{n}")),
                ..Call::new(
                    "Bash",
                    if n <= 2 {
                        ["a", "b"][n as usize - 1]
                    } else {
                        "x"
                    },
                    n,
                )
            })
            .collect();
        let outcome = |n: u64| Outcome {
            call_id: format!("c{n}"),
            fingerprint: if n <= 2 {
                format!("r{n}")
            } else {
                "same".into()
            },
            failed: false,
        };
        let mut live = LoopDetector::new(LoopSettings::with_limit(5));
        let mut found_live = None;
        for call in &calls {
            live.judge_by_progress();
            assert_eq!(live.call(call.clone()), None);
            found_live = found_live.or(live.result(&outcome(call.step)));
        }
        let mut chunked = LoopDetector::new(LoopSettings::with_limit(5));
        chunked.judge_by_progress();
        for call in &calls {
            assert_eq!(chunked.call(call.clone()), None);
        }
        let found_chunked = (1..=7).find_map(|n| chunked.result(&outcome(n)));
        assert_eq!(found_live, found_chunked);
        assert_eq!(found_live.map(|f| (f.count, f.first_step)), Some((5, 3)));
    }
}
