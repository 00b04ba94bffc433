//! A run's pools: which it joins (`match` and `--pool`), its admission at the start (refused
//! when a pool is spent or full, or waiting for a slot with `--wait-for-pool`), its budgets
//! lowered to each pool's share, its lease renewed by a thread of its own, its spend charged
//! live and its pools watched while it runs ([`live`]), and the rest of its spend charged when
//! it ends.

mod end;
mod live;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use stepguard_config::{ConfigModel, Origin, PoolConfig, RunFacts};
use stepguard_core::{FailureSlug, PoolLedger, RunRecord, StepLimit};
use stepguard_gateway::{Budget, CallSpend, PoolLeft, Reservation, SharedBudget};
use stepguard_ledger::{
    Admission, ChargeKey, Exhaustion, Grant, Ledger, Measure, PoolSpec, RunKey, Share, Usage,
    micros_to_usd, usd_to_micros,
};

use crate::exit::UsageError;
use crate::output;
use crate::settings::Limits;

pub(crate) use live::{LiveKeeper, LiveObserver};

/// How often `--wait-for-pool` asks again for a slot.
const WAIT_POLL: Duration = Duration::from_millis(250);

/// A run refused at the start by a pool: `pool_exhausted` or `pool_busy` (exit 3).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct PoolRefused {
    /// The slug of the refusal.
    pub slug: FailureSlug,
    /// What the user reads: the pool, what is spent and when the window frees enough.
    pub message: String,
}

/// The pools a run joins: every pool whose `match` it meets, and those `named` (`--pool`); an
/// unknown name is an error naming the pools there are.
pub(crate) fn select(
    model: &ConfigModel,
    run: &RunFacts<'_>,
    named: &[String],
) -> anyhow::Result<Vec<PoolConfig>> {
    for name in named {
        if !model.pools.contains_key(name) {
            let known: Vec<&str> = model.pools.keys().map(String::as_str).collect();
            let known = if known.is_empty() {
                "no pool is declared; add a [pools.NAME] table to a config file".to_owned()
            } else {
                format!("the pools are: {}", known.join(", "))
            };
            return Err(UsageError(format!("--pool {name}: no such pool; {known}")).into());
        }
    }
    Ok(model
        .pools
        .values()
        .filter(|p| p.matcher.matches(run) || named.contains(&p.name))
        .cloned()
        .collect())
}

/// A run admitted to its pools.
pub(crate) struct Membership {
    ledger: Arc<dyn Ledger>,
    /// Which ledger keeps the pools, for the record.
    mark: PoolLedger,
    run: RunKey,
    pools: Vec<PoolConfig>,
    shares: Vec<Share>,
    /// What the gateway settled per model call, so the end-of-run charge leaves it out.
    settled: Arc<Mutex<Usage>>,
    /// Whether the ledger was away at some point of the run.
    lost: Arc<AtomicBool>,
    /// The history database, beside which an end charge the ledger did not take is kept.
    history: std::path::PathBuf,
    /// How often the run reads its pools' allowance while it runs.
    watch: Duration,
}

/// The sequence number of the end-of-run charge; model call `n` reserves and settles `n + 1`.
const END_CHARGE: u64 = 1;

/// The run's pools as the gateway sees them: every main model call reserves its estimate in
/// the ledger, atomically over all the run's pools, and settles to its real usage after.
struct PoolBudget {
    ledger: Arc<dyn Ledger>,
    run: RunKey,
    settled: Arc<Mutex<Usage>>,
    /// The calls settled, so a call settled twice is left out of the end charge once.
    seen: Mutex<std::collections::HashSet<u64>>,
    /// Whether the ledger is away now, as the last call found it (said once per absence).
    warned: AtomicBool,
    /// Whether the ledger was ever away during the run (shared with the end charge).
    lost: Arc<AtomicBool>,
    /// The caps of the run's pools, for the share the staged notices tell of.
    caps: Vec<PoolSpec>,
    /// What each pool had left after the latest granted reservation.
    last: Mutex<Vec<Share>>,
}

impl PoolBudget {
    fn key(&self, seq: u64) -> ChargeKey {
        ChargeKey {
            run: self.run.clone(),
            seq: seq.saturating_add(END_CHARGE),
        }
    }

