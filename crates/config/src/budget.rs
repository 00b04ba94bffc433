//! The step budget on the ladder: how `max_steps` (and the legacy `max_turns`) values are
//! validated, and the levels a run's budget is resolved from ([`resolve`]).
//!
//! Precedence, highest first (a level's `max_steps` spelling beats its legacy `max_turns` one):
//!
//! 1. the command line: `--max-steps`, else the legacy `--max-turns`;
//! 2. the environment: `STEPGUARD_MAX_STEPS`, else the legacy `STEPGUARD_MAX_TURNS`;
//! 3. `task_types.T.max_steps`;
//! 4. global `max_steps` (`defaults.max_steps` is the same level);
//! 5. `task_types.T.max_turns`;
//! 6. global `max_turns` (`defaults.max_turns` is the same level);
//! 7. the selected profile's budget, else the default, [`DEFAULT_MAX_STEPS`].
//!
//! When a profile is selected and a budget is also set explicitly (levels 1–6), the explicit
//! budget is an upper bound: the effective budget is `min(explicit, profile)`.
//!
//! A policy ceiling ([`PolicySettings::max_steps_ceiling`], from a file the repository cannot
//! edit) bounds the result of all of the above, `unlimited` included: the effective budget is
//! `min(resolved, ceiling)`, and when the ceiling lowers it, the source names the policy.
//! The walk itself is the shared ladder's ([`crate::ladder`]).
//!
//! Resolution also warns, naming where each value was set, when a legacy `max_turns` decides
//! the budget (deprecated), when one is ignored because a `max_steps` of higher precedence
//! applies (both spellings at one level, or a task type's `max_turns` under the global
//! `max_steps`), and when the task type has no `[task_types.T]` table.
//!
//! [`PolicySettings::max_steps_ceiling`]: crate::PolicySettings::max_steps_ceiling

use std::fmt;

use serde::Serialize;
use stepguard_core::StepLimit;
use stepguard_core::budget::{BUILTIN_PROFILES, DEFAULT_MAX_STEPS, MAX_STEPS_CEILING};

use crate::ladder::{self, Candidate, Levels, Limit, ProfileLevel};
use crate::model::{Ceiling, ConfigModel, LevelSettings};
use crate::value::{InvalidValue, LimitError, LimitName, Origin, RawValue, Setting};

/// The exact deprecation text emitted when a legacy `max_turns` setting decides the budget.
pub const MAX_TURNS_DEPRECATION: &str = "`max_turns` is deprecated; use `max_steps`.";

/// What a step budget accepts, for messages.
const STEPS_EXPECTED: &str = "a whole number from 1 to 100000, or \"unlimited\"";
/// What a step ceiling accepts, for messages.
const STEPS_CEILING_EXPECTED: &str = "a whole number from 1 to 100000";
/// [`MAX_STEPS_CEILING`] as text, for messages.
const MAX_STEPS_TEXT: &str = "100000";

/// The step budget as a limit of the ladder.
#[derive(Clone, Copy, Debug)]
pub struct Steps;

impl Limit for Steps {
    type Value = StepLimit;
    const NAME: LimitName = LimitName::Steps;
    const CEILING_KEY: &'static str = "max_steps_ceiling";

    fn parse(raw: &RawValue) -> Result<StepLimit, InvalidValue> {
        parse_max_steps(raw)
    }

    fn tighter(a: StepLimit, b: StepLimit) -> StepLimit {
        a.min(b)
    }

    fn describe(value: StepLimit) -> String {
        format!("{value} steps")
    }

    fn show_ceiling(value: StepLimit) -> String {
        value.to_string()
    }

    fn check_ceiling(value: StepLimit) -> Result<(), InvalidValue> {
        match value {
            StepLimit::Limited(n) if (1..=MAX_STEPS_CEILING).contains(&n) => Ok(()),
            other => Err(InvalidValue::InvalidCeiling {
                value: other.to_string(),
                expected: STEPS_CEILING_EXPECTED,
            }),
        }
    }
}

/// Validates a raw step budget from any source (flag, env, file): a whole number from 1 to
/// [`MAX_STEPS_CEILING`], or `unlimited`.
pub fn parse_max_steps(raw: &RawValue) -> Result<StepLimit, InvalidValue> {
    match raw {
        RawValue::Integer(n) => steps_from_integer(*n),
        RawValue::Text(s) => {
            let t = s.trim();
            if t.eq_ignore_ascii_case("unlimited") {
                return Ok(StepLimit::Unlimited);
            }
            match t.parse::<i64>() {
                Ok(n) => steps_from_integer(n),
                Err(_) if t.parse::<f64>().is_ok() => Err(InvalidValue::Fractional {
                    value: format!("{s:?}"),
                }),
                Err(_) => Err(InvalidValue::NotANumber {
                    value: format!("{s:?}"),
                    expected: STEPS_EXPECTED,
                }),
            }
        }
        RawValue::Float(f) => Err(InvalidValue::Fractional {
            value: format!("{:?}", f.to_string()),
        }),
        RawValue::Other(kind) => Err(InvalidValue::WrongType {
            found: kind.clone(),
            expected: "a whole number or \"unlimited\"",
        }),
    }
}

