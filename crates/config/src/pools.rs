//! Pools: `[pools.NAME]` tables, budgets that every run joining them shares (see
//! `stepguard-ledger`).
//!
//! ```toml
//! [pools.review-daily]
//! max_cost_usd = 50.0          # any of: max_cost_usd, max_tokens, max_steps, max_runs
//! max_tokens = 20_000_000
//! window = "24h"               # rolling; "day"/"week" (in `timezone`, UTC by default); "none"
//! max_concurrent_runs = 8
//! match = { task_type = "review" }   # or provider, profile, repository; "all"
//! ```
//!
//! Pools are read from every config file, the policy-only ones included. A run joins every pool
//! whose `match` it meets (every key given must equal the run's; `"all"` matches every run) and
//! the pools named with `--pool`; a pool without `match` is joined only by name.
//!
//! The same pool in several files merges to the tightest: each cap is the lowest any file gives.
//! Its `window` and `match` are those of the lowest-precedence policy-bearing file that declares
//! it (the system's over the user's); a project file cannot change them, nor remove the pool or
//! raise a cap (it may only add or lower caps), with a warning naming the file and the key (see
//! [`crate::loosening`]).

use std::collections::BTreeMap;

use stepguard_ledger::{PoolLimits, PoolSpec, Window, usd_to_micros};

use crate::value::Origin;
use crate::{Diagnostic, FileRole, Severity, at, did_you_mean};

/// The keys of a `[pools.NAME]` table.
pub const POOL_KEYS: &[&str] = &[
    "max_cost_usd",
    "max_tokens",
    "max_steps",
    "max_runs",
    "max_concurrent_runs",
    "window",
    "timezone",
    "match",
];

/// The keys of a pool's `match` table.
pub const MATCH_KEYS: &[&str] = &["task_type", "provider", "profile", "repository"];

/// Which runs join a pool by themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolMatch {
    /// `match = "all"`: every run.
    pub all: bool,
    /// Runs of this task type.
    pub task_type: Option<String>,
    /// Runs of this provider.
    pub provider: Option<String>,
    /// Runs under this profile.
    pub profile: Option<String>,
    /// Runs in this repository (its remote URL or top-level path, as `history --repo` shows).
    pub repository: Option<String>,
}

/// What a run is, for matching pools.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunFacts<'a> {
    /// Its task type.
    pub task_type: Option<&'a str>,
    /// Its provider.
    pub provider: &'a str,
    /// Its profile.
    pub profile: Option<&'a str>,
    /// Its git repository.
    pub repository: Option<&'a str>,
}

impl PoolMatch {
    /// Whether no run joins by itself (the pool is joined only with `--pool`).
    pub fn is_empty(&self) -> bool {
        *self == PoolMatch::default()
    }

    /// Whether `run` joins the pool by itself.
    pub fn matches(&self, run: &RunFacts<'_>) -> bool {
        if self.all {
            return true;
        }
        let want = |key: &Option<String>, have: Option<&str>| {
            key.as_deref().is_none_or(|k| Some(k) == have)
        };
        !self.is_empty()
            && want(&self.task_type, run.task_type)
            && want(&self.provider, Some(run.provider))
            && want(&self.profile, run.profile)
            && want(&self.repository, run.repository)
    }
}

impl std::fmt::Display for PoolMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.all {
            return f.write_str("all");
        }
        let keys = [
            ("task_type", &self.task_type),
            ("provider", &self.provider),
            ("profile", &self.profile),
            ("repository", &self.repository),
        ];
        let given: Vec<String> = keys
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} = {v:?}")))
            .collect();
        if given.is_empty() {
            f.write_str("--pool only")
        } else {
            f.write_str(&given.join(", "))
        }
    }
}

/// One pool as the config files in effect declare it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// The pool's name.
    pub name: String,
    /// `max_cost_usd`.
    pub max_cost_usd: Option<f64>,
    /// `max_tokens`.
    pub max_tokens: Option<u64>,
    /// `max_steps`.
    pub max_steps: Option<u64>,
    /// `max_runs`: runs started in the window.
    pub max_runs: Option<u64>,
    /// `max_concurrent_runs`.
    pub max_concurrent_runs: Option<u64>,
    /// `window` (with `timezone`).
    pub window: Window,
    /// `match`.
    pub matcher: PoolMatch,
    /// Every file that declares it, highest precedence first (`pools.NAME` in each).
    pub origins: Vec<Origin>,
    /// Whether a policy-bearing file declares it (then a project file cannot loosen it).
    pub from_policy: bool,
}

