//! Plan-and-execute loops: a planner proposes steps (`code`, `conclude`, `nop`), an executor runs
//! them, and a hard limit bounds the steps executed.
//!
//! Rules: the 0-based index of the next step is checked as `index >= max_steps` before it runs;
//! a `code` step may be retried (default 3 retries) without consuming extra steps; re-planning
//! never resets the counter; `conclude` and `nop` end the loop; early exits (an answer before any
//! step, the goal reached) are recorded with the step count; at the limit, a human-in-the-loop
//! callback may supply a final `conclude` step, which ends the loop and is reported as such.

use serde::{Deserialize, Serialize};

/// The kinds of planned steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStepKind {
    /// Run code (may fail and be retried).
    Code,
    /// Give the final answer; ends the loop.
    Conclude,
    /// Nothing to do; ends the loop.
    Nop,
}

/// One planned step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    /// Its kind.
    pub kind: PlanStepKind,
    /// What it does, for the transcript.
    #[serde(default)]
    pub description: String,
}

/// What the planner says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The task is answered before any step runs.
    Answer(String),
    /// Steps to run, in order.
    Steps(Vec<PlanStep>),
}

/// What running one attempt of a step gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepResult {
    /// It worked.
    Done,
    /// It worked and the goal is reached: end early.
    GoalReached,
    /// It failed (a `code` step may be retried).
    Failed,
}

/// How the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanEnd {
    /// Answered before any step.
    AnsweredEarly,
    /// A step reached the goal.
    GoalReached,
    /// A `conclude` step ran.
    Concluded,
    /// A `nop` step ran.
    Nop,
    /// The limit was reached and a human supplied the final `conclude` step.
    ConcludedByHuman,
    /// The limit was reached.
    LimitReached,
    /// The planner had nothing more to propose.
    PlanExhausted,
}

/// One executed step, for the transcript.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecutedStep {
    /// 0-based step index.
    pub index: u32,
    /// Kind.
    pub kind: PlanStepKind,
    /// Attempts it took (1 + retries).
    pub attempts: u32,
    /// Whether it succeeded.
    pub ok: bool,
    /// True when a human supplied it at the limit.
    pub from_human: bool,
}

/// The loop's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanOutcome {
    /// How it ended.
    pub end: PlanEnd,
    /// Steps executed (each counted once, whatever its retries).
    pub steps: u32,
    /// Plans made (1 + re-plans).
    pub plans: u32,
    /// Every executed step.
    pub executed: Vec<ExecutedStep>,
}

/// Limits of a plan-and-execute loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Hard limit on executed steps.
    pub max_steps: u32,
    /// Retries of a failing `code` step (default 3).
    pub code_retries: u32,
    /// Plans allowed (the first and re-plans), so a planner cannot loop for ever.
    pub max_plans: u32,
}

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            max_steps: 10,
            code_retries: 3,
            max_plans: 10,
        }
    }
}

