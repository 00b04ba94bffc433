//! Loosening under a policy: while a policy is in force, a project file (the repository's own,
//! which the agent under it may edit) cannot turn off or loosen any enforcement. Only the user's
//! and the system's files can; a setting of a project file that would loosen what they (or the
//! defaults) say is left out of the model, with a warning naming the file, the key and the
//! policy.
//!
//! The settings a file can loosen, and what loosening each means:
//!
//! | setting | loosened by |
//! |---|---|
//! | `run.unrecognized_stream` | `"warn"` where the files below say `"stop"` (the default) |
//! | `run.wrap_up` | `false` where the files below say `true` |
//! | `P.max_steps_unit` | any unit other than the one the files below choose (stepguard cannot rank a provider's units; a unit the policy fixes is checked by `validate` instead) |
//! | `loops.limit` | a higher limit, or `"off"` |
//! | `task_types.T.loop_limit`, `profiles.NAME.loop_limit` | a limit higher than the one the files below give that task type or profile |
//! | `loops.window` | a smaller window |
//! | `loops.ignore_tools` | a tool the files below do not exempt |
//!
//! The native limits, the pre-flight check and the containment are chosen on the command line
//! only, so no file can loosen them.

use stepguard_core::loops::{DEFAULT_LOOP_LIMIT, LoopSettings};

use crate::loop_settings::builtin_profile_loop_limit;
use crate::model::{ConfigModel, PolicySettings};
use crate::value::{LoopLimit, Origin};
use crate::{Diagnostic, ParsedFile, Severity, UNIT_KEY, at};

/// Removes from `file` (a project file) every setting that would loosen what `below` (the user's
/// and system's files merged) says, adding a warning for each to the file's diagnostics.
pub(crate) fn strip(file: &mut ParsedFile, below: &ConfigModel, policy: &PolicySettings) {
    let Some(policy_origin) = policy.origin() else {
        return;
    };
    let mut ignored: Vec<(Origin, String)> = Vec::new();
    run_settings(&mut file.model, below, &mut ignored);
    units(&mut file.model, below, policy, &mut ignored);
    loop_limits(&mut file.model, below, &mut ignored);
    loop_scope(&mut file.model, below, &mut ignored);
    for (origin, what) in ignored {
        file.diagnostics
            .push(warning(&origin, &what, policy_origin));
    }
}

fn warning(origin: &Origin, what: &str, policy: &Origin) -> Diagnostic {
    at(
        Severity::Warning,
        origin,
        format!(
            "{what} would loosen enforcement while a policy is in force ({policy}); ignored. \
             Only the user's or the system's config file may loosen it"
        ),
    )
}

/// `run.unrecognized_stream = "warn"` and `run.wrap_up = false`.
fn run_settings(m: &mut ConfigModel, below: &ConfigModel, out: &mut Vec<(Origin, String)>) {
    let below_warns = below
        .unrecognized_stream
        .as_ref()
        .is_some_and(|(w, _)| w == "warn");
    if let Some((what, origin)) = &m.unrecognized_stream
        && what == "warn"
        && !below_warns
    {
        out.push((origin.clone(), "\"warn\"".to_owned()));
        m.unrecognized_stream = None;
    }
    let below_on = below.wrap_up.as_ref().is_some_and(|(on, _)| *on);
    if let Some((false, origin)) = &m.wrap_up
        && below_on
    {
        out.push((origin.clone(), "false".to_owned()));
        m.wrap_up = None;
    }
}

/// A provider's `max_steps_unit` other than the one below; a unit the policy fixes is left to
/// `validate`, which refuses any other.
fn units(
    m: &mut ConfigModel,
    below: &ConfigModel,
    policy: &PolicySettings,
    out: &mut Vec<(Origin, String)>,
) {
    for (provider, options) in &mut m.providers {
        if policy.units.contains_key(provider) {
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
            out.push((origin.clone(), format!("unit {unit} (instead of {chosen})")));
            options.remove(UNIT_KEY);
        }
    }
}

/// Returns true when `a` allows more than `b` (`off` allows the most).
fn looser(a: LoopLimit, b: LoopLimit) -> bool {
    a != b && a.min(b) == b
}

/// `loops.limit`, `task_types.T.loop_limit` and `profiles.NAME.loop_limit`.
fn loop_limits(m: &mut ConfigModel, below: &ConfigModel, out: &mut Vec<(Origin, String)>) {
    let default = LoopLimit::Limited(DEFAULT_LOOP_LIMIT);
    let below_limit = below.loops.limit.as_ref().map_or(default, |(l, _)| *l);
    if let Some((limit, origin)) = &m.loops.limit
        && looser(*limit, below_limit)
    {
        out.push((origin.clone(), format!("a loop limit of {limit}")));
        m.loops.limit = None;
    }
    m.loops.task_types.retain(|name, (limit, origin)| {
        let bound = below
            .loops
            .task_types
            .get(name)
            .map_or(below_limit, |l| l.0);
        let keep = !looser(*limit, bound);
        if !keep {
            out.push((origin.clone(), format!("a loop limit of {limit}")));
        }
        keep
    });
    m.loops.profiles.retain(|name, (limit, origin)| {
        let bound = match below.loops.profiles.get(name) {
            Some((l, _)) => *l,
            None => builtin_profile_loop_limit(name).map_or(default, LoopLimit::Limited),
        };
        let keep = !looser(*limit, bound);
        if !keep {
            out.push((origin.clone(), format!("a loop limit of {limit}")));
        }
        keep
    });
}

/// `loops.window` below the window below, and `loops.ignore_tools` exempting a tool not exempt
/// below.
fn loop_scope(m: &mut ConfigModel, below: &ConfigModel, out: &mut Vec<(Origin, String)>) {
    let below_window = below
        .loops
        .window
        .as_ref()
        .map_or(LoopSettings::DEFAULT_WINDOW, |(w, _)| *w);
    if let Some((window, origin)) = &m.loops.window
        && *window < below_window
    {
        out.push((
            origin.clone(),
            format!("a window of {window} calls (below {below_window})"),
        ));
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
        if !new.is_empty() {
            out.push((
                origin.clone(),
                format!("exempting {} from loop detection", new.join(", ")),
            ));
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
                 while a policy is in force ({USER}: policy.max_steps_ceiling); ignored. Only \
                 the user's or the system's config file may loosen it"
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
