//! Shared budgets of stepguard: pools, and the ledger that keeps their spend.
//!
//! A *pool* is a budget shared by every run that joins it, over a [`Window`]: a cost in
//! micro-dollars, tokens, steps, runs started, and a cap on runs at the same time. Every run's
//! own budget stays; a pool only ever lowers what a run may spend.
//!
//! One trait, [`Ledger`], is what the rest of stepguard sees. The local ledger ([`sqlite`], the
//! history database in WAL mode: every agent on one host shares pools through it) and the fleet
//! ledger (PostgreSQL, many hosts) implement it. The trait is synchronous; async callers (the
//! gateway) call it from a blocking thread.
//!
//! # Design
//!
//! * **Money is integer micro-dollars** ([`Usage::cost_micros`]); no float is ever summed.
//! * **Every write is idempotent.** A run is named by a [`RunKey`] unique across hosts; joining
//!   twice takes one slot. A reservation and a charge are named by a [`ChargeKey`] (`run`,
//!   `seq`), chosen by the caller: a replay (a retry after a lost answer, charges sent again when
//!   a lost ledger is back) is not charged twice. Reservations and charges share one `seq` space
//!   per run; settling a reservation turns it into the charge of the same key.
//! * **Leases.** A run's concurrency slot and its open reservations are leases of
//!   [`Ledger::lease_time`] (30 s by default) that [`Ledger::renew`] extends. A run that stops
//!   renewing (SIGKILL, a lost machine) loses them when the lease runs out: its slot is free and
//!   its open reservations no longer count; what it was charged stays charged.
//! * **Reservations are atomic over all of a run's pools**: either every pool grants the
//!   estimate or none is touched, and the refusal names the pool that could not pay.
//! * **Overshoot bound.** A pool's charged spend exceeds a cap only by what calls spend beyond
//!   their reservations (a reservation is the estimate, settled to the actual usage), plus, for
//!   runs charged from their stream without reservations, at most one usage report per running
//!   member (each is charged after it happened).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use stepguard_ledger::{sqlite::SqliteLedger, Admission, ChargeKey, Grant, Ledger, PoolLimits,
//!     PoolSpec, RunKey, Usage, Window};
//!
//! let dir = tempfile::tempdir()?;
//! let ledger = SqliteLedger::open(&dir.path().join("history.db"))?;
//! let pool = PoolSpec {
//!     name: "review-daily".into(),
//!     limits: PoolLimits { max_tokens: Some(1_000), ..PoolLimits::default() },
//!     window: Window::Rolling(Duration::from_secs(24 * 3600)),
//! };
//! let now = SystemTime::now();
//! let run = RunKey::new("host-1/42");
//! assert!(matches!(ledger.join(&run, &[pool], now)?, Admission::Admitted(_)));
//! let key = ChargeKey { run: run.clone(), seq: 1 };
//! assert!(matches!(ledger.reserve(&key, Usage::tokens(600), now)?, Grant::Granted(_)));
//! ledger.settle(&key, Usage::tokens(500), now)?;
//! let second = ChargeKey { run: run.clone(), seq: 2 };
//! assert!(matches!(ledger.reserve(&second, Usage::tokens(600), now)?, Grant::Refused(_)));
//! ledger.leave(&run, now)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod sqlite;
mod window;

use std::time::{Duration, SystemTime};

pub use window::{CalendarUnit, Window};

/// How long a run's slot and reservations last without a renewal, unless a ledger says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Micro-dollars in one US dollar: the ledger keeps money as integers.
pub const MICROS_PER_USD: u64 = 1_000_000;

/// Converts dollars to whole micro-dollars, rounding up (a cap or a charge is never made smaller
/// than what was said). Negative and non-finite amounts are zero.
pub fn usd_to_micros(usd: f64) -> u64 {
    if !usd.is_finite() || usd <= 0.0 {
        return 0;
    }
    // The cast saturates at u64::MAX for absurd amounts, which is what a cap means then.
    (usd * MICROS_PER_USD as f64).ceil() as u64
}

/// Converts micro-dollars to dollars, for messages and records.
pub fn micros_to_usd(micros: u64) -> f64 {
    micros as f64 / MICROS_PER_USD as f64
}

/// The identity of one run in the ledger, unique across hosts (for example
/// `HOST/BOOT-ID/PID/START`): the CLI makes it, the ledger never interprets it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey(pub String);

impl RunKey {
    /// Names a run.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The idempotency key of one reservation or charge: the run and a number the run never reuses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChargeKey {
    /// The run that spends.
    pub run: RunKey,
    /// The run's own sequence number (any order; never reused for another amount).
    pub seq: u64,
}

