//! The behaviour every ledger must show (the checks in `crates/ledger/tests/common`, shared with
//! the local ledger's tests), on PostgreSQL. They move time, so the ledger runs on the caller's
//! clock ([`Clock::Caller`]); the database's clock is tested in `postgres.rs`.
//!
//! `#[ignore]`d like every test needing the server binaries: a plain `cargo nextest run`
//! reports them as skipped; `--run-ignored all` (as `.ci/run`) runs them.
#![allow(missing_docs)]

#[path = "../../ledger/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Duration;

use stepguard_ledger_postgres::{Clock, PgLedger, PgOptions};
use stepguard_pgserver::PgServer;

/// A fresh server and a ledger on it with the default lease.
fn with_ledger(check: fn(&dyn stepguard_ledger::Ledger)) {
    let server = PgServer::start(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL server: {e}"));
    let options = PgOptions {
        lease: Duration::from_secs(30),
        clock: Clock::Caller,
    };
    let ledger = PgLedger::connect_with(&server.url(), &|_| None, options).expect("connect");
    check(&ledger);
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn reserves_settles_and_refuses() {
    with_ledger(common::reserves_settles_and_refuses);
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn replays_are_not_charged_twice() {
    with_ledger(common::replays_are_not_charged_twice);
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn charges_need_a_membership() {
    with_ledger(common::charges_need_a_membership);
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn leases_expire() {
    with_ledger(common::leases_expire);
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn spent_pools_refuse_joins() {
    with_ledger(common::spent_pools_refuse_joins);
}

#[test]
#[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
fn rolling_windows_age_out() {
    with_ledger(common::rolling_windows_age_out);
}
