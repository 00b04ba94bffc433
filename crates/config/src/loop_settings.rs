//! Loop settings: the loop limit, the window and the exempt tools, where each comes from, and the
//! precedence levels the limit is resolved from on the shared ladder ([`crate::ladder`]), as the
//! budget is ([`crate::budget`]).
//!
//! Precedence of the limit, highest first:
//!
//! 1. the command line: `--loop-limit`;
//! 2. the environment: `STEPGUARD_LOOP_LIMIT`;
//! 3. `task_types.T.loop_limit`;
//! 4. `loops.limit`;
//! 5. the selected profile's limit (`profiles.NAME.loop_limit`, else the built-in one,
//!    [`BUILTIN_PROFILE_LOOP_LIMITS`]), else the default, [`DEFAULT_LOOP_LIMIT`].
//!
//! As with budgets, when a profile is selected and a limit is also set explicitly (levels 1–4),
//! the explicit limit is an upper bound: the effective limit is `min(explicit, profile)`, `off`
//! being the loosest of all (so `--profile strict --loop-limit off` keeps strict's limit, as
//! `--profile strict --max-steps unlimited` keeps its budget). A profile whose limit is `off`
//! bounds nothing. A policy that locks `loops` (`[policy] locked = ["loops"]`) bounds the limit
//! at the default: no flag, variable, file or profile may raise it or turn it off.
//!
//! The window (`loops.window`) and the exempt tools (`loops.ignore_tools`) are set in config
//! files only, at one level. A window below the effective limit is widened to it, with a warning.
//!
//! Values from files are validated when the file is parsed, so [`resolve`]
//! sees only valid ones there; the flag and the environment are validated here.
//!
//! ```
//! use stepguard_config::{ConfigModel, LoopLimit};
//! use stepguard_config::loop_settings::{LoopRequest, resolve};
//!
//! let config = ConfigModel::default();
//! let r = resolve(&LoopRequest::new(&config)).unwrap();
//! assert_eq!((r.limit, r.source.as_str()), (LoopLimit::Limited(5), "default"));
//! assert_eq!(r.settings.map(|s| s.window), Some(20));
//! ```

use crate::ladder::{self, Candidate, Levels, Limit, ProfileLevel};
use crate::model::{ConfigModel, Lock};
use crate::value::{InvalidValue, LimitError, LimitName, LoopLimit, Origin, RawValue, Setting};
use stepguard_core::loops::{DEFAULT_LOOP_LIMIT, LoopSettings};

/// The largest loop limit or window accepted; anything above is almost certainly a typo (say
/// `off` for no loop detection instead).
pub const MAX_LOOP_SETTING: u32 = 1000;

/// The built-in profiles' loop limits (the profiles of [`stepguard_core::budget::BUILTIN_PROFILES`]).
///
/// * `smoke` (3) and `strict` (3): small runs in which the same call three times is already a
///   loop, not a retry;
/// * `fast` (4): one fewer than the default, like its budget, stopped well before a runaway;
/// * `yolo` (8): long autonomous runs re-run the same test or build command legitimately, so
///   it tolerates more, but still has a limit.
pub const BUILTIN_PROFILE_LOOP_LIMITS: &[(&str, u32)] =
    &[("smoke", 3), ("strict", 3), ("fast", 4), ("yolo", 8)];

/// What a loop limit accepts, for messages.
const LIMIT_EXPECTED: &str = "a whole number from 2 to 1000, or \"off\"";
/// What a window accepts, for messages.
const WINDOW_EXPECTED: &str = "a whole number from 2 to 1000";

/// The loop limit as a limit of the ladder (a policy locking `loops` bounds it at the default).
#[derive(Clone, Copy, Debug)]
pub struct Loops;

impl Limit for Loops {
    type Value = LoopLimit;
    const NAME: LimitName = LimitName::LoopLimit;
    // A policy that locks `loops` bounds the limit at the default: `policy locked (FILE)`.
    const CEILING_KEY: &'static str = "locked";

    fn parse(raw: &RawValue) -> Result<LoopLimit, InvalidValue> {
        parse_loop_limit(raw)
    }

    fn tighter(a: LoopLimit, b: LoopLimit) -> LoopLimit {
        a.min(b)
    }

    fn describe(value: LoopLimit) -> String {
        format!("a loop limit of {value}")
    }

