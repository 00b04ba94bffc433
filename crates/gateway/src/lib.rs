//! A model gateway on 127.0.0.1 that makes an agent wrap up instead of being killed.
//!
//! Every agent CLI takes a model base URL, so stepguard can sit between the CLI and its model
//! without the CLI's cooperation. [`Gateway::start`] listens on an ephemeral loopback port under
//! an unguessable per-run path token ([`Gateway::url`]); [`point`] rewrites the agent's command
//! or environment to use it, as the provider plugin's manifest declares, and finds the upstream
//! the CLI would have used. Then, for each request:
//!
//! * **Side requests** (no tools offered: titles, routing, compaction) and everything that is
//!   not a model call pass through untouched and uncounted.
//! * **Main requests** (tools offered: one step of the agent) are paced by the run's budget
//!   ([`Pace`]): forwarded as they are while the budget allows; the one that must be the last
//!   gets tool use turned off in its dialect and one ephemeral `system notice: …` user text
//!   ([`Dialect::disable_tools`], [`Dialect::add_notice`]); any after it is never forwarded and
//!   is answered by the gateway with a short final text ([`Dialect::final_reply`]), so the
//!   upstream never sees more model calls than the budget.
//! * **Staged notices** ([`Staged`]): when the run has spent 50%, 80% or 95% (the run's choice)
//!   of a limit (steps, tokens, cost, its pool share, the time before its timeout), the next
//!   main call forwarded as usual carries one ephemeral `system notice:` saying what is left;
//!   each threshold once, recorded ([`Gateway::notices`]).
//! * Response bodies stream back frame by frame (SSE included) with constant memory; only the
//!   last reply's first MiB is kept, for its text ([`Gateway::final_text`]).
//! * Headers pass as they are (the per-run key swapped for the real one) and are never logged; request bodies are
//!   never stored unless [`GatewayConfig::record_requests`] asks (then without credentials).
//!
//! * Model request bodies are read whole (at most [`MAX_MODEL_REQUEST`] each), all of them
//!   together within [`GatewayConfig::body_memory`]: past it a request gets 503 with
//!   `Retry-After`. Paths are made canonical before they are classified (what is classified is
//!   what is forwarded), or refused; a call that must be rewritten but cannot is refused.
//! * With a token or cost budget, the run's first calls go one at a time until one has settled
//!   (there is no estimate before), then calls under way are reserved at the estimate.
//! * With a budget other runs share ([`GatewayConfig::shared_budget`], stepguard's pools), each
//!   main call reserves its estimate there before it is forwarded and settles to its usage after
//!   ([`SharedBudget`]): one the budget cannot pay is answered by the gateway, and the last one
//!   that fits goes out tool-less with a notice naming the pool.
//!
//! The CLI's real API keys stay in the gateway ([`GatewayConfig::api_keys`]): the agent gets
//! per-run keys ([`Gateway::run_keys`]) and the gateway swaps the real key in as it forwards; a
//! request with the real key itself or another run's per-run key gets 401, one with no key or a
//! credential the gateway did not make (the CLI's own login) passes as it came.
//!
//! Requests without the token get 403, and the gateway forwards only to its one upstream: it is
//! never an open proxy. An upstream that cannot be reached is answered with 502 at once and
//! reported ([`GatewayEvent::UpstreamFailed`]), so the run ends promptly as `provider_error`.
//! The gateway runs on a small tokio runtime of its own thread; the rest of stepguard stays
//! synchronous.

mod dialect;
mod keys;
mod notices;
mod point;
mod proxy;
mod usage;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

pub use dialect::{Dialect, UnknownDialect};
pub use notices::{Deadline, NoticeLimit, PoolLeft, SentNotice, Staged};
pub use point::{PointError, Pointing, point};
pub use usage::CallUsage;

/// The notice the last model call carries.
pub const WRAP_UP_NOTICE: &str = "system notice: the step budget is reached. Make no more tool \
calls. Reply with a final status summary: what was done, what is left, and how to continue.";

/// The text a model call past the budget is answered with, in the gateway's own name.
pub const REFUSAL_TEXT: &str = "Stopped by stepguard: the step budget is spent, so this model \
call was not made. See the previous message for the summary.";

