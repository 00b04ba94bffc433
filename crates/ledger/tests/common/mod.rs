//! Behaviour every ledger must show, written against `&dyn Ledger` so that each ledger's tests
//! (the local SQLite one here, PostgreSQL's beside it) run the same checks.
#![allow(dead_code, missing_docs)]

use std::time::{Duration, SystemTime};

use stepguard_ledger::{
    Admission, ChargeKey, Grant, Ledger, Measure, PoolLimits, PoolSpec, RunKey, Usage, Window,
};

pub const HOUR: Duration = Duration::from_secs(3600);

pub fn t0() -> SystemTime {
    // A fixed instant, so windows and leases are exact.
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

pub fn pool(name: &str, limits: PoolLimits, window: Window) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        limits,
        window,
    }
}

pub fn tokens_pool(name: &str, cap: u64) -> PoolSpec {
    pool(
        name,
        PoolLimits {
            max_tokens: Some(cap),
            ..PoolLimits::default()
        },
        Window::Rolling(24 * HOUR),
    )
}

pub fn key(run: &str, seq: u64) -> ChargeKey {
    ChargeKey {
        run: RunKey::new(run),
        seq,
    }
}

pub fn admitted(a: Admission) -> Vec<stepguard_ledger::Share> {
    match a {
        Admission::Admitted(shares) => shares,
        other => panic!("expected admission, got {other:?}"),
    }
}

pub fn tokens_charged(ledger: &dyn Ledger, pool: &PoolSpec, now: SystemTime) -> (u64, u64) {
    let status = ledger
        .status(std::slice::from_ref(pool), now)
        .expect("status");
    let m = status[0]
        .measures
        .iter()
        .find(|m| m.measure == Measure::Tokens)
        .expect("a token cap");
    (m.charged, m.reserved)
}

/// Reserve, settle, refuse: the refusal names the pool, what is spent and when it frees.
pub fn reserves_settles_and_refuses(ledger: &dyn Ledger) {
    let p = tokens_pool("daily", 1_000);
    let other = tokens_pool("team", 10_000);
    let run = RunKey::new("r1");
    let shares = admitted(
        ledger
            .join(&run, &[p.clone(), other.clone()], t0())
            .expect("join"),
    );
    assert_eq!(shares[0].tokens, Some(1_000));
    let g = ledger
        .reserve(&key("r1", 1), Usage::tokens(600), t0())
        .expect("reserve");
    let Grant::Granted(left) = g else {
        panic!("refused: {g:?}")
    };
    assert_eq!(
        left.iter()
            .find(|s| s.pool == "daily")
            .and_then(|s| s.tokens),
        Some(400)
    );
    assert_eq!(tokens_charged(ledger, &p, t0()), (0, 600));
    let later = t0() + Duration::from_secs(60);
    let left = ledger
        .settle(&key("r1", 1), Usage::tokens(700), later)
        .expect("settle");
    assert_eq!(
        left.iter()
            .find(|s| s.pool == "daily")
            .and_then(|s| s.tokens),
        Some(300)
    );
    assert_eq!(tokens_charged(ledger, &p, later), (700, 0));
    // 400 more does not fit in daily (300 left): nothing is reserved in team either.
    match ledger
        .reserve(&key("r1", 2), Usage::tokens(400), later)
        .expect("reserve")
    {
        Grant::Refused(e) => {
            assert_eq!(
                (e.pool.as_str(), e.measure, e.spent, e.cap, e.asked),
                ("daily", Measure::Tokens, 700, 1_000, 400)
            );
            // The 700 charged at `later` age out of the 24 h window at later + 24 h.
            assert_eq!(e.frees_at, Some(later + 24 * HOUR));
        }
        g => panic!("granted past the cap: {g:?}"),
    }
    assert_eq!(tokens_charged(ledger, &other, later), (700, 0));
    // A day later the window has freed it.
    let next_day = later + 24 * HOUR + Duration::from_secs(1);
    assert!(matches!(
        ledger
            .reserve(&key("r1", 2), Usage::tokens(400), next_day)
            .expect("reserve"),
        Grant::Granted(_)
    ));
}