    fn show_ceiling(value: LoopLimit) -> String {
        value.to_string()
    }

    fn check_ceiling(_: LoopLimit) -> Result<(), InvalidValue> {
        Ok(())
    }
}

/// Validates a raw loop limit from any source (flag, env, file): a whole number from 2 to
/// [`MAX_LOOP_SETTING`], or `off`.
pub fn parse_loop_limit(raw: &RawValue) -> Result<LoopLimit, InvalidValue> {
    if let RawValue::Text(s) = raw
        && s.trim().eq_ignore_ascii_case("off")
    {
        return Ok(LoopLimit::Off);
    }
    whole_number(raw, LIMIT_EXPECTED).map(LoopLimit::Limited)
}

/// Validates a raw `loops.window`: a whole number from 2 to [`MAX_LOOP_SETTING`].
pub fn window_from_raw(raw: &RawValue) -> Result<u32, InvalidValue> {
    whole_number(raw, WINDOW_EXPECTED)
}

fn whole_number(raw: &RawValue, expected: &'static str) -> Result<u32, InvalidValue> {
    let n = match raw {
        RawValue::Integer(n) => *n,
        RawValue::Text(s) => match s.trim().parse::<i64>() {
            Ok(n) => n,
            Err(_) if s.trim().parse::<f64>().is_ok() => {
                return Err(InvalidValue::NotWhole {
                    value: format!("{s:?}"),
                    expected,
                });
            }
            Err(_) => {
                return Err(InvalidValue::NotANumber {
                    value: format!("{s:?}"),
                    expected,
                });
            }
        },
        RawValue::Float(f) => {
            return Err(InvalidValue::NotWhole {
                value: f.to_string(),
                expected,
            });
        }
        RawValue::Other(kind) => {
            return Err(InvalidValue::WrongType {
                found: kind.clone(),
                expected,
            });
        }
    };
    if n < 2 {
        Err(InvalidValue::TooSmall {
            value: n.to_string(),
            expected,
        })
    } else {
        u32::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_LOOP_SETTING)
            .ok_or(InvalidValue::TooLarge {
                value: n.to_string(),
                max: "1000",
                expected,
            })
    }
}

/// The inputs of one loop-settings resolution.
#[derive(Clone, Debug)]
pub struct LoopRequest<'a> {
    /// `--loop-limit` from the command line.
    pub flag: Option<Setting>,
    /// `STEPGUARD_LOOP_LIMIT` from the environment.
    pub env: Option<Setting>,
    /// `--profile` (or `STEPGUARD_PROFILE`), which beats the config's `profile`.
    pub profile: Option<(String, Origin)>,
    /// The task type of the run, if any.
    pub task_type: Option<&'a str>,
    /// The merged config files.
    pub config: &'a ConfigModel,
}

impl<'a> LoopRequest<'a> {
    /// Creates a request with no flag, env, profile or task type over `config`.
    pub fn new(config: &'a ConfigModel) -> Self {
        LoopRequest {
            flag: None,
            env: None,
            profile: None,
            task_type: None,
            config,
        }
    }
}

/// The loop settings of a run and where the limit came from.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedLoops {
    /// What the detector is given; `None` when loop detection is off.
    pub settings: Option<LoopSettings>,
    /// The effective limit.
    pub limit: LoopLimit,
    /// Short label of the deciding source: `--loop-limit`, `env STEPGUARD_LOOP_LIMIT`,
    /// `task_types.review.loop_limit`, `loops.limit`, `profile strict`, `default`, …
    pub source: String,
    /// The config file that decided, when it was a file.
    pub source_file: Option<String>,
    /// The explicit limit that the profile's lowered, when it did.
    pub explicit: Option<LoopLimit>,
    /// The window: the configured one (or [`LoopSettings::DEFAULT_WINDOW`]), widened to the
    /// limit.
    pub window: u32,
    /// The exempt tools.
    pub ignore_tools: Vec<String>,
    /// Warnings for the user (a window widened to the limit), each naming its origin.
    pub warnings: Vec<String>,
}

/// Returns the built-in loop limit of a profile, if `name` is a built-in profile.
pub fn builtin_profile_loop_limit(name: &str) -> Option<u32> {
    BUILTIN_PROFILE_LOOP_LIMITS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, l)| *l)
}

