//! End-to-end tests of the `stepguard` binary: one integration test binary, one module per area.

mod harness;

mod config_cmd;
mod count_cmd;
mod plugins;
