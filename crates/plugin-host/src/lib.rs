//! Finds and loads stepguard provider plugins and keeps the registry of providers.
//!
//! Built-in providers and plugin files are reached through the same interface
//! ([`stepguard_plugin_api::host::Provider`]). Plugin files come only from directories the user
//! configured, in this order: `--plugin-dir` (repeatable), `STEPGUARD_PLUGIN_PATH` (a
//! `:`-separated list), the user's data directory (`$XDG_DATA_HOME/stepguard/plugins`), the
//! `plugins/` directory beside the executable, and `../lib/stepguard/plugins` from the
//! executable's directory (the layout `.ci/dist` installs: `bin/stepguard` plus
//! `lib/stepguard/plugins/*.so`); never the working directory: relative entries in
//! `STEPGUARD_PLUGIN_PATH` are ignored ([`SearchPath::ignored`]), while a relative `--plugin-dir`
//! is explicit and resolved against the working directory. The first file that provides a name
//! wins.
//!
//! Plugins decide how steps are counted, so loading one is a matter of trust:
//!
//! - a file is opened only when it, its directory and every directory above it are owned by
//!   root or the current user and writable by nobody else ([`trust::check_plugin_file`], like
//!   OpenSSH's `StrictModes` and `safe_path`);
//! - a plugin whose name matches a built-in replaces it only when the caller consents
//!   ([`LoadPolicy::allow_override`]); otherwise the built-in stays and the file is refused. The
//!   name comes from the plugin's manifest, so such a file has been opened by then: this keeps
//!   the budget's counter, it does not sandbox code that the current user could already run.
//!
//! A command opens only the files it needs ([`Needed`], [`Registry::load_dirs_for`]): one of a
//! built-in provider that no plugin may replace opens none.
//!
//! A file that is refused or fails to load is skipped and remembered ([`Registry::failures`],
//! [`Registry::failures_for`]): a command that needs the provider it was meant to be fails with
//! the same message ([`LookupError::FailedToLoad`]), and a provider that is not found at all
//! names the files whose provider could not be read ([`LookupError::Unknown`]). Each reason is one
//! line; a long one (abi_stable's layout report runs to well over a thousand lines) is shortened
//! and the full text kept in [`FailureReason::details`].
//!
//! ```
//! let registry = stepguard_plugin_host::Registry::new(Vec::new());
//! assert!(registry.get("codex").is_err());
//! ```
#![forbid(unsafe_code)]

pub mod trust;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use stepguard_plugin_api::ABI_GENERATION;
use stepguard_plugin_api::ProviderBox;
use stepguard_plugin_api::abi::HostCallbacks;
use stepguard_plugin_api::abi_stable_rstr::RStr;
use stepguard_plugin_api::host::{self, DYLIB_EXTENSION, LoadError, Provider};

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

/// Which plugin files a command needs opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needed<'a> {
    /// Every file (`plugins`, `config`, `validate`: they report on all of them).
    All,
    /// Only what provider `name` may come from: no file at all when it is built in and no
    /// plugin may replace it, else every file (a file's provider is known only once opened).
    Provider(&'a str),
}

/// What the registry may load, beyond files that pass the trust check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadPolicy {
    /// Let a plugin replace a built-in provider of the same name (off: the file is refused).
    pub allow_override: bool,
}

/// Why a plugin file is not in the registry.
///
/// Its `Display` is one line: a load error whose text is long or spans lines (abi_stable's layout
/// report) is replaced by a short reason and a hint, and [`FailureReason::details`] keeps the
/// full text for the verbose log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailureReason {
    /// Someone other than root and the current user can change the file or its directory; it
    /// was not opened.
    #[error(transparent)]
    Unsafe(#[from] trust::UnsafePlugin),
    /// It provides a built-in provider's name and the policy does not allow overrides.
    #[error(
        "it would replace the built-in provider `{provider}`; pass --allow-override to allow it"
    )]
    WouldOverride {
        /// The built-in provider's name.
        provider: String,
    },
    /// It did not load.
    #[error("{}", load_summary(.0))]
    Load(#[from] LoadError),
}

