//! The engine's decisions: the tree is stopped once, for the first reason that asks, and a
//! breach is either a stop or a question to the [`LimitPolicy`] on a thread of its own, whose
//! answer stops the run or resumes it under a new limit.

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use stepguard_core::StepLimit;
use stepguard_core::verdict::TerminatedBy;
use stepguard_supervisor::{StopReport, Tree};

use crate::event::{Event, Resume};
use crate::spec::{Breach, LimitDecision, LimitPolicy, OnUnrecognized, Question};

/// How the limit is kept: the policy, and whether it asks.
pub(crate) struct AtLimit {
    /// The policy; away while it is being asked (it comes back with its answer).
    pub policy: Box<dyn LimitPolicy>,
    /// How long a question may go unanswered.
    pub ask_timeout: Option<Duration>,
    /// Where the asking thread sends its answer.
    pub answers: Sender<Event>,
}

/// The engine's decisions so far.
pub(crate) struct Supervision<'t> {
    tree: &'t Tree,
    grace: Duration,
    /// The limit in force (a policy that asks may raise it).
    pub limit: StepLimit,
    /// Who stopped the run, once someone did.
    pub terminated_by: Option<TerminatedBy>,
    /// How the stop went.
    pub stop: Option<StopReport>,
    /// The step at which the budget was first exceeded.
    pub breached_at: Option<u64>,
    /// The policy's answers, in order.
    pub decisions: Vec<LimitDecision>,
    /// What the record's message says about how the run ended, when the engine knows best.
    pub why: Option<String>,
    /// The question at the limit, while it is open, and the step that raised it.
    asking: Option<(Question, u64)>,
    /// Tells the reader, which waits after a breach, how to go on.
    resume: Sender<Resume>,
    /// The policy while it is home (not being asked).
    policy: Option<Box<dyn LimitPolicy>>,
    asks: bool,
    ask_timeout: Option<Duration>,
    answers: Sender<Event>,
}

impl<'t> Supervision<'t> {
    /// Nothing decided yet: the run goes on under `limit`.
    pub fn new(
        tree: &'t Tree,
        grace: Duration,
        limit: StepLimit,
        at_limit: AtLimit,
        resume: Sender<Resume>,
    ) -> Self {
        Supervision {
            tree,
            grace,
            limit,
            terminated_by: None,
            stop: None,
            breached_at: None,
            decisions: Vec::new(),
            why: None,
            asking: None,
            resume,
            asks: at_limit.policy.asks(),
            policy: Some(at_limit.policy),
            ask_timeout: at_limit.ask_timeout,
            answers: at_limit.answers,
        }
    }

    /// Whether the policy asks (someone answers at the limit).
    pub fn asks(&self) -> bool {
        self.asks
    }

    /// Whether a question at the limit is open.
    pub fn is_asking(&self) -> bool {
        self.asking.is_some()
    }

    /// Whether the policy was sent to ask and has not come back (its thread may still be
    /// tidying the terminal).
    pub fn policy_away(&self) -> bool {
        self.policy.is_none()
    }

    /// When the open question stops being waited for, if it ever does.
    pub fn question_deadline(&self) -> Option<Instant> {
        self.asking.as_ref().and_then(|(q, _)| q.deadline())
    }

    /// The reader stopped right after the line of `step`, over the limit: stop, or ask.
    pub fn breach(&mut self, step: u64, now: Instant) {
        self.breached_at.get_or_insert(step);
        match self.policy.take() {
            Some(policy) if self.asks => self.ask(policy, step, now),
            policy => {
                self.policy = policy;
                self.decide(LimitDecision::Stop, step);
            }
        }
    }

    /// Pauses the tree and asks `policy` on a thread of its own.
    fn ask(&mut self, mut policy: Box<dyn LimitPolicy>, step: u64, now: Instant) {
        self.tree.pause(true);
        let question = Question::new(self.ask_timeout.and_then(|t| now.checked_add(t)));
        let breach = Breach {
            step,
            limit: self.limit,
        };
        let answers = self.answers.clone();
        let asked = question.clone();
        let spawned = std::thread::Builder::new()
            .name("stepguard-ask".into())
            .spawn(move || {
                let d = policy.decide(&breach, &asked);
                let _ = answers.send(Event::Decided(d, policy));
            });
        match spawned {
            Ok(_) => self.asking = Some((question, step)),
            Err(e) => {
                tracing::error!("cannot ask at the limit ({e}); stopping");
                self.decide(LimitDecision::Stop, step);
            }
        }
    }

    /// The policy answered (and is back); true when the question was still open, so the
    /// answer was carried out and the pause, which was ours, is over.
    pub fn answered(&mut self, decision: LimitDecision, policy: Box<dyn LimitPolicy>) -> bool {
        self.policy = Some(policy);
        match self.asking.take() {
            Some((question, step)) if !question.withdrawn() => {
                self.decisions.push(decision);
                self.decide(decision, step);
                true
            }
            _ => false,
        }
    }

    /// Stops the run when the open question has waited past its deadline.
    pub fn check_question(&mut self, now: Instant) {
        let Some((question, step)) = &self.asking else {
            return;
        };
        if question.deadline().is_none_or(|d| now < d) {
            return;
        }
        let step = *step;
        let waited = humantime::format_duration(self.ask_timeout.unwrap_or_default());
        self.why = Some(format!("no answer at the limit within {waited}; stopped"));
        tracing::info!("no answer at the limit within {waited}; stopping the agent");
        self.withdraw_question();
        self.decisions.push(LimitDecision::Stop);
        self.decide(LimitDecision::Stop, step);
    }

    /// Carries out the decision at the breach of `step`: stop, or raise the limit and resume.
    pub fn decide(&mut self, decision: LimitDecision, step: u64) {
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
    pub fn withdraw_question(&mut self) {
        if let Some((question, _)) = self.asking.take() {
            question.withdraw();
            let _ = self.resume.send(Resume::Stop);
        }
    }

    /// Acts on output none of which was recognised: stop, or warn.
    pub fn unrecognised(&mut self, on: OnUnrecognized, why: String) {
        match on {
            OnUnrecognized::Stop => {
                tracing::info!("{why}");
                self.why.get_or_insert(why);
                self.stop(TerminatedBy::Unrecognized, Signal::TERM);
            }
            OnUnrecognized::Warn => tracing::warn!("{why}"),
        }
    }

    /// Stops the tree for `why` unless someone already did, and gives the record `message`
    /// unless it has one.
    pub fn stop_because(&mut self, why: TerminatedBy, message: String) {
        if self.terminated_by.is_none() {
            self.why.get_or_insert(message);
            self.stop(why, Signal::TERM);
        }
    }

    /// Stops the tree once, for the first reason that asked.
    pub fn stop(&mut self, why: TerminatedBy, first: Signal) {
        self.withdraw_question();
        if self.terminated_by.is_some() {
            return;
        }
        self.terminated_by = Some(why);
        tracing::info!(reason = why.as_str(), "stopping the agent's process tree");
        let report = self.tree.stop(first, self.grace);
        tracing::debug!(?report, "process tree stopped");
        if report.unconfirmed {
            tracing::warn!(
                "stepguard could not confirm that every process of the run is gone: processes \
                 kept appearing after SIGKILL (e.g. a PID hopper); some may live on. \
                 --containment cgroup stops them reliably"
            );
        } else if report.survivors > 0 {
            tracing::warn!(
                survivors = report.survivors,
                "processes of the run survived SIGKILL (unkillable, e.g. in uninterruptible sleep)"
            );
        }
        self.stop = Some(report);
    }
}