/// Replays of a charge, a settle and a reservation are not counted twice.
pub fn replays_are_not_charged_twice(ledger: &dyn Ledger) {
    let p = tokens_pool("replay", 10_000);
    let run = RunKey::new("replayer");
    admitted(
        ledger
            .join(&run, std::slice::from_ref(&p), t0())
            .expect("join"),
    );
    for _ in 0..3 {
        ledger
            .charge(&key("replayer", 1), Usage::tokens(100), t0())
            .expect("charge");
    }
    for _ in 0..3 {
        ledger
            .reserve(&key("replayer", 2), Usage::tokens(500), t0())
            .expect("reserve");
    }
    assert_eq!(tokens_charged(ledger, &p, t0()), (100, 500));
    for _ in 0..3 {
        ledger
            .settle(&key("replayer", 2), Usage::tokens(200), t0())
            .expect("settle");
    }
    // A settle of a key never reserved charges it, once.
    for _ in 0..2 {
        ledger
            .settle(&key("replayer", 3), Usage::tokens(50), t0())
            .expect("settle");
    }
    // A late reservation replay after its settle does not reserve again.
    ledger
        .reserve(&key("replayer", 2), Usage::tokens(500), t0())
        .expect("reserve");
    assert_eq!(tokens_charged(ledger, &p, t0()), (350, 0));
    // Joining again is not a second run, nor a second slot.
    let runs = pool(
        "runs",
        PoolLimits {
            max_runs: Some(1),
            max_concurrent_runs: Some(1),
            ..PoolLimits::default()
        },
        Window::Lifetime,
    );
    admitted(
        ledger
            .join(&RunKey::new("once"), std::slice::from_ref(&runs), t0())
            .expect("join"),
    );
    admitted(
        ledger
            .join(&RunKey::new("once"), std::slice::from_ref(&runs), t0())
            .expect("join again"),
    );
}

/// A charge for a run that joined nothing is an error, not a silent loss.
pub fn charges_need_a_membership(ledger: &dyn Ledger) {
    let err = ledger
        .charge(&key("stranger", 1), Usage::tokens(1), t0())
        .expect_err("charged a stranger");
    assert!(err.to_string().contains("stranger"), "{err}");
}

/// Concurrency caps, and leases that free a dead run's slot and reservations (not its spend).
pub fn leases_expire(ledger: &dyn Ledger) {
    let lease = ledger.lease_time();
    let p = pool(
        "slots",
        PoolLimits {
            max_concurrent_runs: Some(1),
            max_tokens: Some(1_000),
            ..PoolLimits::default()
        },
        Window::Rolling(HOUR),
    );
    admitted(
        ledger
            .join(&RunKey::new("dies"), std::slice::from_ref(&p), t0())
            .expect("join"),
    );
    ledger
        .charge(&key("dies", 1), Usage::tokens(300), t0())
        .expect("charge");
    ledger
        .reserve(&key("dies", 2), Usage::tokens(600), t0())
        .expect("reserve");
    match ledger
        .join(&RunKey::new("waits"), std::slice::from_ref(&p), t0())
        .expect("join")
    {
        Admission::Busy(b) => assert_eq!((b.pool.as_str(), b.running, b.cap), ("slots", 1, 1)),
        other => panic!("a second run got in: {other:?}"),
    }
    // Renewed just before the lease ends, the slot is still held.
    let renewed = t0() + lease - Duration::from_millis(10);
    ledger.renew(&RunKey::new("dies"), renewed).expect("renew");
    assert!(matches!(
        ledger
            .join(
                &RunKey::new("waits"),
                std::slice::from_ref(&p),
                renewed + Duration::from_millis(20)
            )
            .expect("join"),
        Admission::Busy(_)
    ));
    // Then it dies: one lease after its last renewal, the slot and its reservation are free.
    let after = renewed + lease + Duration::from_millis(1);
    let shares = admitted(
        ledger
            .join(&RunKey::new("waits"), std::slice::from_ref(&p), after)
            .expect("join"),
    );
    assert_eq!(
        shares[0].tokens,
        Some(700),
        "the dead run's 300 stay charged, its 600 reserved are freed"
    );
    assert_eq!(tokens_charged(ledger, &p, after), (300, 0));
    let status = ledger
        .status(std::slice::from_ref(&p), after)
        .expect("status");
    assert_eq!(status[0].running, vec![RunKey::new("waits")]);
    // Leaving frees the slot at once.
    ledger.leave(&RunKey::new("waits"), after).expect("leave");
    admitted(
        ledger
            .join(&RunKey::new("third"), std::slice::from_ref(&p), after)
            .expect("join"),
    );
}