    /// A ledger fault mid-run: said once; the run goes on under its own (pool-lowered) budget.
    fn warn(&self, e: &stepguard_ledger::LedgerError) {
        self.lost.store(true, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            output::diag(
                "warning",
                format!(
                    "cannot reserve model calls in this run's pools ({e}); the run goes on under \
                     its own budget and the pools' share it last knew, and what it spends is \
                     charged at its end"
                ),
            );
        }
    }
}

impl PoolBudget {
    /// A call the ledger answered: when it was away, says it is back.
    fn answered(&self) {
        if self.warned.swap(false, Ordering::Relaxed) {
            output::note(
                "the pools' ledger is back: model calls reserve in the pools again, and what \
                 the run spent meanwhile is charged at its end",
            );
        }
    }
}

/// The gateway's word for a pool measure.
fn budget_of(measure: Measure) -> Budget {
    match measure {
        Measure::Cost => Budget::Cost,
        Measure::Tokens => Budget::Tokens,
        Measure::Steps | Measure::Runs => Budget::Steps,
    }
}

/// The ledger's usage of a model call.
fn usage_of(spend: CallSpend) -> Usage {
    Usage {
        tokens: spend.tokens,
        cost_micros: usd_to_micros(spend.cost_usd),
        steps: 0,
    }
}

/// The first pool whose share after this call cannot pay `after`: this call must be the last.
fn last_for(shares: &[Share], after: Usage) -> Option<Reservation> {
    shares.iter().find_map(|share| {
        [Measure::Tokens, Measure::Cost].into_iter().find_map(|m| {
            let left = share.left(m)?;
            (m.of(&after) > left).then(|| Reservation::Last {
                pool: share.pool.clone(),
                budget: budget_of(m),
            })
        })
    })
}

impl SharedBudget for PoolBudget {
    fn reserve(&self, seq: u64, next: CallSpend, after: CallSpend) -> Reservation {
        // At least a token and a micro-dollar: a spent pool refuses even a call of no estimate.
        let estimate = Usage {
            tokens: next.tokens.max(1),
            cost_micros: usd_to_micros(next.cost_usd).max(1),
            steps: 0,
        };
        match self
            .ledger
            .reserve(&self.key(seq), estimate, SystemTime::now())
        {
            Ok(Grant::Granted(shares)) => {
                self.answered();
                let answer = last_for(&shares, usage_of(after)).unwrap_or(Reservation::Go);
                *self.last.lock().unwrap_or_else(PoisonError::into_inner) = shares;
                answer
            }
            Ok(Grant::Refused(e)) => {
                self.answered();
                Reservation::Refused {
                    pool: e.pool,
                    budget: budget_of(e.measure),
                }
            }
            Err(e) => {
                self.warn(&e);
                Reservation::Go
            }
        }
    }

    /// The most spent token or cost share of the run's pools, as the latest grant left it.
    fn left(&self) -> Option<PoolLeft> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        most_spent(&self.caps, &last)
    }

    fn settle(&self, seq: u64, actual: CallSpend) {
        let usage = usage_of(actual);
        match self.ledger.settle(&self.key(seq), usage, SystemTime::now()) {
            Ok(_) => {
                self.answered();
                let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                if !seen.insert(seq) {
                    return;
                }
                let mut s = self.settled.lock().unwrap_or_else(PoisonError::into_inner);
                s.tokens = s.tokens.saturating_add(usage.tokens);
                s.cost_micros = s.cost_micros.saturating_add(usage.cost_micros);
            }
            Err(e) => self.warn(&e),
        }
    }
}

/// Of `shares`, the token or cost share with the least left for its cap, in the gateway's units
/// (tokens, dollars).
fn most_spent(caps: &[PoolSpec], shares: &[Share]) -> Option<PoolLeft> {
    let mut best: Option<(f64, PoolLeft)> = None;
    for share in shares {
        let Some(spec) = caps.iter().find(|c| c.name == share.pool) else {
            continue;
        };
        for m in [Measure::Tokens, Measure::Cost] {
            let (Some(left), Some(cap)) = (share.left(m), spec.limits.cap(m)) else {
                continue;
            };
            if cap == 0 {
                continue;
            }
            let ratio = left as f64 / cap as f64;
            if best.as_ref().is_some_and(|(r, _)| *r <= ratio) {
                continue;
            }
            let (left, cap) = match m {
                Measure::Cost => (micros_to_usd(left), micros_to_usd(cap)),
                _ => (left as f64, cap as f64),
            };
            let pool = share.pool.clone();
            let budget = budget_of(m);
            best = Some((
                ratio,
                PoolLeft {
                    pool,
                    budget,
                    left,
                    cap,
                },
            ));
        }
    }
    best.map(|(_, p)| p)
}