/// What one model call spends, in a [`SharedBudget`]'s terms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallSpend {
    /// Input plus output tokens (cached input included).
    pub tokens: u64,
    /// Dollars (0 when the call cannot be priced).
    pub cost_usd: f64,
}

/// A shared budget's answer to a model call's reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// The estimate is reserved and the call after it fits too: forward the call as it is.
    Go,
    /// The estimate is reserved but the call after it would not fit: this call is the last,
    /// tool-less, with a notice naming `pool`.
    Last {
        /// The shared budget (pool) that will be spent.
        pool: String,
        /// The measure that will be spent.
        budget: Budget,
    },
    /// Nothing was reserved: `pool` cannot pay the estimate, and the call is answered by the
    /// gateway.
    Refused {
        /// The shared budget (pool) that cannot pay.
        pool: String,
        /// The measure that is spent.
        budget: Budget,
    },
}

/// A budget that other runs share (stepguard's pools), consulted for every main model call:
/// the call's estimate is reserved before it is forwarded and settled to its real usage after,
/// under one sequence number per call (numbered from 1, never reused).
///
/// The gateway calls both from a blocking thread, never from its runtime. An implementation
/// that cannot reach its budget answers [`Reservation::Go`] (the run's own budget still holds)
/// and says so itself.
pub trait SharedBudget: Send + Sync {
    /// Reserves `next` (this call's estimate) for call `seq`; `after` is the estimate of the
    /// call after it, to tell whether this one must be the last.
    fn reserve(&self, seq: u64, next: CallSpend, after: CallSpend) -> Reservation;

    /// Settles call `seq` to what it really spent (zero for a call that was not made).
    fn settle(&self, seq: u64, actual: CallSpend);

    /// What is left of the run's share, as of the latest reservation, for the staged notices
    /// ([`Staged`]); `None` (the default): the budget does not say.
    fn left(&self) -> Option<PoolLeft> {
        None
    }
}

/// How the run's budget paces model calls.
#[derive(Clone, Debug)]
pub struct Pace {
    /// The step budget; `None` means no budget (nothing is rewritten or refused).
    pub limit: Option<u64>,
    /// Steps counted so far from the agent's stream (the run's ledger, shared).
    pub steps: Arc<AtomicU64>,
    /// What a tool-less reply costs in the counted unit: 1 for message/item units, 0 for tool
    /// units.
    pub reply_cost: u64,
    /// Whether the unit is `request`: the gateway's count of main requests is the step count.
    pub count_requests: bool,
    /// The token budget (input + output of every model call, cached input included).
    pub max_tokens: Option<u64>,
    /// The cost budget in US dollars; needs [`Pace::price`].
    pub max_cost_usd: Option<f64>,
    /// Prices a model call: `(model, usage) → dollars`, `None` for a model it does not know.
    pub price: Option<Pricing>,
}

/// The function behind [`Pricing`].
pub type PriceFn = dyn Fn(&str, &CallUsage) -> Option<f64> + Send + Sync;

/// Prices a model call by model name and usage (`None`: the model has no price).
#[derive(Clone)]
pub struct Pricing(pub Arc<PriceFn>);

impl Pace {
    /// Whether calls to `model` can be priced (a cost budget needs it).
    pub(crate) fn can_price(&self, model: &str) -> bool {
        self.price
            .as_ref()
            .is_some_and(|p| (p.0)(model, &CallUsage::default()).is_some())
    }
}

impl std::fmt::Debug for Pricing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pricing(..)")
    }
}

/// Which budget made a model call the last one (or refused it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The step budget.
    Steps,
    /// The token budget.
    Tokens,
    /// The cost budget.
    Cost,
}