/// What a model call (or a stretch of a stream) spends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens, every kind summed as the run's own token budget sums them.
    pub tokens: u64,
    /// Cost in micro-dollars.
    pub cost_micros: u64,
    /// Agent steps.
    pub steps: u64,
}

impl Usage {
    /// Tokens only.
    pub fn tokens(tokens: u64) -> Self {
        Self {
            tokens,
            ..Self::default()
        }
    }

    /// Whether nothing is spent.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// The caps of one pool; `None` is no cap on that measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolLimits {
    /// Cost over the window, in micro-dollars.
    pub max_cost_micros: Option<u64>,
    /// Tokens over the window.
    pub max_tokens: Option<u64>,
    /// Agent steps over the window.
    pub max_steps: Option<u64>,
    /// Runs started (joined) over the window.
    pub max_runs: Option<u64>,
    /// Runs in the pool at the same time (holding a live lease).
    pub max_concurrent_runs: Option<u64>,
}

impl PoolLimits {
    /// The cap on one spend measure.
    pub fn cap(&self, measure: Measure) -> Option<u64> {
        match measure {
            Measure::Cost => self.max_cost_micros,
            Measure::Tokens => self.max_tokens,
            Measure::Steps => self.max_steps,
            Measure::Runs => self.max_runs,
        }
    }
}

/// One pool as a run's configuration declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// The pool's name: runs that name the same pool share its spend.
    pub name: String,
    /// Its caps.
    pub limits: PoolLimits,
    /// The window its spend is counted over.
    pub window: Window,
}

/// A measure a pool caps over its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Micro-dollars.
    Cost,
    /// Tokens.
    Tokens,
    /// Agent steps.
    Steps,
    /// Runs started.
    Runs,
}

impl Measure {
    /// Every measure, in the order messages list them.
    pub const ALL: [Measure; 4] = [
        Measure::Cost,
        Measure::Tokens,
        Measure::Steps,
        Measure::Runs,
    ];

    /// The measure of a usage (runs are not a usage: zero).
    pub fn of(self, usage: &Usage) -> u64 {
        match self {
            Measure::Cost => usage.cost_micros,
            Measure::Tokens => usage.tokens,
            Measure::Steps => usage.steps,
            Measure::Runs => 0,
        }
    }

    /// The config key of its cap (`max_cost_usd`, …).
    pub fn key(self) -> &'static str {
        match self {
            Measure::Cost => "max_cost_usd",
            Measure::Tokens => "max_tokens",
            Measure::Steps => "max_steps",
            Measure::Runs => "max_runs",
        }
    }
}

/// Why a pool cannot pay: a measure is spent (or would be by the estimate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhaustion {
    /// The pool.
    pub pool: String,
    /// The measure that is spent.
    pub measure: Measure,
    /// What is spent in the window (charged plus open reservations), in the measure's unit.
    pub spent: u64,
    /// The cap.
    pub cap: u64,
    /// What was asked for (the estimate; 1 for a run joining).
    pub asked: u64,
    /// When the window will have freed enough for the ask; `None` never (a lifetime pool).
    pub frees_at: Option<SystemTime>,
}

/// A pool whose concurrency cap is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The pool.
    pub pool: String,
    /// Runs holding a live slot.
    pub running: u64,
    /// The cap.
    pub cap: u64,
}

/// What is left of one pool for a run (`None`: the pool has no cap on that measure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The pool.
    pub pool: String,
    /// Micro-dollars left.
    pub cost_micros: Option<u64>,
    /// Tokens left.
    pub tokens: Option<u64>,
    /// Steps left.
    pub steps: Option<u64>,
}

impl Share {
    /// What is left of one measure (`None`: uncapped; runs are never a share).
    pub fn left(&self, measure: Measure) -> Option<u64> {
        match measure {
            Measure::Cost => self.cost_micros,
            Measure::Tokens => self.tokens,
            Measure::Steps => self.steps,
            Measure::Runs => None,
        }
    }

    /// Whether a capped measure has nothing left: a run in this pool must stop spending.
    pub fn is_spent(&self) -> bool {
        [self.cost_micros, self.tokens, self.steps].contains(&Some(0))
    }
}

/// The answer to [`Ledger::join`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The run holds a slot in every pool; what each pool has left.
    Admitted(Vec<Share>),
    /// A pool is spent: nothing was taken.
    Exhausted(Exhaustion),
    /// A pool's concurrency cap is full: nothing was taken (the caller may wait and ask again).
    Busy(Busy),
}

/// The answer to [`Ledger::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// Every pool holds the estimate for this key; what each has left after it.
    Granted(Vec<Share>),
    /// A pool cannot pay the estimate: nothing was reserved.
    Refused(Exhaustion),
}

