//! The end of a run in its pools: what it spent and nothing charged yet is charged, once, and
//! it leaves, within the run's exit bound.
//!
//! The charges owed are keyed: a live charge whose answer never came is owed under its own
//! key, and the rest under the end charge's. The ledger works on a thread of its own; a ledger
//! that has not answered by the exit bound (a fleet server gone, a database locked) is not
//! waited for: what is owed goes to the outbox beside the history database, and whichever of
//! the two reaches the ledger second finds its keys taken, so nothing is charged twice.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use stepguard_core::RunRecord;
use stepguard_ledger::{ChargeKey, Ledger, LedgerError, RunKey, Usage, usd_to_micros};

use super::live::Book;
use super::{END_CHARGE, spent};

/// However late the run ends, its pools' ledger gets this long to take the end charge.
pub(crate) const END_FLOOR: Duration = Duration::from_millis(250);

/// What a run owes its pools at its end.
#[derive(Clone)]
pub(crate) struct EndCharge {
    pub ledger: Arc<dyn Ledger>,
    pub run: RunKey,
    /// What the gateway settled per model call.
    pub settled: Arc<Mutex<Usage>>,
    /// What the run spent, from its record.
    pub total: Usage,
}

/// How the ledger took the end of a run.
pub(crate) enum Ended {
    /// Every charge taken and the run left its pools; the end charge's amount.
    Charged(Usage),
    /// The ledger failed: why, and the charges it did not take (in order).
    Failed(LedgerError, Vec<(ChargeKey, Usage)>),
    /// No answer by the bound: the charges owed as they stood.
    Late(Vec<(ChargeKey, Usage)>),
}

/// What the run spent, from its record: tokens (input and output), cost and steps.
pub(crate) fn spent_by(record: &RunRecord) -> Usage {
    Usage {
        tokens: record
            .usage
            .tokens
            .map_or(0, |t| t.input_tokens.saturating_add(t.output_tokens)),
        cost_micros: record.usage.cost_usd.map_or(0, usd_to_micros),
        steps: record.counts.num_steps_computed.unwrap_or(0),
    }
}

fn minus(a: Usage, b: Usage) -> Usage {
    Usage {
        tokens: a.tokens.saturating_sub(b.tokens),
        cost_micros: a.cost_micros.saturating_sub(b.cost_micros),
        steps: a.steps.saturating_sub(b.steps),
    }
}

impl EndCharge {
    /// The charges owed, given the live charges' book: the unanswered live charge under its own
    /// key, then the end charge of what is left (the total less what was settled per call,
    /// charged live, or is owed under the live charge's key).
    pub(crate) fn owed(&self, book: &Book) -> Vec<(ChargeKey, Usage)> {
        let settled = *self.settled.lock().unwrap_or_else(PoisonError::into_inner);
        let mut rest = minus(minus(self.total, settled), book.charged);
        let mut owed = Vec::with_capacity(2);
        if let Some((seq, amount)) = book.pending {
            rest = minus(rest, amount);
            owed.push((self.key(seq), amount));
        }
        owed.push((self.key(END_CHARGE), rest));
        owed
    }

    fn key(&self, seq: u64) -> ChargeKey {
        ChargeKey {
            run: self.run.clone(),
            seq,
        }
    }

    /// Charges what is owed, in order, and leaves the pools.
    fn charge(&self, book: &Book) -> Ended {
        let owed = self.owed(book);
        let now = SystemTime::now();
        for (i, (key, usage)) in owed.iter().enumerate() {
            if let Err(e) = self.ledger.charge(key, *usage, now) {
                return Ended::Failed(e, owed[i..].to_vec());
            }
        }
        let end = owed.last().map(|(_, usage)| *usage).unwrap_or_default();
        match self.ledger.leave(&self.run, now) {
            Ok(()) => Ended::Charged(end),
            Err(e) => Ended::Failed(e, Vec::new()),
        }
    }

