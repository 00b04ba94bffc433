//! Finds, parses and validates `stepguard.toml` files into the core's [`ConfigModel`].
//!
//! Discovery: the nearest `stepguard.toml` walking up from the working directory, then the user's
//! config file (`$XDG_CONFIG_HOME/stepguard/stepguard.toml`, by default
//! `~/.config/stepguard/stepguard.toml`), then the system file (`/etc/stepguard/stepguard.toml`,
//! or `$STEPGUARD_SYSTEM_CONFIG`). A value in the project file beats the same key in the user
//! file, which beats the system file. `--config PATH` replaces discovery of settings with exactly
//! one file.
//!
//! Policy: a `[policy]` table counts only in a *policy-bearing* file, one the repository under
//! the agent cannot edit: the user's file, the system file, or the file named by
//! `STEPGUARD_POLICY` (of which only `[policy]` counts). The user and system files bear policy
//! even when `--config` replaces discovery. A project file's `[policy]` (found by walking up, or
//! named by `--config`) is ignored with a warning. Several policy files merge to the tightest:
//! the lowest `max_steps_ceiling`, `allow_plugin_override = false` over `true`, and a provider's
//! fixed unit must agree. See [`FileRole`] and [`discover_sources`].
//!
//! Loosening: while a policy is in force, a project file cannot turn off or loosen enforcement
//! (`[run] unrecognized_stream`, `[run] wrap_up`, units, loop limits, the window, exempt tools);
//! such settings are left out with a warning. `[policy] locked = [...]` forbids loosening the
//! settings it names to the user's and system's files too ([`Lock`]). See [`loosening`].
//!
//! Loop settings: `[loops]` (`limit`, `window`, `ignore_tools`) and `loop_limit` in
//! `[task_types.T]` and `[profiles.NAME]` are validated as they are parsed (a bad value is an
//! error naming its key) and resolved by [`loop_settings::resolve`].
//!
//! Token and cost budgets: `max_tokens` and `max_cost_usd` are read wherever `max_steps` is
//! (top level, `[defaults]`, `[task_types.T]`, `[profiles.NAME]`), and `[policy]` may set
//! `max_tokens_ceiling` and `max_cost_usd_ceiling` (the lowest of the policy files wins). Each
//! is validated as it is parsed (a bad value is an error naming its key) and resolved by
//! [`spend::resolve`].
//!
//! Resolution: one precedence ladder ([`ladder`]: flag → env → task type → global config →
//! profile bound → policy ceiling, each value with its provenance) resolves every limit of a
//! run: the step budget ([`budget::resolve`]), the token and cost budgets ([`spend::resolve`])
//! and the loop limit ([`loop_settings::resolve`]). Each limit declares how its values are parsed
//! and validated ([`ladder::Limit`]); a bad value of any of them is a [`LimitError`].
//!
//! Parsing reports problems as [`Diagnostic`]s that name the file and the key (and line and column
//! for syntax errors). Unknown keys are warnings with a "did you mean" when a known key is close.
//! Any top-level table that is not a stepguard key holds options of the provider it names, e.g.
//! `[codex] max_steps_unit = "actionable"`; the core keeps them opaque and plugins validate them.
//!
//! ```
//! let file = stepguard_config::parse_str("/p/stepguard.toml", "max_steps = 30\n[codex]\nmax_steps_unit = \"tool\"\n").unwrap();
//! let loaded = stepguard_config::merge(vec![file]);
//! assert!(loaded.model.global.max_steps.is_some());
//! assert!(loaded.model.providers.contains_key("codex"));
//! ```
#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

pub mod budget;
pub mod ladder;
pub mod ledger;
pub mod loop_settings;
pub mod loosening;
pub mod model;
pub mod notices;
pub mod pools;
pub mod spend;
pub mod value;

pub use budget::{BudgetRequest, ResolvedBudget};
pub use ladder::{Limit, Resolved};
pub use ledger::{LedgerConfig, OnLedgerError, PROJECT_LEDGER_IGNORED};
pub use loop_settings::{LoopRequest, ResolvedLoops};
pub use model::{
    Ceiling, ConfigModel, LevelSettings, Lock, LoopConfig, PolicySettings, ProfileSettings,
};
pub use pools::{PoolConfig, PoolMatch, RunFacts};
pub use spend::{ResolvedLimit, ResolvedSpend, SpendRequest};
pub use value::{InvalidValue, LimitError, LimitName, LoopLimit, Origin, RawValue, Setting};

/// The file name looked for in the working directory and its parents.
pub const PROJECT_FILE: &str = "stepguard.toml";

/// The system config file, a policy-bearing file (see [`SYSTEM_CONFIG_ENV`]).
pub const SYSTEM_CONFIG: &str = "/etc/stepguard/stepguard.toml";

/// Environment variable that replaces the path of [`SYSTEM_CONFIG`] (for tests and unusual
/// installs).
pub const SYSTEM_CONFIG_ENV: &str = "STEPGUARD_SYSTEM_CONFIG";

/// Environment variable naming a file of which only `[policy]` counts; it must exist when set.
pub const POLICY_ENV: &str = "STEPGUARD_POLICY";

/// The warning for a `[policy]` table in a project file, after the file and key.
pub const PROJECT_POLICY_IGNORED: &str = "[policy] in a project file is ignored; set policy in \
     the user or system file or STEPGUARD_POLICY";

/// Provider names stepguard ships built in, used for "did you mean" on provider tables.
pub const BUILTIN_PROVIDERS: &[&str] = &["claude", "codex", "gemini"];

const TOP_LEVEL_KEYS: &[&str] = &[
    "max_steps",
    "max_turns",
    "max_tokens",
    "max_cost_usd",
    "profile",
    "defaults",
    "task_types",
    "profiles",
    "policy",
    "run",
    "loops",
    "telemetry",
    "pools",
    "ledger",
];
const LEVEL_KEYS: &[&str] = &["max_steps", "max_turns", "max_tokens", "max_cost_usd"];
const TASK_TYPE_KEYS: &[&str] = &[
    "max_steps",
    "max_turns",
    "max_tokens",
    "max_cost_usd",
    "loop_limit",
];
const PROFILE_KEYS: &[&str] = &["max_steps", "max_tokens", "max_cost_usd", "loop_limit"];
const LOOPS_KEYS: &[&str] = &["limit", "window", "ignore_tools"];
const POLICY_KEYS: &[&str] = &[
    "max_steps_ceiling",
    "max_tokens_ceiling",
    "max_cost_usd_ceiling",
    "allow_plugin_override",
    "locked",
];
const POLICY_PROVIDER_KEYS: &[&str] = &["max_steps_unit"];
const RUN_KEYS: &[&str] = &[
    "unrecognized_stream",
    "wrap_up",
    "checkpoint",
    "checkpoint_max_file_mb",
    "checkpoint_timeout",
    "notices",
];
const TELEMETRY_KEYS: &[&str] = &[
    "endpoint",
    "protocol",
    "headers",
    "service_name",
    "flush_timeout",
];