/// A name for this run unique across hosts: host, boot, pid and the start time.
pub(crate) fn run_key() -> RunKey {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    RunKey::new(format!(
        "{}/{}/{}/{nanos}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id"),
        std::process::id()
    ))
}

/// Joins `pools`, waiting up to `wait` while a concurrency cap is full; a spent pool, or a full
/// one past the wait, is a [`PoolRefused`].
pub(crate) fn admit(
    opened: crate::ledger::Opened,
    pools: Vec<PoolConfig>,
    wait: Option<Duration>,
) -> anyhow::Result<Membership> {
    let (ledger, mark, history): (Arc<dyn Ledger>, _, _) =
        (opened.ledger.into(), opened.mark, opened.history);
    let watch = live::watch_interval()?;
    let run = run_key();
    let specs: Vec<_> = pools.iter().map(PoolConfig::spec).collect();
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        match ledger.join(&run, &specs, SystemTime::now())? {
            Admission::Admitted(shares) => {
                return Ok(Membership {
                    ledger,
                    mark,
                    run,
                    pools,
                    shares,
                    settled: Arc::default(),
                    lost: Arc::default(),
                    history,
                    watch,
                });
            }
            Admission::Exhausted(e) => {
                return Err(PoolRefused {
                    slug: FailureSlug::PoolExhausted,
                    message: exhausted(&e),
                }
                .into());
            }
            Admission::Busy(b) if deadline.is_some_and(|d| Instant::now() < d) => {
                tracing::debug!(pool = %b.pool, running = b.running, "waiting for a slot");
                std::thread::sleep(WAIT_POLL);
            }
            Admission::Busy(b) => {
                let waited = wait.map_or_else(String::new, |w| {
                    format!(" after waiting {}", humantime::format_duration(w))
                });
                let message = format!(
                    "pool `{}` is full: {} of {} concurrent runs{waited}; try again later, or wait \
                     for a slot with --wait-for-pool DUR",
                    b.pool, b.running, b.cap
                );
                return Err(PoolRefused {
                    slug: FailureSlug::PoolBusy,
                    message,
                }
                .into());
            }
        }
    }
}

/// What a refusal says: the pool, what is spent of what, and when the window frees enough.
fn exhausted(e: &Exhaustion) -> String {
    let amount = |v: u64| match e.measure {
        Measure::Cost => format!("${:.2}", micros_to_usd(v)),
        Measure::Tokens => format!("{v} tokens"),
        Measure::Steps => format!("{v} steps"),
        Measure::Runs => format!("{v} runs"),
    };
    let when = match e.frees_at {
        Some(t) => format!(
            "the window frees enough at {}",
            humantime::format_rfc3339_seconds(t)
        ),
        None => "its window never frees (window = \"none\"): raise the cap".to_owned(),
    };
    format!(
        "pool `{}` is spent: {} of {} ({}); {when}",
        e.pool,
        amount(e.spent),
        amount(e.cap),
        e.measure.key()
    )
}

impl Membership {
    /// Which ledger keeps the run's pools, for the record.
    pub(crate) fn ledger(&self) -> PoolLedger {
        self.mark
    }

    /// The names of the pools joined, for the record.
    pub(crate) fn names(&self) -> Vec<String> {
        self.pools.iter().map(|p| p.name.clone()).collect()
    }

    /// Lowers the run's own budgets to the least pool share: the steps, tokens and cost a pool
    /// has left become the run's budget when they are tighter, with `pool NAME` as its source.
    pub(crate) fn clamp(&self, limits: &mut Limits) {
        for (share, pool) in self.shares.iter().zip(&self.pools) {
            let file = match pool.origins.first() {
                Some(Origin::File { path, .. }) => Some(path.clone()),
                _ => None,
            };
            let source = format!("pool {}", pool.name);
            if let Some(left) = share.tokens {
                let t = &mut limits.spend.tokens;
                if t.value.is_none_or(|v| left < v) {
                    (t.value, t.source, t.source_file) = (Some(left), source.clone(), file.clone());
                }
            }
            if let Some(left) = share.cost_micros.map(micros_to_usd) {
                let c = &mut limits.spend.cost;
                if c.value.is_none_or(|v| left < v) {
                    (c.value, c.source, c.source_file) = (Some(left), source.clone(), file.clone());
                }
            }
            if let Some(left) = share.steps.map(|s| u32::try_from(s).unwrap_or(u32::MAX)) {
                let b = &mut limits.budget;
                if b.max_steps.get().is_none_or(|v| left < v) {
                    (b.max_steps, b.source, b.source_file) =
                        (StepLimit::Limited(left), source.clone(), file);
                }
            }
        }
    }

