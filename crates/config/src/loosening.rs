//! Loosening under a policy: while a policy is in force, a project file (the repository's own,
//! which the agent under it may edit) cannot turn off or loosen any enforcement. Only the user's
//! and the system's files can, and a policy can forbid those too: a setting it names in
//! `locked = [...]` may only be tightened, by any file. A setting that would loosen what the
//! files below it (or the defaults) say is left out of the model, with a warning naming the
//! file, the key and the policy.
//!
//! The settings a file can loosen, and what loosening each means:
//!
//! | setting | lock | loosened by |
//! |---|---|---|
//! | `run.unrecognized_stream` | `unrecognized_stream` | `"warn"` where the files below say `"stop"` (the default) |
//! | `run.wrap_up` | `wrap_up` | `false` where the files below say `true` |
//! | `P.max_steps_unit` | (`[policy.P] max_steps_unit`) | any unit other than the one the files below choose (stepguard cannot rank a provider's units; a unit the policy fixes is checked by `validate` instead) |
//! | `loops.limit` | `loops` | a higher limit, or `"off"` |
//! | `task_types.T.loop_limit`, `profiles.NAME.loop_limit` | `loops` | a limit higher than the one the files below give that task type or profile |
//! | `profile = NAME` | `loops` | selecting a profile whose loop limit is higher than the one the files below give (the profile's limit is held at that one; its other settings stay) |
//! | `loops.window` | `loops` | a smaller window |
//! | `loops.ignore_tools` | `loops` | a tool the files below do not exempt |
//!
//! The native limits, the pre-flight check and the containment are chosen on the command line
//! only, so no file can loosen them; the CLI refuses the flags that loosen a locked setting.
//!
//! Pools ([`crate::pools`]) are judged apart, policy or not: a pool declared in several files
//! keeps the window and the match of its first declaration (the lowest-precedence policy-bearing
//! file's), and each cap is the lowest any file gives, so no file can remove a pool, raise a cap,
//! or move the window or the match ([`pool`]).

use std::collections::BTreeMap;

use stepguard_core::loops::{DEFAULT_LOOP_LIMIT, LoopSettings};

use crate::loop_settings::builtin_profile_loop_limit;
use crate::model::{ConfigModel, Lock, PolicySettings};

use crate::pools::{self, PoolConfig};
use crate::value::{LoopLimit, Origin};
use crate::{Diagnostic, FileRole, ParsedFile, Severity, UNIT_KEY, at};

/// Which loosening a file is judged for, and the policy that forbids it.
struct Judge<'p> {
    policy: &'p PolicySettings,
    /// A project file: every loosening is forbidden, not only what the policy locks.
    project: bool,
    /// The settings left out: where, what, and the policy setting that forbade it.
    ignored: Vec<(Origin, String, &'p Origin)>,
}

impl<'p> Judge<'p> {
    /// Returns the policy setting that forbids loosening `lock` in this file (`None`: a unit,
    /// which only a project file may not change).
    fn forbids(&self, lock: Option<Lock>) -> Option<&'p Origin> {
        let locked = lock.and_then(|l| self.policy.locks(l));
        match locked {
            Some(origin) => Some(origin),
            None if self.project => self.policy.origin(),
            None => None,
        }
    }

    /// Leaves a setting out when loosening `lock` is forbidden; returns true when it is.
    fn refuse(&mut self, lock: Option<Lock>, origin: &Origin, what: String) -> bool {
        match self.forbids(lock) {
            Some(policy) => {
                self.ignored.push((origin.clone(), what, policy));
                true
            }
            None => false,
        }
    }
}