fn steps_from_integer(n: i64) -> Result<StepLimit, InvalidValue> {
    let value = n.to_string();
    let expected = STEPS_EXPECTED;
    if n < 0 {
        Err(InvalidValue::Negative { value, expected })
    } else if n == 0 {
        Err(InvalidValue::Zero { value, expected })
    } else if n > i64::from(MAX_STEPS_CEILING) {
        Err(InvalidValue::AboveCeiling {
            value,
            max: MAX_STEPS_TEXT,
        })
    } else {
        // In range 1..=MAX_STEPS_CEILING, so the conversion cannot fail.
        Ok(StepLimit::Limited(
            u32::try_from(n).unwrap_or(MAX_STEPS_CEILING),
        ))
    }
}

/// Validates a raw `policy.max_steps_ceiling`: a whole number from 1 to [`MAX_STEPS_CEILING`]
/// (`unlimited` is refused: it would bound nothing).
pub fn parse_ceiling(setting: &Setting) -> Result<Ceiling, LimitError> {
    match parse_max_steps(&setting.value) {
        Ok(StepLimit::Limited(n)) => Ok(Ceiling {
            max_steps: n,
            origin: setting.origin.clone(),
        }),
        _ => Err(LimitError::invalid(
            LimitName::Steps,
            &setting.origin,
            InvalidValue::InvalidCeiling {
                value: setting.value.shown(),
                expected: STEPS_CEILING_EXPECTED,
            },
        )),
    }
}

/// The inputs of one budget resolution: flags, env and the merged config, plus the run's scope.
#[derive(Clone, Debug)]
pub struct BudgetRequest<'a> {
    /// `--max-steps` / `--max-turns` from the command line.
    pub flags: LevelSettings,
    /// `STEPGUARD_MAX_STEPS` / `STEPGUARD_MAX_TURNS` from the environment.
    pub env: LevelSettings,
    /// `--profile` (or `STEPGUARD_PROFILE`), which beats the config's `profile`.
    pub profile: Option<(String, Origin)>,
    /// The task type of the run, if any.
    pub task_type: Option<&'a str>,
    /// The merged config files.
    pub config: &'a ConfigModel,
}

impl<'a> BudgetRequest<'a> {
    /// Creates a request with no flags, env, profile or task type over `config`.
    pub fn new(config: &'a ConfigModel) -> Self {
        BudgetRequest {
            flags: LevelSettings::default(),
            env: LevelSettings::default(),
            profile: None,
            task_type: None,
            config,
        }
    }

    /// Returns the task type's `[task_types.T]` settings (empty when there is none).
    fn task_level(&self) -> &'a LevelSettings {
        static EMPTY: LevelSettings = LevelSettings {
            max_steps: None,
            max_turns: None,
            max_tokens: None,
            max_cost_usd: None,
        };
        self.task_type
            .and_then(|t| self.config.task_types.get(t))
            .unwrap_or(&EMPTY)
    }
}

/// The effective budget of a run and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResolvedBudget {
    /// The effective limit (`null` in JSON when unlimited).
    pub max_steps: StepLimit,
    /// Short label of the deciding source: `--max-steps`, `env STEPGUARD_MAX_STEPS`,
    /// `task_types.review.max_steps`, `profile strict`, `default`, …
    pub source: String,
    /// The config file that decided, when it was a file.
    pub source_file: Option<String>,
    /// The selected profile, if any.
    pub profile: Option<String>,
    /// The explicit budget that the profile's budget lowered, when it did (an explicit budget at
    /// or under the profile's is not bounded by it, and this is `None`).
    pub explicit_max_steps: Option<StepLimit>,
    /// The budget before the policy ceiling lowered it, when it did.
    pub uncapped_max_steps: Option<StepLimit>,
    /// Warnings for the user (deprecations, budgets the policy lowered), each naming its origin.
    pub warnings: Vec<String>,
}

/// Returns the built-in budget of a profile, if `name` is one.
pub fn builtin_profile(name: &str) -> Option<u32> {
    stepguard_core::budget::builtin_profile(name)
}

/// Which explicit levels are the legacy `max_turns` spelling, in [`explicit_levels`]' order.
const LEGACY: [bool; 8] = [false, true, false, true, false, false, true, true];

/// Returns the explicit levels of the step budget, highest first (see the module docs).
fn explicit_levels<'b>(req: &'b BudgetRequest<'_>) -> Vec<Option<Candidate<'b, StepLimit>>> {
    let task = req.task_level();
    let global = &req.config.global;
    [
        &req.flags.max_steps,
        &req.flags.max_turns,
        &req.env.max_steps,
        &req.env.max_turns,
        &task.max_steps,
        &global.max_steps,
        &task.max_turns,
        &global.max_turns,
    ]
    .into_iter()
    .map(|setting| Candidate::raw(setting.as_ref()))
    .collect()
}

