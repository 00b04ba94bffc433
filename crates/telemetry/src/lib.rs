//! Every stepguard run as OpenTelemetry, so teams see budgets across machines.
//!
//! The local history answers "what happened on this machine"; a fleet of CI runners needs
//! "which task types hit their budgets", "p95 steps this week", "which provider version started
//! looping". Teams already run an OpenTelemetry collector for such questions, so stepguard
//! exports to it over OTLP/HTTP with the `opentelemetry` crates rather than serving anything of
//! its own:
//!
//! * [`TelemetryConfig`] reads the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, the
//!   per-signal `_TRACES_ENDPOINT` / `_METRICS_ENDPOINT`, `_PROTOCOL`, `_HEADERS`,
//!   `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`, `TRACEPARENT`) over
//!   the `[telemetry]` table ([`TelemetrySettings`]). With no endpoint it is `None`: nothing is
//!   created and no network is touched.
//! * [`TelemetryObserver`] is a [`stepguard_runner::RunObserver`]. Created before the run, it
//!   fixes the run's span (a child of `TRACEPARENT` when given) so the agent can be handed a
//!   `TRACEPARENT` of its own ([`TelemetryObserver::child_env`]); during the run it only notes
//!   in memory when each step began; at the end it exports one `invoke_agent` span (GenAI
//!   semantic conventions plus `stepguard.*` attributes, `step`, `breach`, `loop_detected`,
//!   `wrap_up` and `stop` events) and the run's metric points (`stepguard.runs`,
//!   `stepguard.run.steps`, `.tokens`, `.cost_usd`, `.duration`). A run with a token or cost
//!   budget carries `stepguard.max_tokens` or `stepguard.max_cost_usd` (and where each came
//!   from, `stepguard.max_tokens_source`, `stepguard.max_cost_usd_source`) beside
//!   `stepguard.max_steps`; one in pools carries their names (`stepguard.pools`, comma-separated).
//!   A run through the model gateway carries `stepguard.model_calls`;
//!   one the gateway wrapped up (`terminated_by` is `wrap_up`) has a `wrap_up` event whose
//!   `stepguard.final_report_chars` is the length of the model's final report in characters.
//!   The report's text is never exported: it may quote anything the agent read.
//! * [`Replay`] replays past run records one at a time, for `stepguard history export --otlp`:
//!   spans go out [`REPLAY_BATCH`] to a request and metric points are aggregated as they come,
//!   so memory does not grow with the history; [`export_records`] replays a slice of them.
//!
//! # Never in the way
//!
//! Nothing is sent while the budget is being enforced. The export at the end runs on threads
//! of its own and is waited for at most [`TelemetryConfig::flush_timeout`] (2 s by default),
//! and, as an observer, never past the run's exit bound (`RunReport::exit_by`);
//! then it is abandoned, and a dead or slow collector costs one `tracing` warning
//! (`telemetry: could not export to URL within 2s: …; the run is unaffected`), never a change to
//! the run's outcome or exit code. The crate never prints.
//!
//! gRPC is not built in (it would bring tonic and an async runtime for one request per run):
//! `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` warns and exports over `http/protobuf`. HTTPS endpoints
//! work with the default `tls` feature (rustls, the system's roots).
//!
//! # Example
//!
//! ```
//! use stepguard_telemetry::{TelemetryConfig, TelemetryObserver};
//!
//! // Nothing set: telemetry is off.
//! assert!(TelemetryConfig::from_env(|_| None).is_none());
//!
//! let env = |name: &str| match name {
//!     "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
//!     "TRACEPARENT" => {
//!         Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned())
//!     }
//!     _ => None,
//! };
//! let config = TelemetryConfig::from_env(env).expect("an endpoint is set");
//! assert_eq!(config.traces_endpoint.as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
//!
//! // Before the run: the agent's TRACEPARENT puts its spans under the run's span.
//! let observer = TelemetryObserver::new(config);
//! let child = observer.traceparent_for_child().expect("spans are exported");
//! assert!(child.starts_with("00-0af7651916cd43dd8448eb211c80319c-"));
//! // Then register it last among the observers: `Runner::new(spec).run(&mut [.., &mut observer])`.
//! ```
#![forbid(unsafe_code)]

mod config;
mod error;
mod export;
mod metrics;
mod observer;
mod replay;
mod span;
mod transport;

pub use config::{
    DEFAULT_FLUSH_TIMEOUT, DEFAULT_MAX_STEP_EVENTS, DEFAULT_SERVICE_NAME, Protocol,
    TelemetryConfig, TelemetrySettings, Temporality,
};
pub use error::{ExportFailure, TelemetryError};
pub use observer::TelemetryObserver;
pub use replay::{REPLAY_BATCH, Replay, export_records};
