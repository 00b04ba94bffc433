//! The provider registry of this process, and how a command picks a provider, unit and options.

use std::collections::BTreeMap;
use std::path::PathBuf;

use stepguard_config::{ConfigModel, Origin};
use stepguard_config::{Diagnostic, LoadedConfig, Severity, did_you_mean};
use stepguard_plugin_api::host::Provider;
use stepguard_plugin_api::{CounterRequest, Manifest, ProviderBox};
use stepguard_plugin_host::{LoadFailure, LoadPolicy, Needed, PLUGIN_PATH_ENV, Registry};

use crate::exit::UsageError;
use crate::output;

/// The provider-table key that selects the unit; handled here, not passed to plugins.
pub(crate) const UNIT_OPTION: &str = "max_steps_unit";

/// Returns the built-in providers, reached through the plugin interface like loaded ones.
pub(crate) fn builtins() -> Vec<ProviderBox> {
    vec![
        stepguard_provider_claude::provider(),
        stepguard_provider_codex::provider(),
        stepguard_provider_gemini::provider(),
    ]
}

/// A provider's table from the config files in effect (`[codex]`): each key with its value and
/// where it was set.
pub(crate) type ProviderTable = BTreeMap<String, (serde_json::Value, Origin)>;

/// Builds the registry: built-ins, then every trusted plugin file in the search path; a plugin
/// replaces a built-in of the same name only with `allow_override` (`--allow-override`). Each
/// `--plugin-dir` that is not a directory and each ignored relative `STEPGUARD_PLUGIN_PATH` entry
/// is reported once on stderr.
///
/// Files that are refused or fail to load are not reported here: `plugins` lists them all
/// ([`warn_failure`]), and a command that needs a provider warns about the files meant to be that
/// provider ([`select`], [`check_config`]). A file no command needs is news only to `plugins`.
///
/// Only the files a command needs are opened ([`Needed`]): `run -p codex` and `count -p codex`
/// open none while codex is built in and may not be replaced.
pub(crate) fn load_registry(
    plugin_dirs: &[PathBuf],
    allow_override: bool,
    needed: Needed<'_>,
) -> Registry {
    for unusable in unusable_plugin_dirs(plugin_dirs) {
        output::diag("warning", unusable);
    }
    let mut registry = Registry::new(builtins());
    let env = std::env::var_os(PLUGIN_PATH_ENV);
    let exe = std::env::current_exe().ok();
    let search = stepguard_plugin_host::plugin_dirs(plugin_dirs, env.as_deref(), exe.as_deref());
    for ignored in &search.ignored {
        output::diag("warning", ignored.to_string());
    }
    registry.load_dirs_for(&search.dirs, LoadPolicy { allow_override }, needed);
    registry
}

/// Warns about a plugin file that was refused or did not load, in one line; a long reason's full
/// text (abi_stable's layout report) goes to the log at info level, shown with `-v`.
pub(crate) fn warn_failure(failure: &LoadFailure) {
    output::diag("warning", failure.to_string());
    log_details(failure);
}

/// Logs the full text behind a shortened reason, at info level (`-v`).
pub(crate) fn log_details(failure: &LoadFailure) {
    if let Some(details) = failure.error.details() {
        tracing::info!("plugin {}: {details}", failure.path.display());
    }
}

/// Returns a warning for a plugin file meant to be provider `name` that was refused or did not
/// load, at the file: `config` and `validate` report it with the config's diagnostics.
fn failure_diagnostic(name: &str, failure: &LoadFailure) -> Diagnostic {
    log_details(failure);
    Diagnostic {
        severity: Severity::Warning,
        file: failure.path.display().to_string(),
        key: None,
        message: format!(
            "plugin for provider `{name}` {}: {}",
            failure.verb(),
            failure.error
        ),
    }
}

/// Returns a warning for each `--plugin-dir` that does not exist or is not a directory (a typo
/// there would otherwise silently load nothing), once per directory.
fn unusable_plugin_dirs(dirs: &[PathBuf]) -> Vec<String> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut out = Vec::new();
    for dir in dirs {
        let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        if seen.contains(&absolute) {
            continue;
        }
        seen.push(absolute);
        let problem = match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => "is not a directory".to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
            Err(e) => format!("cannot be read ({e})"),
        };
        out.push(format!(
            "plugin directory {} (--plugin-dir) {problem}; no plugins are loaded from it",
            dir.display()
        ));
    }
    out
}

