//! The plugin author's side: two safe traits, and the adapters that put them behind the frozen ABI.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RSlice, RStr, RString};

use crate::abi::{
    ChunkReport, CounterBox, CounterObj, CounterObj_TO, HostCallbacks, LineReport, PluginMod,
    PluginModRef, ProviderBox, ProviderObj, ProviderObj_TO,
};
use crate::model::{CounterRequest, CounterStats, Manifest, RESERVED_OPTIONS};

/// A provider plugin: declares itself and opens step counters. Implement this, then call
/// [`crate::export_plugin!`].
pub trait ProviderPlugin: Send + Sync + 'static {
    /// Returns the plugin's manifest (name, version, units, options, native limit).
    fn manifest(&self) -> Manifest;

    /// Checks the values of provider options (from the provider's config table) before any
    /// counter opens.
    ///
    /// Keys are checked before this is called, whatever it does: the adapter refuses any key
    /// the manifest does not declare (naming the accepted ones), and leaves out the keys the
    /// host handles itself ([`crate::model::RESERVED_OPTIONS`]), so `options` holds only
    /// declared keys. The default accepts every value; override it to check them.
    fn validate_options(
        &self,
        options: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), String> {
        let _ = options;
        Ok(())
    }

    /// Opens a counter for one stream. The unit is always one the manifest declares, and the
    /// options are declared ones that have passed [`ProviderPlugin::validate_options`].
    fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String>;

    /// Answers a method of the narrow waist that this plugin knows; `None` for unknown methods.
    fn call(
        &self,
        method: &str,
        payload: &serde_json::Value,
    ) -> Option<Result<serde_json::Value, String>> {
        let _ = (method, payload);
        None
    }
}

/// Counts the steps of one stream, line by line.
pub trait StepCounter: Send {
    /// Reads one line of the agent's stdout (without its `\n`, bytes not assumed UTF-8).
    ///
    /// Return an error only when counting can no longer be trusted; the host then stops the
    /// agent (fail closed).
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String>;

    /// Returns the final numbers; called once, after the last line.
    fn finish(&mut self) -> CounterStats;

    /// Returns the tool calls seen since the last call, in stream order, and forgets them
    /// (protocol 1.3; declare [`Manifest::reports_tool_calls`]). The host asks only after a
    /// chunk whose lines set [`LineReport::TOOL_CALL`], so mark those lines.
    fn take_tool_calls(&mut self) -> Vec<crate::model::ToolCall> {
        Vec::new()
    }

    /// Returns the tool results seen since the last call, in stream order, and forgets them
    /// (protocol 1.6; declare [`Manifest::reports_tool_results`]). Each names the call it
    /// answers, so report calls [with their id](crate::ToolCall::with_id). The host asks only
    /// after a chunk whose lines set [`LineReport::TOOL_RESULT`], so mark those lines.
    fn take_tool_results(&mut self) -> Vec<crate::model::ToolResult> {
        Vec::new()
    }

    /// Returns the token usage seen since the last call, as a delta (what it added to the
    /// run's totals), and forgets it; `None` when there was none (protocol 1.5; declare
    /// [`Manifest::reports_usage`]). The host asks only after a chunk whose lines set
    /// [`LineReport::USAGE`], so mark those lines, and keeps a running sum to hold against a
    /// token budget (and, priced, a cost budget) as the run goes.
    ///
    /// Report usage as early as the stream shows it, and let the deltas add up to
    /// [`CounterStats::tokens`]: when the stream's final numbers (a result event's) exceed what
    /// was reported line by line, report the difference on that line. Deltas never go below
    /// zero, so a number that only grows is the safe one to follow.
    fn take_usage(&mut self) -> Option<crate::model::Tokens> {
        None
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_owned());
    format!("plugin panicked: {text}")
}

/// Runs `f`, turning a panic into an error so that no unwind crosses the boundary.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> RResult<T, RString> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(RString::from(e)),
        Err(payload) => RResult::RErr(RString::from(panic_message(payload.as_ref()))),
    }
}

/// Refuses option keys `manifest` does not declare and drops the ones the host reserves, so
/// that a plugin's own [`ProviderPlugin::validate_options`] sees only declared keys.
fn declared_options(
    manifest: &Manifest,
    mut options: serde_json::Map<String, serde_json::Value>,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    options.retain(|key, _| !RESERVED_OPTIONS.contains(&key.as_str()));
    let declared = |key: &str| manifest.options.iter().any(|o| o.name == key);
    if let Some(key) = options.keys().find(|k| !declared(k)) {
        let accepted = if manifest.options.is_empty() {
            "it accepts none".to_owned()
        } else {
            let names: Vec<&str> = manifest.options.iter().map(|o| o.name.as_str()).collect();
            format!("accepted: {}", names.join(", "))
        };
        return Err(format!(
            "unknown option `{key}` for provider `{}`; {accepted}",
            manifest.name
        ));
    }
    Ok(options)
}