/// A spent pool refuses a run at the start; `max_runs` counts runs started in the window.
pub fn spent_pools_refuse_joins(ledger: &dyn Ledger) {
    let p = pool(
        "tiny",
        PoolLimits {
            max_tokens: Some(100),
            max_runs: Some(2),
            ..PoolLimits::default()
        },
        Window::Rolling(HOUR),
    );
    admitted(
        ledger
            .join(&RunKey::new("a"), std::slice::from_ref(&p), t0())
            .expect("join"),
    );
    ledger
        .charge(&key("a", 1), Usage::tokens(150), t0())
        .expect("charge over the cap: it happened");
    ledger.leave(&RunKey::new("a"), t0()).expect("leave");
    match ledger
        .join(&RunKey::new("b"), std::slice::from_ref(&p), t0())
        .expect("join")
    {
        Admission::Exhausted(e) => {
            assert_eq!(
                (e.pool.as_str(), e.measure, e.spent, e.cap),
                ("tiny", Measure::Tokens, 150, 100)
            );
            assert_eq!(e.frees_at, Some(t0() + HOUR));
        }
        other => panic!("joined a spent pool: {other:?}"),
    }
    let runs = pool(
        "two-runs",
        PoolLimits {
            max_runs: Some(2),
            ..PoolLimits::default()
        },
        Window::Lifetime,
    );
    admitted(
        ledger
            .join(&RunKey::new("c"), std::slice::from_ref(&runs), t0())
            .expect("join"),
    );
    admitted(
        ledger
            .join(&RunKey::new("d"), std::slice::from_ref(&runs), t0())
            .expect("join"),
    );
    match ledger
        .join(&RunKey::new("e"), std::slice::from_ref(&runs), t0())
        .expect("join")
    {
        Admission::Exhausted(e) => assert_eq!(
            (e.measure, e.spent, e.cap, e.frees_at),
            (Measure::Runs, 2, 2, None)
        ),
        other => panic!("a third run started: {other:?}"),
    }
}

/// A rolling window counts exactly the charges in it as they age out (the ledgers keep running
/// totals, so this is what the totals must still give), tells when the oldest frees, and takes a
/// charge from a writer whose clock is behind at the pool's last charge time.
pub fn rolling_windows_age_out(ledger: &dyn Ledger) {
    let p = pool(
        "hourly",
        PoolLimits {
            max_tokens: Some(1_000),
            max_steps: Some(10),
            ..PoolLimits::default()
        },
        Window::Rolling(HOUR),
    );
    let minutes = |m: u64| t0() + Duration::from_secs(m * 60);
    admitted(
        ledger
            .join(&RunKey::new("w"), std::slice::from_ref(&p), t0())
            .expect("join"),
    );
    for (seq, at, tokens) in [(1, 0, 100), (2, 20, 200), (3, 40, 300)] {
        ledger
            .charge(
                &key("w", seq),
                Usage {
                    tokens,
                    steps: 1,
                    cost_micros: 0,
                },
                minutes(at),
            )
            .expect("charge");
    }
    assert_eq!(tokens_charged(ledger, &p, minutes(59)), (600, 0));
    assert_eq!(tokens_charged(ledger, &p, minutes(61)), (500, 0));
    assert_eq!(tokens_charged(ledger, &p, minutes(81)), (300, 0));
    assert_eq!(tokens_charged(ledger, &p, minutes(101)), (0, 0));
    // 450 more at +61 needs 50 to age out of the 500 in the window: the charge at +20 frees it.
    match ledger
        .reserve(&key("w", 4), Usage::tokens(550), minutes(61))
        .expect("reserve")
    {
        Grant::Refused(e) => {
            assert_eq!((e.spent, e.cap, e.asked), (500, 1_000, 550));
            assert_eq!(e.frees_at, Some(minutes(80)));
        }
        g => panic!("granted past the cap: {g:?}"),
    }
    // 50 more needs the +20 and +40 charges gone: +100.
    match ledger
        .reserve(&key("w", 4), Usage::tokens(1_000), minutes(61))
        .expect("reserve")
    {
        Grant::Refused(e) => assert_eq!(e.frees_at, Some(minutes(100))),
        g => panic!("granted past the cap: {g:?}"),
    }
    // A writer whose clock says +30 (behind the last charge, at +40) is charged at +40, so the
    // window still holds it until +100.
    ledger
        .charge(&key("w", 5), Usage::tokens(50), minutes(30))
        .expect("charge");
    assert_eq!(tokens_charged(ledger, &p, minutes(95)), (350, 0));
    assert_eq!(tokens_charged(ledger, &p, minutes(101)), (0, 0));
    let status = ledger
        .status(std::slice::from_ref(&p), minutes(61))
        .expect("status");
    let steps = status[0]
        .measures
        .iter()
        .find(|m| m.measure == Measure::Steps)
        .expect("a step cap");
    assert_eq!((steps.charged, steps.frees_at), (2, Some(minutes(80))));
}