/// Checks a provider's table against its plugin, the one check `config`, `validate`, `run` and
/// `count` share: `max_steps_unit` (handled here, never passed to plugins) must name one of the
/// provider's units; every other key must be an option the provider's manifest declares, which
/// the host checks itself (naming the key, the accepted keys and the close match) whatever the
/// plugin's `validate_options` would accept; and the declared options then go to the plugin's
/// `validate_options` for their values, its message reported at the table.
///
/// Returns one error diagnostic per problem; none for an empty table.
pub(crate) fn check_options(
    name: &str,
    provider: &Provider,
    table: &ProviderTable,
) -> Vec<Diagnostic> {
    let Some((_, (_, first))) = table.iter().next() else {
        return Vec::new();
    };
    let manifest = provider.manifest();
    let declared = |key: &str| manifest.options.iter().any(|o| o.name == key);
    let mut accepted = vec![UNIT_OPTION];
    accepted.extend(manifest.options.iter().map(|o| o.name.as_str()));
    let mut out = Vec::new();
    let mut options = serde_json::Map::new();
    for (key, (value, origin)) in table {
        if key == UNIT_OPTION {
            if let Err(message) = check_unit(name, manifest, value) {
                out.push(error_at(origin, message));
            }
        } else if declared(key) {
            options.insert(key.clone(), value.clone());
        } else {
            // Checked here, not left to the plugin: an override of `validate_options` (or a
            // plugin built before the API checked keys) may accept anything.
            out.push(error_at(
                origin,
                format!(
                    "unknown option `{key}` for provider `{name}`; {}accepted keys: {}",
                    suggestion(key, &accepted),
                    accepted.join(", ")
                ),
            ));
        }
    }
    if let Err(refused) = provider.validate_options(&options) {
        // Problems that belong to the table as a whole are reported at `[name]` in its file.
        let table_origin = Origin::File {
            path: first.file().unwrap_or_default().to_owned(),
            key: name.to_owned(),
        };
        out.push(error_at(
            &table_origin,
            format!("invalid options for provider `{name}`: {}", refused.message),
        ));
    }
    out
}

/// Checks a unit name from a config file against the provider's units.
fn check_unit(name: &str, manifest: &Manifest, value: &serde_json::Value) -> Result<(), String> {
    let units: Vec<&str> = manifest.units.iter().map(|u| u.name.as_str()).collect();
    match value.as_str() {
        Some(unit) if units.contains(&unit) => Ok(()),
        Some(unit) => Err(unknown_unit(name, unit, &units)),
        None => Err(format!(
            "expected a unit name (a string) for provider `{name}`, found {value}; valid units: {}",
            units.join(", ")
        )),
    }
}

fn unknown_unit(name: &str, unit: &str, units: &[&str]) -> String {
    format!(
        "unknown unit `{unit}` for provider `{name}`; {}valid units: {}",
        suggestion(unit, units),
        units.join(", ")
    )
}

/// Returns `did you mean `x`? ` when a known name is close to `name`, else nothing.
fn suggestion(name: &str, known: &[&str]) -> String {
    did_you_mean(name, known)
        .map(|s| format!("did you mean `{s}`? "))
        .unwrap_or_default()
}

