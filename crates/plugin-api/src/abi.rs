//! The frozen binary interface: the root module, the two trait objects and the per-line report.
//!
//! **Frozen since ABI generation 1.** Nothing in this module may change layout: no new fields in
//! [`PluginMod`], [`LineReport`] or [`HostCallbacks`], no new methods in [`ProviderObj`] or
//! [`CounterObj`]. Everything that evolves travels through the `call` methods (a method name and a
//! JSON payload) and the JSON types in [`crate::model`], versioned by [`crate::PROTOCOL_VERSION`].
//! A change here is a new [`crate::ABI_GENERATION`].
//!
//! Because their layout cannot change within a generation, the structs here are *not*
//! `#[non_exhaustive]`: a struct literal such as
//! `LineReport { steps_begun: 1, ..LineReport::empty() }` stays valid for all of 1.x. The
//! constructors ([`LineReport::step`], [`LineReport::noise`], [`HostCallbacks::new`] …) read
//! better all the same.

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RBox, RResult, RSlice, RStr, RString};
use abi_stable::{StableAbi, declare_root_module_statics, sabi_trait};

/// The plugin library's root module: a single constructor.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    /// Creates the provider, handing it the host's callbacks (logging).
    #[sabi(last_prefix_field)]
    pub new_provider: extern "C" fn(host: HostCallbacks) -> RResult<ProviderBox, RString>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "stepguard_plugin";
    const NAME: &'static str = "stepguard_plugin";
    // Changes only when the frozen layout changes (a new ABI generation), never per release.
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.0.0");
}

/// Callbacks the host hands to a plugin so that its logs reach the host's `tracing` subscriber.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct HostCallbacks {
    /// Logs one message: `level` is 1 (error) … 5 (trace), `target` the plugin's module path.
    pub log: extern "C" fn(level: u8, target: RStr<'_>, message: RStr<'_>),
    /// The most verbose level the host wants (1 = error … 5 = trace, 0 = nothing).
    pub max_level: u8,
}

impl HostCallbacks {
    /// Creates the callbacks: `log` receives every event up to `max_level` (1 = error …
    /// 5 = trace, 0 = nothing).
    pub const fn new(
        log: extern "C" fn(level: u8, target: RStr<'_>, message: RStr<'_>),
        max_level: u8,
    ) -> Self {
        HostCallbacks { log, max_level }
    }
}

/// What one line of the agent's stdout meant, answered per line without any JSON.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineReport {
    /// New steps first seen on this line (begun, or completed without a seen beginning).
    pub steps_begun: u32,
    /// Steps completed on this line.
    pub steps_completed: u32,
    /// Legacy turns begun on this line.
    pub turns: u32,
    /// Steps of sub-agents seen on this line (never counted against the budget).
    pub sub_agent_steps: u32,
    /// Bit flags: [`LineReport::NOISE`], [`LineReport::TERMINAL`], [`LineReport::UNKNOWN_EVENT`],
    /// [`LineReport::TOOL_CALL`], [`LineReport::USAGE`], [`LineReport::TOOL_RESULT`].
    pub flags: u32,
    /// Reserved for future use; always zero.
    pub reserved: [u32; 3],
}

impl LineReport {
    /// The line was not an event (non-JSON, blank, a banner …).
    pub const NOISE: u32 = 1;
    /// The line was the stream's terminal event (result, turn.completed …).
    pub const TERMINAL: u32 = 1 << 1;
    /// The line was JSON of an event type the mapping does not know.
    pub const UNKNOWN_EVENT: u32 = 1 << 2;
    /// The line carried a tool call: the host asks the counter for it
    /// ([`crate::StepCounter::take_tool_calls`], protocol 1.3) after the chunk, once.
    pub const TOOL_CALL: u32 = 1 << 3;
    /// The line carried token usage: the host asks the counter for it
    /// ([`crate::StepCounter::take_usage`], protocol 1.5) after the chunk, once.
    pub const USAGE: u32 = 1 << 4;
    /// The line carried a tool result: the host asks the counter for it
    /// ([`crate::StepCounter::take_tool_results`], protocol 1.6) after the chunk, once.
    pub const TOOL_RESULT: u32 = 1 << 5;