impl FailureReason {
    /// Returns true when the host refused the file rather than the file failing to load.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, FailureReason::Load(_))
    }

    /// Returns the full text of a reason whose `Display` was shortened to one line (abi_stable's
    /// layout report), or `None` when the one line says everything.
    pub fn details(&self) -> Option<String> {
        match self {
            FailureReason::Load(error) => {
                let full = error.to_string();
                is_long(&full).then_some(full)
            }
            FailureReason::Unsafe(_) | FailureReason::WouldOverride { .. } => None,
        }
    }
}

/// The longest load error shown as it is; longer ones (or any spanning lines) are shortened.
const MAX_REASON_CHARS: usize = 240;

fn is_long(text: &str) -> bool {
    text.contains('\n') || text.chars().count() > MAX_REASON_CHARS
}

/// Returns a load error as one line. A failed layout check gets a fixed reason and what to do:
/// the report itself (one line per mismatched field, well over a thousand for a plugin built
/// against another API) is of use only to whoever rebuilds the plugin.
fn load_summary(error: &LoadError) -> String {
    let full = error.to_string();
    if !is_long(&full) {
        return full;
    }
    match error {
        LoadError::Layout(_) => format!(
            "its type layout does not match this stepguard's plugin ABI (built against an \
             incompatible stepguard-plugin-api); rebuild it against stepguard-plugin-api \
             {ABI_GENERATION}.x; -v shows the layout report"
        ),
        _ => {
            let first = full.lines().next().unwrap_or_default().trim_end();
            let first: String = first.chars().take(MAX_REASON_CHARS).collect();
            format!("{first} ...; -v shows the details")
        }
    }
}

/// A plugin file that was refused or could not be loaded.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: FailureReason,
    /// The provider it was probably meant to be (from its manifest, else its file name).
    pub provider_hint: Option<String>,
    /// True when `provider_hint` is the name the plugin's manifest declares; false when it is a
    /// guess from the file name (the file was refused unopened, or failed before its manifest).
    pub name_declared: bool,
}

impl LoadFailure {
    /// Returns `was refused` or `failed to load`.
    pub fn verb(&self) -> &'static str {
        if self.error.is_refusal() {
            "was refused"
        } else {
            "failed to load"
        }
    }
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.path.display();
        match &self.error {
            FailureReason::Unsafe(why) => write!(f, "refusing plugin {path}: {why}"),
            FailureReason::WouldOverride { provider } => write!(
                f,
                "plugin {path} would replace the built-in provider `{provider}`; pass --allow-override to allow it"
            ),
            FailureReason::Load(_) => write!(f, "skipped plugin {path}: {}", self.error),
        }
    }
}

/// Example plugins that ship with stepguard's source rather than inside the binary, with the
/// library file `.ci/dist` installs for each.
pub const EXAMPLE_PLUGINS: &[(&str, &str)] = &[("opencode", "libstepguard_plugin_opencode")];

/// A provider that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// No provider by that name exists anywhere.
    #[error(
        "unknown provider `{name}`; available providers: {available}{}",
        unknown_suffix(.name, .unread)
    )]
    Unknown {
        /// The name asked for.
        name: String,
        /// Comma-separated names of the providers that exist.
        available: String,
        /// Plugin files that were refused or failed before their provider's name could be read:
        /// any of them may be the one asked for.
        unread: Vec<LoadFailure>,
    },
    /// The provider's plugin file exists but was refused or failed to load.
    #[error(
        "provider `{name}` is unavailable: plugin {} {}: {error}",
        .path.display(),
        if .error.is_refusal() { "was refused" } else { "failed to load" }
    )]
    FailedToLoad {
        /// The name asked for.
        name: String,
        /// The plugin file.
        path: PathBuf,
        /// Why it failed.
        error: FailureReason,
    },
}