/// Removes from `file` every setting that would loosen what `below` (the files of lower
/// precedence, merged) says, where the policy forbids it, adding a warning for each to the
/// file's diagnostics: in a project file, every loosening; in the user's and system's files,
/// that of a setting the policy locks.
pub(crate) fn strip(file: &mut ParsedFile, below: &ConfigModel, policy: &PolicySettings) {
    if !file.role.has_settings() {
        return;
    }
    let mut judge = Judge {
        policy,
        project: file.role == FileRole::Project,
        ignored: Vec::new(),
    };
    run_settings(&mut file.model, below, &mut judge);
    units(&mut file.model, below, &mut judge);
    loop_limits(&mut file.model, below, &mut judge);
    selected_profile(&mut file.model, below, &mut judge);
    loop_scope(&mut file.model, below, &mut judge);
    for (origin, what, policy) in judge.ignored {
        file.diagnostics.push(warning(&origin, &what, policy));
    }
}

/// Merges `over` (a declaration of a pool in a file of higher precedence than `base`'s) into
/// `base`: caps it adds or lowers count; caps it raises, and a different window or match, are
/// left out, each with a warning (returned, for `over`'s file).
pub(crate) fn pool(base: &mut PoolConfig, over: &PoolConfig, role: FileRole) -> Vec<Diagnostic> {
    let origin = over
        .origins
        .first()
        .cloned()
        .unwrap_or_else(|| Origin::Flag(String::new()));
    let key = |k: &str| match &origin {
        Origin::File { path, key } => Origin::File {
            path: path.clone(),
            key: format!("{key}.{k}"),
        },
        other => other.clone(),
    };
    let mut warnings = Vec::new();
    let snapshot = base.clone();
    let judge = |name: &str, b: Option<u64>, o: Option<u64>| -> (Option<u64>, Option<Diagnostic>) {
        match (b, o) {
            (Some(b), Some(o)) if o > b => (
                Some(b),
                Some(pools::ignored(
                    &key(name),
                    &format!("{name} = {o} (above {b})"),
                    &snapshot,
                )),
            ),
            (_, Some(o)) => (Some(o), None),
            (b, None) => (b, None),
        }
    };
    for (name, slot, o) in [
        ("max_tokens", &mut base.max_tokens, over.max_tokens),
        ("max_steps", &mut base.max_steps, over.max_steps),
        ("max_runs", &mut base.max_runs, over.max_runs),
        (
            "max_concurrent_runs",
            &mut base.max_concurrent_runs,
            over.max_concurrent_runs,
        ),
    ] {
        let (v, w) = judge(name, *slot, o);
        *slot = v;
        warnings.extend(w);
    }
    match (base.max_cost_usd, over.max_cost_usd) {
        (Some(b), Some(o)) if o > b => warnings.push(pools::ignored(
            &key("max_cost_usd"),
            &format!("max_cost_usd = {o} (above {b})"),
            &snapshot,
        )),
        (_, Some(o)) => base.max_cost_usd = Some(o),
        (_, None) => {}
    }
    // A declaration without windowed caps says nothing of the window; one without `match`
    // nothing of who joins.
    let windowed = over.max_cost_usd.is_some()
        || over.max_tokens.is_some()
        || over.max_steps.is_some()
        || over.max_runs.is_some();
    if windowed && over.window != base.window {
        warnings.push(pools::ignored(
            &key("window"),
            &format!("window {}", over.window),
            &snapshot,
        ));
    }
    if !over.matcher.is_empty() && over.matcher != base.matcher {
        warnings.push(pools::ignored(
            &key("match"),
            &format!("match {}", over.matcher),
            &snapshot,
        ));
    }
    base.origins.insert(0, origin);
    base.from_policy |= role.bears_policy();
    warnings
}