struct ProviderAdapter<P: ProviderPlugin>(P);

impl<P: ProviderPlugin> ProviderObj for ProviderAdapter<P> {
    fn manifest_json(&self) -> RResult<RString, RString> {
        guarded(|| {
            // The protocol sent is the lowest this manifest needs, whichever way it was built,
            // so that rebuilding against a newer API crate does not lock out older hosts.
            let mut manifest = self.0.manifest();
            manifest.protocol = manifest.min_protocol();
            serde_json::to_string(&manifest)
                .map(RString::from)
                .map_err(|e| e.to_string())
        })
    }

    fn call(&self, method: RStr<'_>, payload: RStr<'_>) -> RResult<RString, RString> {
        guarded(|| {
            let payload: serde_json::Value = if payload.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::from_str(payload.as_str())
                    .map_err(|e| format!("invalid payload: {e}"))?
            };
            let result = match method.as_str() {
                "validate_options" => {
                    let options = payload.as_object().cloned().unwrap_or_default();
                    let options = declared_options(&self.0.manifest(), options)?;
                    self.0
                        .validate_options(&options)
                        .map(|()| serde_json::Value::Null)
                }
                other => match self.0.call(other, &payload) {
                    Some(r) => r,
                    None => Err(format!("unknown method `{other}`")),
                },
            }?;
            serde_json::to_string(&result)
                .map(RString::from)
                .map_err(|e| e.to_string())
        })
    }

    fn open_counter(&self, request_json: RStr<'_>) -> RResult<CounterBox, RString> {
        guarded(|| {
            let mut request: CounterRequest = serde_json::from_str(request_json.as_str())
                .map_err(|e| format!("invalid counter request: {e}"))?;
            let manifest = self.0.manifest();
            if !manifest.units.iter().any(|u| u.name == request.unit) {
                return Err(format!(
                    "unknown unit `{}` for provider `{}`; valid units: {}",
                    request.unit,
                    manifest.name,
                    manifest.unit_names()
                ));
            }
            request.options = declared_options(&manifest, std::mem::take(&mut request.options))?;
            self.0.validate_options(&request.options)?;
            let counter = self.0.open_counter(&request)?;
            let mut adapter = CounterAdapter::new(counter);
            adapter.discard_calls = request.tool_calls_unused;
            Ok(CounterObj_TO::from_value(adapter, TD_Opaque))
        })
    }
}

struct CounterAdapter {
    inner: Box<dyn StepCounter>,
    poisoned: bool,
    /// Steps begun by the lines fed so far, which stamps each tool call with its step.
    steps_begun: u64,
    /// Tool calls taken from the counter line by line, not yet taken by the host.
    calls: Vec<crate::model::ToolCall>,
    /// Tool results taken from the counter line by line, not yet taken by the host.
    results: Vec<crate::model::ToolResult>,
    /// The host takes no tool calls or results ([`CounterRequest::tool_calls_unused`]): the
    /// counter's are dropped as they come, so that none pile up.
    discard_calls: bool,
}

/// The adapter's view of one line fed: takes the line's tool calls (stamped with the step
/// they were made in) and results at once, so that the host learns each call's step however
/// many lines a chunk held.
struct LineTaker<'a> {
    discard_calls: bool,
    steps_begun: &'a mut u64,
    calls: &'a mut Vec<crate::model::ToolCall>,
    results: &'a mut Vec<crate::model::ToolResult>,
}

impl LineTaker<'_> {
    fn after_line(&mut self, counter: &mut dyn StepCounter, report: &LineReport) {
        *self.steps_begun = self
            .steps_begun
            .saturating_add(u64::from(report.steps_begun));
        if self.discard_calls {
            if report.has(LineReport::TOOL_CALL) {
                drop(counter.take_tool_calls());
            }
            if report.has(LineReport::TOOL_RESULT) {
                drop(counter.take_tool_results());
            }
            return;
        }
        if report.has(LineReport::TOOL_CALL) {
            let step = *self.steps_begun;
            self.calls
                .extend(counter.take_tool_calls().into_iter().map(|mut call| {
                    call.step.get_or_insert(step);
                    call
                }));
        }
        if report.has(LineReport::TOOL_RESULT) {
            self.results.extend(counter.take_tool_results());
        }
    }
}

impl CounterAdapter {
    fn new(inner: Box<dyn StepCounter>) -> Self {
        CounterAdapter {
            inner,
            poisoned: false,
            steps_begun: 0,
            calls: Vec::new(),
            results: Vec::new(),
            discard_calls: false,
        }
    }

    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut dyn StepCounter) -> Result<T, String>,
    ) -> RResult<T, RString> {
        if self.poisoned {
            return RResult::RErr(RString::from("counter unusable after an earlier panic"));
        }
        let inner = &mut *self.inner;
        let result = guarded(|| f(inner));
        if let RResult::RErr(e) = &result {
            self.poisoned = e.as_str().starts_with("plugin panicked");
        }
        result
    }
}