    /// Stops the live keeper (`stop`, which returns its book) and the lease's renewal (`done`),
    /// then charges, on a thread of its own; waits for it until `by`, at least [`END_FLOOR`].
    pub(crate) fn run(
        self,
        stop: impl FnOnce() -> Book + Send + 'static,
        book: Arc<Mutex<Book>>,
        by: Instant,
    ) -> Ended {
        let (tx, rx) = mpsc::channel();
        let worker = self.clone();
        let spawned = std::thread::Builder::new()
            .name("stepguard-pool-end".into())
            .spawn(move || {
                let book = stop();
                let _ = tx.send(worker.charge(&book));
            });
        if spawned.is_err() {
            return Ended::Late(self.owed(&lock(&book)));
        }
        let wait = by
            .max(Instant::now() + END_FLOOR)
            .saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(ended) => ended,
            Err(_) => Ended::Late(self.owed(&lock(&book))),
        }
    }
}

fn lock(book: &Mutex<Book>) -> Book {
    *book.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The owed charges in words, for a message.
pub(crate) fn owed_in_words(owed: &[(ChargeKey, Usage)]) -> String {
    let total = owed.iter().fold(Usage::default(), |a, (_, u)| Usage {
        tokens: a.tokens.saturating_add(u.tokens),
        cost_micros: a.cost_micros.saturating_add(u.cost_micros),
        steps: a.steps.saturating_add(u.steps),
    });
    spent(total)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn usage(tokens: u64, steps: u64) -> Usage {
        Usage {
            tokens,
            cost_micros: 0,
            steps,
        }
    }

    fn end(ledger: Arc<dyn Ledger>, total: Usage, settled: Usage) -> EndCharge {
        EndCharge {
            ledger,
            run: RunKey::new("run-1"),
            settled: Arc::new(Mutex::new(settled)),
            total,
        }
    }

    /// The unanswered live charge keeps its key and amount and the end charge leaves it out, so
    /// a ledger that did take it (its answer lost) charges it once.
    #[test]
    fn an_unanswered_live_charge_is_owed_under_its_own_key() {
        let ledger: Arc<dyn Ledger> = Arc::new(super::super::tests::Down);
        let e = end(ledger, usage(1_000, 6), usage(300, 0));
        let book = Book {
            charged: usage(200, 4),
            pending: Some((1 << 40 | 3, usage(100, 1))),
        };
        let owed = e.owed(&book);
        let seqs: Vec<u64> = owed.iter().map(|(k, _)| k.seq).collect();
        assert_eq!(seqs, [1 << 40 | 3, END_CHARGE]);
        assert_eq!(owed[0].1, usage(100, 1));
        assert_eq!(
            owed[1].1,
            usage(400, 1),
            "1000 - 300 settled - 200 live - 100 pending"
        );
        assert_eq!(owed_in_words(&owed), "500 tokens, $0.0000, 2 steps");
    }

    /// A ledger call that never returns is not waited for past the bound: what is owed comes
    /// back, with the live keeper's book as it stood.
    #[test]
    fn a_ledger_that_does_not_answer_is_left_at_the_bound() {
        let ledger: Arc<dyn Ledger> = Arc::new(super::super::tests::Down);
        let e = end(ledger, usage(50, 2), Usage::default());
        let book = Arc::new(Mutex::new(Book {
            charged: usage(20, 1),
            pending: None,
        }));
        let started = Instant::now();
        let ended = e.run(
            || {
                std::thread::sleep(Duration::from_secs(30));
                Book::default()
            },
            Arc::clone(&book),
            Instant::now() + Duration::from_millis(100),
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let Ended::Late(owed) = ended else {
            panic!("not late")
        };
        assert_eq!(owed.len(), 1);
        assert_eq!((owed[0].0.seq, owed[0].1), (END_CHARGE, usage(30, 1)));
    }

    /// A ledger that refuses leaves every charge owed, in order.
    #[test]
    fn a_failing_ledger_leaves_every_charge_owed() {
        let ledger: Arc<dyn Ledger> = Arc::new(super::super::tests::Down);
        let e = end(ledger, usage(50, 2), Usage::default());
        let book = Book {
            charged: Usage::default(),
            pending: Some((1 << 40 | 1, usage(10, 0))),
        };
        let ended = e.run(
            move || book,
            Arc::new(Mutex::new(book)),
            Instant::now() + Duration::from_secs(5),
        );
        let Ended::Failed(_, owed) = ended else {
            panic!("not failed")
        };
        let seqs: Vec<u64> = owed.iter().map(|(k, _)| k.seq).collect();
        assert_eq!(seqs, [1 << 40 | 1, END_CHARGE]);
    }
}