impl PoolConfig {
    /// The pool as the ledger keeps it.
    pub fn spec(&self) -> PoolSpec {
        PoolSpec {
            name: self.name.clone(),
            limits: PoolLimits {
                max_cost_micros: self.max_cost_usd.map(usd_to_micros),
                max_tokens: self.max_tokens,
                max_steps: self.max_steps,
                max_runs: self.max_runs,
                max_concurrent_runs: self.max_concurrent_runs,
            },
            window: self.window.clone(),
        }
    }
}

/// Reads the `pools` table of one file.
pub(crate) fn parse(
    path: &str,
    role: FileRole,
    value: &toml::Value,
    diagnostics: &mut Vec<Diagnostic>,
) -> BTreeMap<String, PoolConfig> {
    let mut reader = Reader {
        path,
        diagnostics,
        failed: false,
    };
    let mut pools = BTreeMap::new();
    let Some(table) = value.as_table() else {
        reader.error(
            "pools",
            format!("expected a table of pools, found {}", value.type_str()),
        );
        return pools;
    };
    for (name, v) in table {
        let key = format!("pools.{name}");
        reader.failed = false;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            reader.error(&key, "a pool name is letters, digits, `-`, `_` or `.`");
            continue;
        }
        let Some(t) = v.as_table() else {
            reader.error(&key, format!("expected a table, found {}", v.type_str()));
            continue;
        };
        if let Some(pool) = reader.pool(name, &key, t, role) {
            pools.insert(name.clone(), pool);
        }
    }
    pools
}

struct Reader<'a> {
    path: &'a str,
    diagnostics: &'a mut Vec<Diagnostic>,
    failed: bool,
}