/// What the gateway tells the run as it happens.
#[derive(Clone, Debug, PartialEq)]
pub enum GatewayEvent {
    /// A main request was forwarded; `number` counts them from 1.
    Forwarded {
        /// Main requests forwarded so far, this one included.
        number: u64,
        /// Whether it was the last one, sent tool-less with the wrap-up notice.
        last: bool,
    },
    /// A main request past the budget was answered by the gateway, not forwarded.
    Refused {
        /// Requests refused so far, this one included.
        count: u64,
    },
    /// A model call's reply streamed through with its usage; the totals so far, all calls.
    Usage {
        /// Input plus output tokens of every call so far.
        tokens: u64,
        /// Their cost in dollars, when every call so far could be priced.
        cost_usd: Option<f64>,
    },
    /// A model call's body could not be read (compressed, not JSON): it was not forwarded,
    /// since it could be neither counted nor paced.
    Unreadable {
        /// What was wrong with it.
        why: String,
    },
    /// A cost budget is set and the model of a call has no price: the call was refused.
    Unpriced {
        /// The model's name as the call gave it.
        model: String,
    },
    /// The upstream could not be reached or broke off: the run cannot go on.
    UpstreamFailed {
        /// What went wrong (never with credentials).
        error: String,
    },
}

/// Everything a gateway needs to start.
pub struct GatewayConfig {
    /// The wire dialect of the CLI's model calls.
    pub dialect: Dialect,
    /// The base URL model calls are forwarded to (`http://` or `https://`).
    pub upstream: String,
    /// How the budget paces main requests.
    pub pace: Pace,
    /// Whether every forwarded main request carries `system notice: this is step X of Y`.
    pub notices: bool,
    /// The staged notices: at which shares of its limits the model is told what is left.
    pub staged: Staged,
    /// A directory to write every request into (bodies, headers without credentials), for
    /// debugging; `None` stores nothing.
    pub record_requests: Option<PathBuf>,
    /// Called for every [`GatewayEvent`], from the gateway's thread; must not block.
    pub on_event: Box<dyn Fn(GatewayEvent) + Send + Sync>,
    /// How long connecting to the upstream may take.
    pub connect_timeout: Duration,
    /// The most bytes of model request bodies held at once, all requests together
    /// ([`DEFAULT_BODY_MEMORY`] unless a caller knows better); a request that would pass it is
    /// answered 503 with `Retry-After` and not forwarded.
    pub body_memory: usize,
    /// The CLI's real API keys (the values of the variables [`Pointing::keys`] names that were
    /// set). The gateway makes a per-run key for each ([`Gateway::run_keys`]), gives the
    /// upstream the real one in its place, and refuses requests that carry a real key or
    /// another run's per-run key; empty, credentials pass through untouched (a CLI logged in
    /// by OAuth).
    pub api_keys: Vec<String>,
    /// A budget shared with other runs that every main model call reserves in before it is
    /// forwarded ([`SharedBudget`]); `None`: only the run's own budgets pace it.
    pub shared_budget: Option<Arc<dyn SharedBudget>>,
}

/// The default cap on model request bodies held at once: two of the largest requests.
pub const DEFAULT_BODY_MEMORY: usize = 512 * 1024 * 1024;

/// The largest model request read whole (whole conversations, so generous).
pub const MAX_MODEL_REQUEST: usize = 256 * 1024 * 1024;

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The upstream URL does not parse or is not http(s).
    #[error("the model upstream `{0}` is not an http:// or https:// URL")]
    BadUpstream(String),
    /// The loopback listener, the runtime or the TLS roots could not be set up.
    #[error("cannot start the model gateway: {0}")]
    Io(#[from] std::io::Error),
    /// A directory for recorded requests could not be created.
    #[error("cannot create the request recording directory {dir}: {source}")]
    RecordDir {
        /// The directory.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
}

/// What the gateway decided for one main request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Forward it as it is (with a step notice when asked).
    Forward { number: u64 },
    /// Forward it tool-less with the wrap-up notice: the model's last call.
    Last { number: u64 },
    /// Answer it without forwarding: the budget is spent.
    Refuse,
    /// Answer it with an error without forwarding: its model has no price.
    Unpriced,
}