impl CounterAdapter {
    /// [`CounterAdapter::run`], with what takes each line's tool calls and results.
    fn run_taking<T>(
        &mut self,
        f: impl FnOnce(&mut dyn StepCounter, &mut LineTaker<'_>) -> Result<T, String>,
    ) -> RResult<T, RString> {
        if self.poisoned {
            return RResult::RErr(RString::from("counter unusable after an earlier panic"));
        }
        let mut taker = LineTaker {
            discard_calls: self.discard_calls,
            steps_begun: &mut self.steps_begun,
            calls: &mut self.calls,
            results: &mut self.results,
        };
        let inner = &mut *self.inner;
        let result = guarded(|| f(inner, &mut taker));
        if let RResult::RErr(e) = &result {
            self.poisoned = e.as_str().starts_with("plugin panicked");
        }
        result
    }
}

impl CounterObj for CounterAdapter {
    fn feed(&mut self, line: RSlice<'_, u8>) -> RResult<LineReport, RString> {
        self.run_taking(|c, taker| {
            let report = c.feed(line.as_slice())?;
            taker.after_line(c, &report);
            Ok(report)
        })
    }

    fn feed_chunk(
        &mut self,
        chunk: RSlice<'_, u8>,
        step_allowance: u64,
    ) -> RResult<ChunkReport, RString> {
        self.run_taking(|c, taker| {
            feed_chunk_with(c, chunk.as_slice(), step_allowance, &mut |c, r| {
                taker.after_line(c, r)
            })
        })
    }

    fn finish(&mut self) -> RResult<RString, RString> {
        self.run(|c| {
            serde_json::to_string(&c.finish())
                .map(RString::from)
                .map_err(|e| e.to_string())
        })
    }

    fn call(&mut self, method: RStr<'_>, _payload: RStr<'_>) -> RResult<RString, RString> {
        match method.as_str() {
            "tool_calls" => {
                let calls = std::mem::take(&mut self.calls);
                self.run(|_| {
                    serde_json::to_string(&calls)
                        .map(RString::from)
                        .map_err(|e| e.to_string())
                })
            }
            "tool_results" => {
                let results = std::mem::take(&mut self.results);
                self.run(|_| {
                    serde_json::to_string(&results)
                        .map(RString::from)
                        .map_err(|e| e.to_string())
                })
            }
            "usage" => self.run(|c| {
                serde_json::to_string(&c.take_usage())
                    .map(RString::from)
                    .map_err(|e| e.to_string())
            }),
            other => RResult::RErr(RString::from(format!("unknown counter method `{other}`"))),
        }
    }
}

/// Feeds the lines of `chunk` to `counter` until the steps begun exceed `step_allowance`.
pub(crate) fn feed_chunk(
    counter: &mut dyn StepCounter,
    chunk: &[u8],
    step_allowance: u64,
) -> Result<ChunkReport, String> {
    feed_chunk_with(counter, chunk, step_allowance, &mut |_, _| {})
}

/// [`feed_chunk`], calling `after_line` with each line's report.
fn feed_chunk_with(
    counter: &mut dyn StepCounter,
    chunk: &[u8],
    step_allowance: u64,
    after_line: &mut dyn FnMut(&mut dyn StepCounter, &LineReport),
) -> Result<ChunkReport, String> {
    let mut out = ChunkReport::default();
    let mut begun: u64 = 0;
    let mut rest = chunk;
    while !rest.is_empty() {
        let (line, taken) = match memchr::memchr(b'\n', rest) {
            Some(nl) => (&rest[..nl], nl + 1),
            None => (rest, rest.len()),
        };
        rest = &rest[taken..];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let r = counter.feed(line)?;
        after_line(counter, &r);
        out.consumed += taken as u64;
        out.lines += 1;
        out.noise_lines += u64::from(r.has(LineReport::NOISE));
        add_report(&mut out.sum, &r);
        begun += u64::from(r.steps_begun);
        if begun > step_allowance {
            out.stopped = true;
            break;
        }
    }
    Ok(out)
}

/// Adds `r` into `sum` (counts saturating, flags OR-ed).
pub fn add_report(sum: &mut LineReport, r: &LineReport) {
    sum.steps_begun = sum.steps_begun.saturating_add(r.steps_begun);
    sum.steps_completed = sum.steps_completed.saturating_add(r.steps_completed);
    sum.turns = sum.turns.saturating_add(r.turns);
    sum.sub_agent_steps = sum.sub_agent_steps.saturating_add(r.sub_agent_steps);
    sum.flags |= r.flags;
}

/// Puts a plugin behind the boundary's provider interface without a dynamic library; this is how
/// built-in providers reach the host through the same interface as loaded ones.
pub fn provider_box<P: ProviderPlugin>(plugin: P) -> ProviderBox {
    ProviderObj_TO::from_value(ProviderAdapter(plugin), TD_Opaque)
}

/// Builds the root module of a dynamic plugin library (used by [`crate::export_plugin!`]).
#[doc(hidden)]
pub fn root_module<P: ProviderPlugin + Default>() -> PluginModRef {
    PluginMod {
        new_provider: new_provider::<P>,
    }
    .leak_into_prefix()
}

extern "C" fn new_provider<P: ProviderPlugin + Default>(
    host: HostCallbacks,
) -> RResult<ProviderBox, RString> {
    guarded(|| {
        // The plugin has its own copy of `tracing`: route its events to the host's subscriber.
        let _ = tracing::subscriber::set_global_default(Forwarder {
            host,
            next_span: AtomicU64::new(1),
        });
        // The plugin's own std prints panics to stderr; route them to the host's log instead
        // (`guarded` turns each one into an error the host reports).
        std::panic::set_hook(Box::new(|info| tracing::debug!("plugin panic: {info}")));
        Ok(provider_box(P::default()))
    })
}

/// A minimal `tracing` subscriber that forwards events to the host's log callback.
struct Forwarder {
    host: HostCallbacks,
    next_span: AtomicU64,
}

fn level_number(level: &tracing::Level) -> u8 {
    match *level {
        tracing::Level::ERROR => 1,
        tracing::Level::WARN => 2,
        tracing::Level::INFO => 3,
        tracing::Level::DEBUG => 4,
        tracing::Level::TRACE => 5,
    }
}

struct MessageVisitor(String);

impl tracing::field::Visit for MessageVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl tracing::Subscriber for Forwarder {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        level_number(metadata.level()) <= self.host.max_level
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut visitor = MessageVisitor(String::new());
        event.record(&mut visitor);
        let meta = event.metadata();
        (self.host.log)(
            level_number(meta.level()),
            RStr::from(meta.target()),
            RStr::from(visitor.0.as_str()),
        );
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Helpers for testing plugins without a host.
pub mod testing {
    use super::StepCounter;
    use crate::abi::LineReport;
    use crate::model::CounterStats;

