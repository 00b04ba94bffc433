//! The one precedence ladder every limit is resolved with.
//!
//! A limit (steps, tokens, cost, loop limit, and any later one) declares in a [`Limit`] how a
//! value is parsed and validated, which of two values is the tighter, and how a value is said
//! in a message. [`resolve`] then walks the levels, highest first:
//!
//! 1. the explicit levels, in precedence order: the command line, the environment, the task
//!    type, the global config (a limit may have more, e.g. the legacy `max_turns` spellings);
//!    the first one set is the *explicit* value, and every one is validated, so a typo in a
//!    lower level never lies in wait until the level above it is removed;
//! 2. the selected profile's value (from `[profiles.NAME]`, else the built-in profile's), which
//!    bounds an explicit value: the result is the tighter of the two;
//! 3. the default, when neither an explicit value nor a profile's applies;
//! 4. the policy ceiling, which bounds all of the above: when it lowers the value, the source
//!    names the policy and a warning names who asked for more (unless nobody did: the default).
//!
//! The result ([`Resolved`]) is the value with its provenance: the source label
//! (`--max-steps`, `env STEPGUARD_MAX_TOKENS`, `task_types.review.loop_limit`, `profile strict`,
//! `default`, `policy max_steps_ceiling (FILE)`), the file, the explicit value the profile
//! lowered and the value the ceiling lowered. Any bad value is a [`LimitError`].

use serde::Serialize;

use crate::value::{InvalidValue, LimitError, LimitName, Origin, RawValue, Setting};

/// What the ladder needs to know of one kind of limit.
pub trait Limit {
    /// The validated value (`None`-like values such as `unlimited` included).
    type Value: Copy + PartialEq;
    /// How messages name the limit.
    const NAME: LimitName;
    /// The policy key of the limit's ceiling, e.g. `max_steps_ceiling` (unused without one).
    const CEILING_KEY: &'static str;

    /// Parses and validates a raw value from any source (flag, env, file).
    fn parse(raw: &RawValue) -> Result<Self::Value, InvalidValue>;
    /// Returns the tighter of two values.
    fn tighter(a: Self::Value, b: Self::Value) -> Self::Value;
    /// Says a value as asked for in the ceiling's warning: `100 steps`, `unlimited tokens`.
    fn describe(value: Self::Value) -> String;
    /// Says a ceiling in a message: `80`, `$2.50`.
    fn show_ceiling(value: Self::Value) -> String;
    /// Checks a ceiling (a model built by hand could hold anything).
    fn check_ceiling(value: Self::Value) -> Result<(), InvalidValue>;
}

/// Validates `setting` as a value of `L`, naming its origin on failure.
pub fn validate<L: Limit>(setting: &Setting) -> Result<L::Value, LimitError> {
    L::parse(&setting.value).map_err(|reason| LimitError::invalid(L::NAME, &setting.origin, reason))
}