/// Resolves the effective budget of a run.
///
/// Every candidate relevant to the run is validated, not only the winner, so a typo in a lower
/// level never lies in wait until the level above it is removed.
pub fn resolve(req: &BudgetRequest<'_>) -> Result<ResolvedBudget, LimitError> {
    let explicit = explicit_levels(req);
    // Bad values are reported before an unknown profile, as a user reads the command line.
    for candidate in explicit.iter().flatten() {
        if let Candidate::Raw(setting) = candidate {
            ladder::validate::<Steps>(setting)?;
        }
    }
    let selected = req.profile.as_ref().or(req.config.profile.as_ref());
    let profile = match selected {
        Some((name, origin)) => profile_level(name, origin, req.config)?,
        None => None,
    };
    let ceiling = req.config.policy.max_steps_ceiling.as_ref();
    let resolved = ladder::resolve::<Steps>(&Levels {
        explicit: explicit.clone(),
        profile,
        default: StepLimit::Limited(DEFAULT_MAX_STEPS),
        ceiling: ceiling.map(|c| (StepLimit::Limited(c.max_steps), &c.origin)),
    })?;

    let mut warnings = Vec::new();
    if let Some(name) = req.task_type
        && !req.config.task_types.contains_key(name)
    {
        warnings.push(unknown_task_type(name, req.config));
    }
    if let Some(level) = resolved.explicit_level
        && LEGACY[level]
        && let Some(Some(Candidate::Raw(setting))) = explicit.get(level)
    {
        warnings.push(format!("{}: {MAX_TURNS_DEPRECATION}", setting.origin));
    }
    warnings.extend(shadowed_legacy(req).iter().map(ToString::to_string));
    warnings.extend(resolved.warnings);
    Ok(ResolvedBudget {
        max_steps: resolved.value,
        source: resolved.source,
        source_file: resolved.source_file,
        profile: selected.map(|(name, _)| name.clone()),
        explicit_max_steps: resolved.explicit,
        uncapped_max_steps: resolved.uncapped,
        warnings,
    })
}

/// Returns the step budget level of the selected profile `name`: its `[profiles.NAME]
/// max_steps`, else the built-in profile's budget; `None` for a profile of the config files
/// that sets no step budget (only a token, cost or loop limit), which bounds no steps. A profile
/// defined nowhere is an error listing the known ones.
fn profile_level<'b>(
    name: &'b str,
    origin: &Origin,
    config: &'b ConfigModel,
) -> Result<Option<ProfileLevel<'b, StepLimit>>, LimitError> {
    if let Some(setting) = config.profiles.get(name).and_then(|p| p.max_steps.as_ref()) {
        return Ok(Some(ProfileLevel::Set(Candidate::Raw(setting))));
    }
    match builtin_profile(name) {
        Some(budget) => Ok(Some(ProfileLevel::Builtin {
            name,
            value: StepLimit::Limited(budget),
        })),
        None if config.profiles.contains_key(name) => Ok(None),
        None => {
            let mut known: Vec<&str> = BUILTIN_PROFILES.iter().map(|(n, _)| *n).collect();
            known.extend(config.profiles.keys().map(String::as_str));
            known.sort_unstable();
            known.dedup();
            Err(LimitError::UnknownProfile {
                name: name.to_owned(),
                origin: origin.clone(),
                known: known.join(", "),
            })
        }
    }
}

/// Returns the warning for a task type that no `[task_types.*]` table defines: the budget is
/// resolved as if none were given, which is worth saying since a typo looks the same.
fn unknown_task_type(name: &str, config: &ConfigModel) -> String {
    let known = if config.task_types.is_empty() {
        "none are configured".to_owned()
    } else {
        let names: Vec<&str> = config.task_types.keys().map(String::as_str).collect();
        format!("known task types: {}", names.join(", "))
    };
    format!(
        "unknown task type `{name}`: no [task_types.{name}] in the config files in effect \
         ({known}); its budget is resolved without one"
    )
}
/// A legacy `max_turns` that a `max_steps` of higher precedence makes dead.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowedLegacy {
    /// The ignored `max_turns` setting.
    pub legacy: Setting,
    /// The `max_steps` setting that takes precedence over it.
    pub winner: Setting,
    /// How the winner's level reads after it: ` (global)`, `` (task type `review`)`` or empty.
    winner_scope: String,
    /// What to do: rename the legacy key (when that would apply it) or remove it.
    advice: String,
}

impl ShadowedLegacy {
    /// Returns why the legacy setting is ignored and what to do, without naming it, e.g.
    /// ``ignored: `max_steps = 40` in /p/stepguard.toml (global) takes precedence; remove it``.
    pub fn reason(&self) -> String {
        format!(
            "ignored: {}{} takes precedence; {}",
            describe(&self.winner),
            self.winner_scope,
            self.advice
        )
    }
}

impl fmt::Display for ShadowedLegacy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {}", describe(&self.legacy), self.reason())
    }
}