/// One measure of a pool in [`PoolStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeasureStatus {
    /// The measure.
    pub measure: Measure,
    /// Charged in the window.
    pub charged: u64,
    /// Held by open reservations.
    pub reserved: u64,
    /// The cap.
    pub cap: u64,
    /// When the window next frees some of it (`None`: nothing to free, or never).
    pub frees_at: Option<SystemTime>,
}

/// A pool as `stepguard pools` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    /// The pool as asked for.
    pub spec: PoolSpec,
    /// Each capped measure.
    pub measures: Vec<MeasureStatus>,
    /// Runs holding a live slot now.
    pub running: Vec<RunKey>,
    /// When the current window started (`None`: a lifetime pool).
    pub window_start: Option<SystemTime>,
}

/// The ledger every pool is kept in.
///
/// Every method takes `now`, the caller's clock (tests move it; the CLI passes the system
/// time). Every method is atomic: it does all it says or nothing.
pub trait Ledger: Send + Sync {
    /// How long a lease lasts without [`Ledger::renew`]; renew well within it (a third).
    fn lease_time(&self) -> Duration;

    /// Where the ledger is, for messages (a path, or a URL without its password).
    fn describe(&self) -> String;

    /// Admits a run to every pool at once: refused with the first spent pool (a cap on cost,
    /// tokens or steps with nothing left, or `max_runs` reached), busy with the first full
    /// concurrency cap, else the run holds a slot (a lease) in each and counts as one run
    /// started. Joining again with the same key is a renewal, not a second run.
    fn join(
        &self,
        run: &RunKey,
        pools: &[PoolSpec],
        now: SystemTime,
    ) -> Result<Admission, LedgerError>;

    /// Reserves an estimate in every pool the run joined, atomically: granted in all, or refused
    /// by the first pool that cannot pay (its spent plus open reservations plus the estimate over
    /// a cap). A replayed key returns what is left without reserving again.
    fn reserve(
        &self,
        key: &ChargeKey,
        estimate: Usage,
        now: SystemTime,
    ) -> Result<Grant, LedgerError>;

    /// Settles a reservation to the actual usage: the estimate is released and the actual is
    /// charged, even over a cap (the call happened). A key without an open reservation (expired,
    /// or never made) is charged as [`Ledger::charge`] would; a key already charged is a no-op.
    fn settle(
        &self,
        key: &ChargeKey,
        actual: Usage,
        now: SystemTime,
    ) -> Result<Vec<Share>, LedgerError>;

    /// Charges usage that happened without a reservation (a stream's usage): once per key, even
    /// over a cap. Returns what each of the run's pools has left.
    fn charge(
        &self,
        key: &ChargeKey,
        actual: Usage,
        now: SystemTime,
    ) -> Result<Vec<Share>, LedgerError>;

    /// Extends the run's slot and open reservations by [`Ledger::lease_time`]. A run whose lease
    /// had run out takes its slot back (it was running all along: a lost ledger, a paused host),
    /// whatever the concurrency cap says.
    fn renew(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError>;

    /// Ends the run's membership: the slot and open reservations are freed, charges stay.
    fn leave(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError>;

    /// What each pool the run joined has left for it now.
    fn allowance(&self, run: &RunKey, now: SystemTime) -> Result<Vec<Share>, LedgerError>;

    /// Each pool's spend, caps, live runs and window, for `stepguard pools`.
    fn status(&self, pools: &[PoolSpec], now: SystemTime) -> Result<Vec<PoolStatus>, LedgerError>;
}

/// What can go wrong in a ledger.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The ledger cannot be reached or opened (a file that cannot be opened, a server down):
    /// the CLI refuses to start a run with pools (exit 2).
    #[error("reach the ledger at {ledger}: {reason}")]
    Unreachable {
        /// Where the ledger is.
        ledger: String,
        /// Why it cannot be reached.
        reason: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The ledger answered with an error (a constraint, a full disk, a lock held too long).
    #[error("use the ledger at {ledger}: {source}")]
    Query {
        /// Where the ledger is.
        ledger: String,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The ledger's tables were written by a newer stepguard.
    #[error(
        "use the ledger at {ledger}: its tables are version {found}, this stepguard knows up to {supported}; upgrade stepguard"
    )]
    Newer {
        /// Where the ledger is.
        ledger: String,
        /// The version found.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// A reservation or charge for a run that never joined a pool (a caller's bug).
    #[error("charge run {run}: it joined no pool in this ledger")]
    NotJoined {
        /// The run.
        run: RunKey,
    },
    /// A window that cannot be computed (an unknown time zone).
    #[error("compute the window {window}: {reason}")]
    Window {
        /// The window as written.
        window: String,
        /// Why.
        reason: String,
    },
}
