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
//! use stepguard_plugin_api::{CounterRequest, CounterStats, LineReport, Manifest, ProviderPlugin, StepCounter};
//!
//! #[derive(Default)]
//! struct Lines;
//!
//! impl ProviderPlugin for Lines {
//!     fn manifest(&self) -> Manifest {
//!         Manifest::new("lines", "0.1.0").unit("line", "every non-empty line is a step", true)
//!     }
//!     fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
//!         Ok(Box::new(LineCounter(0)))
//!     }
//! }
//!
//! struct LineCounter(u64);
//!
//! impl StepCounter for LineCounter {
//!     fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
//!         if line.is_empty() { return Ok(LineReport::noise()); }
//!         self.0 += 1;
//!         Ok(LineReport { steps_begun: 1, steps_completed: 1, ..LineReport::empty() })
//!     }
//!     fn finish(&mut self) -> CounterStats {
//!         CounterStats { num_steps_computed: self.0, ..CounterStats::default() }
//!     }
//! }
//!
//! // In a cdylib crate: stepguard_plugin_api::export_plugin!(Lines);
//! ```
//!
//! # Compatibility
//!
//! * [`ABI_GENERATION`] names the frozen binary layout ([`abi`]). The host refuses another
//!   generation before touching anything else, with a message saying what to rebuild against.
//! * [`PROTOCOL_VERSION`] versions the JSON payloads ([`model`]). A plugin built against protocol
//!   `X.Y` loads in a host speaking `X.Z` with `Z >= Y`. History: 1.0 manifest, counters, stats;
//!   1.1 manifest `native_limit`, stats `sub_agent_steps`.
#![deny(missing_docs)]
// The plugin boundary is the one crate where `unsafe` lives: abi_stable's derives generate it,
// and the host's loader needs it for dlopen; each hand-written block carries a `// SAFETY:` note.
#![allow(unsafe_code)]
// abi_stable's `StableAbi` derive emits impls inside constants.
#![allow(non_local_definitions)]

pub mod abi;
pub mod guest;
#[cfg(feature = "host")]
pub mod host;
pub mod model;

pub use abi::{ChunkReport, HostCallbacks, LineReport, PluginModRef, ProviderBox};
pub use guest::{ProviderPlugin, StepCounter, provider_box, testing};
pub use model::{
    CounterRequest, CounterStats, Manifest, NativeLimit, OptionInfo, Terminal, Tokens, UnitInfo,
    slug_for_error_text,
};

/// abi_stable's borrowed string, which appears in [`HostCallbacks`]' signature.
pub mod abi_stable_rstr {
    pub use abi_stable::std_types::RStr;
}

/// The generation of the frozen binary layout. Changes only when [`abi`] changes.
pub const ABI_GENERATION: u32 = 1;

/// The version of the JSON protocol spoken by this API crate.
pub const PROTOCOL_VERSION: &str = "1.1.0";

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