/// Returns each legacy `max_turns` relevant to the request that a `max_steps` of higher
/// precedence makes dead: at the same level (both spellings set) or, for the task type's
/// `max_turns`, the global `max_steps` (level 4 beats level 5, which surprises whoever wrote the
/// more specific table).
///
/// A task type's `max_steps` beating the global `max_turns` is the ordinary specific-over-general
/// rule and is not reported; neither is a shadowed value equal to the winner, since nothing is
/// lost. [`resolve`] warns about each; `validate` uses it to say why a `max_turns` is unused.
pub fn shadowed_legacy(req: &BudgetRequest<'_>) -> Vec<ShadowedLegacy> {
    let task = req.task_level();
    let global = &req.config.global;
    let task_scope = format!(" (task type `{}`)", req.task_type.unwrap_or_default());
    // (legacy, the max_steps that beats it, how to name the winner's level).
    let (task_winner, task_winner_scope) = match &task.max_steps {
        Some(_) => (&task.max_steps, task_scope.as_str()),
        None => (&global.max_steps, " (global)"),
    };
    let pairs = [
        (&req.flags.max_turns, &req.flags.max_steps, ""),
        (&req.env.max_turns, &req.env.max_steps, ""),
        (&task.max_turns, task_winner, task_winner_scope),
        (&global.max_turns, &global.max_steps, " (global)"),
    ];
    let mut out = Vec::new();
    for (legacy, winner, scope) in pairs {
        let (Some(legacy), Some(winner)) = (legacy, winner) else {
            continue;
        };
        if parse_max_steps(&legacy.value).ok() == parse_max_steps(&winner.value).ok() {
            continue;
        }
        let advice = match &legacy.origin {
            // A task type's legacy budget under the global `max_steps`: renaming it applies it.
            Origin::File { key, .. }
                if key.starts_with("task_types.") && task.max_steps.is_none() =>
            {
                format!(
                    "rename it to `{}max_steps` to apply it",
                    key.trim_end_matches("max_turns")
                )
            }
            _ => "remove it".to_owned(),
        };
        out.push(ShadowedLegacy {
            legacy: legacy.clone(),
            winner: winner.clone(),
            winner_scope: scope.to_owned(),
            advice,
        });
    }
    out
}