/// A failure to read or parse a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("failed to read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{path}:{line}:{column}: invalid TOML: {message}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The user's config file (which may hold the user's policy) cannot be placed.
    #[error(
        "failed to find the user's config file: {reason}; set HOME or XDG_CONFIG_HOME to an \
         absolute path"
    )]
    NoUserConfig {
        /// Why, e.g. `HOME is unset and the user has no home directory in the passwd database`.
        reason: String,
    },
    /// The file parsed but holds values of the wrong shape (e.g. `profile = 3`).
    #[error("{}", format_errors(.0))]
    Invalid(Vec<Diagnostic>),
}

fn format_errors(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth fixing; does not stop a run.
    Warning,
    /// Stops a run and fails `validate`.
    Error,
}

/// One problem found in a config file, naming the file and the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Warning or error.
    pub severity: Severity,
    /// The file, as displayed.
    pub file: String,
    /// The dotted key path, when the problem is at a key.
    pub key: Option<String>,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        match &self.key {
            Some(key) => write!(f, "{level}: {}: {key}: {}", self.file, self.message),
            None => write!(f, "{level}: {}: {}", self.file, self.message),
        }
    }
}

/// What a config file may set, decided by how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRole {
    /// Found by walking up from the working directory, or named by `--config`: the repository's
    /// own settings. Its `[policy]` is ignored with a warning, since the agent may edit it.
    Project,
    /// The user's file: settings below the project file, and policy.
    User,
    /// The system file: settings below the user file, and policy.
    System,
    /// Only its `[policy]` counts: the `STEPGUARD_POLICY` file, and the user and system files
    /// when `--config` replaces discovery.
    PolicyOnly,
}

impl FileRole {
    /// Returns true when the file's `[policy]` counts.
    pub fn bears_policy(self) -> bool {
        self != FileRole::Project
    }

    /// Returns true when the file's settings (budgets, profiles, provider options) count.
    pub fn has_settings(self) -> bool {
        self != FileRole::PolicyOnly
    }
}

/// A config file to read, and what it may set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSource {
    /// The file.
    pub path: PathBuf,
    /// What it may set.
    pub role: FileRole,
}

/// Where the config files outside the project are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchPaths {
    /// The user's file; used when it exists.
    pub user: Option<PathBuf>,
    /// The system file; used when it exists.
    pub system: Option<PathBuf>,
    /// The `STEPGUARD_POLICY` file; named explicitly, so it must exist.
    pub policy: Option<PathBuf>,
}

impl SearchPaths {
    /// Returns the paths of this process: [`user_config_path`], `$STEPGUARD_SYSTEM_CONFIG` else
    /// [`SYSTEM_CONFIG`], and `$STEPGUARD_POLICY`. Empty variables count as unset. Fails when
    /// the user's file cannot be placed (see [`user_config_path`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Ok(SearchPaths {
            user: Some(user_config_path()?),
            system: Some(var(SYSTEM_CONFIG_ENV).unwrap_or_else(|| PathBuf::from(SYSTEM_CONFIG))),
            policy: var(POLICY_ENV),
        })
    }
}

/// One parsed config file: its settings and the problems found in it.
#[derive(Clone, Debug)]
pub struct ParsedFile {
    /// The file, as displayed.
    pub path: String,
    /// What the file may set; settings and policy it may not set are left out of `model`.
    pub role: FileRole,
    /// What the file sets.
    pub model: ConfigModel,
    /// Settings at the same level as another setting (`defaults.max_steps` beside `max_steps`),
    /// kept so `validate` can check them although the model holds one per level.
    pub shadowed: Vec<Setting>,
    /// Problems found.
    pub diagnostics: Vec<Diagnostic>,
}

/// All config files in effect, merged.
#[derive(Clone, Debug, Default)]
pub struct LoadedConfig {
    /// The files, highest precedence first; files of which only the policy counts come last.
    pub files: Vec<ParsedFile>,
    /// The merged settings, and in `model.policy` the merged policy.
    pub model: ConfigModel,
}

impl LoadedConfig {
    /// Returns every diagnostic of every file, in file order.
    pub fn diagnostics(&self) -> impl Iterator<Item = &Diagnostic> {
        self.files.iter().flat_map(|f| f.diagnostics.iter())
    }

    /// Returns the files whose settings count, highest precedence first.
    pub fn settings_files(&self) -> impl Iterator<Item = &ParsedFile> {
        self.files.iter().filter(|f| f.role.has_settings())
    }

    /// Returns the policy-bearing files that set any policy.
    pub fn policy_files(&self) -> impl Iterator<Item = &ParsedFile> {
        self.files
            .iter()
            .filter(|f| f.role.bears_policy() && !f.model.policy.is_empty())
    }

    /// Returns the directory of the highest-precedence project or user file, where `.stepguard/`
    /// lives.
    pub fn project_dir(&self) -> Option<PathBuf> {
        self.files
            .iter()
            .find(|f| matches!(f.role, FileRole::Project | FileRole::User))
            .and_then(|f| Path::new(&f.path).parent().map(Path::to_path_buf))
    }
}

/// Returns the user's config file path: `$XDG_CONFIG_HOME/stepguard/stepguard.toml` when
/// `XDG_CONFIG_HOME` is absolute (a relative one is ignored, as the XDG spec says), else
/// `$HOME/.config/stepguard/stepguard.toml`, with the home directory of the user's passwd entry
/// when `HOME` is unset or empty (as OpenSSH and `std::env::home_dir` do).
///
/// Fails closed, so the user's policy never silently stops applying: when `HOME` is a relative
/// path (it would be looked for under the working directory, which the repository controls), and
/// when there is no home directory at all ([`ConfigError::NoUserConfig`]).
pub fn user_config_path() -> Result<PathBuf, ConfigError> {
    user_config_from(
        std::env::var_os("XDG_CONFIG_HOME"),
        std::env::var_os("HOME"),
        || etcetera::home_dir().ok(),
    )
}