    /// Opens a counter for `unit` on `plugin` and feeds it a whole stream (see [`feed_all`]).
    pub fn count(
        plugin: &dyn super::ProviderPlugin,
        unit: &str,
        stream: &[u8],
    ) -> Result<(LineReport, CounterStats), String> {
        let mut counter = plugin.open_counter(&crate::model::CounterRequest::new(unit))?;
        feed_all(counter.as_mut(), stream)
    }

    /// Feeds `stream` line by line to a counter for `unit` and returns the tool calls it reports
    /// (protocol 1.3), each with the steps begun up to its line. Fails on the line where the
    /// [`LineReport::TOOL_CALL`] flag and the reported calls disagree (the host asks for calls
    /// only after a flagged chunk, so an unflagged call would never be seen).
    pub fn tool_calls(
        plugin: &dyn super::ProviderPlugin,
        unit: &str,
        stream: &[u8],
    ) -> Result<Vec<(crate::model::ToolCall, u64)>, String> {
        let mut counter = plugin.open_counter(&crate::model::CounterRequest::new(unit))?;
        let mut step = 0;
        let mut out = Vec::new();
        for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let report = counter.feed(line)?;
            step += u64::from(report.steps_begun);
            let taken = counter.take_tool_calls();
            if report.has(LineReport::TOOL_CALL) == taken.is_empty() {
                return Err(format!(
                    "the TOOL_CALL flag and the {} reported call(s) disagree on: {}",
                    taken.len(),
                    String::from_utf8_lossy(line)
                ));
            }
            out.extend(taken.into_iter().map(|c| (c, step)));
        }
        Ok(out)
    }

    /// Feeds `stream` line by line to a counter for `unit` and returns the tool results it
    /// reports (protocol 1.6), each with the call it answers. Fails on the line where the
    /// [`LineReport::TOOL_RESULT`] flag and the reported results disagree, and on a result
    /// that names no call reported before it.
    pub fn tool_results(
        plugin: &dyn super::ProviderPlugin,
        unit: &str,
        stream: &[u8],
    ) -> Result<Vec<(crate::model::ToolCall, crate::model::ToolResult)>, String> {
        let mut counter = plugin.open_counter(&crate::model::CounterRequest::new(unit))?;
        let mut calls = Vec::new();
        let mut out = Vec::new();
        for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let report = counter.feed(line)?;
            calls.extend(counter.take_tool_calls());
            let taken = counter.take_tool_results();
            if report.has(LineReport::TOOL_RESULT) == taken.is_empty() {
                return Err(format!(
                    "the TOOL_RESULT flag and the {} reported result(s) disagree on: {}",
                    taken.len(),
                    String::from_utf8_lossy(line)
                ));
            }
            for result in taken {
                let call = calls
                    .iter()
                    .find(|c: &&crate::model::ToolCall| {
                        c.id.as_deref() == Some(result.call_id.as_str())
                    })
                    .ok_or_else(|| format!("result of no reported call: {result:?}"))?;
                out.push((call.clone(), result));
            }
        }
        Ok(out)
    }