/// Describes a setting as the user wrote it: `` `max_steps = 40` in FILE ``, `` `--max-steps 5` ``,
/// `` `STEPGUARD_MAX_STEPS=5` ``.
fn describe(setting: &Setting) -> String {
    let text = match &setting.value {
        RawValue::Text(s) if !matches!(setting.origin, Origin::File { .. }) => s.clone(),
        other => other.shown(),
    };
    match &setting.origin {
        Origin::Flag(flag) => format!("`{flag} {text}`"),
        Origin::Env(var) => format!("`{var}={text}`"),
        Origin::File { path, key } => format!("`{key} = {text}` in {path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProfileSettings;

    #[test]
    fn a_profile_that_sets_no_step_budget_bounds_no_steps() {
        let mut config = ConfigModel::default();
        config.profiles.insert(
            "cheap".into(),
            ProfileSettings {
                max_tokens: int(1000, file("profiles.cheap.max_tokens")),
                ..Default::default()
            },
        );
        let req = BudgetRequest {
            flags: LevelSettings::default(),
            env: LevelSettings::default(),
            profile: Some(("cheap".into(), Origin::Flag("--profile".into()))),
            task_type: None,
            config: &config,
        };
        let r = resolve(&req).unwrap();
        assert_eq!(r.max_steps, StepLimit::Limited(DEFAULT_MAX_STEPS));
        assert_eq!(
            (r.source.as_str(), r.profile.as_deref()),
            ("default", Some("cheap"))
        );
        // A profile nobody defined is still an error.
        let req = BudgetRequest {
            profile: Some(("nope".into(), Origin::Flag("--profile".into()))),
            ..req
        };
        assert!(matches!(
            resolve(&req),
            Err(LimitError::UnknownProfile { .. })
        ));
    }

    fn file(key: &str) -> Origin {
        Origin::File {
            path: "/p/stepguard.toml".into(),
            key: key.into(),
        }
    }

    fn int(n: i64, origin: Origin) -> Option<Setting> {
        Some(Setting {
            value: RawValue::Integer(n),
            origin,
        })
    }

    /// Builds a request where precedence level `i` (0-based, 8 levels) is set to `100 + i`.
    fn with_levels(levels: &[usize]) -> (LevelSettings, LevelSettings, ConfigModel) {
        let mut flags = LevelSettings::default();
        let mut env = LevelSettings::default();
        let mut config = ConfigModel::default();
        let mut task = LevelSettings::default();
        for &i in levels {
            let v = 100 + i as i64;
            match i {
                0 => flags.max_steps = int(v, Origin::Flag("--max-steps".into())),
                1 => flags.max_turns = int(v, Origin::Flag("--max-turns".into())),
                2 => env.max_steps = int(v, Origin::Env("STEPGUARD_MAX_STEPS".into())),
                3 => env.max_turns = int(v, Origin::Env("STEPGUARD_MAX_TURNS".into())),
                4 => task.max_steps = int(v, file("task_types.review.max_steps")),
                5 => config.global.max_steps = int(v, file("max_steps")),
                6 => task.max_turns = int(v, file("task_types.review.max_turns")),
                7 => config.global.max_turns = int(v, file("defaults.max_turns")),
                _ => unreachable!(),
            }
        }
        config.task_types.insert("review".into(), task);
        (flags, env, config)
    }

    const LABELS: [&str; 8] = [
        "--max-steps",
        "--max-turns",
        "env STEPGUARD_MAX_STEPS",
        "env STEPGUARD_MAX_TURNS",
        "task_types.review.max_steps",
        "max_steps",
        "task_types.review.max_turns",
        "defaults.max_turns",
    ];

    fn run(levels: &[usize], task: Option<&str>) -> ResolvedBudget {
        let (flags, env, config) = with_levels(levels);
        resolve(&BudgetRequest {
            flags,
            env,
            profile: None,
            task_type: task,
            config: &config,
        })
        .unwrap()
    }

    #[test]
    fn every_pair_of_levels_resolves_to_the_higher_one() {
        for (hi, label) in LABELS.iter().enumerate() {
            for lo in hi + 1..LABELS.len() {
                let r = run(&[hi, lo], Some("review"));
                assert_eq!(
                    r.max_steps,
                    StepLimit::Limited(100 + hi as u32),
                    "{hi} vs {lo}"
                );
                assert_eq!(&r.source, label, "{hi} vs {lo}");
            }
        }
    }

    #[test]
    fn each_level_alone_is_used() {
        for (i, label) in LABELS.iter().enumerate() {
            let r = run(&[i], Some("review"));
            assert_eq!(r.max_steps, StepLimit::Limited(100 + i as u32));
            assert_eq!(&r.source, label);
        }
    }

    #[test]
    fn task_type_levels_apply_only_to_their_task_type() {
        let r = run(&[4, 5], Some("other"));
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(105), "max_steps")
        );
        let r = run(&[4, 6], None);
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(DEFAULT_MAX_STEPS), "default")
        );
    }

    #[test]
    fn nothing_set_gives_the_default() {
        let r = run(&[], None);
        assert_eq!(r.max_steps, StepLimit::Limited(50));
        assert_eq!(r.source, "default");
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn legacy_max_turns_warns_with_exact_text_naming_its_origin() {
        let cases = [
            (
                1,
                "--max-turns: `max_turns` is deprecated; use `max_steps`.",
            ),
            (
                3,
                "env STEPGUARD_MAX_TURNS: `max_turns` is deprecated; use `max_steps`.",
            ),
            (
                6,
                "/p/stepguard.toml: task_types.review.max_turns: `max_turns` is deprecated; use `max_steps`.",
            ),
            (
                7,
                "/p/stepguard.toml: defaults.max_turns: `max_turns` is deprecated; use `max_steps`.",
            ),
        ];
        for (level, text) in cases {
            assert_eq!(
                run(&[level], Some("review")).warnings,
                vec![text.to_owned()]
            );
        }
    }

    #[test]
    fn max_turns_shadowed_by_max_steps_warns_naming_both() {
        assert_eq!(
            run(&[0, 1], None).warnings,
            ["`--max-turns 101` is ignored: `--max-steps 100` takes precedence; remove it"]
        );
        assert_eq!(
            run(&[2, 3], None).warnings,
            [
                "`STEPGUARD_MAX_TURNS=103` is ignored: `STEPGUARD_MAX_STEPS=102` takes precedence; \
                 remove it"
            ]
        );
        assert_eq!(
            run(&[5, 7], None).warnings,
            [
                "`defaults.max_turns = 107` in /p/stepguard.toml is ignored: `max_steps = 105` in \
                 /p/stepguard.toml (global) takes precedence; remove it"
            ]
        );
        assert_eq!(
            run(&[4, 6], Some("review")).warnings,
            [
                "`task_types.review.max_turns = 106` in /p/stepguard.toml is ignored: \
                 `task_types.review.max_steps = 104` in /p/stepguard.toml (task type `review`) \
                 takes precedence; remove it"
            ]
        );
    }

    #[test]
    fn task_type_max_turns_under_the_global_max_steps_warns_how_to_apply_it() {
        let r = run(&[5, 6], Some("review"));
        assert_eq!(r.max_steps, StepLimit::Limited(105));
        assert_eq!(
            r.warnings,
            [
                "`task_types.review.max_turns = 106` in /p/stepguard.toml is ignored: \
                 `max_steps = 105` in /p/stepguard.toml (global) takes precedence; rename it to \
                 `task_types.review.max_steps` to apply it"
            ]
        );
        // Reported whatever decides the run, since the file is wrong either way.
        let r = run(&[0, 5, 6], Some("review"));
        assert_eq!(r.max_steps, StepLimit::Limited(100));
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        // Only for the task type in question.
        assert!(run(&[5, 6], None).warnings.is_empty());
    }

    #[test]
    fn shadowing_that_loses_nothing_or_is_specific_over_general_is_silent() {
        // A task type's max_steps beating the global max_turns is the ordinary override.
        assert!(run(&[4, 7], Some("review")).warnings.is_empty());
        // Both spellings with one value: nothing is ignored.
        let config = ConfigModel {
            global: LevelSettings {
                max_steps: int(40, file("max_steps")),
                max_turns: int(40, file("max_turns")),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = resolve(&BudgetRequest::new(&config)).unwrap();
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn unknown_task_type_warns_listing_the_known_ones_and_uses_the_budget_without_it() {
        let r = run(&[5], Some("revew"));
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(105), "max_steps")
        );
        assert_eq!(
            r.warnings,
            [
                "unknown task type `revew`: no [task_types.revew] in the config files in effect \
                 (known task types: review); its budget is resolved without one"
            ]
        );
        let config = ConfigModel::default();
        let r = resolve(&BudgetRequest {
            task_type: Some("ops"),
            ..BudgetRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.max_steps, StepLimit::Limited(DEFAULT_MAX_STEPS));
        assert!(
            r.warnings[0].contains("(none are configured)"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn warning_is_emitted_once_even_with_many_legacy_settings() {
        assert_eq!(run(&[1, 3, 6, 7], Some("review")).warnings.len(), 1);
    }

    fn with_profile(explicit: Option<i64>, profile: &str, config: ConfigModel) -> ResolvedBudget {
        let flags = LevelSettings {
            max_steps: explicit.and_then(|n| int(n, Origin::Flag("--max-steps".into()))),
            max_turns: None,
            ..Default::default()
        };
        resolve(&BudgetRequest {
            flags,
            env: LevelSettings::default(),
            profile: Some((profile.into(), Origin::Flag("--profile".into()))),
            task_type: None,
            config: &config,
        })
        .unwrap()
    }

    #[test]
    fn profile_is_the_default_when_nothing_else_is_set() {
        for &(name, budget) in BUILTIN_PROFILES {
            let r = with_profile(None, name, ConfigModel::default());
            assert_eq!(r.max_steps, StepLimit::Limited(budget));
            assert_eq!(r.source, format!("profile {name}"));
            assert_eq!(r.profile.as_deref(), Some(name));
        }
    }

    #[test]
    fn explicit_budget_is_an_upper_bound_on_the_profile() {
        // strict is 15: an explicit 10 tightens it, an explicit 40 cannot loosen it.
        let r = with_profile(Some(10), "strict", ConfigModel::default());
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(10), "--max-steps")
        );
        // The profile bounded nothing, so there is nothing to report about it.
        assert_eq!(r.explicit_max_steps, None);
        let r = with_profile(Some(15), "strict", ConfigModel::default());
        assert_eq!(r.explicit_max_steps, None);
        let r = with_profile(Some(40), "strict", ConfigModel::default());
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(15), "profile strict")
        );
        assert_eq!(r.explicit_max_steps, Some(StepLimit::Limited(40)));
    }

    #[test]
    fn configured_profile_budget_replaces_builtin_and_custom_profiles_work() {
        let mut config = ConfigModel::default();
        config.profiles.insert(
            "strict".into(),
            ProfileSettings {
                max_steps: int(8, file("profiles.strict.max_steps")),
                ..Default::default()
            },
        );
        config.profiles.insert(
            "nightly".into(),
            ProfileSettings {
                max_steps: int(400, file("profiles.nightly.max_steps")),
                ..Default::default()
            },
        );
        let r = with_profile(None, "strict", config.clone());
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(8), "profiles.strict.max_steps")
        );
        let r = with_profile(Some(300), "nightly", config);
        assert_eq!(r.max_steps, StepLimit::Limited(300));
    }

    #[test]
    fn unknown_profile_is_an_error_listing_known_ones() {
        let config = ConfigModel::default();
        let err = resolve(&BudgetRequest {
            profile: Some(("strcit".into(), Origin::Flag("--profile".into()))),
            ..BudgetRequest::new(&config)
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown profile `strcit` (from --profile); known profiles: fast, smoke, strict, yolo"
        );
    }

    #[test]
    fn unlimited_disables_the_budget_and_a_profile_still_bounds_it() {
        let config = ConfigModel::default();
        let flags = LevelSettings {
            max_steps: Some(Setting::text(
                "unlimited",
                Origin::Flag("--max-steps".into()),
            )),
            max_turns: None,
            ..Default::default()
        };
        let r = resolve(&BudgetRequest {
            flags: flags.clone(),
            ..BudgetRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.max_steps, StepLimit::Unlimited);
        let r = resolve(&BudgetRequest {
            flags,
            profile: Some(("smoke".into(), Origin::Flag("--profile".into()))),
            ..BudgetRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.max_steps, StepLimit::Limited(5));
    }

    #[test]
    fn profile_from_flag_beats_profile_from_config() {
        let config = ConfigModel {
            profile: Some(("yolo".into(), file("profile"))),
            ..Default::default()
        };
        let r = resolve(&BudgetRequest {
            profile: Some(("smoke".into(), Origin::Flag("--profile".into()))),
            ..BudgetRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.profile.as_deref(), Some("smoke"));
        let r = resolve(&BudgetRequest {
            ..BudgetRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_steps, r.profile.as_deref()),
            (StepLimit::Limited(250), Some("yolo"))
        );
    }

    #[test]
    fn every_invalid_value_is_an_error_naming_its_source() {
        let cases: Vec<(RawValue, &str)> = vec![
            (RawValue::Integer(0), "0 is not a valid budget"),
            (RawValue::Integer(-3), "-3 is negative"),
            (
                RawValue::Integer(100_001),
                "100001 is above the ceiling of 100000",
            ),
            (RawValue::Text("ten".into()), "\"ten\" is not a number"),
            (
                RawValue::Text("2.5".into()),
                "\"2.5\" is not a whole number",
            ),
            (RawValue::Text("-1".into()), "-1 is negative"),
            (RawValue::Text("0".into()), "0 is not a valid budget"),
            (RawValue::Float(3.0), "\"3\" is not a whole number"),
            (
                RawValue::Other("a boolean".into()),
                "expected a whole number or \"unlimited\", found a boolean",
            ),
        ];
        for (value, text) in cases {
            let config = ConfigModel {
                global: LevelSettings {
                    max_steps: Some(Setting {
                        value: value.clone(),
                        origin: file("max_steps"),
                    }),
                    max_turns: None,
                    ..Default::default()
                },
                ..Default::default()
            };
            let err = resolve(&BudgetRequest {
                ..BudgetRequest::new(&config)
            })
            .unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with("invalid budget at /p/stepguard.toml: max_steps: "),
                "{msg}"
            );
            assert!(msg.contains(text), "{msg} should contain {text}");
        }
    }

    #[test]
    fn invalid_lower_level_is_reported_even_when_shadowed() {
        let config = ConfigModel {
            global: LevelSettings {
                max_steps: int(0, file("max_steps")),
                max_turns: None,
                ..Default::default()
            },
            ..Default::default()
        };
        let flags = LevelSettings {
            max_steps: int(5, Origin::Flag("--max-steps".into())),
            max_turns: None,
            ..Default::default()
        };
        let err = resolve(&BudgetRequest {
            flags,
            ..BudgetRequest::new(&config)
        });
        assert!(matches!(err, Err(LimitError::InvalidValue { .. })));
    }

    #[test]
    fn limits_at_the_edges_are_accepted() {
        assert_eq!(
            parse_max_steps(&RawValue::Integer(1)),
            Ok(StepLimit::Limited(1))
        );
        assert_eq!(
            parse_max_steps(&RawValue::Integer(100_000)),
            Ok(StepLimit::Limited(100_000))
        );
        assert_eq!(
            parse_max_steps(&RawValue::Text(" 7 ".into())),
            Ok(StepLimit::Limited(7))
        );
        assert_eq!(
            parse_max_steps(&RawValue::Text("UNLIMITED".into())),
            Ok(StepLimit::Unlimited)
        );
    }

    fn policy_file(key: &str) -> Origin {
        Origin::File {
            path: "/etc/stepguard/stepguard.toml".into(),
            key: key.into(),
        }
    }

    fn with_ceiling(mut config: ConfigModel, ceiling: u32) -> ConfigModel {
        config.policy.max_steps_ceiling = Some(Ceiling {
            max_steps: ceiling,
            origin: policy_file("policy.max_steps_ceiling"),
        });
        config
    }

    const POLICY_SOURCE: &str = "policy max_steps_ceiling (/etc/stepguard/stepguard.toml)";

    #[test]
    fn ceiling_bounds_every_level_and_names_the_policy() {
        for (i, label) in LABELS.iter().enumerate() {
            let (flags, env, config) = with_levels(&[i]);
            let config = with_ceiling(config, 80);
            let r = resolve(&BudgetRequest {
                flags,
                env,
                profile: None,
                task_type: Some("review"),
                config: &config,
            })
            .unwrap();
            assert_eq!(r.max_steps, StepLimit::Limited(80), "{label}");
            assert_eq!(r.source, POLICY_SOURCE, "{label}");
            assert_eq!(
                r.source_file.as_deref(),
                Some("/etc/stepguard/stepguard.toml")
            );
            assert_eq!(
                r.uncapped_max_steps,
                Some(StepLimit::Limited(100 + i as u32))
            );
            let lowered = r
                .warnings
                .iter()
                .find(|w| w.contains("policy ceiling"))
                .unwrap_or_else(|| panic!("{label}: {:?}", r.warnings));
            assert_eq!(
                lowered,
                &format!(
                    "{} asks for {} steps, above the policy ceiling of 80 set in \
                     /etc/stepguard/stepguard.toml: policy.max_steps_ceiling; using 80",
                    if i < 4 {
                        (*label).to_owned()
                    } else {
                        format!("/p/stepguard.toml: {label}")
                    },
                    100 + i
                )
            );
        }
    }

    #[test]
    fn unlimited_becomes_the_ceiling() {
        let config = with_ceiling(ConfigModel::default(), 80);
        let flags = LevelSettings {
            max_steps: Some(Setting::text(
                "unlimited",
                Origin::Flag("--max-steps".into()),
            )),
            max_turns: None,
            ..Default::default()
        };
        let r = resolve(&BudgetRequest {
            flags,
            ..BudgetRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.max_steps, StepLimit::Limited(80));
        assert_eq!(r.uncapped_max_steps, Some(StepLimit::Unlimited));
        assert_eq!(
            r.warnings,
            [
                "--max-steps asks for unlimited steps, above the policy ceiling of 80 set in \
              /etc/stepguard/stepguard.toml: policy.max_steps_ceiling; using 80"
            ]
        );
    }

    #[test]
    fn budgets_under_the_ceiling_are_untouched() {
        let config = with_ceiling(ConfigModel::default(), 80);
        let r = with_profile(Some(10), "yolo", config.clone());
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(10), "--max-steps")
        );
        assert_eq!(r.uncapped_max_steps, None);
        assert!(r.warnings.is_empty());
        // Exactly at the ceiling is allowed and keeps its own source.
        let r = with_profile(Some(80), "yolo", config);
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(80), "--max-steps")
        );
    }

    #[test]
    fn ceiling_bounds_profiles_and_the_default_without_warning_for_the_default() {
        let r = with_profile(None, "yolo", with_ceiling(ConfigModel::default(), 80));
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(80), POLICY_SOURCE)
        );
        assert_eq!(r.profile.as_deref(), Some("yolo"));
        assert_eq!(
            r.warnings,
            [
                "profile yolo asks for 250 steps, above the policy ceiling of 80 set in \
              /etc/stepguard/stepguard.toml: policy.max_steps_ceiling; using 80"
            ]
        );
        let config = with_ceiling(ConfigModel::default(), 20);
        let r = resolve(&BudgetRequest::new(&config)).unwrap();
        assert_eq!(
            (r.max_steps, r.source.as_str()),
            (StepLimit::Limited(20), POLICY_SOURCE)
        );
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn deprecation_warning_is_kept_beside_the_ceiling_warning() {
        let (flags, env, config) = with_levels(&[1]);
        let config = with_ceiling(config, 50);
        let r = resolve(&BudgetRequest {
            flags,
            env,
            profile: None,
            task_type: None,
            config: &config,
        })
        .unwrap();
        assert_eq!(r.max_steps, StepLimit::Limited(50));
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(r.warnings[0].contains(MAX_TURNS_DEPRECATION));
    }

    #[test]
    fn ceiling_values_are_validated() {
        let setting = |value: RawValue| Setting {
            value,
            origin: policy_file("policy.max_steps_ceiling"),
        };
        assert_eq!(
            parse_ceiling(&setting(RawValue::Integer(80))).map(|c| c.max_steps),
            Ok(80)
        );
        for (value, text) in [
            (RawValue::Integer(0), "0 is not a valid ceiling"),
            (RawValue::Integer(100_001), "100001 is not a valid ceiling"),
            (
                RawValue::Text("unlimited".into()),
                "\"unlimited\" is not a valid ceiling",
            ),
            (RawValue::Float(2.5), "2.5 is not a valid ceiling"),
            (
                RawValue::Other("a boolean".into()),
                "a boolean is not a valid ceiling",
            ),
        ] {
            let err = parse_ceiling(&setting(value)).unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    "invalid budget at /etc/stepguard/stepguard.toml: policy.max_steps_ceiling: \
                     {text}; use a whole number from 1 to 100000"
                )
            );
        }
        // A model built by hand with an out-of-range ceiling is refused, not applied.
        let config = with_ceiling(ConfigModel::default(), 0);
        assert!(matches!(
            resolve(&BudgetRequest::new(&config)),
            Err(LimitError::InvalidValue { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn effective_budget_is_min_of_request_and_ceiling(
            asked in proptest::option::of(1u32..=MAX_STEPS_CEILING),
            ceiling in 1u32..=MAX_STEPS_CEILING,
        ) {
            let value = asked.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
            let config = with_ceiling(ConfigModel::default(), ceiling);
            let r = resolve(&BudgetRequest {
                flags: LevelSettings {
                    max_steps: Some(Setting::text(value, Origin::Flag("--max-steps".into()))),
                    max_turns: None,
                    ..Default::default()
                },
                ..BudgetRequest::new(&config)
            })
            .unwrap();
            let expected = asked.map_or(ceiling, |a| a.min(ceiling));
            proptest::prop_assert_eq!(r.max_steps, StepLimit::Limited(expected));
        }
    }
}
