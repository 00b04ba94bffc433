//! The host's side of the boundary: load a plugin file safely and talk to providers and counters
//! through safe wrappers.

use std::path::{Path, PathBuf};

use abi_stable::library::lib_header_from_path;
use abi_stable::std_types::{RResult, RSlice, RStr};

use crate::abi::{ChunkReport, CounterBox, HostCallbacks, LineReport, PluginModRef, ProviderBox};
use crate::model::{CounterRequest, CounterStats, Manifest};
use crate::{ABI_GENERATION, ABI_GENERATION_SYMBOL, PROTOCOL_VERSION};

/// Why a plugin file could not be loaded.
///
/// New reasons may be added in a minor release, so matches need a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file is not a loadable dynamic library at all.
    #[error("not a stepguard plugin: not a loadable library ({0})")]
    NotALibrary(String),
    /// A dynamic library without the ABI-generation symbol.
    #[error("not a stepguard plugin (it has no `{ABI_GENERATION_SYMBOL}` symbol)")]
    NotAPlugin,
    /// Built for another frozen layout. ABI generation `N` is what stepguard-plugin-api `N.x`
    /// builds, so the message names the major version to rebuild against.
    #[error(
        "built for plugin ABI {found}, this stepguard speaks {ABI_GENERATION}; rebuild against stepguard-plugin-api {ABI_GENERATION}.x"
    )]
    AbiGeneration {
        /// The generation the plugin reports.
        found: u32,
    },
    /// abi_stable's layout check refused the root module.
    #[error("plugin layout check failed: {0}")]
    Layout(String),
    /// The plugin's constructor failed (or panicked).
    #[error("plugin failed to start: {0}")]
    Init(String),
    /// The manifest is not valid JSON of the expected shape.
    #[error("invalid plugin manifest: {0}")]
    Manifest(String),
    /// The plugin needs a protocol this host does not speak.
    #[error("protocol {required} required, this host speaks {host}")]
    Protocol {
        /// The oldest protocol the plugin declares it needs (major.minor).
        required: String,
        /// What this host speaks (major.minor).
        host: String,
        /// The provider the plugin declares, when its manifest was readable.
        provider: Option<String>,
    },
}

impl LoadError {
    /// Returns the provider name the failed plugin declared, when it got that far.
    pub fn provider(&self) -> Option<&str> {
        match self {
            LoadError::Protocol { provider, .. } => provider.as_deref(),
            _ => None,
        }
    }
}

/// An error returned by a plugin while counting (including a caught panic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin `{provider}` failed: {message}")]
#[non_exhaustive]
pub struct CallError {
    /// The provider whose plugin failed.
    pub provider: String,
    /// The plugin's message.
    pub message: String,
}

impl CallError {
    /// Creates the error `provider`'s plugin returned (or its caught panic's message).
    pub fn new(provider: impl Into<String>, message: impl Into<String>) -> Self {
        CallError {
            provider: provider.into(),
            message: message.into(),
        }
    }
}

fn major_minor(v: &semver::Version) -> String {
    format!("{}.{}", v.major, v.minor)
}

/// Checks that a plugin needing `plugin_protocol` can be used by this host.
///
/// A plugin declares the oldest protocol it needs ([`Manifest::min_protocol`]); the host
/// refuses it only when that is newer than [`PROTOCOL_VERSION`] (or of another major).
pub fn check_protocol(plugin_protocol: &str) -> Result<(), LoadError> {
    let host =
        semver::Version::parse(PROTOCOL_VERSION).map_err(|e| LoadError::Manifest(e.to_string()))?;
    let plugin = semver::Version::parse(plugin_protocol)
        .map_err(|e| LoadError::Manifest(format!("protocol `{plugin_protocol}`: {e}")))?;
    // `^X.Y.Z` accepts any host X.(>=Y) (or, for 0.x, the same minor).
    let req = semver::VersionReq::parse(&format!("^{plugin}"))
        .map_err(|e| LoadError::Manifest(e.to_string()))?;
    if req.matches(&host) {
        Ok(())
    } else {
        Err(LoadError::Protocol {
            required: major_minor(&plugin),
            host: major_minor(&host),
            provider: None,
        })
    }
}

/// A provider ready to open counters, built in or loaded from a file.
pub struct Provider {
    manifest: Manifest,
    object: ProviderBox,
    /// Whether the `request` unit was added by the host (the plugin does not count it).
    request_unit: bool,
}

