//! The step ledger: how many steps a run has begun and completed, measured against its budget.
//!
//! The rule: a budget of N lets N steps happen; the run is over budget the moment step N+1
//! *begins* (or completes, for providers whose streams show no beginning, where completion is the
//! first sight of the step). A step that has begun is counted even if it never completes, so a
//! killed stream still counts the step that was under way.

use serde::{Deserialize, Serialize};

use crate::budget::StepLimit;

/// Where a run stands against its budget after an observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetStatus {
    /// Fewer than N steps have begun.
    Within {
        /// Steps counted so far.
        used: u64,
    },
    /// Exactly N steps have begun: the next one breaches.
    AtLimit {
        /// Steps counted so far (= the limit).
        used: u64,
    },
    /// More than N steps have begun: the run must stop.
    Over {
        /// Steps counted so far.
        used: u64,
        /// The limit that was exceeded.
        limit: u32,
    },
    /// The budget is unlimited.
    Unlimited {
        /// Steps counted so far.
        used: u64,
    },
}

impl BudgetStatus {
    /// Returns true when the run has exceeded its budget.
    pub const fn is_over(self) -> bool {
        matches!(self, BudgetStatus::Over { .. })
    }
}

/// Per-run step and turn accounting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLedger {
    limit: Option<u32>,
    steps_begun: u64,
    steps_completed: u64,
    /// The step number that first exceeded the budget, if any.
    breached_at: Option<u64>,
    /// Steps as the provider itself reported them, when its stream says.
    pub steps_reported: Option<u64>,
    /// Legacy turns as the provider reported them.
    pub turns_reported: Option<u64>,
    /// Legacy turns as we computed them from the stream.
    pub turns_computed: Option<u64>,
}

impl StepLedger {
    /// Creates an empty ledger for a run with the given limit.
    pub fn new(limit: StepLimit) -> Self {
        StepLedger {
            limit: limit.get(),
            steps_begun: 0,
            steps_completed: 0,
            breached_at: None,
            steps_reported: None,
            turns_reported: None,
            turns_computed: None,
        }
    }

    /// Returns the limit the ledger enforces.
    pub fn limit(&self) -> StepLimit {
        self.limit.map_or(StepLimit::Unlimited, StepLimit::Limited)
    }

    /// Raises (or removes) the limit, e.g. after a human allowed more steps at the limit.
    ///
    /// A limit can only be loosened here through an explicit human decision; a breach already
    /// recorded stays recorded.
    pub fn set_limit(&mut self, limit: StepLimit) -> BudgetStatus {
        self.limit = limit.get();
        self.status()
    }

    /// Records that `n` new steps began.
    pub fn begin(&mut self, n: u64) -> BudgetStatus {
        self.steps_begun = self.steps_begun.saturating_add(n);
        self.check_breach()
    }

    /// Records that `n` steps completed; a completion beyond the begun count is counted as begun
    /// too, because completion was the first sight of that step.
    pub fn complete(&mut self, n: u64) -> BudgetStatus {
        self.steps_completed = self.steps_completed.saturating_add(n);
        if self.steps_completed > self.steps_begun {
            self.steps_begun = self.steps_completed;
        }
        self.check_breach()
    }

    fn check_breach(&mut self) -> BudgetStatus {
        let status = self.status();
        if let (BudgetStatus::Over { .. }, None) = (status, self.breached_at) {
            // The first step past the limit is the breaching one.
            self.breached_at = self.limit.map(|l| u64::from(l) + 1);
        }
        status
    }

    /// Returns the status without recording anything.
    pub fn status(&self) -> BudgetStatus {
        let used = self.steps_begun;
        match self.limit {
            None => BudgetStatus::Unlimited { used },
            Some(limit) if used > u64::from(limit) => BudgetStatus::Over { used, limit },
            Some(limit) if used == u64::from(limit) => BudgetStatus::AtLimit { used },
            Some(_) => BudgetStatus::Within { used },
        }
    }

    /// Returns the number of steps counted (begun, including those seen only at completion).
    pub fn steps(&self) -> u64 {
        self.steps_begun
    }

    /// Returns the number of steps seen completing.
    pub fn steps_completed(&self) -> u64 {
        self.steps_completed
    }

    /// Returns the step number that breached the budget, if one did.
    pub fn breached_at(&self) -> Option<u64> {
        self.breached_at
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn budget_of_n_lets_n_steps_happen() {
        let mut l = StepLedger::new(StepLimit::Limited(3));
        assert_eq!(l.begin(1), BudgetStatus::Within { used: 1 });
        assert_eq!(l.complete(1), BudgetStatus::Within { used: 1 });
        assert_eq!(l.begin(1), BudgetStatus::Within { used: 2 });
        assert_eq!(l.begin(1), BudgetStatus::AtLimit { used: 3 });
        assert_eq!(l.complete(2), BudgetStatus::AtLimit { used: 3 });
        assert_eq!(l.breached_at(), None);
        assert_eq!(l.begin(1), BudgetStatus::Over { used: 4, limit: 3 });
        assert_eq!(l.breached_at(), Some(4));
    }

    #[test]
    fn completion_without_beginning_counts_as_a_step() {
        let mut l = StepLedger::new(StepLimit::Limited(1));
        assert_eq!(l.complete(1), BudgetStatus::AtLimit { used: 1 });
        assert!(l.complete(1).is_over());
        assert_eq!((l.steps(), l.steps_completed()), (2, 2));
    }

    #[test]
    fn unlimited_never_breaches() {
        let mut l = StepLedger::new(StepLimit::Unlimited);
        assert_eq!(
            l.begin(1_000_000),
            BudgetStatus::Unlimited { used: 1_000_000 }
        );
        assert_eq!(l.breached_at(), None);
    }

    #[test]
    fn raising_the_limit_keeps_the_recorded_breach() {
        let mut l = StepLedger::new(StepLimit::Limited(1));
        l.begin(2);
        assert_eq!(
            l.set_limit(StepLimit::Limited(5)),
            BudgetStatus::Within { used: 2 }
        );
        assert_eq!(l.breached_at(), Some(2));
    }

    #[derive(Clone, Debug)]
    enum Ev {
        Begin(u64),
        Complete(u64),
    }

    fn events() -> impl Strategy<Value = Vec<Ev>> {
        proptest::collection::vec(
            prop_oneof![
                (0u64..4).prop_map(Ev::Begin),
                (0u64..4).prop_map(Ev::Complete)
            ],
            0..200,
        )
    }

    proptest! {
        /// No sequence of events lets more than N steps complete (or begin) without the ledger
        /// saying "over budget" at that very event.
        #[test]
        fn never_more_than_n_steps_without_over_budget(limit in 1u32..20, evs in events()) {
            let mut l = StepLedger::new(StepLimit::Limited(limit));
            let mut said_over = false;
            for ev in evs {
                let status = match ev {
                    Ev::Begin(n) => l.begin(n),
                    Ev::Complete(n) => l.complete(n),
                };
                said_over |= status.is_over();
                if l.steps_completed() > u64::from(limit) || l.steps() > u64::from(limit) {
                    prop_assert!(status.is_over(), "more than {} steps but status {:?}", limit, status);
                    prop_assert!(said_over);
                    prop_assert_eq!(l.breached_at(), Some(u64::from(limit) + 1));
                } else {
                    prop_assert!(!status.is_over());
                }
                prop_assert!(l.steps_completed() <= l.steps());
            }
        }
    }
}