/// Checks every provider table of the config in effect (only `only`'s when given) and every unit
/// the policy fixes against the providers' plugins: what `config` and `validate` report, with
/// the same messages `run` and `count` fail with. A table or policy for a provider that is not
/// available is a warning (it may be a plugin installed elsewhere), which names the plugin file
/// when one meant to be that provider was refused. A refused file meant to be a provider that is
/// available (a built-in it would have replaced) and that these checks need (`only`, or one with
/// a table or a policy unit) is a warning at the file; other refused files are not mentioned.
pub(crate) fn check_config(
    registry: &Registry,
    config: &ConfigModel,
    only: Option<&str>,
) -> Vec<Diagnostic> {
    let wanted = |name: &str| only.is_none_or(|p| p == name);
    let mut out = Vec::new();
    let mut needed: std::collections::BTreeSet<&str> = only.into_iter().collect();
    needed.extend(
        config
            .policy
            .units
            .keys()
            .map(String::as_str)
            .filter(|n| wanted(n)),
    );
    needed.extend(
        config
            .providers
            .keys()
            .map(String::as_str)
            .filter(|n| wanted(n)),
    );
    for name in needed {
        // An unavailable provider's warning below already names its file.
        if registry.get(name).is_ok() {
            out.extend(
                registry
                    .failures_for(name)
                    .map(|f| failure_diagnostic(name, f)),
            );
        }
    }
    for (name, (unit, origin)) in config.policy.units.iter().filter(|(n, _)| wanted(n)) {
        match registry.get(name) {
            Ok(entry) => {
                let value = serde_json::Value::String(unit.clone());
                if let Err(message) = check_unit(name, entry.provider.manifest(), &value) {
                    out.push(error_at(origin, message));
                }
            }
            Err(e) => out.push(diagnostic(
                Severity::Warning,
                origin,
                format!("policy for a provider that is not available: {e}"),
            )),
        }
    }
    for (name, table) in config.providers.iter().filter(|(n, _)| wanted(n)) {
        let Some((_, (_, first))) = table.iter().next() else {
            continue;
        };
        match registry.get(name) {
            Ok(entry) => out.extend(check_options(name, &entry.provider, table)),
            Err(e) => out.push(diagnostic(
                Severity::Warning,
                first,
                format!("options for a provider that is not available: {e}"),
            )),
        }
    }
    out
}

fn error_at(origin: &Origin, message: String) -> Diagnostic {
    diagnostic(Severity::Error, origin, message)
}

fn diagnostic(severity: Severity, origin: &Origin, message: String) -> Diagnostic {
    let (file, key) = match origin {
        Origin::File { path, key } => (path.clone(), Some(key.clone())),
        other => (other.to_string(), None),
    };
    Diagnostic {
        severity,
        file,
        key,
        message,
    }
}

/// Returns a diagnostic as an error message: `FILE: KEY: message`, without its level.
pub(crate) fn located(d: &Diagnostic) -> String {
    match &d.key {
        Some(key) => format!("{}: {key}: {}", d.file, d.message),
        None => format!("{}: {}", d.file, d.message),
    }
}

/// A provider chosen for one command, with the counter request to open.
pub(crate) struct Selection<'r> {
    /// The provider.
    pub provider: &'r Provider,
    /// Where it came from: `builtin` or the plugin file.
    pub source: String,
    /// The unit and options to count with.
    pub request: CounterRequest,
}