/// The unit of providers with a model endpoint: one model call that offers tools is one step.
/// The model gateway counts it; the stream still tells turns, tool calls and the outcome.
pub const REQUEST_UNIT: &str = "request";

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// Wraps a provider object, reading and checking its manifest.
    pub fn new(object: ProviderBox) -> Result<Self, LoadError> {
        let json = match object.manifest_json() {
            RResult::ROk(s) => s,
            RResult::RErr(e) => return Err(LoadError::Init(e.into_string())),
        };
        let manifest: Manifest =
            serde_json::from_str(json.as_str()).map_err(|e| LoadError::Manifest(e.to_string()))?;
        check_protocol(&manifest.protocol).map_err(|e| match e {
            LoadError::Protocol { required, host, .. } => LoadError::Protocol {
                required,
                host,
                provider: Some(manifest.name.clone()),
            },
            other => other,
        })?;
        if manifest.units.is_empty() {
            return Err(LoadError::Manifest(format!(
                "provider `{}` declares no units",
                manifest.name
            )));
        }
        let mut manifest = manifest;
        let synthesized = manifest.model_endpoint.is_some()
            && !manifest.units.iter().any(|u| u.name == REQUEST_UNIT);
        if synthesized {
            // Every provider whose CLI can be pointed at the gateway can count model calls.
            let mut unit = crate::UnitInfo::new(
                REQUEST_UNIT,
                "model calls that offer tools, counted by the model gateway (needs `run --wrap-up`)",
                false,
            );
            unit.reply_cost = Some(1);
            manifest.units.push(unit);
        }
        Ok(Provider {
            manifest,
            object,
            request_unit: synthesized,
        })
    }

    /// Returns the provider's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Asks the plugin to validate provider options.
    pub fn validate_options(
        &self,
        options: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), CallError> {
        let payload = serde_json::Value::Object(options.clone()).to_string();
        match self
            .object
            .call(RStr::from("validate_options"), RStr::from(payload.as_str()))
        {
            RResult::ROk(_) => Ok(()),
            RResult::RErr(e) => Err(self.error(e.into_string())),
        }
    }

    /// Opens a counter.
    ///
    /// For the host's `request` unit the plugin counts its default unit, and the counter
    /// reports no steps: the model gateway counts them ([`Counter::counts_model_calls`]).
    pub fn open_counter(&self, request: &CounterRequest) -> Result<Counter, CallError> {
        let model_calls = self.request_unit && request.unit == REQUEST_UNIT;
        let mut request = request.clone();
        if model_calls {
            request.unit = self.manifest.default_unit().unwrap_or_default().to_owned();
        }
        let json = serde_json::to_string(&request).map_err(|e| self.error(e.to_string()))?;
        match self.object.open_counter(RStr::from(json.as_str())) {
            RResult::ROk(object) => Ok(Counter {
                provider: self.manifest.name.clone(),
                object,
                model_calls,
            }),
            RResult::RErr(e) => Err(self.error(e.into_string())),
        }
    }

    fn error(&self, message: String) -> CallError {
        CallError {
            provider: self.manifest.name.clone(),
            message,
        }
    }
}

/// A counter for one stream.
pub struct Counter {
    provider: String,
    object: CounterBox,
    /// Counting the `request` unit: the stream's steps are not steps.
    model_calls: bool,
}

impl Counter {
    /// Feeds one line (without its newline).
    #[inline]
    pub fn feed(&mut self, line: &[u8]) -> Result<LineReport, CallError> {
        match self.object.feed(RSlice::from_slice(line)) {
            RResult::ROk(r) if self.model_calls => Ok(no_steps(r)),
            RResult::ROk(r) => Ok(r),
            RResult::RErr(e) => Err(CallError {
                provider: self.provider.clone(),
                message: e.into_string(),
            }),
        }
    }

    /// Feeds whole lines, stopping right after the line on which the steps begun exceed
    /// `step_allowance` (use `u64::MAX` to read everything).
    #[inline]
    pub fn feed_chunk(
        &mut self,
        chunk: &[u8],
        step_allowance: u64,
    ) -> Result<ChunkReport, CallError> {
        let allowance = if self.model_calls {
            u64::MAX
        } else {
            step_allowance
        };
        match self.object.feed_chunk(RSlice::from_slice(chunk), allowance) {
            RResult::ROk(mut r) if self.model_calls => {
                r.sum = no_steps(r.sum);
                Ok(r)
            }
            RResult::ROk(r) => Ok(r),
            RResult::RErr(e) => Err(CallError {
                provider: self.provider.clone(),
                message: e.into_string(),
            }),
        }
    }