/// One explicit level's value: raw (validated by the ladder) or already validated (as the
/// parser does for loop limits in files).
#[derive(Clone, Copy, Debug)]
pub enum Candidate<'a, V> {
    /// A raw setting.
    Raw(&'a Setting),
    /// A value validated when its file was parsed.
    Parsed(V, &'a Origin),
}

impl<'a, V: Copy> Candidate<'a, V> {
    /// Returns the candidate for an optional raw setting.
    pub fn raw(setting: Option<&'a Setting>) -> Option<Self> {
        setting.map(Candidate::Raw)
    }

    /// Returns the candidate for an optional validated value.
    pub fn parsed(value: Option<&'a (V, Origin)>) -> Option<Self> {
        value.map(|(v, origin)| Candidate::Parsed(*v, origin))
    }

    fn rung<L: Limit<Value = V>>(self) -> Result<Rung<V>, LimitError> {
        Ok(match self {
            Candidate::Raw(setting) => Rung::at(validate::<L>(setting)?, &setting.origin),
            Candidate::Parsed(value, origin) => Rung::at(value, origin),
        })
    }
}

/// The selected profile's level.
#[derive(Clone, Copy, Debug)]
pub enum ProfileLevel<'a, V> {
    /// Set in `[profiles.NAME]`.
    Set(Candidate<'a, V>),
    /// The built-in profile `name`'s value.
    Builtin {
        /// The profile's name.
        name: &'a str,
        /// Its value.
        value: V,
    },
}

/// Every level of one limit for one run.
#[derive(Clone, Debug)]
pub struct Levels<'a, V> {
    /// The explicit levels, highest first; `None` where a level does not set the limit.
    pub explicit: Vec<Option<Candidate<'a, V>>>,
    /// The selected profile's value, if the profile has one.
    pub profile: Option<ProfileLevel<'a, V>>,
    /// The value when no explicit level and no profile sets one.
    pub default: V,
    /// The policy ceiling and where it was set.
    pub ceiling: Option<(V, &'a Origin)>,
}

/// A value that can decide, with its provenance.
#[derive(Clone, Debug)]
struct Rung<V> {
    value: V,
    /// Source label, e.g. `--max-steps`, `profile strict`.
    label: String,
    file: Option<String>,
    /// Who asked for it, as a user would look for it: `--max-steps`, `FILE: KEY`, `profile yolo`.
    asked: String,
}

impl<V> Rung<V> {
    fn at(value: V, origin: &Origin) -> Self {
        Rung {
            value,
            label: origin.label(),
            file: origin.file().map(str::to_owned),
            asked: origin.to_string(),
        }
    }
}

/// A resolved limit and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Resolved<V> {
    /// The effective value.
    pub value: V,
    /// Short label of the deciding source: `--max-tokens`, `env STEPGUARD_MAX_TOKENS`,
    /// `task_types.review.max_tokens`, `profiles.NAME.max_tokens`, `profile strict`,
    /// `policy max_tokens_ceiling (FILE)`, or `default`.
    pub source: String,
    /// The config file that decided, when it was a file.
    pub source_file: Option<String>,
    /// The explicit value that the profile's lowered, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explicit: Option<V>,
    /// The value before the policy ceiling lowered it, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncapped: Option<V>,
    /// Which explicit level was set first (an index into [`Levels::explicit`]), if any.
    #[serde(skip)]
    pub explicit_level: Option<usize>,
    /// The ceiling's warning, when it lowered a value somebody asked for.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Resolves one limit over its levels (see the module docs).
pub fn resolve<L: Limit>(levels: &Levels<'_, L::Value>) -> Result<Resolved<L::Value>, LimitError> {
    let mut explicit: Option<(usize, Rung<L::Value>)> = None;
    for (i, candidate) in levels.explicit.iter().enumerate() {
        let Some(candidate) = candidate else { continue };
        let rung = candidate.rung::<L>()?;
        if explicit.is_none() {
            explicit = Some((i, rung));
        }
    }
    let profile = match levels.profile {
        Some(ProfileLevel::Set(candidate)) => Some(candidate.rung::<L>()?),
        Some(ProfileLevel::Builtin { name, value }) => Some(Rung {
            value,
            label: format!("profile {name}"),
            file: None,
            asked: format!("profile {name}"),
        }),
        None => None,
    };
    let explicit_level = explicit.as_ref().map(|(i, _)| *i);
    let explicit = explicit.map(|(_, rung)| rung);
    // (the rung that decides, the explicit value the profile lowered).
    let (decided, lowered) = match (explicit, profile) {
        (Some(e), Some(p)) if L::tighter(e.value, p.value) != e.value => (Some(p), Some(e.value)),
        (Some(e), _) => (Some(e), None),
        (None, p) => (p, None),
    };
    let mut resolved = Resolved {
        value: decided.as_ref().map_or(levels.default, |r| r.value),
        source: decided
            .as_ref()
            .map_or_else(|| "default".to_owned(), |r| r.label.clone()),
        source_file: decided.as_ref().and_then(|r| r.file.clone()),
        explicit: lowered,
        uncapped: None,
        explicit_level,
        warnings: Vec::new(),
    };
    if let Some((cap, origin)) = levels.ceiling {
        apply_ceiling::<L>(&mut resolved, cap, origin, decided.map(|r| r.asked))?;
    }
    Ok(resolved)
}

/// Lowers the resolved value to the policy ceiling when it is above it (an unlimited value
/// always is).
fn apply_ceiling<L: Limit>(
    resolved: &mut Resolved<L::Value>,
    cap: L::Value,
    origin: &Origin,
    asked: Option<String>,
) -> Result<(), LimitError> {
    L::check_ceiling(cap).map_err(|reason| LimitError::invalid(L::NAME, origin, reason))?;
    let requested = resolved.value;
    if L::tighter(requested, cap) == requested {
        return Ok(());
    }
    // The default is nobody's request: lowering it is not worth a warning on every run.
    if let Some(asked) = asked {
        let cap = L::show_ceiling(cap);
        resolved.warnings.push(format!(
            "{asked} asks for {}, above the policy ceiling of {cap} set in {origin}; using {cap}",
            L::describe(requested)
        ));
    }
    resolved.value = cap;
    resolved.source = format!(
        "policy {} ({})",
        L::CEILING_KEY,
        origin
            .file()
            .map_or_else(|| origin.to_string(), str::to_owned)
    );
    resolved.source_file = origin.file().map(str::to_owned);
    resolved.uncapped = Some(requested);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit the ladder has never seen (say, a pool of agents), to show that a new limit needs
    /// only its [`Limit`]: whole numbers from 1 to 9, no "unlimited".
    struct Pool;

    impl Limit for Pool {
        type Value = u32;
        const NAME: LimitName = LimitName::Steps;
        const CEILING_KEY: &'static str = "max_pool_ceiling";

        fn parse(raw: &RawValue) -> Result<u32, InvalidValue> {
            match raw {
                RawValue::Integer(n @ 1..=9) => Ok(u32::try_from(*n).unwrap_or(9)),
                other => Err(InvalidValue::NotANumber {
                    value: other.shown(),
                    expected: "1 to 9",
                }),
            }
        }

        fn tighter(a: u32, b: u32) -> u32 {
            a.min(b)
        }

        fn describe(value: u32) -> String {
            format!("{value} agents")
        }

        fn show_ceiling(value: u32) -> String {
            value.to_string()
        }

        fn check_ceiling(value: u32) -> Result<(), InvalidValue> {
            Self::parse(&RawValue::Integer(i64::from(value))).map(drop)
        }
    }

    fn setting(n: i64, origin: Origin) -> Setting {
        Setting {
            value: RawValue::Integer(n),
            origin,
        }
    }

    fn file(key: &str) -> Origin {
        Origin::File {
            path: "/p/stepguard.toml".into(),
            key: key.into(),
        }
    }

    #[test]
    fn the_first_explicit_level_decides_and_every_one_is_validated() {
        let flag = setting(3, Origin::Flag("--pool".into()));
        let global = setting(5, file("pool"));
        let r = resolve::<Pool>(&Levels {
            explicit: vec![
                None,
                Candidate::raw(Some(&flag)),
                Candidate::raw(Some(&global)),
            ],
            profile: None,
            default: 2,
            ceiling: None,
        })
        .unwrap();
        assert_eq!(
            (r.value, r.source.as_str(), r.explicit_level),
            (3, "--pool", Some(1))
        );
        let bad = setting(0, file("pool"));
        let err = resolve::<Pool>(&Levels {
            explicit: vec![Candidate::raw(Some(&flag)), Candidate::raw(Some(&bad))],
            profile: None,
            default: 2,
            ceiling: None,
        })
        .unwrap_err();
        assert_eq!(
            err,
            LimitError::invalid(
                LimitName::Steps,
                &file("pool"),
                InvalidValue::NotANumber {
                    value: "0".into(),
                    expected: "1 to 9"
                }
            )
        );
    }

    #[test]
    fn the_profile_bounds_the_default_is_last_and_the_ceiling_bounds_all() {
        let flag = setting(6, Origin::Flag("--pool".into()));
        let policy = file("policy.max_pool_ceiling");
        let levels = |explicit: Option<&Setting>, profile: Option<u32>, ceiling: Option<u32>| {
            resolve::<Pool>(&Levels {
                explicit: vec![Candidate::raw(explicit)],
                profile: profile.map(|value| ProfileLevel::Builtin { name: "big", value }),
                default: 2,
                ceiling: ceiling.map(|c| (c, &policy)),
            })
            .unwrap()
        };
        let r = levels(Some(&flag), Some(4), None);
        assert_eq!((r.value, r.source.as_str()), (4, "profile big"));
        assert_eq!(r.explicit, Some(6));
        let r = levels(Some(&flag), Some(8), None);
        assert_eq!(
            (r.value, r.source.as_str(), r.explicit),
            (6, "--pool", None)
        );
        let r = levels(None, None, None);
        assert_eq!((r.value, r.source.as_str()), (2, "default"));
        let r = levels(Some(&flag), None, Some(5));
        assert_eq!(
            (r.value, r.source.as_str(), r.uncapped),
            (5, "policy max_pool_ceiling (/p/stepguard.toml)", Some(6))
        );
        assert_eq!(
            r.warnings,
            [
                "--pool asks for 6 agents, above the policy ceiling of 5 set in \
              /p/stepguard.toml: policy.max_pool_ceiling; using 5"
            ]
        );
        // The default lowered by the ceiling is nobody's request: no warning.
        let r = levels(None, None, Some(1));
        assert_eq!((r.value, r.warnings.len()), (1, 0));
    }
}