/// Merges the pools of every file (highest precedence first) into the pools in effect: the
/// lowest-precedence policy-bearing declaration sets the window and the match, every cap is
/// the tightest any file gives, and what a project file would loosen is left out with a warning
/// added to that file's diagnostics.
pub(crate) fn merge_pools(files: &mut [ParsedFile]) -> BTreeMap<String, PoolConfig> {
    let mut merged: BTreeMap<String, PoolConfig> = BTreeMap::new();
    // Lowest precedence first, policy-bearing files before project files: a project file is
    // judged against every policy declaration.
    let mut order: Vec<usize> = (0..files.len()).rev().collect();
    order.sort_by_key(|&i| files[i].role == FileRole::Project);
    for i in order {
        let file = &mut files[i];
        for (name, declared) in &file.model.pools {
            match merged.get_mut(name) {
                None => {
                    merged.insert(name.clone(), declared.clone());
                }
                Some(base) => {
                    let warnings = pool(base, declared, file.role);
                    file.diagnostics.extend(warnings);
                }
            }
        }
    }
    merged
}

fn warning(origin: &Origin, what: &str, policy: &Origin) -> Diagnostic {
    let rule = if matches!(policy, Origin::File { key, .. } if key == "policy.locked") {
        "the policy locks it"
    } else {
        "only the user's or the system's config file may loosen it"
    };
    at(
        Severity::Warning,
        origin,
        format!(
            "{what} would loosen enforcement while a policy is in force ({policy}); ignored: \
             {rule}"
        ),
    )
}

/// `run.unrecognized_stream = "warn"` and `run.wrap_up = false`.
fn run_settings(m: &mut ConfigModel, below: &ConfigModel, judge: &mut Judge<'_>) {
    let below_warns = below
        .unrecognized_stream
        .as_ref()
        .is_some_and(|(w, _)| w == "warn");
    if let Some((what, origin)) = &m.unrecognized_stream
        && what == "warn"
        && !below_warns
        && judge.refuse(Some(Lock::UnrecognizedStream), origin, "\"warn\"".into())
    {
        m.unrecognized_stream = None;
    }
    let below_on = below.wrap_up.as_ref().is_some_and(|(on, _)| *on);
    if let Some((false, origin)) = &m.wrap_up
        && below_on
        && judge.refuse(Some(Lock::WrapUp), origin, "false".into())
    {
        m.wrap_up = None;
    }
}

/// A provider's `max_steps_unit` other than the one below; a unit the policy fixes is left to
/// `validate`, which refuses any other.
fn units(m: &mut ConfigModel, below: &ConfigModel, judge: &mut Judge<'_>) {
    for (provider, options) in &mut m.providers {
        if judge.policy.units.contains_key(provider) {
            continue;
        }
        let below_unit = below
            .providers
            .get(provider)
            .and_then(|o| o.get(UNIT_KEY))
            .map(|(v, _)| v);
        if let Some((unit, origin)) = options.get(UNIT_KEY)
            && below_unit != Some(unit)
        {
            let chosen = match below_unit {
                Some(b) => format!("the unit {b} of the files below"),
                None => "the provider's default unit".to_owned(),
            };
            if judge.refuse(None, origin, format!("unit {unit} (instead of {chosen})")) {
                options.remove(UNIT_KEY);
            }
        }
    }
}

/// Returns true when `a` allows more than `b` (`off` allows the most).
fn looser(a: LoopLimit, b: LoopLimit) -> bool {
    a != b && a.min(b) == b
}

/// `loops.limit`, `task_types.T.loop_limit` and `profiles.NAME.loop_limit`.
fn loop_limits(m: &mut ConfigModel, below: &ConfigModel, judge: &mut Judge<'_>) {
    let default = LoopLimit::Limited(DEFAULT_LOOP_LIMIT);
    let below_limit = below.loops.limit.as_ref().map_or(default, |(l, _)| *l);
    let lock = Some(Lock::Loops);
    if let Some((limit, origin)) = &m.loops.limit
        && looser(*limit, below_limit)
        && judge.refuse(lock, origin, format!("a loop limit of {limit}"))
    {
        m.loops.limit = None;
    }
    m.loops.task_types.retain(|name, (limit, origin)| {
        let bound = below
            .loops
            .task_types
            .get(name)
            .map_or(below_limit, |l| l.0);
        !(looser(*limit, bound) && judge.refuse(lock, origin, format!("a loop limit of {limit}")))
    });
    m.loops.profiles.retain(|name, (limit, origin)| {
        let bound = match below.loops.profiles.get(name) {
            Some((l, _)) => *l,
            None => builtin_profile_loop_limit(name).map_or(default, LoopLimit::Limited),
        };
        !(looser(*limit, bound) && judge.refuse(lock, origin, format!("a loop limit of {limit}")))
    });
}