    /// Returns the tool calls the counter saw since the last call (protocol 1.3; ask only
    /// plugins whose manifest says `tool_calls`, after a chunk that set
    /// [`crate::LineReport::TOOL_CALL`]).
    pub fn tool_calls(&mut self) -> Result<Vec<crate::model::ToolCall>, CallError> {
        let err = |message: String| CallError {
            provider: self.provider.clone(),
            message,
        };
        let calls: Vec<crate::model::ToolCall> =
            match self.object.call("tool_calls".into(), "".into()) {
                RResult::ROk(json) => serde_json::from_str(json.as_str())
                    .map_err(|e| err(format!("invalid tool calls: {e}")))?,
                RResult::RErr(e) => return Err(err(e.into_string())),
            };
        // Counting model calls, the stream's steps are not the run's: its stamps mean nothing.
        Ok(if self.model_calls {
            calls
                .into_iter()
                .map(|mut c| {
                    c.step = None;
                    c
                })
                .collect()
        } else {
            calls
        })
    }

    /// Returns the tool results the counter saw since the last call (protocol 1.6; ask only
    /// plugins whose manifest says `tool_results`, after a chunk that set
    /// [`crate::LineReport::TOOL_RESULT`]).
    pub fn tool_results(&mut self) -> Result<Vec<crate::model::ToolResult>, CallError> {
        let err = |message: String| CallError {
            provider: self.provider.clone(),
            message,
        };
        match self.object.call("tool_results".into(), "".into()) {
            RResult::ROk(json) => serde_json::from_str(json.as_str())
                .map_err(|e| err(format!("invalid tool results: {e}"))),
            RResult::RErr(e) => Err(err(e.into_string())),
        }
    }

    /// Returns the token usage the counter saw since the last call, as a delta, or `None`
    /// (protocol 1.5; ask only plugins whose manifest says `reports_usage`, after a chunk that
    /// set [`crate::LineReport::USAGE`]). The deltas of a run add up to its
    /// [`CounterStats::tokens`].
    pub fn take_usage(&mut self) -> Result<Option<crate::model::Tokens>, CallError> {
        let err = |message: String| CallError {
            provider: self.provider.clone(),
            message,
        };
        match self.object.call("usage".into(), "".into()) {
            RResult::ROk(json) => {
                serde_json::from_str(json.as_str()).map_err(|e| err(format!("invalid usage: {e}")))
            }
            RResult::RErr(e) => Err(err(e.into_string())),
        }
    }

    /// Returns the final numbers.
    pub fn finish(&mut self) -> Result<CounterStats, CallError> {
        let err = |message: String| CallError {
            provider: self.provider.clone(),
            message,
        };
        match self.object.finish() {
            RResult::ROk(json) => {
                let mut stats: crate::CounterStats = serde_json::from_str(json.as_str())
                    .map_err(|e| err(format!("invalid stats: {e}")))?;
                if self.model_calls {
                    // Model calls are counted by the gateway, not in the stream.
                    stats.num_steps_computed = 0;
                    stats.num_steps_reported = None;
                }
                Ok(stats)
            }
            RResult::RErr(e) => Err(err(e.into_string())),
        }
    }

    /// Whether this counter counts the `request` unit, whose steps the model gateway counts:
    /// its reports and stats carry no steps.
    pub fn counts_model_calls(&self) -> bool {
        self.model_calls
    }
}

/// A report with its steps taken out (turns, flags and sub-agent steps stay).
fn no_steps(mut r: LineReport) -> LineReport {
    r.steps_begun = 0;
    r.steps_completed = 0;
    r
}

/// Loads a plugin file: pre-flight with `libloading` (ABI generation), then abi_stable's layout
/// check, then the constructor and the manifest's protocol check.
///
/// Libraries are never unloaded (abi_stable keeps them), so load each file once per process.
/// Loading runs the library's initialisers: loading is the trust decision, which is why plugins
/// come only from directories the user configured.
pub fn load_file(path: &Path, host: HostCallbacks) -> Result<Provider, LoadError> {
    preflight(path)?;
    let header = lib_header_from_path(path).map_err(|e| LoadError::Layout(e.to_string()))?;
    let module = header
        .init_root_module::<PluginModRef>()
        .map_err(|e| LoadError::Layout(e.to_string()))?;
    let object = match (module.new_provider())(host) {
        RResult::ROk(object) => object,
        RResult::RErr(e) => return Err(LoadError::Init(e.into_string())),
    };
    Provider::new(object)
}