impl Reader<'_> {
    fn push(&mut self, severity: Severity, key: &str, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic {
            severity,
            file: self.path.to_owned(),
            key: Some(key.to_owned()),
            message: message.into(),
        });
    }

    fn error(&mut self, key: &str, message: impl Into<String>) {
        self.failed = true;
        self.push(Severity::Error, key, message);
    }

    fn count(&mut self, key: &str, v: &toml::Value) -> Option<u64> {
        match v
            .as_integer()
            .and_then(|i| u64::try_from(i).ok())
            .filter(|&i| i > 0)
        {
            Some(n) => Some(n),
            None => {
                self.error(
                    key,
                    format!("expected a whole number of at least 1, found {v}"),
                );
                None
            }
        }
    }

    fn text(&mut self, key: &str, v: &toml::Value) -> Option<String> {
        match v.as_str() {
            Some(s) if !s.trim().is_empty() => Some(s.to_owned()),
            _ => {
                self.error(key, format!("expected a non-empty string, found {v}"));
                None
            }
        }
    }

    fn pool(
        &mut self,
        name: &str,
        key: &str,
        t: &toml::Table,
        role: FileRole,
    ) -> Option<PoolConfig> {
        let mut pool = PoolConfig {
            name: name.to_owned(),
            max_cost_usd: None,
            max_tokens: None,
            max_steps: None,
            max_runs: None,
            max_concurrent_runs: None,
            window: Window::Lifetime,
            matcher: PoolMatch::default(),
            origins: vec![Origin::File {
                path: self.path.to_owned(),
                key: key.to_owned(),
            }],
            from_policy: role.bears_policy(),
        };
        let mut window = None;
        let mut timezone = None;
        for (k, v) in t {
            let at = format!("{key}.{k}");
            match k.as_str() {
                "max_cost_usd" => match v.as_float().or(v.as_integer().map(|i| i as f64)) {
                    Some(usd) if usd > 0.0 && usd.is_finite() => pool.max_cost_usd = Some(usd),
                    _ => self.error(
                        &at,
                        format!("expected dollars above 0 (e.g. 50.0), found {v}"),
                    ),
                },
                "max_tokens" => pool.max_tokens = self.count(&at, v),
                "max_steps" => pool.max_steps = self.count(&at, v),
                "max_runs" => pool.max_runs = self.count(&at, v),
                "max_concurrent_runs" => pool.max_concurrent_runs = self.count(&at, v),
                "window" => window = self.text(&at, v),
                "timezone" => timezone = self.text(&at, v),
                "match" => pool.matcher = self.matcher(&at, v)?,
                other => {
                    let message = match did_you_mean(other, POOL_KEYS) {
                        Some(s) => format!("unknown key `{other}`; did you mean `{s}`?"),
                        None => format!(
                            "unknown key `{other}`; known keys here: {}",
                            POOL_KEYS.join(", ")
                        ),
                    };
                    self.push(Severity::Warning, &at, message);
                }
            }
        }
        let windowed = pool.max_cost_usd.is_some()
            || pool.max_tokens.is_some()
            || pool.max_steps.is_some()
            || pool.max_runs.is_some();
        match window.as_deref() {
            Some(w) => match Window::parse(w, timezone.as_deref()) {
                Ok(parsed) => pool.window = parsed,
                Err(e) => self.error(&format!("{key}.window"), e.to_string()),
            },
            None if windowed => self.error(
                key,
                "a pool with max_cost_usd, max_tokens, max_steps or max_runs needs a window: \
                 window = \"24h\" (rolling), \"day\" or \"week\" (with timezone), or \"none\"",
            ),
            None if timezone.is_some() => self.error(
                &format!("{key}.timezone"),
                "a timezone needs window = \"day\" or \"week\"",
            ),
            None => {}
        }
        if !windowed && pool.max_concurrent_runs.is_none() {
            self.error(
                key,
                "a pool caps something: set max_cost_usd, max_tokens, max_steps, max_runs or \
                 max_concurrent_runs",
            );
        }
        (!self.failed).then_some(pool)
    }

    fn matcher(&mut self, key: &str, v: &toml::Value) -> Option<PoolMatch> {
        if v.as_str() == Some("all") {
            return Some(PoolMatch {
                all: true,
                ..PoolMatch::default()
            });
        }
        let Some(t) = v.as_table().filter(|t| !t.is_empty()) else {
            self.error(
                key,
                format!(
                    "expected \"all\" or a table of {} (e.g. {{ task_type = \"review\" }}), found {v}",
                    MATCH_KEYS.join(", ")
                ),
            );
            return None;
        };
        let mut m = PoolMatch::default();
        for (k, v) in t {
            let at = format!("{key}.{k}");
            let slot = match k.as_str() {
                "task_type" => &mut m.task_type,
                "provider" => &mut m.provider,
                "profile" => &mut m.profile,
                "repository" => &mut m.repository,
                other => {
                    let hint = did_you_mean(other, MATCH_KEYS)
                        .map(|s| format!("did you mean `{s}`? "))
                        .unwrap_or_default();
                    self.error(
                        &at,
                        format!(
                            "unknown key `{other}`; {hint}a pool matches by {}",
                            MATCH_KEYS.join(", ")
                        ),
                    );
                    return None;
                }
            };
            *slot = Some(self.text(&at, v)?);
        }
        Some(m)
    }
}