/// The end of the unknown-provider message: the files that might have been the provider, and
/// how to get an example plugin that is not installed.
fn unknown_suffix(name: &str, unread: &[LoadFailure]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for failure in unread {
        let _ = write!(
            out,
            "; plugin {}, whose provider could not be read, {}: {}",
            failure.path.display(),
            failure.verb(),
            failure.error
        );
    }
    if let Some((example, file)) = EXAMPLE_PLUGINS.iter().find(|(n, _)| *n == name) {
        let _ = write!(
            out,
            "; `{example}` is an example plugin that ships with stepguard's source: build it with \
             `.ci/dist` (installs lib/stepguard/plugins/{file}.{DYLIB_EXTENSION} beside \
             bin/stepguard) or `cargo build --release -p stepguard-plugin-{example}` and pass \
             `--plugin-dir target/release`"
        );
    }
    out
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
                Err(error) => registry.record(LoadFailure {
                    path: PathBuf::from("<builtin>"),
                    error: error.into(),
                    provider_hint: None,
                    name_declared: false,
                }),
            }
        }
        registry
    }

    /// Loads every plugin file in `dirs` (in order; missing directories are skipped) under the
    /// default policy: no plugin may replace a built-in.
    pub fn load_dirs(&mut self, dirs: &[PathBuf]) {
        self.load_dirs_with(dirs, LoadPolicy::default());
    }

    /// Loads the plugin files in `dirs` that a command needing `needed` needs (see [`Needed`]):
    /// a command of a built-in provider that no plugin may replace opens none, so a bad file
    /// in a plugin directory cannot touch it.
    pub fn load_dirs_for(&mut self, dirs: &[PathBuf], policy: LoadPolicy, needed: Needed<'_>) {
        if let Needed::Provider(name) = needed
            && !policy.allow_override
            && self
                .entries
                .get(name)
                .is_some_and(|e| e.source == Source::Builtin)
        {
            tracing::debug!(
                provider = name,
                "built in and not replaceable: no plugin file opened"
            );
            return;
        }
        self.load_dirs_with(dirs, policy);
    }

    /// Loads every plugin file in `dirs` (in order; missing directories are skipped) under
    /// `policy`. Files that fail the trust check are refused without being opened.
    pub fn load_dirs_with(&mut self, dirs: &[PathBuf], policy: LoadPolicy) {
        let mut loaded_names = Vec::new();
        for dir in dirs {
            let Ok(files) = host::list_dir(dir) else {
                continue;
            };
            for path in files {
                self.load_file(&path, policy, &mut loaded_names);
            }
        }
    }

    fn load_file(&mut self, path: &Path, policy: LoadPolicy, loaded_names: &mut Vec<String>) {
        if let Err(unsafe_plugin) = trust::check_plugin_file(path) {
            self.record(LoadFailure {
                path: path.to_path_buf(),
                error: unsafe_plugin.into(),
                provider_hint: name_from_file(path),
                name_declared: false,
            });
            return;
        }
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
                if replaces_builtin && !policy.allow_override {
                    self.record(LoadFailure {
                        path: path.to_path_buf(),
                        error: FailureReason::WouldOverride {
                            provider: name.clone(),
                        },
                        provider_hint: Some(name),
                        name_declared: true,
                    });
                    return;
                }
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
                let declared = error.provider().map(str::to_owned);
                let name_declared = declared.is_some();
                self.record(LoadFailure {
                    path: path.to_path_buf(),
                    error: error.into(),
                    provider_hint: declared.or_else(|| name_from_file(path)),
                    name_declared,
                });
            }
        }
    }

    /// Remembers a failure. It is logged here only at debug level, in one line: whether the user
    /// hears of it depends on the command (the CLI warns about the files a command needs).
    fn record(&mut self, failure: LoadFailure) {
        tracing::debug!("{failure}");
        self.failures.push(failure);
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
            unread: self
                .failures
                .iter()
                .filter(|f| !f.name_declared)
                .cloned()
                .collect(),
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

    /// Returns the plugin files that were refused or failed to load, in search order.
    pub fn failures(&self) -> &[LoadFailure] {
        &self.failures
    }

    /// Returns the plugin files meant to be provider `name` (by their manifest, else their file
    /// name) that were refused or failed to load: what a command that needs `name` warns about.
    pub fn failures_for<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a LoadFailure> {
        self.failures
            .iter()
            .filter(move |f| f.provider_hint.as_deref() == Some(name))
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

/// The plugin directories to search, and the `STEPGUARD_PLUGIN_PATH` entries left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchPath {
    /// The directories, in search order.
    pub dirs: Vec<PathBuf>,
    /// Relative entries of `STEPGUARD_PLUGIN_PATH` (including `.` and empty ones), which would
    /// load plugins from wherever stepguard happens to run; each is worth one warning.
    pub ignored: Vec<IgnoredEntry>,
}

/// A relative `STEPGUARD_PLUGIN_PATH` entry that was not searched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredEntry(pub PathBuf);

impl std::fmt::Display for IgnoredEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ignoring relative entry {:?} in {PLUGIN_PATH_ENV}; plugin directories there must be absolute",
            self.0.display().to_string()
        )
    }
}