/// [`user_config_path`] from the values of `XDG_CONFIG_HOME` and `HOME`, and the passwd entry's
/// home directory (asked only when `HOME` is unset or empty).
fn user_config_from(
    xdg_config_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    passwd_home: impl FnOnce() -> Option<PathBuf>,
) -> Result<PathBuf, ConfigError> {
    let file = |config_dir: PathBuf| config_dir.join("stepguard").join(PROJECT_FILE);
    if let Some(dir) = xdg_config_home
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        return Ok(file(dir));
    }
    let home =
        match home.filter(|h| !h.is_empty()).map(PathBuf::from) {
            Some(home) if home.is_absolute() => home,
            Some(home) => {
                return Err(ConfigError::NoUserConfig {
                    reason: format!("HOME is `{}`, not an absolute path", home.display()),
                });
            }
            None => passwd_home().filter(|h| h.is_absolute()).ok_or_else(|| {
                ConfigError::NoUserConfig {
                    reason: "HOME is unset and the user has no home directory in the passwd \
                         database"
                        .to_owned(),
                }
            })?,
        };
    Ok(file(home.join(".config")))
}

/// Returns the config files in effect for `cwd`, highest precedence first: the project file
/// (`explicit`, else the nearest `stepguard.toml` walking up from `cwd`), the user file, the
/// system file, then the `STEPGUARD_POLICY` file.
///
/// With `explicit` (`--config`), the user and system files are read for their policy only. A
/// project file that is the user or system file takes that file's role. The policy file is
/// listed even when missing, so that loading fails instead of running without its policy.
pub fn discover_sources(
    cwd: &Path,
    explicit: Option<&Path>,
    search: &SearchPaths,
) -> Vec<ConfigSource> {
    let mut sources = Vec::new();
    let project = match explicit {
        Some(path) => Some(path.to_path_buf()),
        None => cwd
            .ancestors()
            .map(|d| d.join(PROJECT_FILE))
            .find(|p| p.is_file()),
    };
    if let Some(path) = project {
        sources.push(ConfigSource {
            path,
            role: FileRole::Project,
        });
    }
    for (path, role) in [
        (&search.user, FileRole::User),
        (&search.system, FileRole::System),
    ] {
        let Some(path) = path.as_deref().filter(|p| p.is_file()) else {
            continue;
        };
        if let Some(found) = sources.iter_mut().find(|s| same_file(&s.path, path)) {
            if found.role == FileRole::Project {
                found.role = role;
            }
            continue;
        }
        sources.push(ConfigSource {
            path: path.to_path_buf(),
            role: if explicit.is_none() {
                role
            } else {
                FileRole::PolicyOnly
            },
        });
    }
    if let Some(path) = &search.policy
        && !sources
            .iter()
            .any(|s| s.role.bears_policy() && same_file(&s.path, path))
    {
        sources.push(ConfigSource {
            path: path.clone(),
            role: FileRole::PolicyOnly,
        });
    }
    sources
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Reads and parses the given files (highest precedence first) and merges them.
///
/// Returns an error for unreadable files, TOML syntax errors, values of the wrong shape and
/// policy files that disagree; warnings (unknown keys) are kept in the result's diagnostics.
pub fn load(sources: &[ConfigSource]) -> Result<LoadedConfig, ConfigError> {
    let mut files = Vec::with_capacity(sources.len());
    for source in sources {
        let display = source.path.display().to_string();
        let text = std::fs::read_to_string(&source.path).map_err(|e| ConfigError::Read {
            path: display.clone(),
            source: e,
        })?;
        files.push(parse_file(&display, &text, source.role)?);
    }
    let loaded = merge(files);
    let errors: Vec<Diagnostic> = loaded
        .diagnostics()
        .filter(|d| d.severity == Severity::Error)
        .cloned()
        .collect();
    if !errors.is_empty() {
        return Err(ConfigError::Invalid(errors));
    }
    Ok(loaded)
}

/// Reads and parses every file, turning unreadable and unparsable files into error diagnostics
/// instead of stopping at the first; used by `validate`, which reports everything at once.
pub fn load_all(sources: &[ConfigSource]) -> (LoadedConfig, Vec<Diagnostic>) {
    let mut files = Vec::with_capacity(sources.len());
    let mut failures = Vec::new();
    for source in sources {
        let display = source.path.display().to_string();
        let parsed = std::fs::read_to_string(&source.path)
            .map_err(|e| ConfigError::Read {
                path: display.clone(),
                source: e,
            })
            .and_then(|text| parse_file(&display, &text, source.role));
        match parsed {
            Ok(file) => files.push(file),
            Err(e) => failures.push(Diagnostic {
                severity: Severity::Error,
                file: display,
                key: None,
                message: match e {
                    ConfigError::Parse {
                        line,
                        column,
                        message,
                        ..
                    } => {
                        format!("line {line}, column {column}: invalid TOML: {message}")
                    }
                    other => other.to_string(),
                },
            }),
        }
    }
    (merge(files), failures)
}

/// Merges parsed files, highest precedence first: for each key, the first file that sets it wins.
///
/// The policies of the files merge to the tightest (see the crate docs); policy files that fix
/// different units for one provider get an error diagnostic.
///
/// While a policy is in force, a project file's settings that would loosen enforcement are left
/// out, each with a warning (see [`loosening`]).
pub fn merge(mut files: Vec<ParsedFile>) -> LoadedConfig {
    let policy = merge_policy(&mut files);
    if !policy.is_empty() {
        // Lowest precedence first, so that each file is judged against what is left below it.
        for i in (0..files.len()).rev() {
            let (upper, lower) = files.split_at_mut(i + 1);
            let file = &mut upper[i];
            let below = overlay(lower.iter().filter(|f| f.role != FileRole::Project));
            loosening::strip(file, &below, &policy);
        }
    }
    let pools = loosening::merge_pools(&mut files);
    // Highest precedence first: the first file setting a key wins (project files set none).
    let mut ledger = LedgerConfig::default();
    for file in &files {
        ledger.fill_from(&file.model.ledger);
    }
    let model = ConfigModel {
        policy,
        pools,
        ledger,
        ..overlay(files.iter())
    };
    LoadedConfig { files, model }
}

/// Merges the settings of `files` (highest precedence first): for each key, the first file that
/// sets it wins. The policy is left empty.
fn overlay<'f>(files: impl DoubleEndedIterator<Item = &'f ParsedFile>) -> ConfigModel {
    let mut model = ConfigModel::default();
    for file in files.rev() {
        let m = &file.model;
        overlay_level(&mut model.global, &m.global);
        for (name, level) in &m.task_types {
            overlay_level(model.task_types.entry(name.clone()).or_default(), level);
        }
        for (name, profile) in &m.profiles {
            let entry = model.profiles.entry(name.clone()).or_default();
            if profile.max_steps.is_some() {
                entry.max_steps.clone_from(&profile.max_steps);
            }
            if profile.max_tokens.is_some() {
                entry.max_tokens.clone_from(&profile.max_tokens);
            }
            if profile.max_cost_usd.is_some() {
                entry.max_cost_usd.clone_from(&profile.max_cost_usd);
            }
        }
        if m.profile.is_some() {
            model.profile.clone_from(&m.profile);
        }
        if m.unrecognized_stream.is_some() {
            model.unrecognized_stream.clone_from(&m.unrecognized_stream);
        }
        if m.wrap_up.is_some() {
            model.wrap_up.clone_from(&m.wrap_up);
        }
        if m.notices.is_some() {
            model.notices.clone_from(&m.notices);
        }
        overlay_checkpoint(&mut model.checkpoint, &m.checkpoint);
        for (key, value) in &m.telemetry {
            model.telemetry.insert(key.clone(), value.clone());
        }
        overlay_loops(&mut model.loops, &m.loops);
        for (provider, options) in &m.providers {
            let entry = model.providers.entry(provider.clone()).or_default();
            for (k, v) in options {
                entry.insert(k.clone(), v.clone());
            }
        }
    }
    model
}