/// A warning for a project setting a pool's loosening ignored.
pub(crate) fn ignored(origin: &Origin, what: &str, base: &PoolConfig) -> Diagnostic {
    let policy = base
        .origins
        .last()
        .map(ToString::to_string)
        .unwrap_or_default();
    at(
        Severity::Warning,
        origin,
        format!(
            "{what} would loosen pool `{}` declared in a policy-bearing file ({policy}); \
             ignored: a project file may only add or lower its caps",
            base.name
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{merge as merge_files, parse_file};

    fn load(files: &[(&str, FileRole, &str)]) -> crate::LoadedConfig {
        merge_files(
            files
                .iter()
                .map(|(p, r, t)| parse_file(p, t, *r).expect("parses"))
                .collect(),
        )
    }

    fn errors(text: &str) -> Vec<String> {
        let parsed = parse_file("/p/stepguard.toml", text, FileRole::Project).expect("toml");
        parsed
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_pool_is_read_with_its_window_and_match() {
        let loaded = load(&[(
            "/p/stepguard.toml",
            FileRole::Project,
            "[pools.review-daily]\nmax_cost_usd = 50.0\nmax_tokens = 20_000_000\nwindow = \"24h\"\n\
             max_concurrent_runs = 8\nmatch = { task_type = \"review\" }\n",
        )]);
        let pool = &loaded.model.pools["review-daily"];
        assert_eq!(pool.max_cost_usd, Some(50.0));
        assert_eq!(pool.spec().limits.max_cost_micros, Some(50_000_000));
        assert_eq!(
            pool.window,
            Window::Rolling(std::time::Duration::from_secs(86_400))
        );
        let review = RunFacts {
            task_type: Some("review"),
            provider: "codex",
            ..RunFacts::default()
        };
        assert!(pool.matcher.matches(&review));
        assert!(!pool.matcher.matches(&RunFacts {
            provider: "codex",
            ..RunFacts::default()
        }));
        assert!(!pool.from_policy);
    }

    #[test]
    fn bad_pools_are_errors_naming_the_key_and_the_fix() {
        let cases = [
            (
                "[pools.a]\nmax_tokens = 10\n",
                "pools.a: a pool with max_cost_usd, max_tokens, max_steps or max_runs needs a window",
            ),
            (
                "[pools.a]\nwindow = \"24h\"\n",
                "pools.a: a pool caps something",
            ),
            (
                "[pools.a]\nmax_tokens = -1\nwindow = \"none\"\n",
                "pools.a.max_tokens: expected a whole number of at least 1",
            ),
            (
                "[pools.a]\nmax_cost_usd = 0\nwindow = \"none\"\n",
                "pools.a.max_cost_usd: expected dollars above 0",
            ),
            (
                "[pools.a]\nmax_runs = 3\nwindow = \"daily\"\n",
                "pools.a.window: compute the window daily",
            ),
            (
                "[pools.a]\nmax_runs = 3\nwindow = \"day\"\ntimezone = \"Nowhere/City\"\n",
                "unknown time zone",
            ),
            (
                "[pools.a]\nmax_runs = 3\nwindow = \"none\"\nmatch = { team = \"x\" }\n",
                "pools.a.match.team: unknown key `team`",
            ),
            (
                "[pools.a]\nmax_runs = 3\nwindow = \"none\"\nmatch = \"everything\"\n",
                "pools.a.match: expected \"all\" or a table",
            ),
            (
                "[pools.\"a b\"]\nmax_runs = 3\nwindow = \"none\"\n",
                "a pool name is letters",
            ),
            ("pools = 3\n", "pools: expected a table of pools"),
        ];
        for (text, want) in cases {
            let errors = errors(text);
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{text}: {errors:?}"
            );
        }
    }

    #[test]
    fn a_project_file_cannot_loosen_or_remove_a_policy_pool() {
        let loaded = load(&[
            (
                "/repo/stepguard.toml",
                FileRole::Project,
                "[pools.team]\nmax_tokens = 5_000_000\nmax_cost_usd = 5.0\nmax_runs = 2\nwindow = \"none\"\n\
                 match = { task_type = \"x\" }\n[pools.mine]\nmax_concurrent_runs = 1\n",
            ),
            (
                "/home/u/.config/stepguard/stepguard.toml",
                FileRole::User,
                "[pools.team]\nmax_tokens = 1_000_000\nmax_runs = 10\nwindow = \"day\"\nmatch = \"all\"\n",
            ),
        ]);
        let team = &loaded.model.pools["team"];
        // Tightened where it can be, the policy's where it would loosen.
        assert_eq!(
            (team.max_tokens, team.max_runs, team.max_cost_usd),
            (Some(1_000_000), Some(2), Some(5.0))
        );
        assert_eq!(team.window, Window::parse("day", None).expect("day"));
        assert!(team.matcher.all);
        assert!(team.from_policy);
        assert_eq!(team.origins.len(), 2);
        let warnings: Vec<String> = loaded.diagnostics().map(ToString::to_string).collect();
        for key in [
            "pools.team.max_tokens",
            "pools.team.window",
            "pools.team.match",
        ] {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.contains(key) && w.contains("would loosen pool `team`")),
                "{key}: {warnings:?}"
            );
        }
        assert!(
            !warnings.iter().any(|w| w.contains("pools.team.max_runs")),
            "{warnings:?}"
        );
        assert!(loaded.model.pools.contains_key("mine"));
    }

    #[test]
    fn a_policy_only_file_declares_pools_too() {
        let loaded = load(&[(
            "/etc/policy.toml",
            FileRole::PolicyOnly,
            "[pools.fleet]\nmax_concurrent_runs = 3\nmatch = \"all\"\n",
        )]);
        assert!(loaded.model.pools["fleet"].from_policy);
    }
}
