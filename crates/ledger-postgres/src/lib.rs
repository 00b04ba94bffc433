//! The fleet ledger (work in progress).
#![forbid(unsafe_code)]

mod connect;
mod passfile;
