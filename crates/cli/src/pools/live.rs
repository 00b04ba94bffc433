//! A run's pools kept live while it runs, on a thread of its own: what the stream spends
//! (tokens, cost, steps, as the engine counts them) is charged to every pool the run joined a
//! few times a second, so other runs in them see it; and the pools' allowance is read every
//! [`WATCH_ENV`] interval (1 s by default), so that when other runs spent a pool the run is in,
//! the engine is told (an [`OutsideLimit`], through `stepguard_runner::OutsideLimits`) and
//! wraps the run up or stops it.
//!
//! Nothing here is on the enforcement path: the engine's progress ticks only send a total on a
//! channel ([`LiveObserver`]); the ledger is written and read by the keeper's thread. Every
//! charge carries the run's key and a sequence number of its own range, and a charge whose
//! answer was lost is sent again with the same key and amount before anything new, so nothing
//! is charged twice; the end-of-run charge leaves out what was charged live.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use stepguard_gateway::Budget;
use stepguard_ledger::{ChargeKey, Ledger, LedgerError, Measure, RunKey, Share, Usage};
use stepguard_runner::{OutsideLimit, Progress, RunObserver};

use crate::exit::UsageError;
use crate::output;

/// Environment variable setting how often a run reads its pools' allowance (default 1 s).
pub(crate) const WATCH_ENV: &str = "STEPGUARD_POOL_WATCH";

/// How often a run reads its pools' allowance unless [`WATCH_ENV`] says otherwise.
const DEFAULT_WATCH: Duration = Duration::from_secs(1);

/// At most this often the stream's spend is charged: a few charges a second, whatever the
/// stream does.
const CHARGE_EVERY: Duration = Duration::from_millis(250);

/// The sequence numbers of live charges start here, apart from the end charge (1) and the
/// gateway's model calls (2, 3, …).
const LIVE_SEQ: u64 = 1 << 40;

/// The watch interval in effect: `STEPGUARD_POOL_WATCH` (50 ms to 1 min), else 1 s.
pub(crate) fn watch_interval() -> anyhow::Result<Duration> {
    let Some(text) = std::env::var_os(WATCH_ENV) else {
        return Ok(DEFAULT_WATCH);
    };
    let text = text.to_string_lossy();
    humantime::parse_duration(&text)
        .ok()
        .filter(|d| (Duration::from_millis(50)..=Duration::from_secs(60)).contains(d))
        .ok_or_else(|| {
            UsageError(format!(
                "{WATCH_ENV}={text}: expected a duration from 50ms to 1m, e.g. 1s"
            ))
            .into()
        })
}

/// What the keeper is told.
enum Msg {
    /// What the run has spent so far, in total.
    Spent(Usage),
    /// The run is over: stop.
    Stop,
}

/// Sends the run's spend so far to the keeper on each progress tick (when it changed): a
/// channel send, nothing slower, on the engine's thread.
pub(crate) struct LiveObserver {
    tx: Sender<Msg>,
    last: Usage,
}

impl RunObserver for LiveObserver {
    fn tick(&mut self, progress: &Progress) {
        let spent = Usage {
            tokens: progress.stream_tokens,
            cost_micros: progress
                .stream_cost_usd
                .map_or(0, stepguard_ledger::usd_to_micros),
            steps: progress.steps,
        };
        if spent != self.last {
            self.last = spent;
            let _ = self.tx.send(Msg::Spent(spent));
        }
    }
}

/// What the live charges came to: what the ledger confirmed, and the charge sent whose answer
/// did not come (it may or may not have been taken: it is owed under its own key, never folded
/// into another charge).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Book {
    pub charged: Usage,
    pub pending: Option<(u64, Usage)>,
}

/// The keeper's thread, running until the run ends.
pub(crate) struct LiveKeeper {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    book: Arc<Mutex<Book>>,
}

impl LiveKeeper {
    /// The live charges' book as it stands, readable while the keeper is still at work (a
    /// ledger call that does not return).
    pub(crate) fn book(&self) -> Arc<Mutex<Book>> {
        Arc::clone(&self.book)
    }