    /// The run's pools for its gateway: each main model call reserves in them and settles.
    pub(crate) fn shared_budget(&self) -> Arc<dyn SharedBudget> {
        Arc::new(PoolBudget {
            ledger: Arc::clone(&self.ledger),
            run: self.run.clone(),
            settled: Arc::clone(&self.settled),
            seen: Mutex::default(),
            warned: AtomicBool::new(false),
            lost: Arc::clone(&self.lost),
            caps: self.pools.iter().map(PoolConfig::spec).collect(),
            last: Mutex::default(),
        })
    }

    /// Starts renewing the run's lease, a third of the lease time apart, on a thread of its own.
    pub(crate) fn renew(&self) -> Renewer {
        let (stop, stopped) = mpsc::channel::<()>();
        let (ledger, run) = (Arc::clone(&self.ledger), self.run.clone());
        let lost = Arc::clone(&self.lost);
        let every = ledger.lease_time() / 3;
        let thread = std::thread::Builder::new()
            .name("stepguard-lease".into())
            .spawn(move || {
                let mut warned = false;
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let renewed = ledger.renew(&run, SystemTime::now());
                    if renewed.is_err() {
                        lost.store(true, Ordering::Relaxed);
                    }
                    if let Err(e) = renewed
                        && !std::mem::replace(&mut warned, true)
                    {
                        output::diag(
                            "warning",
                            format!(
                                "cannot renew this run's place in its pools ({e}); the run goes \
                                 on under its own budget and the pools' share it started with"
                            ),
                        );
                    }
                }
            })
            .ok();
        Renewer { stop, thread }
    }

    /// Starts keeping the run's pools live (see [`live`]): the observer feeds the stream's
    /// spend to a thread that charges it and reads the pools' allowance, and tells the run
    /// through `limits` when other runs spent one of its pools.
    pub(crate) fn live(
        &self,
        limits: stepguard_runner::OutsideLimits,
    ) -> (LiveKeeper, LiveObserver) {
        live::Keeper {
            ledger: Arc::clone(&self.ledger),
            run: self.run.clone(),
            start: self.shares.clone(),
            settled: Arc::clone(&self.settled),
            tell: Some(Box::new(move |limit| {
                limits.reached(limit);
            })),
            watch: self.watch,
        }
        .spawn()
    }

    /// Charges what the run spent (steps, tokens, cost from its record) to its pools, once, and
    /// leaves them; what its model calls already settled and what was charged live are left
    /// out. Within the run's exit bound `by` (at least [`end::END_FLOOR`]): a ledger that has
    /// not answered by then, or cannot be reached, has what is owed kept in the outbox for the
    /// next stepguard; another ledger fault is a warning.
    pub(crate) fn finish(
        self,
        record: &RunRecord,
        renewer: Renewer,
        live: LiveKeeper,
        by: Instant,
    ) {
        let charge = end::EndCharge {
            ledger: Arc::clone(&self.ledger),
            run: self.run.clone(),
            settled: Arc::clone(&self.settled),
            total: end::spent_by(record),
        };
        let book = live.book();
        let stop = move || {
            let book = live.stop();
            renewer.stop();
            book
        };
        match charge.run(stop, book, by) {
            end::Ended::Charged(usage) if self.lost.load(Ordering::Relaxed) => {
                output::note(format!(
                    "the pools' ledger is back: this run's spend ({}) is charged to its pools, once",
                    spent(usage)
                ));
            }
            end::Ended::Charged(_) => {}
            end::Ended::Failed(e @ stepguard_ledger::LedgerError::Unreachable { .. }, owed) => {
                self.keep(&owed, &e.to_string());
            }
            end::Ended::Failed(e, _) => output::diag(
                "warning",
                format!("cannot charge this run to its pools: {e}"),
            ),
            end::Ended::Late(owed) => {
                self.keep(
                    &owed,
                    "the pools' ledger did not answer by the run's exit bound",
                );
            }
        }
    }

    /// Keeps the charges the ledger did not take in the outbox beside the history database,
    /// for the next stepguard that reaches the ledger to charge (once each); says where.
    fn keep(&self, owed: &[(ChargeKey, Usage)], why: &str) {
        let name = self.ledger.describe();
        let kept = owed.iter().try_fold(None, |_, (key, usage)| {
            crate::pool_outbox::keep(&self.history, &name, key, *usage).map(Some)
        });
        let said = match kept {
            Ok(_) => format!(
                "cannot charge this run to its pools ({why}); its spend ({}) is kept in {} and \
                 the next stepguard to reach the ledger charges it, once",
                end::owed_in_words(owed),
                crate::pool_outbox::dir(&self.history).display()
            ),
            Err(io) => format!(
                "cannot charge this run to its pools ({why}), nor keep the charge in {}: {io}",
                crate::pool_outbox::dir(&self.history).display()
            ),
        };
        output::diag("warning", said);
    }
}