/// The gateway's own count of a run's model calls.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) forwarded: u64,
    pub(crate) last_sent: bool,
    pub(crate) refused: u64,
    pub(crate) force_last: bool,
    pub(crate) notice: Option<String>,
    pub(crate) final_text: Option<String>,
    pub(crate) recorded: u64,
    /// Usage of every model call so far (main and side).
    pub(crate) usage: CallUsage,
    /// Their cost; `None` once a call could not be priced.
    pub(crate) cost: Option<f64>,
    /// Tokens and cost of the latest main calls, newest last (for the next call's estimate).
    pub(crate) recent: Vec<(u64, f64)>,
    /// Which budget made the last call the last.
    pub(crate) reason: Option<Budget>,
    /// Whether the tool-less last call went out and was answered (a wrap-up happened).
    pub(crate) wrapped: bool,
    /// Model calls (main and side) admitted and not yet settled.
    pub(crate) metered: u64,
    /// The largest call accounted so far, main or side: the estimate before a main call has
    /// settled; `None` until a call has settled with its usage.
    pub(crate) largest: Option<(u64, f64)>,
    /// Main calls reserved in the shared budget so far (the last one's sequence number).
    pub(crate) reserved: u64,
    /// The shared budget (pool) that made the last call the last, or refused a call.
    pub(crate) pool: Option<String>,
    /// Whether the run was told its shared budget is spent ([`Gateway::wrap_up_for`]): its
    /// last call goes out even though the shared budget refuses it.
    pub(crate) outside: bool,
    /// The staged notices told so far.
    pub(crate) told: notices::Told,
}

/// What the next two main calls will likely use, in tokens and dollars.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Estimate {
    next: (u64, f64),
    after: (u64, f64),
}

impl Tally {
    /// What the next main call, and the one after it, will likely use: the largest of the
    /// latest calls (a sub-agent's small call must not hide its parent's big one), grown as the
    /// latest grew, since a conversation only gets longer.
    fn estimate(&self) -> Option<Estimate> {
        let Some(&(t1, c1)) = self.recent.last() else {
            // Only side calls have settled: the largest of them, without growth.
            let largest = self.largest?;
            return Some(Estimate {
                next: largest,
                after: largest,
            });
        };
        let (tmax, cmax) = self
            .recent
            .iter()
            .fold((0u64, 0f64), |(t, c), (ti, ci)| (t.max(*ti), c.max(*ci)));
        let (gt, gc) = match self
            .recent
            .len()
            .checked_sub(2)
            .and_then(|i| self.recent.get(i))
        {
            Some(&(t0, c0)) => (t1.saturating_sub(t0), (c1 - c0).max(0.0)),
            None => (0, 0.0),
        };
        let next = (tmax.max(t1.saturating_add(gt)), cmax.max(c1 + gc));
        let after = (next.0.saturating_add(gt), next.1 + gc);
        Some(Estimate { next, after })
    }

    /// What the token and cost budgets say of the next main call: refuse it (the budget is
    /// spent or it would cross it), make it the last (the one after it would cross), or go on.
    /// The other calls still under way (main and side, admitted before this one) count at the
    /// estimate, so concurrent calls cannot all slip in.
    fn spend_plan(&self, pace: &Pace) -> Option<(bool, Budget)> {
        let est = self.estimate();
        let pending = self.metered.saturating_sub(1);
        if let Some(max) = pace.max_tokens {
            let e = est.unwrap_or_default();
            let spent = self
                .usage
                .total()
                .saturating_add(e.next.0.saturating_mul(pending));
            if spent >= max || spent.saturating_add(e.next.0) > max {
                return Some((true, Budget::Tokens));
            }
            if est.is_some() && spent.saturating_add(e.next.0).saturating_add(e.after.0) > max {
                return Some((false, Budget::Tokens));
            }
        }
        if let (Some(max), Some(cost)) = (pace.max_cost_usd, self.cost) {
            // Dollars are summed in floating point: a nano-dollar of rounding is not a crossing.
            const EPS: f64 = 1e-9;
            let e = est.unwrap_or_default();
            let spent = cost + e.next.1 * pending as f64;
            if spent >= max - EPS || spent + e.next.1 > max + EPS {
                return Some((true, Budget::Cost));
            }
            if est.is_some() && spent + e.next.1 + e.after.1 > max + EPS {
                return Some((false, Budget::Cost));
            }
        }
        None
    }