/// `profile = NAME`: selecting a profile whose loop limit (this file's, the files' below, or
/// the built-in one) is looser than the limit below loosens loops by itself, so the profile's
/// limit is held at that limit; the profile's other settings stay.
fn selected_profile(m: &mut ConfigModel, below: &ConfigModel, judge: &mut Judge<'_>) {
    let Some((name, origin)) = m.profile.clone() else {
        return;
    };
    let default = LoopLimit::Limited(DEFAULT_LOOP_LIMIT);
    let below_limit = below.loops.limit.as_ref().map_or(default, |(l, _)| *l);
    let limit = m
        .loops
        .profiles
        .get(&name)
        .or_else(|| below.loops.profiles.get(&name))
        .map(|(l, _)| *l)
        .or_else(|| builtin_profile_loop_limit(&name).map(LoopLimit::Limited));
    if let Some(limit) = limit
        && looser(limit, below_limit)
        && judge.refuse(
            Some(Lock::Loops),
            &origin,
            format!("profile {name}'s loop limit of {limit}"),
        )
    {
        m.loops.profiles.insert(name, (below_limit, origin));
    }
}

/// `loops.window` below the window below, and `loops.ignore_tools` exempting a tool not exempt
/// below.
fn loop_scope(m: &mut ConfigModel, below: &ConfigModel, judge: &mut Judge<'_>) {
    let below_window = below
        .loops
        .window
        .as_ref()
        .map_or(LoopSettings::DEFAULT_WINDOW, |(w, _)| *w);
    let lock = Some(Lock::Loops);
    if let Some((window, origin)) = &m.loops.window
        && *window < below_window
        && judge.refuse(
            lock,
            origin,
            format!("a window of {window} calls (below {below_window})"),
        )
    {
        m.loops.window = None;
    }
    let below_tools: &[String] = below
        .loops
        .ignore_tools
        .as_ref()
        .map_or(&[], |(t, _)| t.as_slice());
    if let Some((tools, origin)) = &m.loops.ignore_tools {
        let new: Vec<&str> = tools
            .iter()
            .filter(|t| !below_tools.contains(t))
            .map(String::as_str)
            .collect();
        let what = format!("exempting {} from loop detection", new.join(", "));
        if !new.is_empty() && judge.refuse(lock, origin, what) {
            m.loops.ignore_tools = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{FileRole, LoadedConfig, Severity, merge, parse_file};

    const PROJECT: &str = "/repo/stepguard.toml";
    const USER: &str = "/home/u/.config/stepguard/stepguard.toml";
    const POLICY: &str = "[policy]\nmax_steps_ceiling = 100\n";

    /// Merges a project file over a user file.
    fn load(project: &str, user: &str) -> LoadedConfig {
        merge(vec![
            parse_file(PROJECT, project, FileRole::Project).unwrap(),
            parse_file(USER, user, FileRole::User).unwrap(),
        ])
    }

    /// The warnings about loosening, as `key: what`.
    fn ignored(loaded: &LoadedConfig) -> Vec<String> {
        loaded
            .diagnostics()
            .filter(|d| d.message.contains("would loosen enforcement"))
            .map(|d| {
                assert_eq!((d.severity, d.file.as_str()), (Severity::Warning, PROJECT));
                assert!(
                    d.message
                        .contains(&format!("({USER}: policy.max_steps_ceiling)")),
                    "{d}"
                );
                format!(
                    "{}: {}",
                    d.key.as_deref().unwrap_or(""),
                    d.message.split(" would").next().unwrap_or("")
                )
            })
            .collect()
    }

    #[test]
    fn a_project_file_cannot_make_an_unrecognised_stream_a_warning_under_a_policy() {
        let project = "[run]\nunrecognized_stream = \"warn\"\n";
        let loaded = load(project, POLICY);
        assert_eq!(loaded.model.unrecognized_stream, None);
        assert_eq!(ignored(&loaded), ["run.unrecognized_stream: \"warn\""]);
        let d = loaded.diagnostics().next().unwrap().to_string();
        assert_eq!(
            d,
            format!(
                "warning: {PROJECT}: run.unrecognized_stream: \"warn\" would loosen enforcement \
                 while a policy is in force ({USER}: policy.max_steps_ceiling); ignored: \
                 only the user's or the system's config file may loosen it"
            )
        );
        // Without a policy the project's choice stands; the user's own file may loosen it.
        let free = load(project, "");
        assert_eq!(free.model.unrecognized_stream.clone().unwrap().0, "warn");
        let user = load(
            project,
            &format!("{POLICY}[run]\nunrecognized_stream = \"warn\"\n"),
        );
        assert_eq!(user.model.unrecognized_stream.clone().unwrap().0, "warn");
        assert!(ignored(&user).is_empty());
        // Stopping is never loosening.
        let stop = load("[run]\nunrecognized_stream = \"stop\"\n", POLICY);
        assert_eq!(stop.model.unrecognized_stream.clone().unwrap().0, "stop");
    }

    #[test]
    fn a_project_file_cannot_turn_the_wrap_up_off_under_a_policy() {
        let user = format!("{POLICY}[run]\nwrap_up = true\n");
        let loaded = load("[run]\nwrap_up = false\n", &user);
        assert_eq!(loaded.model.wrap_up.as_ref().map(|w| w.0), Some(true));
        assert_eq!(ignored(&loaded), ["run.wrap_up: false"]);
        assert_eq!(
            load("[run]\nwrap_up = false\n", "[run]\nwrap_up = true\n")
                .model
                .wrap_up
                .map(|w| w.0),
            Some(false)
        );
        // Turning it on is tightening.
        let on = load("[run]\nwrap_up = true\n", POLICY);
        assert_eq!(on.model.wrap_up.as_ref().map(|w| w.0), Some(true));
        assert!(ignored(&on).is_empty());
    }

    #[test]
    fn a_project_file_cannot_change_a_unit_the_policy_does_not_fix() {
        let loaded = load("[codex]\nmax_steps_unit = \"item\"\n", POLICY);
        assert!(!loaded.model.providers["codex"].contains_key("max_steps_unit"));
        assert_eq!(
            ignored(&loaded),
            ["codex.max_steps_unit: unit \"item\" (instead of the provider's default unit)"]
        );
        // The user's unit stands; the same unit in the project changes nothing.
        let user = format!("{POLICY}[codex]\nmax_steps_unit = \"tool\"\n");
        let loaded = load("[codex]\nmax_steps_unit = \"item\"\n", &user);
        assert_eq!(
            loaded.model.providers["codex"]["max_steps_unit"].0,
            serde_json::json!("tool")
        );
        let same = load("[codex]\nmax_steps_unit = \"tool\"\n", &user);
        assert!(ignored(&same).is_empty());
        // Without a policy the project chooses.
        let free = load("[codex]\nmax_steps_unit = \"item\"\n", "");
        assert_eq!(
            free.model.providers["codex"]["max_steps_unit"].0,
            serde_json::json!("item")
        );
        // A unit fixed by the policy is refused by validate, as before.
        let fixed = load(
            "[codex]\nmax_steps_unit = \"item\"\n",
            "[policy.codex]\nmax_steps_unit = \"tool\"\n",
        );
        assert!(ignored(&fixed).is_empty());
        assert!(
            crate::validate(&fixed, false)
                .iter()
                .any(|d| d.severity == Severity::Error && d.message.contains("fixed by policy"))
        );
    }

    #[test]
    fn a_project_file_cannot_raise_or_turn_off_a_loop_limit_under_a_policy() {
        let project = "[loops]\nlimit = \"off\"\n[task_types.review]\nloop_limit = 9\n\
                       [profiles.strict]\nloop_limit = 4\n[profiles.mine]\nloop_limit = 6\n";
        let loaded = load(project, POLICY);
        let loops = &loaded.model.loops;
        assert_eq!(loops.limit, None);
        assert!(loops.task_types.is_empty());
        assert!(loops.profiles.is_empty());
        assert_eq!(
            ignored(&loaded),
            [
                "loops.limit: a loop limit of off",
                "task_types.review.loop_limit: a loop limit of 9",
                "profiles.mine.loop_limit: a loop limit of 6",
                "profiles.strict.loop_limit: a loop limit of 4",
            ]
        );
        // Limits at or below those of the user's file and the defaults stand.
        let user = format!("{POLICY}[loops]\nlimit = 8\n");
        let tight = "[loops]\nlimit = 3\n[task_types.review]\nloop_limit = 8\n\
                     [profiles.yolo]\nloop_limit = 8\n";
        let loaded = load(tight, &user);
        assert!(ignored(&loaded).is_empty(), "{:?}", ignored(&loaded));
        assert_eq!(loaded.model.loops.limit.as_ref().unwrap().0.get(), Some(3));
        assert_eq!(loaded.model.loops.task_types.len(), 1);
        // Without a policy, anything goes.
        let free = load(project, "");
        assert_eq!(free.model.loops.task_types.len(), 1);
        assert_eq!(free.model.loops.profiles.len(), 2);
    }

    #[test]
    fn a_project_file_cannot_raise_the_loop_limit_by_selecting_a_profile_under_a_policy() {
        // yolo's built-in limit is 8, above the default 5: selecting it is loosening.
        let loaded = load("profile = \"yolo\"\n", POLICY);
        assert_eq!(
            ignored(&loaded),
            ["profile: profile yolo's loop limit of 8"]
        );
        let held = &loaded.model.loops.profiles["yolo"].0;
        assert_eq!(held.get(), Some(super::DEFAULT_LOOP_LIMIT));
        assert_eq!(
            loaded.model.profile.as_ref().map(|p| p.0.as_str()),
            Some("yolo")
        );
        // A profile no looser than the limit below stands as it is.
        let loaded = load("profile = \"strict\"\n", POLICY);
        assert!(ignored(&loaded).is_empty(), "{:?}", ignored(&loaded));
        let user = format!("{POLICY}[loops]\nlimit = 8\n");
        let loaded = load("profile = \"yolo\"\n", &user);
        assert!(ignored(&loaded).is_empty(), "{:?}", ignored(&loaded));
        // Without a policy, anything goes.
        let free = load("profile = \"yolo\"\n", "");
        assert!(free.model.loops.profiles.is_empty());
    }

    #[test]
    fn a_project_file_cannot_narrow_the_window_or_exempt_tools_under_a_policy() {
        let project = "[loops]\nwindow = 10\nignore_tools = [\"Bash\", \"Read\"]\n";
        let loaded = load(project, POLICY);
        assert_eq!(loaded.model.loops.window, None);
        assert_eq!(loaded.model.loops.ignore_tools, None);
        assert_eq!(
            ignored(&loaded),
            [
                "loops.window: a window of 10 calls (below 20)",
                "loops.ignore_tools: exempting Bash, Read from loop detection",
            ]
        );
        // A wider window and the tools the user already exempts stand.
        let user = format!("{POLICY}[loops]\nignore_tools = [\"Read\", \"Bash\"]\n");
        let wide = "[loops]\nwindow = 30\nignore_tools = [\"Bash\"]\n";
        let loaded = load(wide, &user);
        assert!(ignored(&loaded).is_empty());
        assert_eq!(loaded.model.loops.window.as_ref().map(|w| w.0), Some(30));
        assert_eq!(
            loaded.model.loops.ignore_tools.as_ref().unwrap().0,
            ["Bash"]
        );
    }

    #[test]
    fn a_policy_from_any_policy_bearing_file_is_in_force() {
        let loaded = merge(vec![
            parse_file(
                PROJECT,
                "[run]\nunrecognized_stream = \"warn\"\n",
                FileRole::Project,
            )
            .unwrap(),
            parse_file(
                "/ci/policy.toml",
                "[policy]\nmax_tokens_ceiling = 1000\n",
                FileRole::PolicyOnly,
            )
            .unwrap(),
        ]);
        assert_eq!(loaded.model.unrecognized_stream, None);
        let d = loaded.diagnostics().next().unwrap();
        assert!(
            d.message
                .contains("(/ci/policy.toml: policy.max_tokens_ceiling)"),
            "{d}"
        );
        // A project file's own [policy] is no policy.
        let own = merge(vec![
            parse_file(
                PROJECT,
                "[run]\nunrecognized_stream = \"warn\"\n[policy]\nmax_steps_ceiling = 5\n",
                FileRole::Project,
            )
            .unwrap(),
        ]);
        assert_eq!(own.model.unrecognized_stream.clone().unwrap().0, "warn");
    }
}

#[cfg(test)]
mod lock_tests {
    use crate::loop_settings::{LoopRequest, resolve};
    use crate::{FileRole, LoadedConfig, Lock, LoopLimit, Setting, merge, parse_file};
    use crate::{Origin, Severity};

    const USER: &str = "/home/u/.config/stepguard/stepguard.toml";
    const SYSTEM: &str = "/etc/stepguard/stepguard.toml";

    fn load(user: &str, system: &str) -> LoadedConfig {
        merge(vec![
            parse_file(USER, user, FileRole::User).unwrap(),
            parse_file(SYSTEM, system, FileRole::System).unwrap(),
        ])
    }

    fn warnings(loaded: &LoadedConfig) -> Vec<String> {
        loaded.diagnostics().map(ToString::to_string).collect()
    }

    #[test]
    fn locked_names_are_read_and_bad_ones_are_errors_naming_the_key() {
        let loaded = load("", "[policy]\nlocked = [\"loops\", \"preflight\"]\n");
        let locked: Vec<Lock> = loaded.model.policy.locked.keys().copied().collect();
        assert_eq!(locked, [Lock::Loops, Lock::Preflight]);
        assert_eq!(
            loaded
                .model
                .policy
                .locks(Lock::Loops)
                .map(ToString::to_string),
            Some(format!("{SYSTEM}: policy.locked"))
        );
        let bad = load(
            "[policy]\nlocked = [\"loop\", 3]\n",
            "[policy]\nlocked = \"all\"\n",
        );
        assert_eq!(
            warnings(&bad),
            [
                format!(
                    "error: {USER}: policy.locked: unknown setting `loop`: expected an array of \
                     setting names (unrecognized_stream, wrap_up, loops, native_limit, \
                     preflight, containment); did you mean `loops`?"
                ),
                format!(
                    "error: {USER}: policy.locked: expected an array of setting names \
                     (unrecognized_stream, wrap_up, loops, native_limit, preflight, \
                     containment), found an integer"
                ),
                format!(
                    "error: {SYSTEM}: policy.locked: expected an array of setting names \
                     (unrecognized_stream, wrap_up, loops, native_limit, preflight, \
                     containment), found a string"
                ),
            ]
        );
        assert!(bad.diagnostics().all(|d| d.severity == Severity::Error));
    }

    #[test]
    fn a_lock_forbids_the_users_file_to_loosen_what_a_policy_only_allows_the_user() {
        // Unlocked, the user's file may loosen everything under a policy.
        let user = "[run]\nunrecognized_stream = \"warn\"\nwrap_up = false\n\
                    [loops]\nlimit = \"off\"\nwindow = 5\nignore_tools = [\"Bash\"]\n";
        let system = "[run]\nwrap_up = true\n[policy]\nmax_steps_ceiling = 50\n";
        let free = load(user, system);
        assert!(warnings(&free).is_empty(), "{:?}", warnings(&free));
        assert_eq!(
            free.model.loops.limit.as_ref().map(|l| l.0),
            Some(LoopLimit::Off)
        );
        // Locked, none of it counts, and each says why.
        let locked =
            format!("{system}locked = [\"unrecognized_stream\", \"wrap_up\", \"loops\"]\n");
        let loaded = load(user, &locked);
        let m = &loaded.model;
        assert_eq!(m.unrecognized_stream, None);
        assert_eq!(m.wrap_up.as_ref().map(|w| w.0), Some(true));
        assert_eq!(
            (&m.loops.limit, &m.loops.window, &m.loops.ignore_tools),
            (&None, &None, &None)
        );
        let keys: Vec<&str> = loaded
            .diagnostics()
            .filter_map(|d| d.key.as_deref())
            .collect();
        assert_eq!(
            keys,
            [
                "run.unrecognized_stream",
                "run.wrap_up",
                "loops.limit",
                "loops.window",
                "loops.ignore_tools"
            ]
        );
        assert_eq!(
            warnings(&loaded)[0],
            format!(
                "warning: {USER}: run.unrecognized_stream: \"warn\" would loosen enforcement \
                 while a policy is in force ({SYSTEM}: policy.locked); ignored: the policy \
                 locks it"
            )
        );
        // The system file's own loosening of a locked setting is refused too.
        let own = load("", "[policy]\nlocked = [\"loops\"]\n[loops]\nlimit = 9\n");
        assert_eq!(own.model.loops.limit, None);
        // Tightening is always allowed.
        let tight = load("[loops]\nlimit = 3\nwindow = 40\n", &locked);
        assert!(warnings(&tight).is_empty());
        assert_eq!(
            tight.model.loops.limit.as_ref().map(|l| l.0),
            Some(LoopLimit::Limited(3))
        );
    }

    #[test]
    fn a_loops_lock_bounds_flags_environment_and_profiles_at_the_default() {
        let loaded = load("", "[policy]\nlocked = [\"loops\"]\n");
        let flag = Setting::text("off", Origin::Flag("--loop-limit".into()));
        let env = Setting::text("12", Origin::Env("STEPGUARD_LOOP_LIMIT".into()));
        let yolo = ("yolo".to_owned(), Origin::Flag("--profile".into()));
        for request in [
            LoopRequest {
                flag: Some(flag),
                ..LoopRequest::new(&loaded.model)
            },
            LoopRequest {
                env: Some(env),
                ..LoopRequest::new(&loaded.model)
            },
            LoopRequest {
                profile: Some(yolo),
                ..LoopRequest::new(&loaded.model)
            },
        ] {
            let r = resolve(&request).unwrap();
            assert_eq!(r.limit, LoopLimit::Limited(5));
            assert_eq!(r.source, format!("policy locked ({SYSTEM})"));
        }
        // A lower limit is untouched.
        let flag = Setting::text("3", Origin::Flag("--loop-limit".into()));
        let r = resolve(&LoopRequest {
            flag: Some(flag),
            ..LoopRequest::new(&loaded.model)
        })
        .unwrap();
        assert_eq!(
            (r.limit, r.source.as_str()),
            (LoopLimit::Limited(3), "--loop-limit")
        );
        // Without the lock, the flag decides.
        let free = load("", "[policy]\nmax_steps_ceiling = 9\n");
        let flag = Setting::text("off", Origin::Flag("--loop-limit".into()));
        let r = resolve(&LoopRequest {
            flag: Some(flag),
            ..LoopRequest::new(&free.model)
        })
        .unwrap();
        assert_eq!(r.limit, LoopLimit::Off);
    }
}
