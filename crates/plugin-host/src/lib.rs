//! Finds and loads stepguard provider plugins and keeps the registry of providers.
//!
//! Built-in providers and plugin files are reached through the same interface
//! ([`stepguard_plugin_api::host::Provider`]). Plugin files come only from directories the user
//! configured, in this order: `--plugin-dir` (repeatable), `STEPGUARD_PLUGIN_PATH` (a
//! `:`-separated list), the user's data directory (`$XDG_DATA_HOME/stepguard/plugins`), and the
//! `plugins/` directory beside the executable; never the working directory implicitly. The first
//! file that provides a name wins; a loaded plugin whose name matches a built-in replaces it.
//!
//! A file that fails to load is skipped and remembered: a command that needs the provider it was
//! meant to be fails with the same message ([`LookupError::FailedToLoad`]).
//!
//! ```
//! let registry = stepguard_plugin_host::Registry::new(Vec::new());
//! assert!(registry.get("codex").is_err());
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use stepguard_plugin_api::ProviderBox;
use stepguard_plugin_api::abi::HostCallbacks;
use stepguard_plugin_api::abi_stable_rstr::RStr;
use stepguard_plugin_api::host::{self, LoadError, Provider};

/// Environment variable with extra plugin directories, `:`-separated.
pub const PLUGIN_PATH_ENV: &str = "STEPGUARD_PLUGIN_PATH";

/// Where a provider came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Linked into the binary.
    Builtin,
    /// Loaded from this file.
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Builtin => f.write_str("builtin"),
            Source::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// One provider in the registry.
#[derive(Debug)]
pub struct Entry {
    /// The provider.
    pub provider: Provider,
    /// Where it came from.
    pub source: Source,
    /// True when this loaded plugin replaced a built-in provider of the same name.
    pub replaces_builtin: bool,
}

/// A plugin file that could not be loaded.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: LoadError,
    /// The provider it was probably meant to be (from its manifest, else its file name).
    pub provider_hint: Option<String>,
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "skipped plugin {}: {}", self.path.display(), self.error)
    }
}

/// A provider that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// No provider by that name exists anywhere.
    #[error("unknown provider `{name}`; available providers: {available}")]
    Unknown {
        /// The name asked for.
        name: String,
        /// Comma-separated names of the providers that exist.
        available: String,
    },
    /// The provider's plugin file exists but failed to load.
    #[error("provider `{name}` is unavailable: plugin {} failed to load: {error}", .path.display())]
    FailedToLoad {
        /// The name asked for.
        name: String,
        /// The plugin file.
        path: PathBuf,
        /// Why it failed.
        error: LoadError,
    },
}

/// All providers available to this process.
#[derive(Debug, Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
    failures: Vec<LoadFailure>,
}

impl Registry {
    /// Creates a registry of built-in providers.
    pub fn new(builtins: Vec<ProviderBox>) -> Self {
        let mut registry = Registry::default();
        for object in builtins {
            match Provider::new(object) {
                Ok(provider) => {
                    let name = provider.manifest().name.clone();
                    registry.entries.insert(
                        name,
                        Entry {
                            provider,
                            source: Source::Builtin,
                            replaces_builtin: false,
                        },
                    );
                }
                // A built-in that does not load is a bug in this build; report it like a plugin.
                Err(error) => registry.failures.push(LoadFailure {
                    path: PathBuf::from("<builtin>"),
                    error,
                    provider_hint: None,
                }),
            }
        }
        registry
    }

    /// Loads every plugin file in `dirs` (in order; missing directories are skipped).
    pub fn load_dirs(&mut self, dirs: &[PathBuf]) {
        let mut loaded_names = Vec::new();
        for dir in dirs {
            let Ok(files) = host::list_dir(dir) else {
                continue;
            };
            for path in files {
                self.load_file(&path, &mut loaded_names);
            }
        }
    }

    fn load_file(&mut self, path: &Path, loaded_names: &mut Vec<String>) {
        match host::load_file(path, host_callbacks()) {
            Ok(provider) => {
                let name = provider.manifest().name.clone();
                if loaded_names.contains(&name) {
                    tracing::warn!(path = %path.display(), provider = %name, "plugin ignored: an earlier plugin directory already provides this provider");
                    return;
                }
                let replaces_builtin = self
                    .entries
                    .get(&name)
                    .is_some_and(|e| e.source == Source::Builtin);
                tracing::debug!(path = %path.display(), provider = %name, replaces_builtin, "plugin loaded");
                loaded_names.push(name.clone());
                self.entries.insert(
                    name,
                    Entry {
                        provider,
                        source: Source::File(path.to_path_buf()),
                        replaces_builtin,
                    },
                );
            }
            Err(error) => {
                let provider_hint = error
                    .provider()
                    .map(str::to_owned)
                    .or_else(|| name_from_file(path));
                self.failures.push(LoadFailure {
                    path: path.to_path_buf(),
                    error,
                    provider_hint,
                });
            }
        }
    }