    /// Whether the token or cost budget has been crossed (more spent than it allows).
    fn crossed(&self, pace: &Pace) -> Option<Budget> {
        if pace.max_tokens.is_some_and(|max| self.usage.total() > max) {
            return Some(Budget::Tokens);
        }
        match (pace.max_cost_usd, self.cost) {
            (Some(max), Some(cost)) if cost > max + 1e-9 => Some(Budget::Cost),
            _ => None,
        }
    }
}

/// State shared by the gateway's handlers and its [`Gateway`] handle.
pub(crate) struct Shared {
    pub(crate) config: GatewayConfig,
    pub(crate) token: String,
    pub(crate) keys: keys::RunKeys,
    pub(crate) tally: Mutex<Tally>,
    /// Woken whenever an admitted model call settles (see [`Shared::admit`]).
    pub(crate) settled: tokio::sync::Notify,
    /// Bytes of request bodies held now (see [`Held`]).
    pub(crate) held: AtomicUsize,
}

/// Bytes of a request body counted against [`GatewayConfig::body_memory`], given back when the
/// request is done with.
pub(crate) struct Held {
    shared: Arc<Shared>,
    bytes: usize,
}

impl Held {
    pub(crate) fn new(shared: &Arc<Shared>) -> Self {
        Held {
            shared: Arc::clone(shared),
            bytes: 0,
        }
    }

    /// Counts `n` more bytes, or says no (counting nothing) when that would pass the cap.
    pub(crate) fn grow(&mut self, n: usize) -> bool {
        let cap = self.shared.config.body_memory;
        let taken = self
            .shared
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(n).filter(|total| *total <= cap)
            });
        if taken.is_ok() {
            self.bytes += n;
        }
        taken.is_ok()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// One admitted model call; dropping it (when its reply has ended, or it was answered without
/// being forwarded) settles it, in the shared budget too, and wakes the calls waiting for the
/// first estimate.
pub(crate) struct Slot {
    shared: Arc<Shared>,
    /// The call's sequence number in the shared budget, when its estimate is reserved there.
    pub(crate) seq: Option<u64>,
    /// What the call spent (zero until its reply has been accounted).
    pub(crate) actual: CallSpend,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut t = self.shared.tally();
            t.metered = t.metered.saturating_sub(1);
        }
        if let (Some(seq), Some(budget)) = (self.seq, &self.shared.config.shared_budget) {
            let (budget, actual) = (Arc::clone(budget), self.actual);
            let settle = move || budget.settle(seq, actual);
            // Off the runtime's thread; the runtime waits for it before the gateway stops.
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(settle)),
                Err(_) => settle(),
            }
        }
        self.shared.settled.notify_waiters();
    }
}

impl Shared {
    pub(crate) fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a model call must wait before it is planned: with a token or cost budget and no
    /// call settled yet there is no estimate to reserve calls under way at, so the run's first
    /// calls go one at a time.
    fn must_wait(&self, t: &Tally) -> bool {
        let pace = &self.config.pace;
        let spend = pace.max_tokens.is_some() || pace.max_cost_usd.is_some();
        spend && t.largest.is_none() && t.metered > 0
    }

