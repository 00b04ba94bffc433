//! Supervising one agent run as a library: the engine behind `stepguard run`.
//!
//! A run is described by a [`RunSpec`], built with [`RunSpec::builder`] (the command, the
//! provider's counter, the budget and its source, then grouped settings: the [`Limits`] beside
//! the budget with the on-limit policy, the [`Clocks`], the [`Confinement`] of the process tree,
//! the [`StreamRecognition`] and the [`Io`]) and yields a [`RunReport`] (the run
//! record, stats, exit code, who stopped it, the breach step, decisions, durations). The engine
//! owns the threads, the signals and the process tree:
//!
//! * a reader thread counts the agent's stdout a run of whole lines at a time through the
//!   provider plugin, queues exactly what was counted for the passthrough, and stops right after
//!   the line whose step exceeds the budget (SIGTERMing the group at once when nobody is to be
//!   asked);
//! * a passthrough thread writes what was counted to the spec's output from a bounded queue
//!   that spills to a temporary file, so a consumer that stops reading never stalls counting;
//! * a reaper collects exits (stepguard is a child subreaper, so orphans come back to it);
//! * a signal listener turns SIGINT, SIGTERM and SIGHUP into a stop of the tree;
//! * the calling thread owns every decision: stop the tree, ask the [`LimitPolicy`], time out;
//!   a limit the caller keeps outside the run (a budget other runs share) comes in as an
//!   event too, through [`Runner::outside_limits`], and is kept by the same ladder;
//! * with [`RunSpec::wrap_up`], a model gateway ([`stepguard_gateway`]) sits between the agent
//!   and its model: it makes the budget's last model call tool-less so the agent ends by itself
//!   with a summary, and never forwards a call past the budget. The process-tree stop stays the
//!   backstop.
//!
//! What varies around a run plugs in through two small interfaces: [`RunObserver`]s see the
//! start, progress ticks and the end (a terminal status line, a history recorder, a summary file,
//! telemetry), and the [`LimitPolicy`] decides at the limit. The library never prints: the
//! agent's output goes to the writer the spec names, diagnostics go to `tracing`.
//!
//! [`count_stream`] is the same counting path without a process, for recorded streams.
//!
//! # One run at a time per process
//!
//! The supervising process becomes a child subreaper, reaps every child it has, and stops every
//! descendant it finds when a run ends, so two runs sharing a process could not tell their
//! processes apart. Runs in one process therefore take turns: [`Runner::run`] waits for any
//! run already under way. Run agents in parallel from separate processes (as `stepguard run`
//! does), and do not wait for other children of your own while a run goes on.
//!
//! ```no_run
//! use stepguard_core::StepLimit;
//! use stepguard_plugin_api::host::Provider;
//! use stepguard_runner::{Clocks, RunSpec, Runner};
//!
//! let codex = Provider::new(stepguard_provider_codex::provider()).unwrap();
//! let counter = codex.open_counter(&Default::default()).unwrap();
//! let command = vec!["codex".into(), "exec".into(), "--json".into(), "fix it".into()];
//! let spec = RunSpec::builder(command, counter)
//!     .budget(StepLimit::Limited(30), "--max-steps")
//!     .clocks(Clocks {
//!         timeout: Some(std::time::Duration::from_secs(600)),
//!         ..Clocks::default()
//!     })
//!     .build();
//! let report = Runner::new(spec).run(&mut []);
//! println!("{} -> exit {}", report.summary_line(), report.exit_code.code());
//! ```
#![forbid(unsafe_code)]

mod end;
mod engine;
mod event;
mod launch;
mod limit;
mod observe;
mod passthrough;
mod program;
mod reader;
mod report;
mod spec;
mod stream;
mod supervise;
mod watchdog;

pub use engine::Runner;
pub use event::{Interrupter, OutsideLimit, OutsideLimits};
pub use observe::{Progress, RunObserver, RunStarted};
pub use report::RunReport;
pub use spec::{
    Breach, Clocks, Confinement, Containment, Io, LimitDecision, LimitPolicy, Limits,
    OnUnrecognized, Question, RecognitionWindow, RunMeta, RunSpec, RunSpecBuilder, SpendLimits,
    StdinMode, StopAtLimit, StreamRecognition, WrapUp,
};
pub use stepguard_supervisor::{ExitStatus, Mechanism, StopReport};
pub use stream::{
    CountError, MOSTLY_UNRECOGNISED_MIN, Recognition, Refusal, StreamCount, count_stream,
    count_stream_with_loops, run_stats, stream_record,
};