/// Resolves the loop settings of a run.
///
/// Both the flag and the environment are validated, not only the winner, so a bad
/// `STEPGUARD_LOOP_LIMIT` never lies in wait until the flag is removed. An unknown profile
/// contributes nothing here (budget resolution reports it).
pub fn resolve(req: &LoopRequest<'_>) -> Result<ResolvedLoops, LimitError> {
    let loops = &req.config.loops;
    let profile = req
        .profile
        .as_ref()
        .or(req.config.profile.as_ref())
        .and_then(|(name, _)| match loops.profiles.get(name) {
            Some(set) => Some(ProfileLevel::Set(Candidate::Parsed(set.0, &set.1))),
            None => builtin_profile_loop_limit(name).map(|l| ProfileLevel::Builtin {
                name,
                value: LoopLimit::Limited(l),
            }),
        });
    let resolved = ladder::resolve::<Loops>(&Levels {
        explicit: vec![
            Candidate::raw(req.flag.as_ref()),
            Candidate::raw(req.env.as_ref()),
            Candidate::parsed(req.task_type.and_then(|t| loops.task_types.get(t))),
            Candidate::parsed(loops.limit.as_ref()),
        ],
        profile,
        default: LoopLimit::Limited(DEFAULT_LOOP_LIMIT),
        ceiling: req
            .config
            .policy
            .locks(Lock::Loops)
            .map(|origin| (LoopLimit::Limited(DEFAULT_LOOP_LIMIT), origin)),
    })?;
    let (limit, source) = (resolved.value, resolved.source);

    let mut warnings = Vec::new();
    let mut window = loops
        .window
        .as_ref()
        .map_or(LoopSettings::DEFAULT_WINDOW, |(w, _)| *w);
    if let LoopLimit::Limited(n) = limit
        && window < n
    {
        if let Some((w, origin)) = &loops.window {
            warnings.push(format!(
                "{origin}: the window of {w} calls is below the loop limit of {n} (from \
                 {source}); using a window of {n}"
            ));
        }
        window = n;
    }
    let ignore_tools = loops
        .ignore_tools
        .as_ref()
        .map(|(tools, _)| tools.clone())
        .unwrap_or_default();
    Ok(ResolvedLoops {
        settings: limit.get().map(|n| LoopSettings {
            limit: n,
            window,
            ignore_tools: ignore_tools.clone(),
        }),
        limit,
        source,
        source_file: resolved.source_file,
        explicit: resolved.explicit,
        window,
        ignore_tools,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(key: &str) -> Origin {
        Origin::File {
            path: "/p/stepguard.toml".into(),
            key: key.into(),
        }
    }

    fn flag(value: &str) -> Option<Setting> {
        Some(Setting::text(value, Origin::Flag("--loop-limit".into())))
    }

    fn env(value: &str) -> Option<Setting> {
        Some(Setting::text(
            value,
            Origin::Env("STEPGUARD_LOOP_LIMIT".into()),
        ))
    }

    /// A config with a global limit of 7, a task type `review` at 6 and a profile `nightly` at 9.
    fn config() -> ConfigModel {
        let mut config = ConfigModel::default();
        config.loops.limit = Some((LoopLimit::Limited(7), file("loops.limit")));
        config.loops.task_types.insert(
            "review".into(),
            (LoopLimit::Limited(6), file("task_types.review.loop_limit")),
        );
        config.loops.profiles.insert(
            "nightly".into(),
            (LoopLimit::Limited(9), file("profiles.nightly.loop_limit")),
        );
        config
    }

    #[test]
    fn the_default_is_the_constant_with_the_default_window() {
        let config = ConfigModel::default();
        let r = resolve(&LoopRequest::new(&config)).unwrap();
        assert_eq!(
            r.settings,
            Some(LoopSettings::with_limit(DEFAULT_LOOP_LIMIT))
        );
        assert_eq!((r.source.as_str(), r.source_file), ("default", None));
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn each_level_beats_the_ones_below_and_names_itself() {
        let config = config();
        let req =
            |flag_v: Option<&str>, env_v: Option<&str>, task: Option<&'static str>| LoopRequest {
                flag: flag_v.and_then(flag),
                env: env_v.and_then(env),
                profile: None,
                task_type: task,
                config: &config,
            };
        let cases = [
            (req(Some("3"), Some("4"), Some("review")), 3, "--loop-limit"),
            (
                req(None, Some("4"), Some("review")),
                4,
                "env STEPGUARD_LOOP_LIMIT",
            ),
            (
                req(None, None, Some("review")),
                6,
                "task_types.review.loop_limit",
            ),
            (req(None, None, Some("other")), 7, "loops.limit"),
            (req(None, None, None), 7, "loops.limit"),
        ];
        for (request, limit, source) in cases {
            let r = resolve(&request).unwrap();
            assert_eq!(
                (r.limit, r.source.as_str()),
                (LoopLimit::Limited(limit), source)
            );
            assert_eq!(r.settings.map(|s| s.limit), Some(limit));
        }
        let r = resolve(&req(None, None, Some("review"))).unwrap();
        assert_eq!(r.source_file.as_deref(), Some("/p/stepguard.toml"));
        let r = resolve(&req(Some("3"), None, None)).unwrap();
        assert_eq!(r.source_file, None);
    }

    #[test]
    fn off_turns_detection_off() {
        let config = config();
        let r = resolve(&LoopRequest {
            flag: flag("OFF"),
            ..LoopRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.limit, r.settings, r.source.as_str()),
            (LoopLimit::Off, None, "--loop-limit")
        );
        let mut config = ConfigModel::default();
        config.loops.limit = Some((LoopLimit::Off, file("loops.limit")));
        let r = resolve(&LoopRequest::new(&config)).unwrap();
        assert_eq!((r.settings, r.source.as_str()), (None, "loops.limit"));
    }

    #[test]
    fn a_profile_is_the_default_and_bounds_an_explicit_limit() {
        let config = ConfigModel::default();
        let with = |profile: &str, flag_v: Option<&str>| {
            resolve(&LoopRequest {
                flag: flag_v.and_then(flag),
                profile: Some((profile.into(), Origin::Flag("--profile".into()))),
                ..LoopRequest::new(&config)
            })
            .unwrap()
        };
        for &(name, limit) in BUILTIN_PROFILE_LOOP_LIMITS {
            let r = with(name, None);
            assert_eq!(r.limit, LoopLimit::Limited(limit));
            assert_eq!(r.source, format!("profile {name}"));
        }
        // strict is 3: an explicit 2 tightens it, an explicit 6 or off cannot loosen it.
        let r = with("strict", Some("2"));
        assert_eq!(
            (r.limit, r.source.as_str(), r.explicit),
            (LoopLimit::Limited(2), "--loop-limit", None)
        );
        let r = with("strict", Some("6"));
        assert_eq!(
            (r.limit, r.source.as_str(), r.explicit),
            (
                LoopLimit::Limited(3),
                "profile strict",
                Some(LoopLimit::Limited(6))
            )
        );
        let r = with("strict", Some("off"));
        assert_eq!(
            (r.limit, r.explicit),
            (LoopLimit::Limited(3), Some(LoopLimit::Off))
        );
        // A profile with no loop limit (not built in, none configured) leaves the default.
        let r = with("custom", None);
        assert_eq!(
            (r.limit, r.source.as_str()),
            (LoopLimit::Limited(DEFAULT_LOOP_LIMIT), "default")
        );
    }

    #[test]
    fn a_configured_profile_limit_replaces_the_builtin_and_the_config_profile_counts() {
        let mut config = config();
        config.loops.profiles.insert(
            "yolo".into(),
            (LoopLimit::Off, file("profiles.yolo.loop_limit")),
        );
        config.profile = Some(("nightly".into(), file("profile")));
        let r = resolve(&LoopRequest {
            task_type: Some("none"),
            ..LoopRequest::new(&config)
        })
        .unwrap();
        // loops.limit (7) is under nightly's 9: the explicit limit stands.
        assert_eq!(
            (r.limit, r.source.as_str()),
            (LoopLimit::Limited(7), "loops.limit")
        );
        config.loops.limit = None;
        let r = resolve(&LoopRequest::new(&config)).unwrap();
        assert_eq!(
            (r.limit, r.source.as_str()),
            (LoopLimit::Limited(9), "profiles.nightly.loop_limit")
        );
        // The flag's profile beats the config's; a profile that is off bounds nothing.
        let r = resolve(&LoopRequest {
            profile: Some(("yolo".into(), Origin::Flag("--profile".into()))),
            ..LoopRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.limit, r.source.as_str()),
            (LoopLimit::Off, "profiles.yolo.loop_limit")
        );
        let r = resolve(&LoopRequest {
            flag: flag("12"),
            profile: Some(("yolo".into(), Origin::Flag("--profile".into()))),
            ..LoopRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.limit, r.source.as_str()),
            (LoopLimit::Limited(12), "--loop-limit")
        );
    }

    #[test]
    fn bad_flag_or_env_values_are_errors_naming_their_source() {
        let config = ConfigModel::default();
        let cases = [
            ("1", "1 is below 2 (a loop is a call made at least twice)"),
            ("0", "0 is below 2 (a loop is a call made at least twice)"),
            ("-3", "-3 is below 2 (a loop is a call made at least twice)"),
            ("1001", "1001 is above the maximum of 1000"),
            ("2.5", "\"2.5\" is not a whole number"),
            ("many", "\"many\" is not a number"),
        ];
        for (value, text) in cases {
            let err = resolve(&LoopRequest {
                flag: flag("3"),
                env: env(value),
                ..LoopRequest::new(&config)
            })
            .unwrap_err()
            .to_string();
            assert_eq!(
                err,
                format!(
                    "invalid loop limit at env STEPGUARD_LOOP_LIMIT: {text}; use a whole number \
                     from 2 to 1000, or \"off\""
                )
            );
        }
    }

    #[test]
    fn raw_values_are_validated_for_limit_and_window() {
        assert_eq!(
            parse_loop_limit(&RawValue::Integer(2)),
            Ok(LoopLimit::Limited(2))
        );
        assert_eq!(
            parse_loop_limit(&RawValue::Integer(1000)),
            Ok(LoopLimit::Limited(1000))
        );
        assert_eq!(
            parse_loop_limit(&RawValue::Text(" off ".into())),
            Ok(LoopLimit::Off)
        );
        assert_eq!(
            parse_loop_limit(&RawValue::Other("a boolean".into()))
                .unwrap_err()
                .to_string(),
            "expected a whole number from 2 to 1000, or \"off\", found a boolean"
        );
        assert_eq!(
            parse_loop_limit(&RawValue::Float(3.5))
                .unwrap_err()
                .to_string(),
            "3.5 is not a whole number; use a whole number from 2 to 1000, or \"off\""
        );
        assert_eq!(window_from_raw(&RawValue::Integer(30)), Ok(30));
        assert_eq!(
            window_from_raw(&RawValue::Text("off".into()))
                .unwrap_err()
                .to_string(),
            "\"off\" is not a number; use a whole number from 2 to 1000"
        );
    }

    #[test]
    fn the_window_widens_to_the_limit_with_a_warning_when_configured() {
        let mut config = ConfigModel::default();
        config.loops.window = Some((4, file("loops.window")));
        config.loops.ignore_tools = Some((vec!["read".into()], file("loops.ignore_tools")));
        let r = resolve(&LoopRequest::new(&config)).unwrap();
        assert_eq!(r.window, 5);
        assert_eq!(
            r.settings,
            Some(LoopSettings {
                limit: 5,
                window: 5,
                ignore_tools: vec!["read".into()]
            })
        );
        assert_eq!(
            r.warnings,
            [
                "/p/stepguard.toml: loops.window: the window of 4 calls is below the loop limit of 5 \
              (from default); using a window of 5"
            ]
        );
        let r = resolve(&LoopRequest {
            flag: flag("3"),
            ..LoopRequest::new(&config)
        })
        .unwrap();
        assert_eq!((r.window, r.warnings.len()), (4, 0));
        // The default window widens silently: nobody asked for it.
        let r = resolve(&LoopRequest {
            flag: flag("30"),
            ..LoopRequest::new(&ConfigModel::default())
        })
        .unwrap();
        assert_eq!((r.window, r.warnings.len()), (30, 0));
        // Off keeps the configured window and tools for display.
        let r = resolve(&LoopRequest {
            flag: flag("off"),
            ..LoopRequest::new(&config)
        })
        .unwrap();
        assert_eq!((r.window, r.ignore_tools.len(), r.settings), (4, 1, None));
    }

    #[test]
    fn limits_serialize_as_number_or_null() {
        assert_eq!(serde_json::to_string(&LoopLimit::Limited(3)).unwrap(), "3");
        assert_eq!(serde_json::to_string(&LoopLimit::Off).unwrap(), "null");
    }
}