    /// Admits one model call: at once when there is an estimate (or no token or cost budget),
    /// else once the call under way has settled.
    pub(crate) async fn admit(self: &Arc<Self>) -> Slot {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut t = self.tally();
                if !self.must_wait(&t) {
                    t.metered += 1;
                    return Slot {
                        shared: Arc::clone(self),
                        seq: None,
                        actual: CallSpend::default(),
                    };
                }
            }
            notified.await;
        }
    }

    /// Decides what happens to the next main request for `model`, and counts it.
    pub(crate) fn plan(&self, model: &str, shared: Option<Reservation>) -> (Plan, Option<String>) {
        let pace = &self.config.pace;
        let mut t = self.tally();
        if t.last_sent {
            return (Plan::Refuse, None);
        }
        // A cost budget cannot be kept with a model it cannot price: fail closed.
        if pace.max_cost_usd.is_some() && !pace.can_price(model) {
            return (Plan::Unpriced, None);
        }
        let forced = t.force_last;
        let shared = match shared {
            // Told that other runs spent the shared budget: the wrap-up still goes out.
            Some(Reservation::Refused { pool, budget }) if t.outside => {
                Some(Reservation::Last { pool, budget })
            }
            other => other,
        };
        let steps_spent = t.steps_spent(pace);
        let spend = match (t.spend_plan(pace), shared) {
            (Some((true, budget)), _) => Some((true, budget)),
            (own, None | Some(Reservation::Go)) => own,
            (_, Some(Reservation::Last { pool, budget })) => {
                t.pool = Some(pool);
                Some((false, budget))
            }
            (_, Some(Reservation::Refused { pool, budget })) => {
                t.pool = Some(pool);
                Some((true, budget))
            }
        };
        let plan = match pace.limit {
            None if !forced => Plan::Forward {
                number: t.forwarded + 1,
            },
            None => Plan::Last {
                number: t.forwarded + 1,
            },
            Some(limit) => {
                let spent = if pace.count_requests {
                    t.forwarded
                } else {
                    // The stream may lag the model calls; each call costs at least a reply.
                    pace.steps
                        .load(Ordering::Relaxed)
                        .max(t.forwarded.saturating_mul(pace.reply_cost))
                };
                let cost = if pace.count_requests {
                    1
                } else {
                    pace.reply_cost
                };
                match limit.checked_sub(spent) {
                    Some(left) if left < cost => Plan::Refuse,
                    None => Plan::Refuse,
                    Some(left) if left <= cost || forced => Plan::Last {
                        number: t.forwarded + 1,
                    },
                    Some(_) => Plan::Forward {
                        number: t.forwarded + 1,
                    },
                }
            }
        };
        let steps_say_last = matches!(plan, Plan::Last { .. }) && !forced;
        let plan = match (plan, spend) {
            (Plan::Forward { number }, Some((false, budget))) => {
                t.reason = Some(budget);
                Plan::Last { number }
            }
            (Plan::Forward { .. } | Plan::Last { .. }, Some((true, budget))) => {
                t.reason.get_or_insert(budget);
                Plan::Refuse
            }
            (plan, _) => {
                if steps_say_last {
                    t.reason = Some(Budget::Steps);
                }
                plan
            }
        };
        match plan {
            Plan::Forward { .. } => {
                t.forwarded += 1;
            }
            Plan::Last { .. } => {
                t.forwarded += 1;
                t.last_sent = true;
            }
            // Nothing more will be forwarded: the run is over for its model. The refusal
            // itself is counted where it is answered.
            Plan::Refuse => t.last_sent = true,
            Plan::Unpriced => {}
        }
        let notice = self.notice_for(&mut t, plan, steps_spent);
        (plan, notice)
    }

    /// The notice a planned call carries: the one pushed (a loop's) and, on a call forwarded
    /// as usual, the staged one for thresholds newly crossed, in one text.
    fn notice_for(&self, t: &mut Tally, plan: Plan, steps_spent: u64) -> Option<String> {
        let pending = t.notice.take();
        let staged = match plan {
            Plan::Forward { number } => {
                t.staged_notice(&self.config.pace, &self.config.staged, steps_spent, number)
            }
            _ => None,
        };
        match (pending, staged) {
            (Some(a), Some(b)) => Some(format!("{a}\n{b}")),
            (a, b) => a.or(b),
        }
    }

    /// The budget that refuses a side call: none goes out once the token or cost budget is
    /// spent or the call would cross it (calls under way counted at the estimate), and that
    /// budget is why the run ends.
    pub(crate) fn side_refused(&self) -> Option<Budget> {
        let mut t = self.tally();
        let budget = match t.spend_plan(&self.config.pace) {
            Some((true, budget)) => budget,
            _ => return None,
        };
        t.reason.get_or_insert(budget);
        Some(budget)
    }

    /// A main call's reply has ended (or failed): it is no longer under way. A reply that was
    /// not a success does not count as a step, nor as the last call, so a retry takes its place.
    pub(crate) fn settle(&self, last: bool, success: bool) {
        let mut t = self.tally();
        if success {
            if last {
                t.wrapped = true;
            }
        } else {
            t.forwarded = t.forwarded.saturating_sub(1);
            if last {
                t.last_sent = false;
            }
        }
    }

    /// Reserves the next main call's estimate in the shared budget, on a blocking thread, and
    /// marks `slot` to settle it; `None` without a shared budget.
    pub(crate) async fn reserve(self: &Arc<Self>, slot: &mut Slot) -> Option<Reservation> {
        let budget = Arc::clone(self.config.shared_budget.as_ref()?);
        let (seq, next, after) = {
            let mut t = self.tally();
            if t.last_sent {
                // Nothing more goes out: nothing to reserve.
                return None;
            }
            t.reserved += 1;
            // Before any call has settled: one token, so a spent pool still refuses.
            let e = t.estimate().unwrap_or(Estimate {
                next: (1, 0.0),
                after: (1, 0.0),
            });
            let spend = |(tokens, cost_usd): (u64, f64)| CallSpend {
                tokens: tokens.max(1),
                cost_usd,
            };
            (t.reserved, spend(e.next), spend(e.after))
        };
        let staged = !self.config.staged.thresholds.is_empty();
        let (answer, left) = tokio::task::spawn_blocking(move || {
            let answer = budget.reserve(seq, next, after);
            (answer, staged.then(|| budget.left()).flatten())
        })
        .await
        .unwrap_or((Reservation::Go, None));
        if left.is_some() {
            self.tally().told.pool = left;
        }
        if !matches!(answer, Reservation::Refused { .. }) {
            slot.seq = Some(seq);
        }
        Some(answer)
    }

    /// The notice the last main call carries: the wrap-up notice, naming the pool when a
    /// shared budget made it the last.
    pub(crate) fn last_notice(&self) -> String {
        match &self.tally().pool {
            Some(pool) => format!(
                "system notice: the shared budget `{pool}` is spent. Make no more tool calls. \
                 Reply with a final status summary: what was done, what is left, and how to \
                 continue."
            ),
            None => WRAP_UP_NOTICE.to_owned(),
        }
    }

    /// Adds one call's usage to the totals and tells the run; `main` calls feed the estimate.
    /// Returns what this call spent.
    pub(crate) fn account(&self, model: &str, main: bool, usage: &CallUsage) -> CallSpend {
        let pace = &self.config.pace;
        let cost = pace.price.as_ref().and_then(|p| (p.0)(model, usage));
        let (tokens, total_cost) = {
            let mut t = self.tally();
            t.usage.add(usage);
            t.cost = match (t.cost, cost) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
            let this = (usage.total(), cost.unwrap_or(0.0));
            t.largest = Some(match t.largest {
                Some((lt, lc)) => (lt.max(this.0), lc.max(this.1)),
                None => this,
            });
            if main {
                t.recent.push(this);
                if t.recent.len() > 4 {
                    t.recent.remove(0);
                }
            }
            (t.usage.total(), t.cost)
        };
        (self.config.on_event)(GatewayEvent::Usage {
            tokens,
            cost_usd: total_cost,
        });
        CallSpend {
            tokens: usage.total(),
            cost_usd: cost.unwrap_or(0.0),
        }
    }
}