/// Returns the plugin directories in search order: `cli_dirs` (a relative one resolved against
/// the working directory: naming it is explicit), the absolute entries of `env_path` (an empty
/// value counts as unset), the user's data directory, `plugins/` beside `exe`, and
/// `lib/stepguard/plugins` under the parent of `exe`'s directory (`PREFIX/bin/stepguard` finds
/// `PREFIX/lib/stepguard/plugins`, the layout `.ci/dist` installs).
pub fn plugin_dirs(
    cli_dirs: &[PathBuf],
    env_path: Option<&OsStr>,
    exe: Option<&Path>,
) -> SearchPath {
    let mut search = SearchPath {
        dirs: cli_dirs
            .iter()
            .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone()))
            .collect(),
        ignored: Vec::new(),
    };
    if let Some(path) = env_path.filter(|p| !p.is_empty()) {
        for entry in std::env::split_paths(path) {
            if entry.is_absolute() {
                search.dirs.push(entry);
            } else {
                search.ignored.push(IgnoredEntry(entry));
            }
        }
    }
    {
        use etcetera::BaseStrategy as _;
        // A relative HOME (or XDG_DATA_HOME) would put the user's plugin directory inside
        // the working directory, a repository's to fill: left out (the config files' lookup
        // refuses such a HOME before any plugin is looked for).
        if let Ok(base) = etcetera::choose_base_strategy() {
            let dir = base.data_dir().join("stepguard").join("plugins");
            if dir.is_absolute() {
                search.dirs.push(dir);
            }
        }
    }
    if let Some(dir) = exe.and_then(Path::parent) {
        search.dirs.push(dir.join("plugins"));
        if let Some(prefix) = dir.parent() {
            search
                .dirs
                .push(prefix.join("lib").join("stepguard").join("plugins"));
        }
    }
    search
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