fn merge_policy(files: &mut [ParsedFile]) -> PolicySettings {
    let mut policy = PolicySettings::default();
    let mut conflicts = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let p = &file.model.policy;
        if let Some(ceiling) = &p.max_steps_ceiling
            && policy
                .max_steps_ceiling
                .as_ref()
                .is_none_or(|c| ceiling.max_steps < c.max_steps)
        {
            policy.max_steps_ceiling = Some(ceiling.clone());
        }
        if let Some((ceiling, _)) = &p.max_tokens_ceiling
            && policy
                .max_tokens_ceiling
                .as_ref()
                .is_none_or(|(c, _)| ceiling < c)
        {
            policy.max_tokens_ceiling.clone_from(&p.max_tokens_ceiling);
        }
        if let Some((ceiling, _)) = &p.max_cost_usd_ceiling
            && policy
                .max_cost_usd_ceiling
                .as_ref()
                .is_none_or(|(c, _)| ceiling < c)
        {
            policy
                .max_cost_usd_ceiling
                .clone_from(&p.max_cost_usd_ceiling);
        }
        for (provider, (unit, origin)) in &p.units {
            match policy.units.get(provider) {
                None => {
                    policy
                        .units
                        .insert(provider.clone(), (unit.clone(), origin.clone()));
                }
                Some((fixed, first)) if fixed != unit => conflicts.push((
                    i,
                    at(
                        Severity::Error,
                        origin,
                        format!(
                            "policy files disagree on the unit of `{provider}`: `{unit}` here, \
                             `{fixed}` in {first}; fix one of them"
                        ),
                    ),
                )),
                Some(_) => {}
            }
        }
        for (lock, origin) in &p.locked {
            policy.locked.entry(*lock).or_insert_with(|| origin.clone());
        }
        // Consent needs every policy file's agreement: one `false` wins.
        if let Some((allow, origin)) = &p.allow_plugin_override
            && policy
                .allow_plugin_override
                .as_ref()
                .is_none_or(|(current, _)| *current && !allow)
        {
            policy.allow_plugin_override = Some((*allow, origin.clone()));
        }
    }
    for (i, diagnostic) in conflicts {
        files[i].diagnostics.push(diagnostic);
    }
    policy
}

fn overlay_loops(into: &mut LoopConfig, from: &LoopConfig) {
    if from.limit.is_some() {
        into.limit.clone_from(&from.limit);
    }
    if from.window.is_some() {
        into.window.clone_from(&from.window);
    }
    // A list replaces the list of a file below it: exemptions are not merged across files.
    if from.ignore_tools.is_some() {
        into.ignore_tools.clone_from(&from.ignore_tools);
    }
    for (name, limit) in &from.task_types {
        into.task_types.insert(name.clone(), limit.clone());
    }
    for (name, limit) in &from.profiles {
        into.profiles.insert(name.clone(), limit.clone());
    }
}

fn overlay_level(into: &mut LevelSettings, from: &LevelSettings) {
    if from.max_steps.is_some() {
        into.max_steps.clone_from(&from.max_steps);
    }
    if from.max_turns.is_some() {
        into.max_turns.clone_from(&from.max_turns);
    }
    if from.max_tokens.is_some() {
        into.max_tokens.clone_from(&from.max_tokens);
    }
    if from.max_cost_usd.is_some() {
        into.max_cost_usd.clone_from(&from.max_cost_usd);
    }
}

/// Parses one project file's text (its `[policy]` is ignored with a warning). Syntax errors are
/// returned as [`ConfigError::Parse`]; every other problem is a diagnostic in the result.
pub fn parse_str(path: &str, text: &str) -> Result<ParsedFile, ConfigError> {
    parse_file(path, text, FileRole::Project)
}

/// Parses one file's text for its role: a [`FileRole::Project`] file's `[policy]` is ignored
/// with a warning, and only the `[policy]` of a [`FileRole::PolicyOnly`] file is read. Syntax
/// errors are returned as [`ConfigError::Parse`]; every other problem is a diagnostic.
pub fn parse_file(path: &str, text: &str, role: FileRole) -> Result<ParsedFile, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
        ConfigError::Parse {
            path: path.to_owned(),
            line,
            column,
            message: e.message().trim().to_owned(),
        }
    })?;
    let mut p = Parser {
        path,
        out: ParsedFile {
            path: path.to_owned(),
            role,
            model: ConfigModel::default(),
            shadowed: Vec::new(),
            diagnostics: Vec::new(),
        },
    };
    p.top_level(&table);
    Ok(p.out)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

struct Parser<'a> {
    path: &'a str,
    out: ParsedFile,
}

