//! The fleet ledger of stepguard's shared budgets: pools kept in one PostgreSQL database that
//! every host (CI runners, laptops, cron boxes) shares.
//!
//! [`PgLedger`] implements [`stepguard_ledger::Ledger`] with the local ledger's semantics
//! (idempotent keys, leases, windows, atomic reservations over all of a run's pools); what
//! differs is how it is made safe among many hosts:
//!
//! * **Row locks, not serializable transactions.** Every write that may add to a pool's spend
//!   (join, reserve, settle, charge) runs at `READ COMMITTED` and first locks the rows of the
//!   pools it touches in `stepguard_pools` (`SELECT … FOR UPDATE`, in name order, so no two
//!   transactions wait on each other in a circle), then reads what is spent and writes. Two
//!   hosts never both see room for the last reservation, and there is no serialization failure
//!   to retry under load (a deadlock or serialization error, should one happen, is retried up
//!   to five times). Renewals and leaving touch only the run's own rows and take no pool lock.
//!   Reads (`allowance`, `status`) see one snapshot (`REPEATABLE READ`, read only).
//! * **The database's clock.** Windows and leases are computed from `now()` at the start of
//!   each transaction ([`Clock::Database`], the default): hosts whose clocks disagree still
//!   agree on when a lease ran out. The `now` the trait's callers pass is used only with
//!   [`Clock::Caller`] (tests that move time).
//! * **Faults.** Connecting is bounded as a whole (TCP, TLS, authentication; 5 s unless the
//!   URL's `connect_timeout` or `PGCONNECT_TIMEOUT` says otherwise) and failing is
//!   [`LedgerError::Unreachable`](stepguard_ledger::LedgerError::Unreachable). A connection
//!   lost between or during calls is made again on the next call (once within a call: every
//!   method is idempotent, so a call whose answer was lost runs again without charging twice).
//!   Statements and lock waits are bounded (30 s, 20 s).
//! * **Running totals.** A window's spend is not summed per call: each pool row keeps the
//!   totals ever charged, each charge is numbered in time order with the totals after it, so
//!   the spend in a window is two index lookups however many charges it holds.
//! * **Tables** (`stepguard_schema`, `stepguard_pools`, `stepguard_pool_members`,
//!   `stepguard_pool_spend`) are versioned like the history store's: numbered steps applied in
//!   order under an advisory lock; a database newer than this build is refused.
//!
//! The URL, the `PG*` variables, the passfile and TLS (rustls with aws-lc-rs; the certificate
//! and host name always verified, against `sslrootcert` or the system's roots) are described
//! in the manual's fleet section (`docs/pools.md`).
//!
//! ```no_run
//! use std::time::SystemTime;
//! use stepguard_ledger::{Admission, Ledger, PoolLimits, PoolSpec, RunKey, Window};
//! use stepguard_ledger_postgres::PgLedger;
//!
//! let ledger = PgLedger::connect("postgres://stepguard:secret@db.example:5432/ledger?sslmode=require")?;
//! let pool = PoolSpec {
//!     name: "review-daily".into(),
//!     limits: PoolLimits { max_tokens: Some(20_000_000), ..PoolLimits::default() },
//!     window: Window::parse("24h", None)?,
//! };
//! let run = RunKey::new("ci-7/3f2a/4242/1");
//! assert!(matches!(ledger.join(&run, &[pool], SystemTime::now())?, Admission::Admitted(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod connect;
mod ledger;
mod passfile;
mod schema;
mod tx;

pub use connect::{DEFAULT_CONNECT_TIMEOUT, Env};
pub use ledger::{Clock, PgLedger, PgOptions};
pub use schema::SCHEMA_VERSION;