/// Reads the plain ABI-generation symbol before abi_stable touches the library, after checking
/// that the file holds everything the loader would map ([`check_elf`]).
pub fn preflight(path: &Path) -> Result<u32, LoadError> {
    check_elf(path)?;
    // SAFETY: opening a library runs its initialisers; the caller chose this file from a
    // directory the user configured for plugins, which is the documented trust decision.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| LoadError::NotALibrary(short_dl_error(&e.to_string(), path)))?;
    let symbol = format!("{ABI_GENERATION_SYMBOL}\0");
    // SAFETY: the symbol, when present, is the `extern "C" fn() -> u32` emitted by
    // `export_plugin!`; the library stays loaded while it is called.
    let generation = unsafe {
        let f = lib
            .get::<extern "C" fn() -> u32>(symbol.as_bytes())
            .map_err(|_| LoadError::NotAPlugin)?;
        f()
    };
    // Never unload: a plugin's statics may be referenced after this (abi_stable never unloads).
    std::mem::forget(lib);
    if generation == ABI_GENERATION {
        Ok(generation)
    } else {
        Err(LoadError::AbiGeneration { found: generation })
    }
}

/// Refuses an ELF file the dynamic loader would map past its end: a plugin cut short (a copy
/// interrupted, a full disk) maps fine and then crashes the host with SIGBUS when a page beyond
/// the end is touched. Every loadable segment must lie within the file. Files that are not ELF
/// are left to the loader, whose message says what they are.
pub fn check_elf(path: &Path) -> Result<(), LoadError> {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let damaged = |why: String| LoadError::NotALibrary(format!("damaged ELF file: {why}"));
    let Ok(file) = std::fs::File::open(path) else {
        // Unreadable: the loader says why in its own words.
        return Ok(());
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let data = object::ReadCache::new(file);
    // A 64-bit ELF file (a 32-bit one, or none at all, is the loader's to refuse).
    let ident = object::ReadRef::read_bytes_at(&data, 0, 5).unwrap_or_default();
    if ident != b"\x7fELF\x02" {
        return Ok(());
    }
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&data)
        .map_err(|e| damaged(format!("{e} ({len} bytes; truncated?)")))?;
    let endian = header.endian().map_err(|e| damaged(e.to_string()))?;
    let segments = header
        .program_headers(endian, &data)
        .map_err(|e| damaged(format!("{e} ({len} bytes; truncated?)")))?;
    for segment in segments {
        if segment.p_type(endian) != object::elf::PT_LOAD {
            continue;
        }
        let (offset, size) = (segment.p_offset(endian), segment.p_filesz(endian));
        let end = offset.saturating_add(size);
        if end > len {
            return Err(damaged(format!(
                "a loadable segment ends at byte {end}, past the end of the file ({len} bytes): \
                 truncated; copy or build it again"
            )));
        }
    }
    Ok(())
}

fn short_dl_error(message: &str, path: &Path) -> String {
    // dlopen messages repeat the path; keep just the reason.
    let p = path.display().to_string();
    message.replace(&format!("{p}: "), "").trim().to_owned()
}

/// The platform's file extension for dynamic libraries (`so`, `dylib`, `dll`).
pub const DYLIB_EXTENSION: &str = std::env::consts::DLL_EXTENSION;

/// Returns true when `path` looks like a dynamic library by its extension.
pub fn is_dylib(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == DYLIB_EXTENSION)
}

/// Lists candidate plugin files in a directory, sorted by name.
pub fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && is_dylib(p))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_rules() {
        assert_eq!(check_protocol("1.0.0"), Ok(()));
        assert_eq!(check_protocol(PROTOCOL_VERSION), Ok(()));
        assert_eq!(
            check_protocol("2.0.0").unwrap_err().to_string(),
            "protocol 2.0 required, this host speaks 1.8"
        );
        assert_eq!(
            check_protocol("1.9.0").unwrap_err().to_string(),
            "protocol 1.9 required, this host speaks 1.8"
        );
        assert_eq!(check_protocol("1.8.0"), Ok(()));
        assert_eq!(check_protocol("1.7.0"), Ok(()));
        assert_eq!(check_protocol("1.6.0"), Ok(()));
        assert!(matches!(check_protocol("one"), Err(LoadError::Manifest(_))));
    }

    #[test]
    fn messages_say_what_to_do() {
        assert_eq!(
            LoadError::AbiGeneration { found: 2 }.to_string(),
            "built for plugin ABI 2, this stepguard speaks 1; rebuild against stepguard-plugin-api 1.x"
        );
        assert_eq!(
            LoadError::NotAPlugin.to_string(),
            "not a stepguard plugin (it has no `stepguard_plugin_abi_generation` symbol)"
        );
    }

    #[test]
    fn a_text_file_is_not_a_library() {
        let dir = std::env::temp_dir().join(format!("sg-plugin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("libfake.{DYLIB_EXTENSION}"));
        std::fs::write(&file, "not a library").unwrap();
        let err = preflight(&file).unwrap_err();
        assert!(matches!(err, LoadError::NotALibrary(_)), "{err}");
        assert!(
            err.to_string()
                .starts_with("not a stepguard plugin: not a loadable library")
        );
        assert_eq!(list_dir(&dir).unwrap(), vec![file]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