impl Parser<'_> {
    fn diag(&mut self, severity: Severity, key: &str, message: impl Into<String>) {
        self.out.diagnostics.push(Diagnostic {
            severity,
            file: self.path.to_owned(),
            key: Some(key.to_owned()),
            message: message.into(),
        });
    }

    fn setting(&self, key: &str, value: &toml::Value) -> Setting {
        Setting {
            value: raw_value(value),
            origin: Origin::File {
                path: self.path.to_owned(),
                key: key.to_owned(),
            },
        }
    }

    fn unknown_key(&mut self, key_path: &str, name: &str, known: &[&str]) {
        let message = match did_you_mean(name, known) {
            Some(s) => format!("unknown key `{name}`; did you mean `{s}`?"),
            None => format!(
                "unknown key `{name}`; known keys here: {}",
                known.join(", ")
            ),
        };
        self.diag(Severity::Warning, key_path, message);
    }

    fn top_level(&mut self, table: &toml::Table) {
        if let Some(value) = table.get("policy") {
            if self.out.role.bears_policy() {
                self.policy(value);
            } else {
                self.diag(Severity::Warning, "policy", PROJECT_POLICY_IGNORED);
            }
        }
        // The fleet ledger counts in the files the repository cannot edit (see `ledger`).
        if let Some(value) = table.get("ledger") {
            if self.out.role.bears_policy() {
                self.out.model.ledger = ledger::parse(self.path, value, &mut self.out.diagnostics);
            } else {
                self.diag(Severity::Warning, "ledger", PROJECT_LEDGER_IGNORED);
            }
        }
        // Pools count in every file, the policy-only ones included (see `pools`).
        if let Some(value) = table.get("pools") {
            self.out.model.pools =
                pools::parse(self.path, self.out.role, value, &mut self.out.diagnostics);
        }
        if !self.out.role.has_settings() {
            return;
        }
        for (key, value) in table {
            match key.as_str() {
                "max_steps" => self.out.model.global.max_steps = Some(self.setting(key, value)),
                "max_turns" => self.out.model.global.max_turns = Some(self.setting(key, value)),
                "max_tokens" => {
                    self.out.model.global.max_tokens = self.spend::<spend::Tokens>(key, value);
                }
                "max_cost_usd" => {
                    self.out.model.global.max_cost_usd = self.spend::<spend::Cost>(key, value);
                }
                "profile" => match value.as_str() {
                    Some(name) => {
                        let origin = Origin::File {
                            path: self.path.to_owned(),
                            key: "profile".into(),
                        };
                        self.out.model.profile = Some((name.to_owned(), origin));
                    }
                    None => self.diag(
                        Severity::Error,
                        key,
                        format!(
                            "expected a profile name (a string), found {}",
                            type_name(value)
                        ),
                    ),
                },
                "run" => self.run_table(value),
                "loops" => self.loops_table(value),
                "telemetry" => self.telemetry_table(value),
                // Handled after the loop, once the top-level keys of the same level are known.
                "defaults" => {}
                // Handled before the loop, by role.
                "policy" | "pools" | "ledger" => {}
                "task_types" => {
                    if let Some(t) = self.expect_table(key, value) {
                        for (name, v) in t {
                            let path = format!("task_types.{name}");
                            if let Some(tt) = self.expect_table(&path, v) {
                                let level = self.level(&path, tt, Some(name));
                                self.out.model.task_types.insert(name.clone(), level);
                            }
                        }
                    }
                }
                "profiles" => {
                    if let Some(t) = self.expect_table(key, value) {
                        for (name, v) in t {
                            let path = format!("profiles.{name}");
                            if let Some(pt) = self.expect_table(&path, v) {
                                let profile = self.profile(&path, pt);
                                self.out.model.profiles.insert(name.clone(), profile);
                            }
                        }
                    }
                }
                other => self.other_top_level(other, value),
            }
        }
        if let Some(value) = table.get("defaults") {
            self.defaults(value);
        }
    }

    fn telemetry_table(&mut self, value: &toml::Value) {
        let Some(table) = self.expect_table("telemetry", value) else {
            return;
        };
        for (key, v) in table {
            let path = format!("telemetry.{key}");
            let ok = match key.as_str() {
                "endpoint" | "protocol" | "service_name" => v.is_str(),
                "flush_timeout" => v
                    .as_str()
                    .is_some_and(|t| humantime::parse_duration(t).is_ok()),
                "headers" => v
                    .as_table()
                    .is_some_and(|t| t.values().all(toml::Value::is_str)),
                other => {
                    self.unknown_key(&path, other, TELEMETRY_KEYS);
                    continue;
                }
            };
            if ok {
                let origin = self.origin(&path);
                self.out
                    .model
                    .telemetry
                    .insert(key.clone(), (toml_to_json(v), origin));
            } else {
                let expected = match key.as_str() {
                    "flush_timeout" => "a duration such as \"2s\"",
                    "headers" => "a table of strings",
                    _ => "a string",
                };
                self.diag(
                    Severity::Error,
                    &path,
                    format!("expected {expected}, found {}", type_name(v)),
                );
            }
        }
    }

    fn run_table(&mut self, value: &toml::Value) {
        let Some(table) = self.expect_table("run", value) else {
            return;
        };
        for (key, v) in table {
            let path = format!("run.{key}");
            match key.as_str() {
                "unrecognized_stream" => match v.as_str() {
                    Some(what @ ("stop" | "warn")) => {
                        let origin = self.origin(&path);
                        self.out.model.unrecognized_stream = Some((what.to_owned(), origin));
                    }
                    _ => self.diag(
                        Severity::Error,
                        &path,
                        format!(
                            "expected \"stop\" or \"warn\", found {}",
                            match v.as_str() {
                                Some(s) => format!("\"{s}\""),
                                None => type_name(v).to_owned(),
                            }
                        ),
                    ),
                },
                "wrap_up" => match v.as_bool() {
                    Some(on) => {
                        let origin = self.origin(&path);
                        self.out.model.wrap_up = Some((on, origin));
                    }
                    None => self.diag(
                        Severity::Error,
                        &path,
                        format!("expected true or false, found {}", type_name(v)),
                    ),
                },
                "notices" => match notices::from_toml(v) {
                    Ok(setting) => {
                        let origin = self.origin(&path);
                        self.out.model.notices = Some((setting, origin));
                    }
                    Err(e) => self.diag(Severity::Error, &path, e),
                },
                "checkpoint" | "checkpoint_max_file_mb" | "checkpoint_timeout" => {
                    self.checkpoint_key(&path, key, v);
                }
                other => self.unknown_key(&path, other, RUN_KEYS),
            }
        }
    }

    /// `[run] checkpoint = "git" | "none"`, `checkpoint_max_file_mb = N` (at least 1),
    /// `checkpoint_timeout = "10s"` (a duration above zero).
    fn checkpoint_key(&mut self, path: &str, key: &str, v: &toml::Value) {
        let origin = self.origin(path);
        let c = &mut self.out.model.checkpoint;
        let bad = match key {
            "checkpoint" => match v.as_str() {
                Some(kind @ ("git" | "none")) => {
                    c.kind = Some((kind.to_owned(), origin));
                    None
                }
                Some(other) => Some(format!("expected \"git\" or \"none\", found \"{other}\"")),
                None => Some(format!(
                    "expected \"git\" or \"none\", found {}",
                    type_name(v)
                )),
            },
            "checkpoint_max_file_mb" => match v.as_integer().and_then(|n| u64::try_from(n).ok()) {
                Some(mb) if mb >= 1 => {
                    c.max_file_mb = Some((mb, origin));
                    None
                }
                _ => Some("expected a whole number of MiB, at least 1 (e.g. 100)".to_owned()),
            },
            _ => match v.as_str().map(humantime::parse_duration) {
                Some(Ok(d)) if !d.is_zero() => {
                    c.timeout = Some((d, origin));
                    None
                }
                _ => Some("expected a duration above zero such as \"10s\"".to_owned()),
            },
        };
        if let Some(message) = bad {
            self.diag(Severity::Error, path, message);
        }
    }

    fn defaults(&mut self, value: &toml::Value) {
        let Some(t) = self.expect_table("defaults", value) else {
            return;
        };
        let level = self.level("defaults", t, None);
        let global = &mut self.out.model.global;
        for (slot, new) in [
            (&mut global.max_steps, level.max_steps),
            (&mut global.max_turns, level.max_turns),
            (&mut global.max_tokens, level.max_tokens),
            (&mut global.max_cost_usd, level.max_cost_usd),
        ] {
            // Top-level keys and [defaults] are one level: the top-level one wins and the other
            // is kept for validate's checks.
            match (slot.is_some(), new) {
                (true, Some(n)) => self.out.shadowed.push(n),
                (false, n) => *slot = n,
                (true, None) => {}
            }
        }
    }

    fn other_top_level(&mut self, key: &str, value: &toml::Value) {
        let mut known: Vec<&str> = TOP_LEVEL_KEYS.to_vec();
        known.extend(BUILTIN_PROVIDERS);
        match value.as_table() {
            // A table close to a known name is a typo, not a provider we never heard of.
            Some(t) if did_you_mean(key, &known).is_none() => {
                let options = t
                    .iter()
                    .map(|(k, v)| {
                        let origin = Origin::File {
                            path: self.path.to_owned(),
                            key: format!("{key}.{k}"),
                        };
                        (k.clone(), (toml_to_json(v), origin))
                    })
                    .collect();
                self.out.model.providers.insert(key.to_owned(), options);
            }
            _ => self.unknown_key(key, key, &known),
        }
    }

    fn policy(&mut self, value: &toml::Value) {
        let Some(table) = self.expect_table("policy", value) else {
            return;
        };
        for (key, value) in table {
            let path = format!("policy.{key}");
            match key.as_str() {
                "max_steps_ceiling" => match budget::parse_ceiling(&self.setting(&path, value)) {
                    Ok(ceiling) => self.out.model.policy.max_steps_ceiling = Some(ceiling),
                    Err(LimitError::InvalidValue { reason, .. }) => {
                        self.diag(Severity::Error, &path, reason.to_string());
                    }
                    Err(other) => self.diag(Severity::Error, &path, other.to_string()),
                },
                "max_tokens_ceiling" => match spend::parse_max_tokens_ceiling(&raw_value(value)) {
                    Ok(ceiling) => {
                        let origin = self.origin(&path);
                        self.out.model.policy.max_tokens_ceiling = Some((ceiling, origin));
                    }
                    Err(reason) => self.diag(Severity::Error, &path, reason.to_string()),
                },
                "max_cost_usd_ceiling" => {
                    match spend::parse_max_cost_usd_ceiling(&raw_value(value)) {
                        Ok(ceiling) => {
                            let origin = self.origin(&path);
                            self.out.model.policy.max_cost_usd_ceiling = Some((ceiling, origin));
                        }
                        Err(reason) => self.diag(Severity::Error, &path, reason.to_string()),
                    }
                }
                "locked" => self.locked(&path, value),
                "allow_plugin_override" => match value.as_bool() {
                    Some(allow) => {
                        let origin = self.origin(&path);
                        self.out.model.policy.allow_plugin_override = Some((allow, origin));
                    }
                    None => self.diag(
                        Severity::Error,
                        &path,
                        format!("expected true or false, found {}", type_name(value)),
                    ),
                },
                other => {
                    let mut known: Vec<&str> = POLICY_KEYS.to_vec();
                    known.extend(BUILTIN_PROVIDERS);
                    match value.as_table() {
                        // A table names a provider, unless it is a typo of a known name.
                        Some(t) if did_you_mean(other, &known).is_none() => {
                            self.policy_provider(other, t);
                        }
                        _ => self.unknown_key(&path, other, &known),
                    }
                }
            }
        }
    }

    /// Reads `policy.locked`: an array of lock names, each known.
    fn locked(&mut self, path: &str, value: &toml::Value) {
        let names: Vec<&str> = Lock::ALL.iter().map(|l| l.name()).collect();
        let expected = format!("expected an array of setting names ({})", names.join(", "));
        let Some(items) = value.as_array() else {
            let message = format!("{expected}, found {}", type_name(value));
            return self.diag(Severity::Error, path, message);
        };
        for item in items {
            let lock = item.as_str().map(|n| (n, Lock::from_name(n)));
            match lock {
                Some((_, Some(lock))) => {
                    let origin = self.origin(path);
                    self.out.model.policy.locked.insert(lock, origin);
                }
                Some((name, None)) => {
                    let hint = match did_you_mean(name, &names) {
                        Some(s) => format!("; did you mean `{s}`?"),
                        None => String::new(),
                    };
                    let message = format!("unknown setting `{name}`: {expected}{hint}");
                    self.diag(Severity::Error, path, message);
                }
                None => {
                    let message = format!("{expected}, found {}", type_name(item));
                    self.diag(Severity::Error, path, message);
                }
            }
        }
    }

    fn policy_provider(&mut self, provider: &str, table: &toml::Table) {
        for (key, value) in table {
            let path = format!("policy.{provider}.{key}");
            match (key.as_str(), value.as_str()) {
                ("max_steps_unit", Some(unit)) => {
                    let origin = self.origin(&path);
                    self.out
                        .model
                        .policy
                        .units
                        .insert(provider.to_owned(), (unit.to_owned(), origin));
                }
                ("max_steps_unit", None) => self.diag(
                    Severity::Error,
                    &path,
                    format!(
                        "expected a unit name (a string), found {}",
                        type_name(value)
                    ),
                ),
                (other, _) => self.unknown_key(&path, other, POLICY_PROVIDER_KEYS),
            }
        }
    }

    fn origin(&self, key: &str) -> Origin {
        Origin::File {
            path: self.path.to_owned(),
            key: key.to_owned(),
        }
    }

    fn expect_table<'t>(&mut self, key: &str, value: &'t toml::Value) -> Option<&'t toml::Table> {
        let t = value.as_table();
        if t.is_none() {
            self.diag(
                Severity::Error,
                key,
                format!("expected a table, found {}", type_name(value)),
            );
        }
        t
    }

    /// Reads a budget level: `[defaults]`, or `[task_types.T]` (`task_type`), which may also set
    /// `loop_limit`.
    fn level(
        &mut self,
        prefix: &str,
        table: &toml::Table,
        task_type: Option<&str>,
    ) -> LevelSettings {
        let mut level = LevelSettings::default();
        for (key, value) in table {
            let path = format!("{prefix}.{key}");
            match (key.as_str(), task_type) {
                ("max_steps", _) => level.max_steps = Some(self.setting(&path, value)),
                ("max_turns", _) => level.max_turns = Some(self.setting(&path, value)),
                ("max_tokens", _) => level.max_tokens = self.spend::<spend::Tokens>(&path, value),
                ("max_cost_usd", _) => {
                    level.max_cost_usd = self.spend::<spend::Cost>(&path, value);
                }
                ("loop_limit", Some(name)) => {
                    if let Some(limit) = self.loop_limit(&path, value) {
                        self.out
                            .model
                            .loops
                            .task_types
                            .insert(name.to_owned(), limit);
                    }
                }
                (other, Some(_)) => self.unknown_key(&path, other, TASK_TYPE_KEYS),
                (other, None) => self.unknown_key(&path, other, LEVEL_KEYS),
            }
        }
        level
    }

    fn profile(&mut self, prefix: &str, table: &toml::Table) -> ProfileSettings {
        let mut profile = ProfileSettings::default();
        let name = prefix.trim_start_matches("profiles.");
        for (key, value) in table {
            let path = format!("{prefix}.{key}");
            match key.as_str() {
                "max_steps" => profile.max_steps = Some(self.setting(&path, value)),
                "max_tokens" => profile.max_tokens = self.spend::<spend::Tokens>(&path, value),
                "max_cost_usd" => profile.max_cost_usd = self.spend::<spend::Cost>(&path, value),
                "loop_limit" => {
                    if let Some(limit) = self.loop_limit(&path, value) {
                        self.out.model.loops.profiles.insert(name.to_owned(), limit);
                    }
                }
                other => self.unknown_key(&path, other, PROFILE_KEYS),
            }
        }
        profile
    }

    /// Validates a token or cost budget at `path`; a bad one is an error diagnostic naming the
    /// key (and is left out of the model).
    fn spend<L: Limit>(&mut self, path: &str, value: &toml::Value) -> Option<Setting> {
        let setting = self.setting(path, value);
        match L::parse(&setting.value) {
            Ok(_) => Some(setting),
            Err(reason) => {
                self.diag(Severity::Error, path, reason.to_string());
                None
            }
        }
    }

    /// Validates a loop limit at `path`; a bad one is an error diagnostic naming the key.
    fn loop_limit(&mut self, path: &str, value: &toml::Value) -> Option<(LoopLimit, Origin)> {
        match loop_settings::parse_loop_limit(&raw_value(value)) {
            Ok(limit) => Some((limit, self.origin(path))),
            Err(reason) => {
                self.diag(Severity::Error, path, reason.to_string());
                None
            }
        }
    }

    /// Reads `[loops]`: `limit`, `window` and `ignore_tools`, each validated here.
    fn loops_table(&mut self, value: &toml::Value) {
        let Some(table) = self.expect_table("loops", value) else {
            return;
        };
        for (key, v) in table {
            let path = format!("loops.{key}");
            match key.as_str() {
                "limit" => {
                    if let Some(limit) = self.loop_limit(&path, v) {
                        self.out.model.loops.limit = Some(limit);
                    }
                }
                "window" => match loop_settings::window_from_raw(&raw_value(v)) {
                    Ok(window) => {
                        let origin = self.origin(&path);
                        self.out.model.loops.window = Some((window, origin));
                    }
                    Err(reason) => self.diag(Severity::Error, &path, reason.to_string()),
                },
                "ignore_tools" => match tool_names(v) {
                    Ok(tools) => {
                        let origin = self.origin(&path);
                        self.out.model.loops.ignore_tools = Some((tools, origin));
                    }
                    Err(message) => self.diag(Severity::Error, &path, message),
                },
                other => self.unknown_key(&path, other, LOOPS_KEYS),
            }
        }
        // One table contradicting itself; a limit from elsewhere only widens the window.
        if let (Some((LoopLimit::Limited(limit), _)), Some((window, _))) =
            (&self.out.model.loops.limit, &self.out.model.loops.window)
            && window < limit
        {
            let message = format!(
                "{window} is below `loops.limit` ({limit}); the window must hold at least \
                 `limit` calls"
            );
            self.diag(Severity::Error, "loops.window", message);
        }
    }
}