/// A running gateway; dropping it stops it.
pub struct Gateway {
    url: String,
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Gateway {
    /// Starts a gateway on an ephemeral port of 127.0.0.1.
    pub fn start(config: GatewayConfig) -> Result<Gateway, GatewayError> {
        let upstream: hyper::Uri = config
            .upstream
            .parse()
            .map_err(|_| GatewayError::BadUpstream(config.upstream.clone()))?;
        if !matches!(upstream.scheme_str(), Some("http" | "https")) || upstream.host().is_none() {
            return Err(GatewayError::BadUpstream(config.upstream.clone()));
        }
        if let Some(dir) = &config.record_requests {
            std::fs::create_dir_all(dir).map_err(|source| GatewayError::RecordDir {
                dir: dir.display().to_string(),
                source,
            })?;
        }
        let token = token()?;
        let keys = keys::RunKeys::new(&config.api_keys, self::token)?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = proxy::client(config.connect_timeout)?;
        let shared = Arc::new(Shared {
            tally: Mutex::new(Tally {
                cost: config.pace.price.as_ref().map(|_| 0.0),
                ..Tally::default()
            }),
            config,
            token: token.clone(),
            keys,
            settled: tokio::sync::Notify::new(),
            held: AtomicUsize::new(0),
        });
        let (shutdown, stop) = tokio::sync::oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("stepguard-gateway".into())
            .spawn(move || {
                runtime.block_on(proxy::serve(listener, serving, client, upstream, stop));
            })?;
        Ok(Gateway {
            url: format!("http://{addr}/{token}"),
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The base URL to give the CLI: loopback, with the run's token as its first path segment.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The per-run keys to give the agent, one for each of [`GatewayConfig::api_keys`] in its
    /// order.
    pub fn run_keys(&self) -> Vec<String> {
        self.shared.keys.per_run()
    }

    /// The socket the gateway listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Main requests forwarded so far (the last one included).
    pub fn forwarded(&self) -> u64 {
        self.shared.tally().forwarded
    }

    /// Main requests answered by the gateway because the budget was spent.
    pub fn refused(&self) -> u64 {
        self.shared.tally().refused
    }

    /// Whether the last model call went out tool-less with the wrap-up notice.
    pub fn wrapped_up(&self) -> bool {
        self.shared.tally().wrapped
    }

    /// Usage of every model call so far, side calls included.
    pub fn usage(&self) -> CallUsage {
        self.shared.tally().usage
    }

    /// The cost of every model call so far, when each could be priced.
    pub fn cost_usd(&self) -> Option<f64> {
        self.shared.tally().cost
    }

    /// The token or cost budget the calls so far have crossed (spent more than), if any: such a
    /// run is never a success.
    pub fn overspent(&self) -> Option<Budget> {
        self.shared.tally().crossed(&self.shared.config.pace)
    }

    /// Whether the gateway answered any call itself because a budget was spent.
    pub fn refused_any(&self) -> bool {
        self.shared.tally().refused > 0
    }

    /// The shared budget (pool) that made the last call the last, or refused a call.
    pub fn pool(&self) -> Option<String> {
        self.shared.tally().pool.clone()
    }

    /// Which budget made the last call the last one, or refused a call (`None`: no budget did,
    /// e.g. a loop forced it). A shared budget's refusal names its measure (see [`Gateway::pool`]).
    pub fn reason(&self) -> Option<Budget> {
        self.shared.tally().reason
    }

    /// The text of the last model call's reply, once it has streamed through.
    pub fn final_text(&self) -> Option<String> {
        self.shared.tally().final_text.clone()
    }

    /// Makes the next main request the last one (tool-less, with the wrap-up notice), whatever
    /// the budget: for a run that must end for another reason, such as a loop.
    pub fn force_last(&self) {
        self.shared.tally().force_last = true;
    }

    /// Makes the next main request the last one because the shared budget `pool` is spent by
    /// other runs (its `budget` measure): tool-less, with the notice naming the pool, and
    /// forwarded even though the shared budget would refuse it, so the run wraps up instead of
    /// being answered by the gateway. The run's own budgets still refuse a call they cannot pay.
    pub fn wrap_up_for(&self, pool: &str, budget: Budget) {
        let mut t = self.shared.tally();
        t.force_last = true;
        t.outside = true;
        t.pool.get_or_insert_with(|| pool.to_owned());
        t.reason.get_or_insert(budget);
    }

    /// The staged notices sent so far, in order ([`Staged`]).
    pub fn notices(&self) -> Vec<SentNotice> {
        self.shared.tally().told.sent.clone()
    }

    /// Adds `text` (starting `system notice: `) to the next forwarded main request, once.
    pub fn push_notice(&self, text: &str) {
        self.shared.tally().notice = Some(text.to_owned());
    }

    /// Stops serving and waits for the gateway's thread (bounded: streams still open are cut).
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

/// 128 random bits from the kernel, as hex: the per-run path token.
fn token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests;