    /// Stops the keeper (after its last try at a charge whose answer was lost) and returns its
    /// book; the end charge leaves out what it charged.
    pub(crate) fn stop(self) -> Book {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread {
            let _ = t.join();
        }
        *self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the keeper works with.
pub(crate) struct Keeper {
    pub ledger: Arc<dyn Ledger>,
    pub run: RunKey,
    /// What each pool had left for the run when it joined.
    pub start: Vec<Share>,
    /// What the gateway settled per model call (the run's own spend, besides the live charges).
    pub settled: Arc<Mutex<Usage>>,
    /// Where to say a pool is spent (the run's `OutsideLimits`); `None`: nobody to tell.
    pub tell: Option<Box<dyn Fn(OutsideLimit) + Send>>,
    /// How often the allowance is read.
    pub watch: Duration,
}

/// The keeper's state: what the stream reported, what is charged, the charge under way.
struct State {
    keeper: Keeper,
    seen: Usage,
    charged: Usage,
    /// A charge sent and not confirmed: sent again, with its key and amount, before any other.
    pending: Option<(u64, Usage)>,
    next_seq: u64,
    told: bool,
    warned: bool,
    /// `charged` and `pending`, published after every charge for the end of the run.
    book: Arc<Mutex<Book>>,
}

impl Keeper {
    /// Starts keeping the run's pools live; returns the keeper and the observer that feeds it.
    pub(crate) fn spawn(self) -> (LiveKeeper, LiveObserver) {
        let (tx, rx) = mpsc::channel();
        let state = State {
            keeper: self,
            seen: Usage::default(),
            charged: Usage::default(),
            pending: None,
            next_seq: LIVE_SEQ,
            told: false,
            warned: false,
            book: Arc::default(),
        };
        let book = Arc::clone(&state.book);
        let thread = std::thread::Builder::new()
            .name("stepguard-pool-live".into())
            .spawn(move || state.run(&rx))
            .ok();
        let observer = LiveObserver {
            tx: tx.clone(),
            last: Usage::default(),
        };
        (LiveKeeper { tx, thread, book }, observer)
    }
}

/// The larger of two totals, measure by measure (a total never goes back).
fn most(a: Usage, b: Usage) -> Usage {
    Usage {
        tokens: a.tokens.max(b.tokens),
        cost_micros: a.cost_micros.max(b.cost_micros),
        steps: a.steps.max(b.steps),
    }
}

fn plus(a: Usage, b: Usage) -> Usage {
    Usage {
        tokens: a.tokens.saturating_add(b.tokens),
        cost_micros: a.cost_micros.saturating_add(b.cost_micros),
        steps: a.steps.saturating_add(b.steps),
    }
}

fn minus(a: Usage, b: Usage) -> Usage {
    Usage {
        tokens: a.tokens.saturating_sub(b.tokens),
        cost_micros: a.cost_micros.saturating_sub(b.cost_micros),
        steps: a.steps.saturating_sub(b.steps),
    }
}

/// The runner's word for a pool measure.
fn budget_of(measure: Measure) -> Budget {
    match measure {
        Measure::Cost => Budget::Cost,
        Measure::Tokens => Budget::Tokens,
        Measure::Steps | Measure::Runs => Budget::Steps,
    }
}

impl State {
    /// Charges and watches until told to stop; its book says what was charged.
    fn run(mut self, rx: &Receiver<Msg>) {
        let mut next_charge = Instant::now();
        let mut next_watch = Instant::now() + self.keeper.watch;
        loop {
            let due = if self.owes() {
                next_charge.min(next_watch)
            } else {
                next_watch
            };
            match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(Msg::Spent(total)) => self.seen = most(self.seen, total),
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if self.owes() && now >= next_charge {
                self.charge();
                next_charge = now + CHARGE_EVERY;
            }
            if now >= next_watch {
                self.watch();
                next_watch = now + self.keeper.watch;
            }
        }
        // A charge whose answer was lost is sent once more, so the end charge knows.
        if self.pending.is_some() {
            self.charge();
        }
    }

    /// Whether something is to be charged.
    fn owes(&self) -> bool {
        self.pending.is_some() || !minus(self.seen, self.charged).is_zero()
    }

    /// Charges what the stream spent since the last charge (or the unconfirmed one again).
    fn charge(&mut self) {
        let (seq, amount) = *self.pending.get_or_insert_with(|| {
            self.next_seq += 1;
            (self.next_seq, minus(self.seen, self.charged))
        });
        let key = ChargeKey {
            run: self.keeper.run.clone(),
            seq,
        };
        *self.book.lock().unwrap_or_else(PoisonError::into_inner) = Book {
            charged: self.charged,
            pending: self.pending,
        };
        match self.keeper.ledger.charge(&key, amount, SystemTime::now()) {
            Ok(shares) => {
                self.pending = None;
                self.charged = plus(self.charged, amount);
                *self.book.lock().unwrap_or_else(PoisonError::into_inner) = Book {
                    charged: self.charged,
                    pending: None,
                };
                self.check(&shares);
            }
            Err(e) => self.warn(&e),
        }
    }

    /// Reads what the pools have left for the run.
    fn watch(&mut self) {
        if self.told || self.keeper.tell.is_none() {
            return;
        }
        match self
            .keeper
            .ledger
            .allowance(&self.keeper.run, SystemTime::now())
        {
            Ok(shares) => self.check(&shares),
            Err(e) => self.warn(&e),
        }
    }

    /// Tells the engine, once, that a pool the run is in has nothing left of a cap that the
    /// run itself did not spend (its own spend of its share is kept by its own budget).
    fn check(&mut self, shares: &[Share]) {
        if self.told {
            return;
        }
        let Some(tell) = &self.keeper.tell else {
            return;
        };
        let settled = *self
            .keeper
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let own = plus(self.charged, settled);
        let spent = shares.iter().find_map(|share| {
            let start = self.keeper.start.iter().find(|s| s.pool == share.pool)?;
            [Measure::Tokens, Measure::Cost, Measure::Steps]
                .into_iter()
                .find(|&m| {
                    share.left(m) == Some(0) && start.left(m).is_some_and(|s| m.of(&own) < s)
                })
                .map(|m| (share.pool.clone(), m))
        });
        if let Some((pool, measure)) = spent {
            self.told = true;
            tell(OutsideLimit {
                why: format!(
                    "pool `{pool}` is spent: nothing is left of its {}, spent by the runs in it",
                    measure.key()
                ),
                name: pool,
                measure: budget_of(measure),
            });
        }
    }

    /// A ledger fault: said once; the run goes on under its own budget.
    fn warn(&mut self, e: &LedgerError) {
        if !std::mem::replace(&mut self.warned, true) {
            output::diag(
                "warning",
                format!(
                    "cannot keep this run's pools live ({e}); the run goes on under its own \
                     budget and the pools' share it started with, and what it spends is charged \
                     at its end"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicU32, Ordering};

    use stepguard_core::StepLimit;
    use stepguard_ledger::sqlite::SqliteLedger;
    use stepguard_ledger::{Admission, PoolLimits, PoolSpec, PoolStatus, Window};

    use super::*;

    fn pool(max_tokens: u64) -> PoolSpec {
        PoolSpec {
            name: "daily".into(),
            limits: PoolLimits {
                max_tokens: Some(max_tokens),
                ..PoolLimits::default()
            },
            window: Window::Lifetime,
        }
    }

    fn join(ledger: &dyn Ledger, run: &RunKey, spec: &PoolSpec) -> Vec<Share> {
        match ledger
            .join(run, std::slice::from_ref(spec), SystemTime::now())
            .unwrap()
        {
            Admission::Admitted(shares) => shares,
            other => panic!("{other:?}"),
        }
    }

    fn charged(ledger: &dyn Ledger, spec: &PoolSpec) -> u64 {
        ledger
            .status(std::slice::from_ref(spec), SystemTime::now())
            .unwrap()[0]
            .measures[0]
            .charged
    }

    fn progress(tokens: u64, steps: u64) -> Progress {
        Progress {
            steps,
            limit: StepLimit::Unlimited,
            elapsed: Duration::ZERO,
            stream_tokens: tokens,
            stream_cost_usd: None,
        }
    }

    /// A ledger whose first `lose` charges are made but answered with an error (an answer lost
    /// on the way back).
    struct LosesAnswers {
        inner: SqliteLedger,
        lose: AtomicU32,
    }

    impl Ledger for LosesAnswers {
        fn lease_time(&self) -> Duration {
            self.inner.lease_time()
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn join(
            &self,
            run: &RunKey,
            pools: &[PoolSpec],
            now: SystemTime,
        ) -> Result<Admission, LedgerError> {
            self.inner.join(run, pools, now)
        }
        fn reserve(
            &self,
            key: &ChargeKey,
            estimate: Usage,
            now: SystemTime,
        ) -> Result<stepguard_ledger::Grant, LedgerError> {
            self.inner.reserve(key, estimate, now)
        }
        fn settle(
            &self,
            key: &ChargeKey,
            actual: Usage,
            now: SystemTime,
        ) -> Result<Vec<Share>, LedgerError> {
            self.inner.settle(key, actual, now)
        }
        fn charge(
            &self,
            key: &ChargeKey,
            actual: Usage,
            now: SystemTime,
        ) -> Result<Vec<Share>, LedgerError> {
            let shares = self.inner.charge(key, actual, now)?;
            if self
                .lose
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(LedgerError::Unreachable {
                    ledger: "test".into(),
                    reason: "the answer was lost".into(),
                    source: None,
                });
            }
            Ok(shares)
        }
        fn renew(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
            self.inner.renew(run, now)
        }
        fn leave(&self, run: &RunKey, now: SystemTime) -> Result<(), LedgerError> {
            self.inner.leave(run, now)
        }
        fn allowance(&self, run: &RunKey, now: SystemTime) -> Result<Vec<Share>, LedgerError> {
            self.inner.allowance(run, now)
        }
        fn status(
            &self,
            pools: &[PoolSpec],
            now: SystemTime,
        ) -> Result<Vec<PoolStatus>, LedgerError> {
            self.inner.status(pools, now)
        }
    }

    /// The stream's totals are charged as they grow, while the run goes on; a charge whose
    /// answer was lost is sent again with its key and is taken once; what the keeper returns is
    /// what the pool holds, so the end charge can leave it out.
    #[test]
    fn the_streams_spend_is_charged_live_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Arc::new(LosesAnswers {
            inner: SqliteLedger::open(&dir.path().join("history.db")).unwrap(),
            lose: AtomicU32::new(1),
        });
        let spec = pool(10_000);
        let run = RunKey::new("host/live");
        let start = join(ledger.as_ref(), &run, &spec);
        let (keeper, mut observer) = Keeper {
            ledger: Arc::clone(&ledger) as Arc<dyn Ledger>,
            run,
            start,
            settled: Arc::default(),
            tell: None,
            watch: Duration::from_millis(50),
        }
        .spawn();
        observer.tick(&progress(300, 2));
        let deadline = Instant::now() + Duration::from_secs(10);
        while charged(ledger.as_ref(), &spec) < 300 {
            assert!(Instant::now() < deadline, "never charged live");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The first answer was lost: the same key again, then the growth on a key of its own.
        observer.tick(&progress(500, 3));
        std::thread::sleep(CHARGE_EVERY * 3);
        observer.tick(&progress(700, 4));
        let live = keeper.stop();
        assert_eq!(live.pending, None);
        assert_eq!(
            live.charged,
            Usage {
                tokens: 700,
                cost_micros: 0,
                steps: 4
            }
        );
        assert_eq!(charged(ledger.as_ref(), &spec), 700, "each token once");
        assert_eq!(ledger.lose.load(Ordering::SeqCst), 0, "an answer was lost");
    }

    /// A pool other runs spent is told once, naming the pool and its measure; a pool the run
    /// spent itself (its whole share) is left to its own budget.
    #[test]
    fn a_pool_spent_by_others_is_told_once_and_one_spent_by_the_run_itself_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let ledger: Arc<dyn Ledger> =
            Arc::new(SqliteLedger::open(&dir.path().join("history.db")).unwrap());
        let spec = pool(1_000);
        let (me, other) = (RunKey::new("host/me"), RunKey::new("host/other"));
        let start = join(ledger.as_ref(), &me, &spec);
        join(ledger.as_ref(), &other, &spec);
        let told = Arc::new(Mutex::new(Vec::new()));
        let keep = |run: &RunKey, start: Vec<Share>| {
            let told = Arc::clone(&told);
            Keeper {
                ledger: Arc::clone(&ledger),
                run: run.clone(),
                start,
                settled: Arc::default(),
                tell: Some(Box::new(move |l| told.lock().unwrap().push(l))),
                watch: Duration::from_millis(50),
            }
            .spawn()
        };
        let (keeper, mut observer) = keep(&me, start.clone());
        observer.tick(&progress(200, 1));
        std::thread::sleep(Duration::from_millis(300));
        assert!(told.lock().unwrap().is_empty(), "800 left: nothing to tell");
        let key = ChargeKey {
            run: other.clone(),
            seq: 9,
        };
        ledger
            .charge(&key, Usage::tokens(900), SystemTime::now())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while told.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "never told");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(keeper.stop().charged.tokens, 200);
        let told_now = told.lock().unwrap().clone();
        assert_eq!(
            told_now,
            [OutsideLimit {
                name: "daily".into(),
                measure: Budget::Tokens,
                why: "pool `daily` is spent: nothing is left of its max_tokens, spent by the \
                      runs in it"
                    .into(),
            }],
            "told once"
        );

        // A run alone that spends its whole share: its own budget keeps it.
        told.lock().unwrap().clear();
        let spec = PoolSpec {
            name: "solo".into(),
            ..pool(500)
        };
        let solo = RunKey::new("host/solo");
        let start = join(ledger.as_ref(), &solo, &spec);
        let (keeper, mut observer) = keep(&solo, start);
        observer.tick(&progress(500, 1));
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(keeper.stop().charged.tokens, 500);
        assert!(
            told.lock().unwrap().is_empty(),
            "{:?}",
            told.lock().unwrap()
        );
    }
}
