//! The stable plugin boundary of stepguard: everything a provider plugin author needs.
//!
//! A provider plugin maps an agent CLI's output stream to steps. Plugins ship as dynamic
//! libraries (`cdylib`) that an already-built `stepguard` loads from `--plugin-dir`, so a new unit
//! or a new provider needs no rebuild of the CLI.
//!
//! # Writing a plugin
//!
//! Implement [`ProviderPlugin`] (declare a [`Manifest`], open counters) and [`StepCounter`]
//! (answer each line with a [`LineReport`], then return [`CounterStats`]), and export the type
//! with [`export_plugin!`]. You never write `extern "C"` or `unsafe`; every exported call is
//! wrapped in `catch_unwind`, so a panic in your code becomes an error the host reports, and your
//! `tracing` events reach the host's log through a callback.
//!
//! ```
//! use stepguard_plugin_api::{
//!     CounterRequest, CounterStats, LineReport, Manifest, ProviderPlugin, StepCounter, Terminal,
//! };
//!
//! #[derive(Default)]
//! struct Lines;
//!
//! impl ProviderPlugin for Lines {
//!     fn manifest(&self) -> Manifest {
//!         Manifest::new("lines", "0.1.0").unit("line", "every non-empty line is a step", true)
//!     }
//!     fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
//!         Ok(Box::new(LineCounter::default()))
//!     }
//! }
//!
//! #[derive(Default)]
//! struct LineCounter {
//!     steps: u64,
//!     done: bool,
//! }
//!
//! impl StepCounter for LineCounter {
//!     fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
//!         if line.is_empty() {
//!             return Ok(LineReport::noise());
//!         }
//!         self.steps += 1;
//!         if line == b"done" {
//!             self.done = true;
//!             return Ok(LineReport::step().with_flags(LineReport::TERMINAL));
//!         }
//!         Ok(LineReport::step())
//!     }
//!     fn finish(&mut self) -> CounterStats {
//!         let mut stats = CounterStats::default();
//!         stats.num_steps_computed = self.steps;
//!         stats.terminal = self.done.then(Terminal::success);
//!         stats
//!     }
//! }
//!
//! // In a cdylib crate: stepguard_plugin_api::export_plugin!(Lines);
//!
//! // Test it without a host:
//! let (sum, stats) = stepguard_plugin_api::testing::count(&Lines, "line", b"a\n\nb\ndone\n")?;
//! assert_eq!((sum.steps_begun, stats.num_steps_computed), (3, 3));
//! assert_eq!(stepguard_plugin_api::testing::outcome(&stats), "success");
//! # Ok::<(), String>(())
//! ```
//!
//! # Depending on this crate
//!
//! The crate is not on a registry; a plugin outside stepguard's repository depends on it by git
//! tag. Cargo finds the package inside the repository by its name:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"] # rlib only so that unit tests and doctests build
//!
//! [dependencies]
//! stepguard-plugin-api = { git = "https://example.invalid/stepguard", tag = "plugin-api-v1.0.0" }
//! ```
//!
//! To build against a local checkout of stepguard instead (say, to try an unreleased change),
//! keep that line and patch the source in the plugin's (or its workspace's) `Cargo.toml`:
//!
//! ```toml
//! [patch."https://example.invalid/stepguard"]
//! stepguard-plugin-api = { path = "../stepguard/crates/plugin-api" }
//! ```
//!
//! The crate carries its own version, edition and dependency versions (no workspace
//! inheritance), so it builds the same inside and outside the repository. Only the
//! [`serde_json`] re-exported here appears in its API; your own `serde_json` need not match.
//!
//! # Which count wins
//!
//! The per-line reports. Each [`LineReport`] the counter returns is what the host enforces the
//! budget with, as the lines arrive, and what it records: the run's step count is the sum of
//! `steps_begun`, its computed turns the sum of `turns`, its sub-agent steps the sum of
//! `sub_agent_steps`. The same numbers in [`CounterStats`] (`num_steps_computed`,
//! `num_turns_computed`, `sub_agent_steps`) are a cross-check: the host compares them with the
//! sums (turns only when the lines report any), warns once when they disagree, and keeps the
//! sums. Return them right (the testing
//! helpers [`testing::feed_all`] and [`testing::count`] give you both sides to compare).
//!
//! Token usage works the same way (protocol 1.5): the deltas [`StepCounter::take_usage`]
//! returns after lines flagged [`LineReport::USAGE`] are what the host holds against a token
//! budget (and, priced, a cost budget) as the run goes, and they should add up to
//! [`CounterStats::tokens`], sub-agents included ([`testing::usage`] gives you the sum to
//! compare). The rest of [`CounterStats`]
//! (terminal event, cost, what the provider itself reported) has no per-line counterpart and is
//! taken as given.
//!
//! # Compatibility
//!
//! **Binary.** [`ABI_GENERATION`] names the frozen binary layout ([`abi`]): the root module, the
//! two trait-object vtables and the `#[repr(C)]` structs [`LineReport`], [`ChunkReport`] and
//! [`HostCallbacks`]. It is 1 for every 1.x release of this crate. A host refuses a plugin of
//! another generation before touching anything else, with a message naming the major version
//! to rebuild against.
//!
//! **Protocol.** [`PROTOCOL_VERSION`] versions the JSON payloads ([`model`]): a host speaking
//! `X.Z` loads a plugin that needs `X.Y` when `Z >= Y`. History: 1.0 manifest, counters, stats;
//! 1.1 manifest `native_limit`, stats `sub_agent_steps`; 1.2 manifest `expects` and `preflight`
//! (checks of the agent's command line); 1.3 manifest `tool_calls`, the line flag
//! [`LineReport::TOOL_CALL`] and the counter method `tool_calls` ([`ToolCall`], for loop
//! detection); 1.4 manifest `model_endpoint` ([`ModelEndpoint`], [`BaseUrlRule`]: how the CLI
//! reaches its model, for the model gateway of `run --wrap-up`) and units' `reply_cost` (what a
//! tool-less model reply costs in the unit, [`Manifest::unit_costing`]); a host speaking 1.4 adds
//! the unit `request` to every provider with a model endpoint; 1.5 manifest `reports_usage`, the
//! line flag [`LineReport::USAGE`] and the counter method `usage`
//! ([`StepCounter::take_usage`]: token usage as the stream shows it, for token and cost
//! budgets), stats `sub_agent_tokens`, manifest `native_token_limit` and `native_cost_limit`
//! (the CLI's own token and cost budgets, `{max_tokens}` and `{max_cost_usd}`) and a
//! [`NativeLimit`] placed [after the program](NativeLimit::after_program); 1.6 manifest
//! `tool_results`, the line flag [`LineReport::TOOL_RESULT`] and the counter method
//! `tool_results` ([`ToolResult`]: a fingerprint of each tool result and the id of the call it
//! answers, so that loop detection judges a repeat by progress), and three optional fields of
//! [`ToolCall`]: `id`, `program` (of a shell tool, [`ToolCall::shell`]) and `step` (stamped by
//! the adapter with the steps begun up to the call's line, so that a loop's first step does not
//! depend on how the stream was chunked). A plugin that reports no results keeps the rule of
//! identical calls. 1.7 adds [`ModelEndpoint`]'s `api_key_env` and `api_key_env_key` (where the
//! CLI reads its API key, so that the gateway holds the real key and the agent a per-run one) and
//! the counter request's `tool_calls_unused` ([`CounterRequest::without_tool_calls`]: the host
//! takes no tool calls or results, so a counter need not find them and the adapter keeps none;
//! hosts before 1.7 leave it out, which means they are taken); 1.8 adds manifest `resume`
//! ([`ResumeTemplate`]: how the CLI resumes a session, for `stepguard resume`) and stats
//! `session_id` (the CLI's id of the session the stream belongs to). New fields get
//! `#[serde(default)]`, nothing uses `deny_unknown_fields`, and fields are never removed or
//! retyped within a protocol major version, so an older host reads a newer plugin's payloads
//! and ignores what it does not know.
//!
//! **Source.** A plugin that builds against 1.x builds against every later 1.y:
//!
//! * Every JSON-model struct ([`Manifest`], [`UnitInfo`], [`OptionInfo`], [`NativeLimit`],
//!   [`PreflightRule`], [`CounterRequest`], [`Terminal`], [`Tokens`], [`CounterStats`]) is
//!   `#[non_exhaustive]`: build it with its constructor and builder methods
//!   ([`Manifest::new`], [`Terminal::success`], [`Terminal::failed`], [`Tokens::new`],
//!   [`NativeLimit::new`], [`CounterRequest::new`] …) or, for [`CounterStats`], from
//!   `CounterStats::default()` followed by field assignments. Struct literals of these types do
//!   not compile outside this crate, so a new field cannot break you. Reading and assigning
//!   their public fields is fine.
//! * The frozen `#[repr(C)]` structs stay exhaustive: their layout cannot change within
//!   generation 1, so a literal such as `LineReport { steps_begun: 1, ..LineReport::empty() }`
//!   stays valid.
//! * Error enums of the host side are `#[non_exhaustive]`; match them with a wildcard arm.
//! * A minor release may add: fields to the JSON-model structs (with a protocol minor bump when
//!   they cross the boundary), constructors and builder methods, provided trait methods with a
//!   default body, functions, constants, slugs in [`TERMINAL_SLUGS`], and variants of
//!   non-exhaustive enums. It never removes or renames any of these, changes a signature,
//!   adds a required trait method, or touches [`abi`].
//!
//! # Supporting older hosts
//!
//! The `protocol` a plugin declares is the *lowest* it needs, not the one this crate speaks, so
//! rebuilding an unchanged plugin against a newer 1.y does not lock out hosts that speak an
//! older protocol. The adapter works it out when it sends the manifest
//! ([`Manifest::min_protocol`]): 1.0, raised to 1.1 by a `native_limit`, to 1.2 by `expects` or
//! `preflight`, to 1.3 by `tool_calls`, to 1.4 by a `model_endpoint` or a unit's `reply_cost`,
//! to 1.5 by `reports_usage`, a `native_token_limit` or `native_cost_limit`, or a native limit
//! placed after the program, to 1.6 by `tool_results`, to 1.7 by a model endpoint's
//! `api_key_env` or `api_key_env_key`, to 1.8 by `resume`, whichever way those fields were set.
//! What the manifest cannot show, raise yourself with [`Manifest::requires_protocol`], e.g. `.requires_protocol("1.1")` for a
//! counter that fills [`CounterStats::sub_agent_steps`]. A host refuses a plugin only when the
//! declared protocol is newer than the one it speaks; an older host ignores fields newer than
//! the declared protocol.
//!
//! # Terminal slugs
//!
//! A failed [`Terminal`] carries one of [`TERMINAL_SLUGS`]: `max_steps`, `max_tokens`,
//! `max_cost`, `timeout`, `provider_error`, `rate_limited`, `context_guard` ([`is_terminal_slug`] checks;
//! [`slug_for_error_text`] picks `rate_limited` or `provider_error` from an error text). The
//! host records any other slug as `provider_error` and warns about it.
//!
//! # Options
//!
//! The adapter refuses provider options the manifest does not declare before it calls
//! [`ProviderPlugin::validate_options`] or [`ProviderPlugin::open_counter`], whether or not the
//! plugin overrides `validate_options`: an override only checks values. The keys the host
//! handles itself ([`RESERVED_OPTIONS`]: `max_steps_unit`) never reach the plugin.
#![deny(missing_docs)]
// The plugin boundary is the one crate where `unsafe` lives: abi_stable's derives generate it,
// and the host's loader needs it for dlopen; each hand-written block carries a `// SAFETY:` note.
#![allow(unsafe_code)]
// abi_stable's `StableAbi` derive emits impls inside constants.
#![allow(non_local_definitions)]