/// Reads `loops.ignore_tools`: an array of tool names, none empty.
fn tool_names(value: &toml::Value) -> Result<Vec<String>, String> {
    let expected = "expected an array of tool names (strings)";
    let Some(items) = value.as_array() else {
        return Err(format!("{expected}, found {}", type_name(value)));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_str() {
            Some(name) if !name.trim().is_empty() => Ok(name.to_owned()),
            Some(_) => Err(format!("{expected}; item {} is empty", i + 1)),
            None => Err(format!("{expected}; item {} is {}", i + 1, type_name(item))),
        })
        .collect()
}

/// Returns the closest known name when it is close enough to be a likely typo.
pub fn did_you_mean<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(name, k), *k))
        .filter(|(d, k)| *d > 0 && *d <= (k.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn raw_value(value: &toml::Value) -> RawValue {
    match value {
        toml::Value::Integer(n) => RawValue::Integer(*n),
        toml::Value::Float(f) => RawValue::Float(*f),
        toml::Value::String(s) => RawValue::Text(s.clone()),
        other => RawValue::Other(type_name(other).to_owned()),
    }
}

/// The checkpoint keys a file sets replace those of the files before it, one by one.
fn overlay_checkpoint(into: &mut model::CheckpointConfig, from: &model::CheckpointConfig) {
    if from.kind.is_some() {
        into.kind.clone_from(&from.kind);
    }
    if from.max_file_mb.is_some() {
        into.max_file_mb = from.max_file_mb.clone();
    }
    if from.timeout.is_some() {
        into.timeout.clone_from(&from.timeout);
    }
}

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a datetime",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

fn toml_to_json(value: &toml::Value) -> serde_json::Value {
    match value {
        toml::Value::String(s) => serde_json::Value::String(s.clone()),
        toml::Value::Integer(n) => serde_json::Value::from(*n),
        toml::Value::Float(f) => serde_json::Value::from(*f),
        toml::Value::Boolean(b) => serde_json::Value::Bool(*b),
        toml::Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        toml::Value::Array(a) => a.iter().map(toml_to_json).collect(),
        toml::Value::Table(t) => t
            .iter()
            .map(|(k, v)| (k.clone(), toml_to_json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    }
}

/// The provider-table key that selects the unit, which a policy may fix.
pub const UNIT_KEY: &str = "max_steps_unit";

/// Checks every file in effect: every budget value at every level, deprecated and conflicting
/// settings, provider units that contradict the policy, and unknown profiles. With `strict`, every warning is reported as an error.
pub fn validate(loaded: &LoadedConfig, strict: bool) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    // The legacy settings a `max_steps` of higher precedence makes dead, for runs without a task
    // type and for each task type.
    let config = &loaded.model;
    let shadowed: Vec<budget::ShadowedLegacy> = std::iter::once(None)
        .chain(config.task_types.keys().map(|t| Some(t.as_str())))
        .flat_map(|task_type| {
            budget::shadowed_legacy(&BudgetRequest {
                task_type,
                ..BudgetRequest::new(config)
            })
        })
        .collect();
    for file in &loaded.files {
        out.extend(file.diagnostics.iter().cloned());
        let m = &file.model;
        let mut levels: Vec<&LevelSettings> = vec![&m.global];
        levels.extend(m.task_types.values());
        let profile_settings = m.profiles.values().filter_map(|p| p.max_steps.as_ref());
        let all_settings = levels
            .iter()
            .flat_map(|l| l.max_steps.iter().chain(l.max_turns.iter()))
            .chain(profile_settings)
            // Token and cost budgets are validated as they are parsed.
            .chain(file.shadowed.iter().filter(|s| !is_spend_setting(s)));
        for setting in all_settings {
            if let Err(reason) = budget::parse_max_steps(&setting.value) {
                out.push(at(Severity::Error, &setting.origin, reason.to_string()));
            }
        }
        for level in &levels {
            match (&level.max_steps, &level.max_turns) {
                (Some(s), Some(t)) => {
                    if let (Ok(a), Ok(b)) = (
                        budget::parse_max_steps(&s.value),
                        budget::parse_max_steps(&t.value),
                    ) && a != b
                    {
                        let message = format!(
                            "`max_steps` ({a}) and `max_turns` ({b}) are both set at one level; \
                             `max_steps` wins. Remove `max_turns`."
                        );
                        out.push(at(Severity::Warning, &t.origin, message));
                    }
                }
                (None, Some(t)) => {
                    let message = match shadowed.iter().find(|s| s.legacy.origin == t.origin) {
                        Some(s) => s.reason(),
                        None => budget::MAX_TURNS_DEPRECATION.to_owned(),
                    };
                    out.push(at(Severity::Warning, &t.origin, message));
                }
                _ => {}
            }
        }
        for shadowed in &file.shadowed {
            out.push(at(
                Severity::Warning,
                &shadowed.origin,
                "set both at the top level and in [defaults]; the top-level value wins",
            ));
        }
        for (provider, (fixed, policy_origin)) in &loaded.model.policy.units {
            let unit = m.providers.get(provider).and_then(|t| t.get(UNIT_KEY));
            if let Some((value, origin)) = unit
                && value.as_str() != Some(fixed.as_str())
            {
                let message = format!(
                    "unit {value} differs from the unit `{fixed}` fixed by policy \
                     ({policy_origin})"
                );
                out.push(at(Severity::Error, origin, message));
            }
        }
        if let Some((name, origin)) = &m.profile {
            // A profile may set only some budgets (tokens, cost, loops): any table defines it.
            let known =
                budget::builtin_profile(name).is_some() || loaded.model.profiles.contains_key(name);
            if !known {
                out.push(at(
                    Severity::Error,
                    origin,
                    format!("unknown profile `{name}`"),
                ));
            }
        }
    }
    if strict {
        for d in &mut out {
            d.severity = Severity::Error;
        }
    }
    out
}

/// Returns true for a `max_tokens` or `max_cost_usd` setting.
fn is_spend_setting(setting: &Setting) -> bool {
    match &setting.origin {
        Origin::File { key, .. } => {
            matches!(key.rsplit('.').next(), Some("max_tokens" | "max_cost_usd"))
        }
        _ => false,
    }
}

fn at(severity: Severity, origin: &Origin, message: impl Into<String>) -> Diagnostic {
    match origin {
        Origin::File { path, key } => Diagnostic {
            severity,
            file: path.clone(),
            key: Some(key.clone()),
            message: message.into(),
        },
        other => Diagnostic {
            severity,
            file: other.to_string(),
            key: None,
            message: message.into(),
        },
    }
}

#[cfg(test)]
mod ladder_tests;
#[cfg(test)]
mod tests;
