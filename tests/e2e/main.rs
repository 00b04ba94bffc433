//! End-to-end tests of the `stepguard` binary: one integration test binary, one module per area.

// A whole run record in one `json!` literal needs more than the default recursion.
#![recursion_limit = "256"]
// Test helpers may panic on anything unexpected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agents;
mod harness;

mod architecture;
mod checkpoints;
mod claude;
mod cli_edges;
mod codex;
mod compat;
mod config_cmd;
mod containment;
mod count_cmd;
mod dist;
mod docs;
mod fail_closed;
mod fleet;
mod gateway_bounds;
mod gemini;
mod history_cmd;
mod history_location;
mod history_spool;
mod hoppers;
mod loops;
mod notices;
mod opencode;
mod options;
mod plugins;
mod pool_calls;
mod pool_live;
mod pools;
mod record_schema;
mod resume;
mod run_cmd;
mod secrets;
mod simulate_cmd;
mod spend;
mod stalled_output;
mod telemetry;
mod whole_run_recognition;
mod wrap_up;
mod wrappers;