pub mod abi;
pub mod fingerprint;
pub mod guest;
#[cfg(feature = "host")]
pub mod host;
pub mod model;
pub mod resume;

pub use abi::{ChunkReport, HostCallbacks, LineReport, PluginModRef, ProviderBox};
pub use guest::{ProviderPlugin, StepCounter, provider_box, testing};
pub use model::{
    BaseUrlRule, CounterRequest, CounterStats, DEFAULT_FIRST_EVENT_MS, Manifest, ModelEndpoint,
    NativeLimit, OptionInfo, PreflightRule, RESERVED_OPTIONS, TERMINAL_SLUGS, Terminal, Tokens,
    ToolCall, ToolResult, UnitInfo, is_terminal_slug, program_name, slug_for_error_text,
};
pub use resume::{ResumeError, ResumeTemplate, is_session_id};

/// abi_stable's borrowed string, which appears in [`HostCallbacks`]' signature.
pub mod abi_stable_rstr {
    pub use abi_stable::std_types::RStr;
}

/// The generation of the frozen binary layout. Changes only when [`abi`] changes.
pub const ABI_GENERATION: u32 = 1;

/// This API crate's own version (the git tag of a release is `plugin-api-v` followed by it).
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where the API crate's source lives (a plugin's git dependency points here).
pub const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");