    /// A report for a noise line.
    pub const fn noise() -> Self {
        LineReport {
            flags: Self::NOISE,
            ..Self::empty()
        }
    }

    /// A report for a line on which one step began and completed (an event that is a whole
    /// step by itself).
    ///
    /// ```
    /// use stepguard_plugin_api::LineReport;
    ///
    /// let last = LineReport::step().with_flags(LineReport::TERMINAL);
    /// assert_eq!((last.steps_begun, last.steps_completed), (1, 1));
    /// assert!(last.has(LineReport::TERMINAL));
    /// ```
    pub const fn step() -> Self {
        LineReport {
            steps_begun: 1,
            steps_completed: 1,
            ..Self::empty()
        }
    }

    /// Returns this report with `flags` set as well (e.g. [`LineReport::TERMINAL`]).
    pub const fn with_flags(mut self, flags: u32) -> Self {
        self.flags |= flags;
        self
    }

    /// A report for a line that changed nothing.
    pub const fn empty() -> Self {
        LineReport {
            steps_begun: 0,
            steps_completed: 0,
            turns: 0,
            sub_agent_steps: 0,
            flags: 0,
            reserved: [0; 3],
        }
    }

    /// Returns true when `flag` is set.
    pub const fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }
}

/// What a chunk of lines meant: how far the counter read and the sum of those lines' reports.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkReport {
    /// Bytes consumed: whole lines, up to and including the line where counting stopped.
    pub consumed: u64,
    /// Lines consumed.
    pub lines: u64,
    /// Non-JSON (noise) lines among them.
    pub noise_lines: u64,
    /// The consumed lines' reports, summed (flags OR-ed).
    pub sum: LineReport,
    /// True when counting stopped early because the steps begun exceeded the allowance.
    pub stopped: bool,
}

/// A provider, as seen across the boundary.
#[sabi_trait]
pub trait ProviderObj: Send + Sync {
    /// Returns the manifest as JSON ([`crate::model::Manifest`]).
    fn manifest_json(&self) -> RResult<RString, RString>;

    /// The narrow waist: calls `method` with a JSON payload and returns JSON.
    fn call(&self, method: RStr<'_>, payload: RStr<'_>) -> RResult<RString, RString>;

    /// Opens a counter for a [`crate::model::CounterRequest`] given as JSON.
    #[sabi(last_prefix_field)]
    fn open_counter(&self, request_json: RStr<'_>) -> RResult<CounterBox, RString>;
}

/// A step counter for one stream, as seen across the boundary.
#[sabi_trait]
pub trait CounterObj: Send {
    /// Feeds one line (without its `\n`; bytes, not assumed UTF-8).
    fn feed(&mut self, line: RSlice<'_, u8>) -> RResult<LineReport, RString>;

    /// Feeds whole `\n`-terminated lines (the last may lack its `\n` at the end of a stream),
    /// stopping right after the line on which the steps begun in this chunk exceed
    /// `step_allowance`: one boundary crossing for many lines, with the breaching line exact.
    fn feed_chunk(
        &mut self,
        chunk: RSlice<'_, u8>,
        step_allowance: u64,
    ) -> RResult<ChunkReport, RString>;

    /// Returns the final [`crate::model::CounterStats`] as JSON.
    fn finish(&mut self) -> RResult<RString, RString>;

    /// The narrow waist for counters.
    #[sabi(last_prefix_field)]
    fn call(&mut self, method: RStr<'_>, payload: RStr<'_>) -> RResult<RString, RString>;
}

/// An owned provider trait object.
pub type ProviderBox = ProviderObj_TO<'static, RBox<()>>;
/// An owned counter trait object.
pub type CounterBox = CounterObj_TO<'static, RBox<()>>;