    /// Feeds `stream` line by line to a counter for `unit` and returns the token usage it
    /// reports (protocol 1.5): each delta with its line number (from 1). Fails on the line
    /// where the [`LineReport::USAGE`] flag and the reported usage disagree (the host asks for
    /// usage only after a flagged chunk, so unflagged usage would never be seen).
    pub fn usage_deltas(
        plugin: &dyn super::ProviderPlugin,
        unit: &str,
        stream: &[u8],
    ) -> Result<Vec<(u64, crate::model::Tokens)>, String> {
        let mut counter = plugin.open_counter(&crate::model::CounterRequest::new(unit))?;
        let mut out = Vec::new();
        for (n, line) in stream.split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let report = counter.feed(line.strip_suffix(b"\r").unwrap_or(line))?;
            let taken = counter.take_usage();
            if report.has(LineReport::USAGE) != taken.is_some() {
                return Err(format!(
                    "the USAGE flag and the reported usage ({taken:?}) disagree on line {}: {}",
                    n + 1,
                    String::from_utf8_lossy(line)
                ));
            }
            out.extend(taken.map(|t| (n as u64 + 1, t)));
        }
        Ok(out)
    }

    /// The sum of the usage deltas a counter for `unit` reports over `stream` (see
    /// [`usage_deltas`]): compare it with [`CounterStats::tokens`] from [`count`].
    ///
    /// ```
    /// # use stepguard_plugin_api::{CounterRequest, CounterStats, LineReport, Manifest, ProviderPlugin, StepCounter, Tokens};
    /// #[derive(Default)]
    /// struct Usage {
    ///     pending: Option<Tokens>,
    ///     total: Tokens,
    /// }
    /// impl StepCounter for Usage {
    ///     fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
    ///         // Each line is "INPUT OUTPUT" for one model call.
    ///         let text = String::from_utf8_lossy(line);
    ///         let mut n = text.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
    ///         let call = Tokens::new(n.next().unwrap_or(0), n.next().unwrap_or(0));
    ///         self.total = self.total.saturating_add(call);
    ///         self.pending = Some(self.pending.unwrap_or_default().saturating_add(call));
    ///         Ok(LineReport::step().with_flags(LineReport::USAGE))
    ///     }
    ///     fn take_usage(&mut self) -> Option<Tokens> {
    ///         self.pending.take()
    ///     }
    ///     fn finish(&mut self) -> CounterStats {
    ///         let mut stats = CounterStats::default();
    ///         stats.tokens = Some(self.total);
    ///         stats
    ///     }
    /// }
    /// # struct Plugin;
    /// # impl ProviderPlugin for Plugin {
    /// #     fn manifest(&self) -> Manifest { Manifest::new("u", "1").unit("call", "", true).reports_usage() }
    /// #     fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
    /// #         Ok(Box::new(Usage::default()))
    /// #     }
    /// # }
    /// use stepguard_plugin_api::testing;
    ///
    /// let stream = b"100 20\n300 40\n";
    /// let live = testing::usage(&Plugin, "call", stream)?;
    /// let (_, stats) = testing::count(&Plugin, "call", stream)?;
    /// assert_eq!(Some(live), stats.tokens);
    /// assert_eq!(live.total(), 460);
    /// # Ok::<(), String>(())
    /// ```
    pub fn usage(
        plugin: &dyn super::ProviderPlugin,
        unit: &str,
        stream: &[u8],
    ) -> Result<crate::model::Tokens, String> {
        Ok(usage_deltas(plugin, unit, stream)?
            .into_iter()
            .fold(crate::model::Tokens::default(), |sum, (_, t)| {
                sum.saturating_add(t)
            }))
    }

    /// Names how a counted stream ended: `success`, `incomplete` (no terminal event), or the
    /// failure slug.
    pub fn outcome(stats: &CounterStats) -> String {
        match &stats.terminal {
            None => "incomplete".into(),
            Some(t) if t.success => "success".into(),
            Some(t) => t.slug.clone().unwrap_or_else(|| "failed".into()),
        }
    }

    /// Feeds a chunk of lines the way the host does ([`crate::abi::CounterObj::feed_chunk`]).
    pub fn feed_chunk(
        counter: &mut dyn StepCounter,
        chunk: &[u8],
        step_allowance: u64,
    ) -> Result<crate::abi::ChunkReport, String> {
        super::feed_chunk(counter, chunk, step_allowance)
    }

    /// Feeds every `\n`-separated line of `stream` (a trailing `\r` trimmed) to `counter`, sums
    /// the per-line reports, and returns them with the final stats.
    pub fn feed_all(
        counter: &mut dyn StepCounter,
        stream: &[u8],
    ) -> Result<(LineReport, CounterStats), String> {
        let mut sum = LineReport::empty();
        let mut lines: Vec<&[u8]> = stream.split(|b| *b == b'\n').collect();
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        for line in lines {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            super::add_report(&mut sum, &counter.feed(line)?);
        }
        Ok((sum, counter.finish()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use abi_stable::std_types::{RResult, RStr};

    use super::*;

    /// A plugin that overrides `validate_options` with a value check that accepts any key, and
    /// records the keys it was shown (shared between clones).
    #[derive(Clone, Default)]
    struct Lenient {
        seen: Arc<Mutex<Vec<Vec<String>>>>,
    }

    impl Lenient {
        fn record(&self, options: &serde_json::Map<String, serde_json::Value>) {
            if let Ok(mut seen) = self.seen.lock() {
                seen.push(options.keys().cloned().collect());
            }
        }
    }

    impl ProviderPlugin for Lenient {
        fn manifest(&self) -> Manifest {
            Manifest::new("lenient", "1")
                .unit("line", "every line", true)
                .option("strictness", "`low` or `high`")
        }

        fn validate_options(
            &self,
            options: &serde_json::Map<String, serde_json::Value>,
        ) -> Result<(), String> {
            self.record(options);
            match options.get("strictness").and_then(|v| v.as_str()) {
                None | Some("low" | "high") => Ok(()),
                Some(other) => Err(format!("`strictness` must be low or high, got {other}")),
            }
        }

        fn open_counter(&self, request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
            self.record(&request.options);
            Err("no counter in this test".to_owned())
        }
    }

    fn validate(provider: &ProviderBox, options: serde_json::Value) -> Result<(), String> {
        match provider.call(
            RStr::from("validate_options"),
            RStr::from(options.to_string().as_str()),
        ) {
            RResult::ROk(_) => Ok(()),
            RResult::RErr(e) => Err(e.into_string()),
        }
    }

    fn open(provider: &ProviderBox, options: serde_json::Value) -> Result<(), String> {
        let request = serde_json::json!({"unit": "line", "options": options}).to_string();
        match provider.open_counter(RStr::from(request.as_str())) {
            RResult::ROk(_) => Ok(()),
            RResult::RErr(e) => Err(e.into_string()),
        }
    }

    fn seen(plugin: &Lenient) -> Vec<Vec<String>> {
        plugin.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    #[test]
    fn undeclared_keys_are_refused_before_an_overriding_validate_options() {
        let provider = provider_box(Lenient::default());
        let refusal = "unknown option `colour` for provider `lenient`; accepted: strictness";
        let bad = serde_json::json!({"strictness": "high", "colour": "red"});
        assert_eq!(validate(&provider, bad.clone()), Err(refusal.to_owned()));
        assert_eq!(open(&provider, bad), Err(refusal.to_owned()));
        // The override still checks values of declared keys.
        assert_eq!(
            validate(&provider, serde_json::json!({"strictness": "extreme"})),
            Err("`strictness` must be low or high, got extreme".to_owned())
        );
        assert_eq!(
            validate(&provider, serde_json::json!({"strictness": "low"})),
            Ok(())
        );
    }

    #[test]
    fn the_override_never_sees_undeclared_or_reserved_keys() {
        let plugin = Lenient::default();
        let provider = provider_box(plugin.clone());
        let _ = validate(&provider, serde_json::json!({"colour": "red"}));
        let _ = open(&provider, serde_json::json!({"colour": "red"}));
        assert!(seen(&plugin).is_empty(), "{:?}", seen(&plugin));
        // `max_steps_unit` is the host's: accepted, and not passed on.
        let reserved = serde_json::json!({"max_steps_unit": "line", "strictness": "low"});
        assert_eq!(validate(&provider, reserved.clone()), Ok(()));
        assert_eq!(
            open(&provider, reserved),
            Err("no counter in this test".to_owned())
        );
        let strictness = vec!["strictness".to_owned()];
        assert_eq!(
            seen(&plugin),
            vec![strictness.clone(), strictness.clone(), strictness]
        );
    }

    #[test]
    fn a_plugin_with_no_options_refuses_every_key() {
        #[derive(Default)]
        struct Bare;
        impl ProviderPlugin for Bare {
            fn manifest(&self) -> Manifest {
                Manifest::new("bare", "1").unit("line", "", true)
            }
            fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
                Err("unused".to_owned())
            }
        }
        let provider = provider_box(Bare);
        assert_eq!(
            validate(&provider, serde_json::json!({"x": 1})),
            Err("unknown option `x` for provider `bare`; it accepts none".to_owned())
        );
        assert_eq!(validate(&provider, serde_json::json!({})), Ok(()));
    }

    /// Reports one model call's usage per line: `INPUT OUTPUT`.
    #[derive(Default)]
    struct Calls {
        pending: Option<crate::model::Tokens>,
    }

    impl StepCounter for Calls {
        fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
            let text = String::from_utf8_lossy(line);
            let mut n = text.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
            let call = crate::model::Tokens::new(n.next().unwrap_or(0), n.next().unwrap_or(0));
            self.pending = Some(self.pending.unwrap_or_default().saturating_add(call));
            Ok(LineReport::step().with_flags(LineReport::USAGE))
        }
        fn finish(&mut self) -> CounterStats {
            CounterStats::default()
        }
        fn take_usage(&mut self) -> Option<crate::model::Tokens> {
            self.pending.take()
        }
    }

    #[test]
    fn usage_crosses_the_boundary_as_json_and_is_taken_once() {
        use crate::model::Tokens;
        let mut counter =
            CounterObj_TO::from_value(CounterAdapter::new(Box::new(Calls::default())), TD_Opaque);
        let chunk = counter.feed_chunk(RSlice::from_slice(b"100 20\n50 5\n"), u64::MAX);
        let RResult::ROk(chunk) = chunk else {
            panic!("feed_chunk failed")
        };
        assert!(chunk.sum.has(LineReport::USAGE));
        let take = |counter: &mut CounterBox| match counter.call("usage".into(), "".into()) {
            RResult::ROk(json) => serde_json::from_str::<Option<Tokens>>(json.as_str()).unwrap(),
            RResult::RErr(e) => panic!("{e}"),
        };
        assert_eq!(take(&mut counter), Some(Tokens::new(150, 25)));
        assert_eq!(take(&mut counter), None);
        // A counter that does not report usage answers `null`.
        let mut quiet = CounterObj_TO::from_value(CounterAdapter::new(Box::new(Quiet)), TD_Opaque);
        assert_eq!(take(&mut quiet), None);
    }

    /// `step` begins a step; `call X` is a call of X (id X); `done X` is X's result.
    #[derive(Default)]
    struct Stepper {
        calls: Vec<crate::model::ToolCall>,
        results: Vec<crate::model::ToolResult>,
    }

    impl StepCounter for Stepper {
        fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
            let line = String::from_utf8_lossy(line);
            Ok(match line.split_once(' ') {
                Some(("call", id)) => {
                    let call = crate::model::ToolCall::new("t", &serde_json::json!(id));
                    self.calls.push(call.with_id(id));
                    LineReport::empty().with_flags(LineReport::TOOL_CALL)
                }
                Some(("done", id)) => {
                    self.results
                        .push(crate::model::ToolResult::new(id, "out", false));
                    LineReport::empty().with_flags(LineReport::TOOL_RESULT)
                }
                _ => LineReport::step(),
            })
        }

        fn finish(&mut self) -> CounterStats {
            CounterStats::default()
        }

        fn take_tool_calls(&mut self) -> Vec<crate::model::ToolCall> {
            std::mem::take(&mut self.calls)
        }

        fn take_tool_results(&mut self) -> Vec<crate::model::ToolResult> {
            std::mem::take(&mut self.results)
        }
    }

    #[test]
    fn tool_calls_carry_their_step_however_the_stream_is_chunked() {
        let stream = b"step\nstep\ncall a\ndone a\nstep\ncall b\ncall c\ndone b\n";
        let take = |counter: &mut CounterBox, method: &str| match counter
            .call(method.into(), "".into())
        {
            RResult::ROk(json) => serde_json::from_str::<serde_json::Value>(json.as_str()).unwrap(),
            RResult::RErr(e) => panic!("{e}"),
        };
        let steps = |calls: &serde_json::Value| -> Vec<(String, u64)> {
            calls
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["id"].as_str().unwrap().to_owned(),
                        c["step"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        let want = vec![
            ("a".to_owned(), 2),
            ("b".to_owned(), 3),
            ("c".to_owned(), 3),
        ];
        // One chunk.
        let mut whole =
            CounterObj_TO::from_value(CounterAdapter::new(Box::new(Stepper::default())), TD_Opaque);
        let RResult::ROk(_) = whole.feed_chunk(RSlice::from_slice(stream), u64::MAX) else {
            panic!("feed_chunk failed")
        };
        assert_eq!(steps(&take(&mut whole, "tool_calls")), want);
        let results = take(&mut whole, "tool_results");
        let ids: Vec<&str> = results
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["call_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(take(&mut whole, "tool_calls"), serde_json::json!([]));
        // Line by line.
        let mut lines =
            CounterObj_TO::from_value(CounterAdapter::new(Box::new(Stepper::default())), TD_Opaque);
        let mut calls = Vec::new();
        for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let RResult::ROk(_) = lines.feed(RSlice::from_slice(line)) else {
                panic!("feed failed")
            };
            calls.extend(steps(&take(&mut lines, "tool_calls")));
        }
        assert_eq!(calls, want);
    }

    #[test]
    fn a_host_that_takes_no_tool_calls_gets_none_kept_for_it() {
        struct Steps;
        impl ProviderPlugin for Steps {
            fn manifest(&self) -> Manifest {
                Manifest::new("steps", "1")
                    .unit("line", "", true)
                    .reports_tool_results()
            }
            fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
                // Ignores the request's hint: the adapter must still keep nothing.
                Ok(Box::new(Stepper::default()))
            }
        }
        let take = |counter: &mut CounterBox, method: &str| match counter
            .call(method.into(), "".into())
        {
            RResult::ROk(json) => serde_json::from_str::<serde_json::Value>(json.as_str()).unwrap(),
            RResult::RErr(e) => panic!("{e}"),
        };
        let stream = b"step\ncall a\ndone a\nstep\ncall b\n".repeat(1000);
        for (request, kept) in [
            (CounterRequest::new("line"), 2000),
            (CounterRequest::new("line").without_tool_calls(), 0),
        ] {
            let json = serde_json::to_string(&request).unwrap();
            let RResult::ROk(mut counter) =
                ProviderAdapter(Steps).open_counter(json.as_str().into())
            else {
                panic!("open_counter failed")
            };
            let RResult::ROk(chunk) = counter.feed_chunk(RSlice::from_slice(&stream), u64::MAX)
            else {
                panic!("feed_chunk failed")
            };
            assert_eq!(chunk.sum.steps_begun, 2000, "steps are counted either way");
            let calls = take(&mut counter, "tool_calls");
            assert_eq!(calls.as_array().unwrap().len(), kept);
            let results = take(&mut counter, "tool_results");
            assert_eq!(results.as_array().unwrap().len(), kept / 2);
        }
        // A host before 1.7 sends no hint: calls are kept.
        let old: CounterRequest = serde_json::from_str(r#"{"unit":"line"}"#).unwrap();
        assert!(!old.tool_calls_unused);
        assert_eq!(
            serde_json::to_string(&CounterRequest::new("line")).unwrap(),
            r#"{"unit":"line","options":{}}"#,
            "the hint is sent only when set"
        );
    }

    struct Quiet;

    impl StepCounter for Quiet {
        fn feed(&mut self, _: &[u8]) -> Result<LineReport, String> {
            Ok(LineReport::empty())
        }
        fn finish(&mut self) -> CounterStats {
            CounterStats::default()
        }
    }

    #[test]
    fn the_usage_helper_refuses_unflagged_usage() {
        struct Unflagged;
        impl ProviderPlugin for Unflagged {
            fn manifest(&self) -> Manifest {
                Manifest::new("unflagged", "1").unit("line", "", true)
            }
            fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
                struct C(Calls);
                impl StepCounter for C {
                    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
                        self.0.feed(line).map(|_| LineReport::step())
                    }
                    fn finish(&mut self) -> CounterStats {
                        CounterStats::default()
                    }
                    fn take_usage(&mut self) -> Option<crate::model::Tokens> {
                        self.0.take_usage()
                    }
                }
                Ok(Box::new(C(Calls::default())))
            }
        }
        let err = testing::usage(&Unflagged, "line", b"1 2\n").unwrap_err();
        assert!(err.contains("disagree on line 1"), "{err}");
    }

    #[test]
    fn the_manifest_sent_declares_the_lowest_protocol_it_needs() {
        let provider = provider_box(Lenient::default());
        let json = match provider.manifest_json() {
            RResult::ROk(json) => json.into_string(),
            RResult::RErr(e) => panic!("{e}"),
        };
        let manifest: Manifest = serde_json::from_str(&json).unwrap();
        assert_eq!(manifest.protocol, "1.0.0");

        #[derive(Default)]
        struct Direct;
        impl ProviderPlugin for Direct {
            fn manifest(&self) -> Manifest {
                let mut m = Manifest::new("direct", "1").unit("line", "", true);
                // Set without the builder: still counted.
                m.expects = "JSON lines".to_owned();
                m
            }
            fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
                Err("unused".to_owned())
            }
        }
        let json = match provider_box(Direct).manifest_json() {
            RResult::ROk(json) => json.into_string(),
            RResult::RErr(e) => panic!("{e}"),
        };
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["protocol"], "1.2.0");
    }
}