/// The newest version of the JSON protocol this API crate speaks: what a host built with it
/// accepts. A plugin declares the oldest it needs instead ([`Manifest::min_protocol`]).
pub const PROTOCOL_VERSION: &str = "1.8.0";

/// The name of the plain `extern "C" fn() -> u32` symbol carrying the ABI generation.
pub const ABI_GENERATION_SYMBOL: &str = "stepguard_plugin_abi_generation";

/// The `serde_json` this crate speaks (option maps, payloads), so plugins need not match versions.
pub use serde_json;

/// Re-exports used by [`export_plugin!`]; not public API.
#[doc(hidden)]
pub mod __private {
    pub use abi_stable::library::{
        __call_root_module_loader, CheckTypeLayout, LibHeader, RootModuleResult,
    };

    pub use crate::guest::root_module;
}

/// Exports a [`ProviderPlugin`] type (which must implement `Default`) from a `cdylib` crate.
///
/// It emits the ABI-generation symbol the host checks first and the root module abi_stable
/// checks the layout of. Use it once per library.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        $crate::export_plugin!(@with_generation $plugin, $crate::ABI_GENERATION);
    };
    (@with_generation $plugin:ty, $generation:expr) => {
        /// The plugin ABI generation this library was built for.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub extern "C" fn stepguard_plugin_abi_generation() -> u32 {
            $generation
        }

        // The name is abi_stable 0.11's mangled root-module symbol; a unit test in
        // stepguard-plugin-api guards it.
        #[doc(hidden)]
        #[allow(unsafe_code)]
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static __STEPGUARD_LIB_HEADER: $crate::__private::LibHeader = {
            extern "C" fn __stepguard_erased_root() -> $crate::__private::RootModuleResult {
                fn root() -> $crate::PluginModRef {
                    $crate::__private::root_module::<$plugin>()
                }
                $crate::__private::__call_root_module_loader(root)
            }
            // SAFETY: the constructor returns a `PluginModRef` built by `root_module`, which is
            // exactly the module type given here.
            #[allow(unsafe_code)]
            unsafe {
                $crate::__private::LibHeader::from_constructor::<$crate::PluginModRef>(
                    __stepguard_erased_root,
                    $crate::__private::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn export_name_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