/// Picks the provider, the unit (`--unit`, else `[P] max_steps_unit`, else the default) and the
/// provider options (`[P]` table), after [`check_options`] accepted the table: a command fails
/// on exactly what `config` and `validate` report as errors for this provider.
pub(crate) fn select<'r>(
    registry: &'r Registry,
    name: &str,
    unit_flag: Option<&str>,
    config: Option<&LoadedConfig>,
) -> anyhow::Result<Selection<'r>> {
    // The files meant to be this provider are the only refused ones this command mentions; when
    // none loaded, the error that follows repeats the first one's reason (exit 4).
    for failure in registry.failures_for(name) {
        warn_failure(failure);
    }
    let entry = registry.get(name)?;
    let provider = &entry.provider;
    let manifest = provider.manifest();
    let empty = ProviderTable::new();
    let table = config
        .and_then(|c| c.model.providers.get(name))
        .unwrap_or(&empty);
    let problems = check_options(name, provider, table);
    if !problems.is_empty() {
        let messages: Vec<String> = problems.iter().map(located).collect();
        return Err(UsageError(messages.join("\n")).into());
    }
    let unit_from_config = table
        .get(UNIT_OPTION)
        .and_then(|(value, origin)| value.as_str().map(|u| (u.to_owned(), origin.to_string())));
    let options: serde_json::Map<String, serde_json::Value> = table
        .iter()
        .filter(|(key, _)| *key != UNIT_OPTION)
        .map(|(key, (value, _))| (key.clone(), value.clone()))
        .collect();
    let fixed = config.and_then(|c| crate::settings::policy_unit(c, name));
    if let Some((fixed, policy)) = &fixed {
        let asked = unit_flag
            .map(|u| (u.to_owned(), "--unit".to_owned()))
            .or_else(|| unit_from_config.clone());
        if let Some((asked, from)) = asked.filter(|(u, _)| u != fixed) {
            return Err(UsageError(format!(
                "unit `{asked}` (from {from}) is not allowed: the policy at {policy} fixes the unit of `{name}` to `{fixed}`"
            ))
            .into());
        }
    }
    let (unit, from) = match (unit_flag, unit_from_config, fixed) {
        (Some(u), _, _) => (u.to_owned(), "--unit".to_owned()),
        (None, Some((u, origin)), _) => (u, origin),
        (None, None, Some((u, policy))) => (u, policy),
        (None, None, None) => (
            manifest.default_unit().unwrap_or_default().to_owned(),
            "default".to_owned(),
        ),
    };
    if !manifest.units.iter().any(|u| u.name == unit) {
        let units: Vec<&str> = manifest.units.iter().map(|u| u.name.as_str()).collect();
        return Err(UsageError(format!(
            "unknown unit `{unit}` for provider `{name}` (from {from}); {}valid units: {}",
            suggestion(&unit, &units),
            units.join(", ")
        ))
        .into());
    }
    Ok(Selection {
        provider,
        source: entry.source.to_string(),
        request: CounterRequest::new(unit).options(options),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(&str, serde_json::Value)]) -> ProviderTable {
        entries
            .iter()
            .map(|(key, value)| {
                let origin = Origin::File {
                    path: "/p/stepguard.toml".into(),
                    key: format!("codex.{key}"),
                };
                ((*key).to_owned(), (value.clone(), origin))
            })
            .collect()
    }

    fn codex_problems(entries: &[(&str, serde_json::Value)]) -> Vec<String> {
        let registry = Registry::new(builtins());
        let codex = &registry.get("codex").unwrap().provider;
        check_options("codex", codex, &table(entries))
            .iter()
            .map(located)
            .collect()
    }

    #[test]
    fn a_typo_of_the_unit_key_is_named_with_the_accepted_keys_and_the_close_match() {
        assert_eq!(
            codex_problems(&[("max_step_unit", serde_json::json!("item"))]),
            [
                "/p/stepguard.toml: codex.max_step_unit: unknown option `max_step_unit` for \
                 provider `codex`; did you mean `max_steps_unit`? accepted keys: max_steps_unit"
            ]
        );
        assert_eq!(
            codex_problems(&[("colour", serde_json::json!("red"))]),
            [
                "/p/stepguard.toml: codex.colour: unknown option `colour` for provider `codex`; \
                 accepted keys: max_steps_unit"
            ]
        );
    }

    /// A plugin whose `validate_options` accepts any key and judges only `strictness`'s value,
    /// as an old plugin or a careless override would.
    #[derive(Default)]
    struct Lenient;

    impl stepguard_plugin_api::ProviderPlugin for Lenient {
        fn manifest(&self) -> Manifest {
            Manifest::new("lenient", "1.0.0")
                .unit("line", "every line", true)
                .option("strictness", "`low` or `high`")
        }

        fn validate_options(
            &self,
            options: &serde_json::Map<String, serde_json::Value>,
        ) -> Result<(), String> {
            match options.get("strictness").and_then(|v| v.as_str()) {
                Some("extreme") => Err("`strictness` must be `low` or `high`".into()),
                _ => Ok(()),
            }
        }

        fn open_counter(
            &self,
            _: &CounterRequest,
        ) -> Result<Box<dyn stepguard_plugin_api::StepCounter>, String> {
            Err("not used".into())
        }
    }

    #[test]
    fn the_host_refuses_undeclared_keys_even_when_the_plugin_accepts_them() {
        let registry = Registry::new(vec![stepguard_plugin_api::provider_box(Lenient)]);
        let lenient = &registry.get("lenient").unwrap().provider;
        let problems = |entries: &[(&str, serde_json::Value)]| -> Vec<String> {
            check_options("lenient", lenient, &table(entries))
                .iter()
                .map(located)
                .collect()
        };
        assert_eq!(
            problems(&[
                ("colour", serde_json::json!("red")),
                ("strictnes", serde_json::json!("low")),
            ]),
            [
                "/p/stepguard.toml: codex.colour: unknown option `colour` for provider \
                 `lenient`; accepted keys: max_steps_unit, strictness",
                "/p/stepguard.toml: codex.strictnes: unknown option `strictnes` for provider \
                 `lenient`; did you mean `strictness`? accepted keys: max_steps_unit, strictness",
            ]
        );
        // The declared ones still go to the plugin for their values.
        assert_eq!(
            problems(&[
                ("colour", serde_json::json!("red")),
                ("strictness", serde_json::json!("extreme")),
            ])[1],
            "/p/stepguard.toml: lenient: invalid options for provider `lenient`: `strictness` \
             must be `low` or `high`"
        );
        assert!(problems(&[("strictness", serde_json::json!("high"))]).is_empty());
    }

    #[test]
    fn unit_values_are_checked_against_the_providers_units() {
        assert!(codex_problems(&[("max_steps_unit", serde_json::json!("tool"))]).is_empty());
        assert_eq!(
            codex_problems(&[("max_steps_unit", serde_json::json!("bogus"))]),
            [
                "/p/stepguard.toml: codex.max_steps_unit: unknown unit `bogus` for provider \
                 `codex`; valid units: item, actionable, tool, message, request"
            ]
        );
        assert_eq!(
            codex_problems(&[("max_steps_unit", serde_json::json!(["item"]))]),
            [
                "/p/stepguard.toml: codex.max_steps_unit: expected a unit name (a string) for \
                 provider `codex`, found [\"item\"]; valid units: item, actionable, tool, message, request"
            ]
        );
    }

    #[test]
    fn select_fails_with_the_same_message_as_the_check() {
        let registry = Registry::new(builtins());
        let mut config = LoadedConfig::default();
        config.model.providers.insert(
            "codex".into(),
            table(&[("max_step_unit", serde_json::json!("item"))]),
        );
        let err = select(&registry, "codex", None, Some(&config))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            codex_problems(&[("max_step_unit", serde_json::json!("item"))])
                .first()
                .map(String::as_str)
        );
    }

    #[test]
    fn check_config_covers_every_table_or_only_the_one_asked_for() {
        let registry = Registry::new(builtins());
        let mut config = ConfigModel::default();
        config.providers.insert(
            "codex".into(),
            table(&[("max_steps_unit", serde_json::json!("bogus"))]),
        );
        config
            .providers
            .insert("opencod".into(), table(&[("x", serde_json::json!(1))]));
        let all = check_config(&registry, &config, None);
        let severities: Vec<Severity> = all.iter().map(|d| d.severity).collect();
        assert_eq!(severities, [Severity::Error, Severity::Warning]);
        assert!(
            all[1].message.starts_with(
                "options for a provider that is not available: unknown provider `opencod`"
            ),
            "{all:?}"
        );
        assert_eq!(check_config(&registry, &config, Some("opencod")).len(), 1);
        assert!(check_config(&registry, &config, Some("claude")).is_empty());
    }

    #[test]
    fn plugin_dirs_that_are_not_directories_are_named_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plugins.txt");
        std::fs::write(&file, "").unwrap();
        let missing = dir.path().join("missing");
        let warnings = unusable_plugin_dirs(&[
            dir.path().to_path_buf(),
            missing.clone(),
            missing.clone(),
            file.clone(),
        ]);
        assert_eq!(
            warnings,
            [
                format!(
                    "plugin directory {} (--plugin-dir) does not exist; no plugins are loaded \
                     from it",
                    missing.display()
                ),
                format!(
                    "plugin directory {} (--plugin-dir) is not a directory; no plugins are \
                     loaded from it",
                    file.display()
                ),
            ]
        );
    }
}
