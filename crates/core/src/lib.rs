//! The contracts of stepguard: step budgets, the step ledger, failure slugs and run stats.
//!
//! stepguard gives coding agents one provider-agnostic step budget, `max_steps`. This crate holds
//! the rules every other crate agrees on, with no I/O, so it can be embedded in any agent loop:
//!
//! * [`budget`]: the step limit ([`StepLimit`]), the default budget and the built-in profiles'
//!   budgets (where a run's budget comes from is resolved by `stepguard-config`'s precedence
//!   ladder, not here);
//! * [`loops`]: loop detection over the run's tool calls ([`loops::LoopDetector`]) and its
//!   settings;
//! * [`ledger`]: [`StepLedger`], which counts steps begun and completed and says when a run is
//!   over budget: a budget of N lets N steps happen, and step N+1 beginning is over budget;
//! * [`slug`]: [`FailureSlug`], the stable machine-readable reasons runs fail;
//! * [`stats`]: [`RunStats`] and the one-line summary (`Steps: X (legacy turns: Y)`);
//! * [`exit`]: the exit codes of the `stepguard` binary;
//! * [`verdict`]: how a supervised run is judged from who stopped it, its stream and its exit;
//! * [`record`]: [`RunRecord`], the one JSON shape of a run that every command emits.
//!
//! # Stability
//!
//! Slug strings, outcome names, exit code numbers, the JSON field names of [`RunStats`] and the JSON
//! form of [`StepLimit`] are public interface and change only with a major version. Enums that will
//! grow are `#[non_exhaustive]`.
//!
//! # Example
//!
//! ```
//! use stepguard_core::{StepLedger, StepLimit};
//!
//! let mut ledger = StepLedger::new(StepLimit::Limited(2));
//! assert!(!ledger.begin(1).is_over());
//! assert!(!ledger.begin(1).is_over()); // step 2 of 2: at the limit, still allowed
//! assert!(ledger.begin(1).is_over()); // step 3 begins: over budget
//! assert_eq!(ledger.breached_at(), Some(3));
//! ```
#![forbid(unsafe_code)]

pub mod budget;
pub mod checkpoint;
pub mod exit;
pub mod ledger;
pub mod loops;
pub mod money;
pub mod record;
pub mod slug;
pub mod stats;
pub mod verdict;

pub use budget::StepLimit;
pub use exit::ExitCode;
pub use ledger::{BudgetStatus, StepLedger};
pub use record::{
    BudgetNotice, Containment, LedgerKind, LimitChoice, NoticeLimit, PoolLedger,
    RECORD_SCHEMA_VERSION, RecordedSlug, RunRecord,
};
pub use slug::FailureSlug;
pub use stats::{Outcome, RunStats, TokenUsage};
pub use verdict::TerminatedBy;