/// Loads one plugin file on its own and returns its manifest, or why it is refused or does not
/// load. The trust check applies as in a plugin directory; built-in names are not considered.
pub fn check_file(path: &Path) -> Result<stepguard_plugin_api::Manifest, FailureReason> {
    if !path.is_file() {
        return Err(LoadError::NotALibrary(format!("{} is not a file", path.display())).into());
    }
    trust::check_plugin_file(path)?;
    Ok(host::load_file(path, host_callbacks()).map(|p| p.manifest().clone())?)
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
    fn search_order_is_flags_env_data_dir_exe_dir_then_prefix_lib() {
        let search = plugin_dirs(
            &[PathBuf::from("/a"), PathBuf::from("/b")],
            Some(std::ffi::OsStr::new("/c:/d")),
            Some(Path::new("/opt/sg/bin/stepguard")),
        );
        let dirs = &search.dirs;
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
        assert_eq!(dirs[6], PathBuf::from("/opt/sg/lib/stepguard/plugins"));
        assert_eq!(dirs.len(), 7);
        assert!(search.ignored.is_empty());
    }

    #[test]
    fn relative_env_entries_are_ignored_and_named() {
        let search = plugin_dirs(&[], Some(std::ffi::OsStr::new(".:/c::plugins:/d")), None);
        assert!(search.dirs.iter().all(|d| d.is_absolute()), "{search:?}");
        assert_eq!(
            &search.dirs[..2],
            &[PathBuf::from("/c"), PathBuf::from("/d")]
        );
        let ignored: Vec<String> = search.ignored.iter().map(ToString::to_string).collect();
        assert_eq!(
            ignored,
            [
                "ignoring relative entry \".\" in STEPGUARD_PLUGIN_PATH; plugin directories there must be absolute",
                "ignoring relative entry \"\" in STEPGUARD_PLUGIN_PATH; plugin directories there must be absolute",
                "ignoring relative entry \"plugins\" in STEPGUARD_PLUGIN_PATH; plugin directories there must be absolute",
            ]
        );
        // A variable set to nothing is as good as unset.
        let empty = plugin_dirs(&[], Some(std::ffi::OsStr::new("")), None);
        assert!(empty.ignored.is_empty());
    }

    #[test]
    fn relative_flag_dirs_are_resolved_against_the_working_directory() {
        let search = plugin_dirs(&[PathBuf::from("my-plugins")], None, None);
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(search.dirs[0], cwd.join("my-plugins"));
        assert!(search.ignored.is_empty());
    }

    #[test]
    fn failures_say_whether_the_file_was_refused_or_did_not_load() {
        let refused = LoadFailure {
            path: PathBuf::from("/x/libfoo.so"),
            error: trust::UnsafePlugin {
                dir: None,
                problem: trust::Problem::Writable { mode: 0o666 },
            }
            .into(),
            provider_hint: Some("foo".into()),
            name_declared: false,
        };
        assert_eq!(
            refused.to_string(),
            "refusing plugin /x/libfoo.so: it is writable by others (mode 0666); chmod go-w it"
        );
        let override_ = LoadFailure {
            path: PathBuf::from("/x/libcodex.so"),
            error: FailureReason::WouldOverride {
                provider: "codex".into(),
            },
            provider_hint: Some("codex".into()),
            name_declared: true,
        };
        assert_eq!(
            override_.to_string(),
            "plugin /x/libcodex.so would replace the built-in provider `codex`; pass --allow-override to allow it"
        );
        let mut registry = Registry::new(Vec::new());
        registry.failures.push(refused);
        assert_eq!(
            registry.get("foo").unwrap_err().to_string(),
            "provider `foo` is unavailable: plugin /x/libfoo.so was refused: it is writable by others (mode 0666); chmod go-w it"
        );
    }

    #[test]
    fn unsafe_files_in_a_plugin_directory_are_refused_without_being_opened() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let file = dir.join(format!("libfoo.{}", std::env::consts::DLL_EXTENSION));
        std::fs::write(&file, b"not a library").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let mut registry = Registry::new(Vec::new());
        registry.load_dirs(std::slice::from_ref(&dir));
        let failures = registry.failures();
        assert_eq!(failures.len(), 1);
        assert!(
            matches!(failures[0].error, FailureReason::Unsafe(_)),
            "{}",
            failures[0]
        );
        assert_eq!(failures[0].provider_hint.as_deref(), Some("foo"));
        assert!(matches!(check_file(&file), Err(FailureReason::Unsafe(_))));

        // Once safe, the same file gets as far as being opened.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(check_file(&file), Err(FailureReason::Load(_))));
    }

    #[test]
    fn unknown_provider_lists_available_ones() {
        let registry = Registry::new(Vec::new());
        assert_eq!(
            registry.get("nope").unwrap_err().to_string(),
            "unknown provider `nope`; available providers: "
        );
    }

    /// A layout report as abi_stable writes it: many lines, the first one general.
    fn layout_report() -> String {
        let mut text = "Compared <this>:\n\tRoot module layout".to_owned();
        for i in 0..1700 {
            text.push_str(&format!("\n\tfield_{i}: expected u64, found u32"));
        }
        text
    }

    #[test]
    fn a_failed_layout_check_is_one_line_and_the_report_is_kept_for_the_log() {
        let failure = LoadFailure {
            path: PathBuf::from("/x/libold.so"),
            error: LoadError::Layout(layout_report()).into(),
            provider_hint: Some("old".into()),
            name_declared: false,
        };
        assert_eq!(
            failure.to_string(),
            format!(
                "skipped plugin /x/libold.so: its type layout does not match this stepguard's \
                 plugin ABI (built against an incompatible stepguard-plugin-api); rebuild it \
                 against stepguard-plugin-api {ABI_GENERATION}.x; -v shows the layout report"
            )
        );
        let details = failure.error.details().expect("details kept");
        assert!(details.contains("field_1699: expected u64"), "{details}");
        // The lookup error that a command needing the provider fails with is one line too.
        let mut registry = Registry::new(Vec::new());
        registry.failures.push(failure);
        let message = registry.get("old").unwrap_err().to_string();
        assert!(!message.contains('\n'), "{message}");
        assert!(message.ends_with("-v shows the layout report"), "{message}");
    }

    #[test]
    fn short_load_errors_are_shown_whole_and_long_ones_cut_to_their_first_line() {
        let short = FailureReason::from(LoadError::Layout("incompatible abi_stable".into()));
        assert_eq!(
            short.to_string(),
            "plugin layout check failed: incompatible abi_stable"
        );
        assert_eq!(short.details(), None);
        let long = FailureReason::from(LoadError::Init("first line\nsecond line".into()));
        assert_eq!(
            long.to_string(),
            "plugin failed to start: first line ...; -v shows the details"
        );
        assert_eq!(
            long.details().as_deref(),
            Some("plugin failed to start: first line\nsecond line")
        );
    }

    #[test]
    fn a_missing_provider_names_the_files_whose_provider_is_unknown_but_not_the_others() {
        let mut registry = Registry::new(Vec::new());
        registry.failures.push(LoadFailure {
            path: PathBuf::from("/x/libmystery.so"),
            error: LoadError::NotAPlugin.into(),
            provider_hint: Some("mystery".into()),
            name_declared: false,
        });
        registry.failures.push(LoadFailure {
            path: PathBuf::from("/x/libcodex.so"),
            error: FailureReason::WouldOverride {
                provider: "codex".into(),
            },
            provider_hint: Some("codex".into()),
            name_declared: true,
        });
        assert_eq!(
            registry.get("wanted").unwrap_err().to_string(),
            "unknown provider `wanted`; available providers: ; plugin /x/libmystery.so, whose \
             provider could not be read, failed to load: not a stepguard plugin (it has no \
             `stepguard_plugin_abi_generation` symbol)"
        );
        let for_codex: Vec<&Path> = registry
            .failures_for("codex")
            .map(|f| f.path.as_path())
            .collect();
        assert_eq!(for_codex, [Path::new("/x/libcodex.so")]);
        assert_eq!(registry.failures_for("claude").count(), 0);
    }

    #[test]
    fn a_missing_example_plugin_says_how_to_get_it() {
        let registry = Registry::new(Vec::new());
        let message = registry.get("opencode").unwrap_err().to_string();
        assert!(
            message.starts_with("unknown provider `opencode`; available providers: ; `opencode` is an example plugin"),
            "{message}"
        );
        for needle in [
            "`.ci/dist` (installs lib/stepguard/plugins/libstepguard_plugin_opencode.",
            "`cargo build --release -p stepguard-plugin-opencode` and pass `--plugin-dir target/release`",
        ] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
        assert!(
            !registry
                .get("opencod")
                .unwrap_err()
                .to_string()
                .contains("example")
        );
    }
}