    /// Returns a provider by name, or why it cannot be used.
    pub fn get(&self, name: &str) -> Result<&Entry, LookupError> {
        if let Some(entry) = self.entries.get(name) {
            return Ok(entry);
        }
        if let Some(f) = self
            .failures
            .iter()
            .find(|f| f.provider_hint.as_deref() == Some(name))
        {
            return Err(LookupError::FailedToLoad {
                name: name.to_owned(),
                path: f.path.clone(),
                error: f.error.clone(),
            });
        }
        Err(LookupError::Unknown {
            name: name.to_owned(),
            available: self.names().join(", "),
        })
    }

    /// Returns the names of all available providers, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    /// Returns every available provider, sorted by name.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Returns the plugin files that failed to load.
    pub fn failures(&self) -> &[LoadFailure] {
        &self.failures
    }
}

/// Guesses the provider a plugin file is meant to be from its name:
/// `libstepguard_provider_opencode.so` and `libopencode.so` both give `opencode`.
pub fn name_from_file(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_str()?;
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    let stem = [
        "stepguard_provider_",
        "stepguard_plugin_",
        "stepguard-provider-",
        "stepguard-plugin-",
    ]
    .iter()
    .find_map(|p| stem.strip_prefix(p))
    .unwrap_or(stem);
    Some(stem.replace('_', "-")).filter(|s| !s.is_empty())
}

/// Returns the plugin directories in search order.
pub fn plugin_dirs(
    cli_dirs: &[PathBuf],
    env_path: Option<&std::ffi::OsStr>,
    exe: Option<&Path>,
) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = cli_dirs.to_vec();
    if let Some(path) = env_path {
        dirs.extend(std::env::split_paths(path).filter(|p| !p.as_os_str().is_empty()));
    }
    {
        use etcetera::BaseStrategy as _;
        if let Ok(base) = etcetera::choose_base_strategy() {
            dirs.push(base.data_dir().join("stepguard").join("plugins"));
        }
    }
    if let Some(dir) = exe.and_then(Path::parent) {
        dirs.push(dir.join("plugins"));
    }
    dirs
}

fn host_callbacks() -> HostCallbacks {
    let max_level = match tracing::level_filters::LevelFilter::current().into_level() {
        None => 0,
        Some(tracing::Level::ERROR) => 1,
        Some(tracing::Level::WARN) => 2,
        Some(tracing::Level::INFO) => 3,
        Some(tracing::Level::DEBUG) => 4,
        Some(tracing::Level::TRACE) => 5,
    };
    HostCallbacks {
        log: log_from_plugin,
        max_level,
    }
}

extern "C" fn log_from_plugin(level: u8, target: RStr<'_>, message: RStr<'_>) {
    let (target, message) = (target.as_str(), message.as_str());
    match level {
        1 => tracing::error!(plugin = target, "{message}"),
        2 => tracing::warn!(plugin = target, "{message}"),
        3 => tracing::info!(plugin = target, "{message}"),
        4 => tracing::debug!(plugin = target, "{message}"),
        _ => tracing::trace!(plugin = target, "{message}"),
    }
}

/// Loads one plugin file on its own and returns its manifest, or why it does not load.
pub fn check_file(path: &Path) -> Result<stepguard_plugin_api::Manifest, LoadError> {
    if !path.is_file() {
        return Err(LoadError::NotALibrary(format!(
            "{} is not a file",
            path.display()
        )));
    }
    host::load_file(path, host_callbacks()).map(|p| p.manifest().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_files() {
        assert_eq!(
            name_from_file(Path::new("/x/libstepguard_provider_opencode.so")).as_deref(),
            Some("opencode")
        );
        assert_eq!(
            name_from_file(Path::new("/x/libopencode.so")).as_deref(),
            Some("opencode")
        );
        assert_eq!(
            name_from_file(Path::new("/x/my_plugin.so")).as_deref(),
            Some("my-plugin")
        );
    }

    #[test]
    fn search_order_is_flags_env_data_dir_exe_dir() {
        let dirs = plugin_dirs(
            &[PathBuf::from("/a"), PathBuf::from("/b")],
            Some(std::ffi::OsStr::new("/c::/d")),
            Some(Path::new("/opt/sg/bin/stepguard")),
        );
        assert_eq!(
            &dirs[..4],
            &[
                PathBuf::from("/a"),
                PathBuf::from("/b"),
                PathBuf::from("/c"),
                PathBuf::from("/d")
            ]
        );
        assert!(dirs[4].ends_with("stepguard/plugins"));
        assert_eq!(dirs[5], PathBuf::from("/opt/sg/bin/plugins"));
        assert!(!dirs.iter().any(|d| d == Path::new(".")));
    }

    #[test]
    fn unknown_provider_lists_available_ones() {
        let registry = Registry::new(Vec::new());
        assert_eq!(
            registry.get("nope").unwrap_err().to_string(),
            "unknown provider `nope`; available providers: "
        );
    }
}