/// A charge in words: `N tokens, $C, S steps`.
fn spent(usage: Usage) -> String {
    format!(
        "{} tokens, ${:.4}, {} steps",
        usage.tokens,
        micros_to_usd(usage.cost_micros),
        usage.steps
    )
}

/// The thread renewing a run's lease.
pub(crate) struct Renewer {
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Renewer {
    fn stop(self) {
        drop(self.stop);
        if let Some(t) = self.thread {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use stepguard_ledger::sqlite::SqliteLedger;
    use stepguard_ledger::{PoolLimits, PoolSpec, Window};

    use super::*;

    #[test]
    fn the_notices_tell_of_the_most_spent_share_in_tokens_or_dollars() {
        let spec = |name: &str, tokens, cost| PoolSpec {
            name: name.into(),
            limits: PoolLimits {
                max_tokens: tokens,
                max_cost_micros: cost,
                ..PoolLimits::default()
            },
            window: Window::Lifetime,
        };
        let caps = [
            spec("a", Some(1000), None),
            spec("b", None, Some(2_000_000)),
        ];
        let share = |pool: &str, tokens, cost_micros| Share {
            pool: pool.into(),
            tokens,
            cost_micros,
            steps: None,
        };
        let left = most_spent(
            &caps,
            &[share("a", Some(500), None), share("b", None, Some(400_000))],
        );
        assert_eq!(
            left,
            Some(PoolLeft {
                pool: "b".into(),
                budget: Budget::Cost,
                left: 0.4,
                cap: 2.0
            })
        );
        let left = most_spent(&caps, &[share("a", Some(100), None)]).unwrap();
        assert_eq!(
            (left.pool.as_str(), left.left, left.cap),
            ("a", 100.0, 1000.0)
        );
        assert_eq!(most_spent(&caps, &[]), None);
        assert_eq!(most_spent(&[], &[share("a", Some(1), None)]), None);
    }

    fn tokens(tokens: u64) -> CallSpend {
        CallSpend {
            tokens,
            cost_usd: 0.0,
        }
    }

    /// A run's model calls in a pool of 300 tokens, over the real local ledger: the second
    /// call of 120 is the last that fits (the pool names itself), the third is refused, each
    /// settled call is charged once, and the end charge leaves them out.
    #[test]
    fn model_calls_reserve_and_settle_in_the_ledger_once() {
        let dir = tempfile::tempdir().unwrap();
        let ledger: Arc<dyn Ledger> =
            Arc::new(SqliteLedger::open(&dir.path().join("history.db")).unwrap());
        let spec = PoolSpec {
            name: "daily".into(),
            limits: PoolLimits {
                max_tokens: Some(300),
                ..PoolLimits::default()
            },
            window: Window::Rolling(Duration::from_secs(3600)),
        };
        let run = RunKey::new("host/1");
        let now = SystemTime::now();
        assert!(matches!(
            ledger.join(&run, std::slice::from_ref(&spec), now).unwrap(),
            Admission::Admitted(_)
        ));
        let settled = Arc::new(Mutex::new(Usage::default()));
        let budget = PoolBudget {
            ledger: Arc::clone(&ledger),
            run: run.clone(),
            settled: Arc::clone(&settled),
            seen: Mutex::default(),
            warned: AtomicBool::new(false),
            lost: Arc::default(),
            caps: Vec::new(),
            last: Mutex::default(),
        };
        assert_eq!(budget.reserve(1, tokens(120), tokens(120)), Reservation::Go);
        budget.settle(1, tokens(120));
        let last = Reservation::Last {
            pool: "daily".into(),
            budget: Budget::Tokens,
        };
        assert_eq!(budget.reserve(2, tokens(120), tokens(120)), last);
        budget.settle(2, tokens(120));
        // A replayed settle is not charged again.
        budget.settle(2, tokens(120));
        let refused = Reservation::Refused {
            pool: "daily".into(),
            budget: Budget::Tokens,
        };
        assert_eq!(budget.reserve(3, tokens(120), tokens(120)), refused);
        let status = ledger.status(&[spec], SystemTime::now()).unwrap();
        let measure = &status[0].measures[0];
        assert_eq!((measure.charged, measure.reserved), (240, 0));
        // The end charge (seq 1) is apart from the calls' keys (2, 3, …).
        assert_eq!(budget.key(1).seq, 2);
        assert_eq!(
            settled.lock().unwrap().tokens,
            240,
            "settled once each, left out of the end charge"
        );
        assert!(!budget.warned.load(Ordering::Relaxed));
    }

    /// A ledger that cannot be reached.
    pub(super) struct Down;

    fn down<T>() -> Result<T, stepguard_ledger::LedgerError> {
        Err(stepguard_ledger::LedgerError::Unreachable {
            ledger: "test".into(),
            reason: "stopped".into(),
            source: None,
        })
    }

    impl Ledger for Down {
        fn lease_time(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn describe(&self) -> String {
            "test".into()
        }
        fn join(
            &self,
            _: &RunKey,
            _: &[PoolSpec],
            _: SystemTime,
        ) -> Result<Admission, stepguard_ledger::LedgerError> {
            down()
        }
        fn reserve(
            &self,
            _: &ChargeKey,
            _: Usage,
            _: SystemTime,
        ) -> Result<Grant, stepguard_ledger::LedgerError> {
            down()
        }
        fn settle(
            &self,
            _: &ChargeKey,
            _: Usage,
            _: SystemTime,
        ) -> Result<Vec<Share>, stepguard_ledger::LedgerError> {
            down()
        }
        fn charge(
            &self,
            _: &ChargeKey,
            _: Usage,
            _: SystemTime,
        ) -> Result<Vec<Share>, stepguard_ledger::LedgerError> {
            down()
        }
        fn renew(&self, _: &RunKey, _: SystemTime) -> Result<(), stepguard_ledger::LedgerError> {
            down()
        }
        fn leave(&self, _: &RunKey, _: SystemTime) -> Result<(), stepguard_ledger::LedgerError> {
            down()
        }
        fn allowance(
            &self,
            _: &RunKey,
            _: SystemTime,
        ) -> Result<Vec<Share>, stepguard_ledger::LedgerError> {
            down()
        }
        fn status(
            &self,
            _: &[PoolSpec],
            _: SystemTime,
        ) -> Result<Vec<stepguard_ledger::PoolStatus>, stepguard_ledger::LedgerError> {
            down()
        }
    }

    /// The ledger lost mid-run: calls go on (under the run's own, pool-lowered budget), with a
    /// warning, and what could not be settled stays for the end charge.
    #[test]
    fn a_lost_ledger_lets_calls_go_on_and_leaves_them_to_the_end_charge() {
        let settled = Arc::new(Mutex::new(Usage::default()));
        let budget = PoolBudget {
            ledger: Arc::new(Down),
            run: RunKey::new("host/2"),
            settled: Arc::clone(&settled),
            seen: Mutex::default(),
            warned: AtomicBool::new(false),
            lost: Arc::default(),
            caps: Vec::new(),
            last: Mutex::default(),
        };
        assert_eq!(budget.reserve(1, tokens(120), tokens(120)), Reservation::Go);
        assert!(budget.warned.load(Ordering::Relaxed), "said");
        budget.settle(1, tokens(120));
        assert_eq!(budget.reserve(2, tokens(120), tokens(120)), Reservation::Go);
        assert_eq!(
            *settled.lock().unwrap(),
            Usage::default(),
            "nothing settled"
        );
    }
}