/// Runs the loop. `plan(executed_so_far)` proposes steps (it is called again after a `code` step
/// fails all its attempts); `run(step, index, attempt)` runs one attempt; `human(index)` is asked
/// at the limit and may return a final `conclude` step.
pub fn run_plan(
    limits: PlanLimits,
    plan: &mut dyn FnMut(u32) -> Plan,
    run: &mut dyn FnMut(&PlanStep, u32, u32) -> StepResult,
    human: &mut dyn FnMut(u32) -> Option<PlanStep>,
) -> PlanOutcome {
    let mut out = PlanOutcome {
        end: PlanEnd::PlanExhausted,
        steps: 0,
        plans: 0,
        executed: Vec::new(),
    };
    'planning: while out.plans < limits.max_plans {
        out.plans += 1;
        let steps = match plan(out.steps) {
            Plan::Answer(_) if out.steps == 0 => {
                out.end = PlanEnd::AnsweredEarly;
                return out;
            }
            Plan::Answer(_) => {
                out.end = PlanEnd::Concluded;
                return out;
            }
            Plan::Steps(steps) => steps,
        };
        if steps.is_empty() {
            break;
        }
        for step in steps {
            let index = out.steps;
            if index >= limits.max_steps {
                match human(index) {
                    Some(s) if s.kind == PlanStepKind::Conclude => {
                        run(&s, index, 1);
                        out.steps += 1;
                        out.executed.push(ExecutedStep {
                            index,
                            kind: s.kind,
                            attempts: 1,
                            ok: true,
                            from_human: true,
                        });
                        out.end = PlanEnd::ConcludedByHuman;
                    }
                    _ => out.end = PlanEnd::LimitReached,
                }
                tracing::info!(limit = limits.max_steps, end = ?out.end, "plan step limit reached");
                return out;
            }
            let tries = if step.kind == PlanStepKind::Code {
                1 + limits.code_retries
            } else {
                1
            };
            let mut result = StepResult::Failed;
            let mut attempts = 0;
            while attempts < tries {
                attempts += 1;
                result = run(&step, index, attempts);
                if result != StepResult::Failed {
                    break;
                }
            }
            out.steps += 1;
            out.executed.push(ExecutedStep {
                index,
                kind: step.kind,
                attempts,
                ok: result != StepResult::Failed,
                from_human: false,
            });
            match (step.kind, result) {
                (_, StepResult::GoalReached) => {
                    out.end = PlanEnd::GoalReached;
                    return out;
                }
                (PlanStepKind::Conclude, _) => {
                    out.end = PlanEnd::Concluded;
                    return out;
                }
                (PlanStepKind::Nop, _) => {
                    out.end = PlanEnd::Nop;
                    return out;
                }
                (PlanStepKind::Code, StepResult::Failed) => continue 'planning,
                (PlanStepKind::Code, StepResult::Done) => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: PlanStepKind) -> PlanStep {
        PlanStep {
            kind,
            description: String::new(),
        }
    }

    #[test]
    fn retries_do_not_consume_steps_and_replans_do_not_reset_the_counter() {
        let mut plans = vec![
            Plan::Steps(vec![step(PlanStepKind::Code), step(PlanStepKind::Code)]),
            Plan::Steps(vec![step(PlanStepKind::Code), step(PlanStepKind::Conclude)]),
        ]
        .into_iter();
        let mut seen_indices = Vec::new();
        let out = run_plan(
            PlanLimits {
                max_steps: 10,
                ..PlanLimits::default()
            },
            &mut |_| plans.next().unwrap_or(Plan::Steps(vec![])),
            &mut |_, index, attempt| {
                seen_indices.push((index, attempt));
                // Step 1 fails all 4 attempts; everything else works at once.
                if index == 1 {
                    StepResult::Failed
                } else {
                    StepResult::Done
                }
            },
            &mut |_| None,
        );
        assert_eq!(out.end, PlanEnd::Concluded);
        assert_eq!((out.steps, out.plans), (4, 2));
        assert_eq!(
            seen_indices,
            [(0, 1), (1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (3, 1)]
        );
    }

    #[test]
    fn the_limit_is_checked_as_index_ge_max_and_a_human_may_conclude() {
        let out = run_plan(
            PlanLimits {
                max_steps: 2,
                ..PlanLimits::default()
            },
            &mut |_| Plan::Steps(vec![step(PlanStepKind::Code); 5]),
            &mut |_, _, _| StepResult::Done,
            &mut |index| {
                assert_eq!(index, 2);
                Some(step(PlanStepKind::Conclude))
            },
        );
        assert_eq!((out.end, out.steps), (PlanEnd::ConcludedByHuman, 3));
        assert!(out.executed[2].from_human);
        let out = run_plan(
            PlanLimits {
                max_steps: 2,
                ..PlanLimits::default()
            },
            &mut |_| Plan::Steps(vec![step(PlanStepKind::Code); 5]),
            &mut |_, _, _| StepResult::Done,
            &mut |_| None,
        );
        assert_eq!((out.end, out.steps), (PlanEnd::LimitReached, 2));
    }

    #[test]
    fn early_exits_are_recorded_with_the_step_count() {
        let out = run_plan(
            PlanLimits::default(),
            &mut |_| Plan::Answer("42".into()),
            &mut |_, _, _| StepResult::Done,
            &mut |_| None,
        );
        assert_eq!((out.end, out.steps), (PlanEnd::AnsweredEarly, 0));
        let out = run_plan(
            PlanLimits::default(),
            &mut |_| Plan::Steps(vec![step(PlanStepKind::Code); 3]),
            &mut |_, index, _| {
                if index == 1 {
                    StepResult::GoalReached
                } else {
                    StepResult::Done
                }
            },
            &mut |_| None,
        );
        assert_eq!((out.end, out.steps), (PlanEnd::GoalReached, 2));
        let out = run_plan(
            PlanLimits::default(),
            &mut |_| Plan::Steps(vec![step(PlanStepKind::Nop)]),
            &mut |_, _, _| StepResult::Done,
            &mut |_| None,
        );
        assert_eq!((out.end, out.steps), (PlanEnd::Nop, 1));
    }
}
