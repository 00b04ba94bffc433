//! Token and cost budgets: `max_tokens` and `max_cost_usd`, where each comes from, and the
//! precedence levels they are resolved from on the shared ladder ([`crate::ladder`]), as the
//! step budget is ([`crate::budget`]).
//!
//! A token budget counts input and output tokens, cached input included; a cost budget is in US
//! dollars. Either may be absent: unlike steps, there is no default, so a run without one has no
//! token or cost budget.
//!
//! Precedence of each, highest first:
//!
//! 1. the command line: `--max-tokens` / `--max-cost-usd`;
//! 2. the environment: `STEPGUARD_MAX_TOKENS` / `STEPGUARD_MAX_COST_USD`;
//! 3. `task_types.T.max_tokens` / `task_types.T.max_cost_usd`;
//! 4. global `max_tokens` / `max_cost_usd` (`defaults.max_tokens` / `defaults.max_cost_usd` is
//!    the same level);
//! 5. the selected profile's (`profiles.NAME.max_tokens` / `profiles.NAME.max_cost_usd`), else
//!    none. No built-in profile sets either: how many tokens or dollars a task needs depends on
//!    the model and its prices far more than on the kind of run a profile describes.
//!
//! As with steps, when a profile is selected and a budget is also set explicitly (levels 1–4),
//! the explicit budget is an upper bound: the effective budget is `min(explicit, profile)`,
//! `unlimited` being the loosest (so `--max-tokens unlimited` under a profile keeps the
//! profile's).
//!
//! A policy ceiling (`policy.max_tokens_ceiling`,
//! `policy.max_cost_usd_ceiling`) bounds the result of all of the above, no budget
//! included: the effective budget is `min(resolved, ceiling)`, and when the ceiling lowers it the
//! source names the policy (`policy max_tokens_ceiling (FILE)`) and, unless nobody asked for the
//! budget (no budget at all), a warning says what was asked for and what is allowed.
//!
//! Every candidate relevant to the run is validated, not only the winner, so a typo in a lower
//! level never lies in wait until the level above it is removed. Config files are also validated
//! as they are parsed; the flags and the environment are validated here.
//!
//! ```
//! use stepguard_config::{ConfigModel, LevelSettings, Origin, Setting};
//! use stepguard_config::spend::{SpendRequest, resolve};
//!
//! let config = ConfigModel::default();
//! let flags = LevelSettings {
//!     max_cost_usd: Some(Setting::text("2.50", Origin::Flag("--max-cost-usd".into()))),
//!     ..LevelSettings::default()
//! };
//! let r = resolve(&SpendRequest { flags, ..SpendRequest::new(&config) }).unwrap();
//! assert_eq!((r.max_cost_usd(), r.cost.source.as_str()), (Some(2.5), "--max-cost-usd"));
//! assert_eq!((r.max_tokens(), r.tokens.source.as_str()), (None, "default"));
//! ```

use serde::Serialize;

use crate::ladder::{self, Candidate, Levels, Limit, ProfileLevel, Resolved};
use crate::model::{ConfigModel, LevelSettings, PolicySettings};
use crate::value::{InvalidValue, LimitError, LimitName, Origin, RawValue};

/// The largest token budget (or ceiling) accepted: 10^12. Anything above is almost certainly a
/// typo; say `unlimited` for no token budget instead.
pub const MAX_TOKENS_LIMIT: u64 = 1_000_000_000_000;

/// The largest cost budget (or ceiling) accepted, in US dollars.
pub const MAX_COST_USD_LIMIT: f64 = 1_000_000.0;

/// The most decimals a cost may have (a hundredth of a cent).
pub const COST_DECIMALS: usize = 4;

/// What a token budget accepts, for messages.
pub const TOKENS_EXPECTED: &str =
    "a whole number of tokens from 1 to 1000000000000, or \"unlimited\"";
/// What a cost budget accepts, for messages.
pub const COST_EXPECTED: &str = "a number of US dollars above 0 and at most 1000000 with at \
                                 most 4 decimals (e.g. 2.50), or \"unlimited\"";
/// What a token ceiling accepts, for messages.
pub const TOKENS_CEILING_EXPECTED: &str = "a whole number of tokens from 1 to 1000000000000";
/// What a cost ceiling accepts, for messages.
pub const COST_CEILING_EXPECTED: &str =
    "a number of US dollars above 0 and at most 1000000 with at most 4 decimals";

/// The token budget (`max_tokens`) as a limit of the ladder; `None` is no budget.
#[derive(Clone, Copy, Debug)]
pub struct Tokens;

/// The cost budget (`max_cost_usd`, US dollars) as a limit of the ladder; `None` is no budget.
#[derive(Clone, Copy, Debug)]
pub struct Cost;

impl Limit for Tokens {
    type Value = Option<u64>;
    const NAME: LimitName = LimitName::Tokens;
    const CEILING_KEY: &'static str = "max_tokens_ceiling";

    fn parse(raw: &RawValue) -> Result<Option<u64>, InvalidValue> {
        parse_max_tokens(raw)
    }

    fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        tighter(a, b)
    }

    fn describe(value: Option<u64>) -> String {
        match value {
            Some(n) => format!("{n} tokens"),
            None => "unlimited tokens".to_owned(),
        }
    }

    fn show_ceiling(value: Option<u64>) -> String {
        value.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
    }

    fn check_ceiling(value: Option<u64>) -> Result<(), InvalidValue> {
        match value {
            Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(()),
            other => Err(InvalidValue::InvalidCeiling {
                value: Self::show_ceiling(other),
                expected: TOKENS_CEILING_EXPECTED,
            }),
        }
    }
}

impl Limit for Cost {
    type Value = Option<f64>;
    const NAME: LimitName = LimitName::Cost;
    const CEILING_KEY: &'static str = "max_cost_usd_ceiling";

    fn parse(raw: &RawValue) -> Result<Option<f64>, InvalidValue> {
        parse_max_cost_usd(raw)
    }

    fn tighter(a: Option<f64>, b: Option<f64>) -> Option<f64> {
        tighter(a, b)
    }

    fn describe(value: Option<f64>) -> String {
        match value {
            Some(f) => dollars(f),
            None => "an unlimited cost".to_owned(),
        }
    }

    fn show_ceiling(value: Option<f64>) -> String {
        value.map_or_else(|| "unlimited".to_owned(), dollars)
    }

    fn check_ceiling(value: Option<f64>) -> Result<(), InvalidValue> {
        match value {
            Some(f) if cost_from_float(f, String::new(), COST_CEILING_EXPECTED).is_ok() => Ok(()),
            other => Err(InvalidValue::InvalidCeiling {
                value: Self::show_ceiling(other),
                expected: COST_CEILING_EXPECTED,
            }),
        }
    }
}

/// Returns true for `unlimited` or `off` (any case, surrounding blanks ignored).
fn is_unlimited(text: &str) -> bool {
    let t = text.trim();
    t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("off")
}

/// Returns true for an optionally negative decimal number: digits, at most one `.`, and at
/// least one digit (`2`, `2.50`, `.5`, `-3`), with no exponent, sign `+`, `inf` or `nan`.
fn is_decimal(text: &str) -> bool {
    let body = text.strip_prefix('-').unwrap_or(text);
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    !(int.is_empty() && frac.is_empty())
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// Validates a raw token budget from any source (flag, env, file): a whole number from 1 to
/// [`MAX_TOKENS_LIMIT`], or `unlimited` (also `off`), which is `None`.
pub fn parse_max_tokens(raw: &RawValue) -> Result<Option<u64>, InvalidValue> {
    let expected = TOKENS_EXPECTED;
    match raw {
        RawValue::Integer(n) => tokens_from_integer(*n, expected).map(Some),
        RawValue::Text(s) if is_unlimited(s) => Ok(None),
        RawValue::Text(s) => {
            let t = s.trim();
            match t.parse::<i64>() {
                Ok(n) => tokens_from_integer(n, expected).map(Some),
                // Digits beyond i64.
                Err(_) if is_decimal(t) && !t.contains('.') => Err(if t.starts_with('-') {
                    InvalidValue::Negative {
                        value: t.to_owned(),
                        expected,
                    }
                } else {
                    InvalidValue::TooLarge {
                        value: t.to_owned(),
                        max: "1000000000000",
                        expected,
                    }
                }),
                Err(_) if is_decimal(t) => Err(InvalidValue::NotWhole {
                    value: format!("{s:?}"),
                    expected,
                }),
                Err(_) => Err(InvalidValue::NotANumber {
                    value: format!("{s:?}"),
                    expected,
                }),
            }
        }
        RawValue::Float(f) if f.is_finite() && f.fract() == 0.0 => Err(InvalidValue::Float {
            value: format!("{f:?}"),
            expected,
        }),
        RawValue::Float(f) if f.is_finite() => Err(InvalidValue::NotWhole {
            value: f.to_string(),
            expected,
        }),
        RawValue::Float(f) => Err(InvalidValue::NotFinite {
            value: f.to_string(),
            expected,
        }),
        RawValue::Other(kind) => Err(InvalidValue::WrongType {
            found: kind.clone(),
            expected,
        }),
    }
}

fn tokens_from_integer(n: i64, expected: &'static str) -> Result<u64, InvalidValue> {
    let value = n.to_string();
    match u64::try_from(n) {
        Err(_) => Err(InvalidValue::Negative { value, expected }),
        Ok(0) => Err(InvalidValue::Zero { value, expected }),
        Ok(n) if n > MAX_TOKENS_LIMIT => Err(InvalidValue::TooLarge {
            value,
            max: "1000000000000",
            expected,
        }),
        Ok(n) => Ok(n),
    }
}

/// Validates a raw cost budget in US dollars from any source: a TOML float or integer, or text
/// such as `"2.5"` (digits and one optional `.`, no exponent), above 0, at most
/// [`MAX_COST_USD_LIMIT`], with at most [`COST_DECIMALS`] decimals; or `unlimited` (also `off`),
/// which is `None`.
pub fn parse_max_cost_usd(raw: &RawValue) -> Result<Option<f64>, InvalidValue> {
    let expected = COST_EXPECTED;
    match raw {
        RawValue::Integer(n) => {
            let value = n.to_string();
            match u32::try_from(*n) {
                _ if *n < 0 => Err(InvalidValue::Negative { value, expected }),
                Ok(0) => Err(InvalidValue::Zero { value, expected }),
                Ok(n) if f64::from(n) <= MAX_COST_USD_LIMIT => Ok(Some(f64::from(n))),
                _ => Err(InvalidValue::TooLarge {
                    value,
                    max: "1000000",
                    expected,
                }),
            }
        }
        RawValue::Float(f) => cost_from_float(*f, f.to_string(), expected).map(Some),
        RawValue::Text(s) if is_unlimited(s) => Ok(None),
        RawValue::Text(s) => {
            let t = s.trim();
            match t.parse::<f64>() {
                Ok(f) if is_decimal(t) => cost_from_float(f, t.to_owned(), expected).map(Some),
                _ => Err(InvalidValue::NotANumber {
                    value: format!("{s:?}"),
                    expected,
                }),
            }
        }
        RawValue::Other(kind) => Err(InvalidValue::WrongType {
            found: kind.clone(),
            expected,
        }),
    }
}

fn cost_from_float(f: f64, value: String, expected: &'static str) -> Result<f64, InvalidValue> {
    if !f.is_finite() {
        Err(InvalidValue::NotFinite { value, expected })
    } else if f < 0.0 {
        Err(InvalidValue::Negative { value, expected })
    } else if f <= 0.0 {
        Err(InvalidValue::Zero { value, expected })
    } else if f > MAX_COST_USD_LIMIT {
        Err(InvalidValue::TooLarge {
            value,
            max: "1000000",
            expected,
        })
    } else if decimals(f) > COST_DECIMALS {
        Err(InvalidValue::TooPrecise { value, expected })
    } else {
        Ok(f)
    }
}

/// Returns how many decimals the shortest text that reads back as `f` has (`2.5` → 1). Rust's
/// `Display` of a float never uses an exponent, so this counts the digits after the point.
fn decimals(f: f64) -> usize {
    f.to_string().split_once('.').map_or(0, |(_, d)| d.len())
}

/// Validates a raw `policy.max_tokens_ceiling`: a whole number from 1 to [`MAX_TOKENS_LIMIT`]
/// (`unlimited` is refused: it would bound nothing).
pub fn parse_max_tokens_ceiling(raw: &RawValue) -> Result<u64, InvalidValue> {
    match parse_max_tokens(raw) {
        Ok(Some(n)) => Ok(n),
        _ => Err(InvalidValue::InvalidCeiling {
            value: raw.shown(),
            expected: TOKENS_CEILING_EXPECTED,
        }),
    }
}

/// Validates a raw `policy.max_cost_usd_ceiling`: US dollars above 0, at most
/// [`MAX_COST_USD_LIMIT`], with at most [`COST_DECIMALS`] decimals (`unlimited` is refused).
pub fn parse_max_cost_usd_ceiling(raw: &RawValue) -> Result<f64, InvalidValue> {
    match parse_max_cost_usd(raw) {
        Ok(Some(f)) => Ok(f),
        _ => Err(InvalidValue::InvalidCeiling {
            value: raw.shown(),
            expected: COST_CEILING_EXPECTED,
        }),
    }
}

/// The inputs of one resolution of the token and cost budgets.
#[derive(Clone, Debug)]
pub struct SpendRequest<'a> {
    /// `--max-tokens` / `--max-cost-usd` from the command line, in `max_tokens` /
    /// `max_cost_usd` (the other fields are not read).
    pub flags: LevelSettings,
    /// `STEPGUARD_MAX_TOKENS` / `STEPGUARD_MAX_COST_USD` from the environment, likewise.
    pub env: LevelSettings,
    /// `--profile` (or `STEPGUARD_PROFILE`), which beats the config's `profile`.
    pub profile: Option<(String, Origin)>,
    /// The task type of the run, if any.
    pub task_type: Option<&'a str>,
    /// The merged config files, policy included.
    pub config: &'a ConfigModel,
}

impl<'a> SpendRequest<'a> {
    /// Creates a request with no flags, env, profile or task type over `config`.
    pub fn new(config: &'a ConfigModel) -> Self {
        SpendRequest {
            flags: LevelSettings::default(),
            env: LevelSettings::default(),
            profile: None,
            task_type: None,
            config,
        }
    }
}

/// One resolved budget (tokens or cost) and where it came from; `value` is `None` (`null` in
/// JSON) when the run has none, `explicit` and `uncapped` are `Some(None)` for an explicit
/// `unlimited` (or no budget, under a ceiling).
pub type ResolvedLimit<T> = Resolved<Option<T>>;

/// The token and cost budgets of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResolvedSpend {
    /// `max_tokens`: input + output tokens, cached input included.
    pub tokens: ResolvedLimit<u64>,
    /// `max_cost_usd`: US dollars.
    pub cost: ResolvedLimit<f64>,
    /// Warnings for the user (budgets the policy lowered), each naming its origin.
    pub warnings: Vec<String>,
}

impl ResolvedSpend {
    /// Returns the effective token budget, `None` when there is none.
    pub fn max_tokens(&self) -> Option<u64> {
        self.tokens.value
    }

    /// Returns the effective cost budget in US dollars, `None` when there is none.
    pub fn max_cost_usd(&self) -> Option<f64> {
        self.cost.value
    }
}

/// Formats dollars for messages: cents always shown (`$2.50`), finer amounts as given
/// (`$0.125`).
fn dollars(f: f64) -> String {
    stepguard_core::money::usd(f)
}

/// Returns the tighter of two budgets, `None` (unlimited) being the loosest.
fn tighter<T: Copy + PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (Some(x), None) | (None, Some(x)) => Some(x),
        (None, None) => None,
    }
}

/// Returns the levels of one spend budget: the explicit ones (flag, env, task type, global),
/// the profile's and the policy ceiling.
fn levels<'b, T: Copy>(
    explicit: [Option<&'b crate::value::Setting>; 4],
    profile: Option<&'b crate::value::Setting>,
    ceiling: Option<&'b (T, Origin)>,
) -> Levels<'b, Option<T>> {
    Levels {
        explicit: explicit.map(Candidate::raw).to_vec(),
        profile: profile.map(|s| ProfileLevel::Set(Candidate::Raw(s))),
        default: None,
        ceiling: ceiling.map(|(cap, origin)| (Some(*cap), origin)),
    }
}

/// Resolves the token and cost budgets of a run (see the module docs for the precedence).
///
/// An unknown profile contributes nothing here (budget resolution reports it); neither does a
/// task type without a `[task_types.T]` table (budget resolution warns about it).
pub fn resolve(req: &SpendRequest<'_>) -> Result<ResolvedSpend, LimitError> {
    let empty = LevelSettings::default();
    let config = req.config;
    let task = req
        .task_type
        .and_then(|t| config.task_types.get(t))
        .unwrap_or(&empty);
    let profile = req
        .profile
        .as_ref()
        .or(config.profile.as_ref())
        .and_then(|(name, _)| config.profiles.get(name));
    let policy: &PolicySettings = &config.policy;
    let mut tokens = ladder::resolve::<Tokens>(&levels(
        [
            req.flags.max_tokens.as_ref(),
            req.env.max_tokens.as_ref(),
            task.max_tokens.as_ref(),
            config.global.max_tokens.as_ref(),
        ],
        profile.and_then(|p| p.max_tokens.as_ref()),
        policy.max_tokens_ceiling.as_ref(),
    ))?;
    let mut cost = ladder::resolve::<Cost>(&levels(
        [
            req.flags.max_cost_usd.as_ref(),
            req.env.max_cost_usd.as_ref(),
            task.max_cost_usd.as_ref(),
            config.global.max_cost_usd.as_ref(),
        ],
        profile.and_then(|p| p.max_cost_usd.as_ref()),
        policy.max_cost_usd_ceiling.as_ref(),
    ))?;
    let mut warnings = std::mem::take(&mut tokens.warnings);
    warnings.append(&mut cost.warnings);
    Ok(ResolvedSpend {
        tokens,
        cost,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProfileSettings;
    use crate::value::Setting;

    fn file(key: &str) -> Origin {
        Origin::File {
            path: "/p/stepguard.toml".into(),
            key: key.into(),
        }
    }

    fn policy_file(key: &str) -> Origin {
        Origin::File {
            path: "/etc/stepguard/stepguard.toml".into(),
            key: key.into(),
        }
    }

    fn int(n: i64, origin: Origin) -> Option<Setting> {
        Some(Setting {
            value: RawValue::Integer(n),
            origin,
        })
    }

    fn float(f: f64, origin: Origin) -> Option<Setting> {
        Some(Setting {
            value: RawValue::Float(f),
            origin,
        })
    }

    fn text(value: &str, origin: Origin) -> Option<Setting> {
        Some(Setting::text(value, origin))
    }

    fn flags(tokens: Option<&str>, cost: Option<&str>) -> LevelSettings {
        LevelSettings {
            max_tokens: tokens.and_then(|v| text(v, Origin::Flag("--max-tokens".into()))),
            max_cost_usd: cost.and_then(|v| text(v, Origin::Flag("--max-cost-usd".into()))),
            ..LevelSettings::default()
        }
    }

    fn env(tokens: Option<&str>, cost: Option<&str>) -> LevelSettings {
        LevelSettings {
            max_tokens: tokens.and_then(|v| text(v, Origin::Env("STEPGUARD_MAX_TOKENS".into()))),
            max_cost_usd: cost.and_then(|v| text(v, Origin::Env("STEPGUARD_MAX_COST_USD".into()))),
            ..LevelSettings::default()
        }
    }

    /// A config with global 500000 tokens / $20, task type `review` at 200000 / $5 and a profile
    /// `cheap` at 100000 / $1.
    fn config() -> ConfigModel {
        let mut config = ConfigModel::default();
        config.global.max_tokens = int(500_000, file("max_tokens"));
        config.global.max_cost_usd = int(20, file("max_cost_usd"));
        config.task_types.insert(
            "review".into(),
            LevelSettings {
                max_tokens: int(200_000, file("task_types.review.max_tokens")),
                max_cost_usd: float(5.0, file("task_types.review.max_cost_usd")),
                ..LevelSettings::default()
            },
        );
        config.profiles.insert(
            "cheap".into(),
            ProfileSettings {
                max_tokens: int(100_000, file("profiles.cheap.max_tokens")),
                max_cost_usd: float(1.0, file("profiles.cheap.max_cost_usd")),
                ..ProfileSettings::default()
            },
        );
        config
    }

    fn cheap() -> Option<(String, Origin)> {
        Some(("cheap".into(), Origin::Flag("--profile".into())))
    }

    #[test]
    fn nothing_set_means_no_budget_from_the_default() {
        let config = ConfigModel::default();
        let r = resolve(&SpendRequest::new(&config)).unwrap();
        assert_eq!((r.max_tokens(), r.max_cost_usd()), (None, None));
        assert_eq!(
            (r.tokens.source.as_str(), r.cost.source.as_str()),
            ("default", "default")
        );
        assert_eq!((r.tokens.source_file, r.cost.source_file), (None, None));
        assert!(r.warnings.is_empty());
        // Built-in profiles set neither.
        for (name, _) in stepguard_core::budget::BUILTIN_PROFILES {
            let r = resolve(&SpendRequest {
                profile: Some(((*name).into(), Origin::Flag("--profile".into()))),
                ..SpendRequest::new(&config)
            })
            .unwrap();
            assert_eq!((r.max_tokens(), r.max_cost_usd()), (None, None), "{name}");
        }
    }

    #[test]
    fn each_level_beats_the_ones_below_and_names_itself() {
        let config = config();
        let req = |f: LevelSettings, e: LevelSettings, task: Option<&'static str>| SpendRequest {
            flags: f,
            env: e,
            profile: None,
            task_type: task,
            config: &config,
        };
        let cases = [
            (
                req(
                    flags(Some("1000"), Some("0.5")),
                    env(Some("2000"), Some("0.75")),
                    Some("review"),
                ),
                (1000, "--max-tokens"),
                (0.5, "--max-cost-usd"),
            ),
            (
                req(
                    flags(None, None),
                    env(Some("2000"), Some("0.75")),
                    Some("review"),
                ),
                (2000, "env STEPGUARD_MAX_TOKENS"),
                (0.75, "env STEPGUARD_MAX_COST_USD"),
            ),
            (
                req(flags(None, None), env(None, None), Some("review")),
                (200_000, "task_types.review.max_tokens"),
                (5.0, "task_types.review.max_cost_usd"),
            ),
            (
                req(flags(None, None), env(None, None), Some("other")),
                (500_000, "max_tokens"),
                (20.0, "max_cost_usd"),
            ),
            (
                req(flags(None, None), env(None, None), None),
                (500_000, "max_tokens"),
                (20.0, "max_cost_usd"),
            ),
        ];
        for (request, (tokens, tokens_source), (cost, cost_source)) in cases {
            let r = resolve(&request).unwrap();
            assert_eq!(
                (r.max_tokens(), r.tokens.source.as_str()),
                (Some(tokens), tokens_source)
            );
            assert_eq!(
                (r.max_cost_usd(), r.cost.source.as_str()),
                (Some(cost), cost_source)
            );
            assert!(r.warnings.is_empty());
        }
        let r = resolve(&req(flags(None, None), env(None, None), Some("review"))).unwrap();
        assert_eq!(r.tokens.source_file.as_deref(), Some("/p/stepguard.toml"));
        assert_eq!(r.cost.source_file.as_deref(), Some("/p/stepguard.toml"));
        let r = resolve(&req(flags(Some("5"), None), env(None, None), None)).unwrap();
        assert_eq!(r.tokens.source_file, None);
        // The two budgets resolve independently: the flag sets tokens, the file sets cost.
        assert_eq!(
            (r.tokens.source.as_str(), r.cost.source.as_str()),
            ("--max-tokens", "max_cost_usd")
        );
    }

    #[test]
    fn the_defaults_table_names_itself() {
        let mut config = ConfigModel::default();
        config.global.max_tokens = int(9000, file("defaults.max_tokens"));
        let r = resolve(&SpendRequest::new(&config)).unwrap();
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str()),
            (Some(9000), "defaults.max_tokens")
        );
    }

    #[test]
    fn a_profile_is_the_default_and_bounds_an_explicit_budget() {
        let config = config();
        let with = |f: LevelSettings, task: Option<&'static str>| {
            resolve(&SpendRequest {
                flags: f,
                profile: cheap(),
                task_type: task,
                ..SpendRequest::new(&config)
            })
            .unwrap()
        };
        // The global 500000 / $20 are above cheap's 100000 / $1: the profile lowers them.
        let r = with(flags(None, None), None);
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str(), r.tokens.explicit),
            (
                Some(100_000),
                "profiles.cheap.max_tokens",
                Some(Some(500_000))
            )
        );
        assert_eq!(
            (r.max_cost_usd(), r.cost.source.as_str(), r.cost.explicit),
            (Some(1.0), "profiles.cheap.max_cost_usd", Some(Some(20.0)))
        );
        assert_eq!(r.tokens.source_file.as_deref(), Some("/p/stepguard.toml"));
        // Tighter explicit budgets stand; `unlimited` cannot loosen the profile.
        let r = with(flags(Some("5000"), Some("0.25")), None);
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str(), r.tokens.explicit),
            (Some(5000), "--max-tokens", None)
        );
        assert_eq!(
            (r.max_cost_usd(), r.cost.source.as_str()),
            (Some(0.25), "--max-cost-usd")
        );
        let r = with(flags(Some("unlimited"), Some("OFF")), None);
        assert_eq!(
            (r.max_tokens(), r.tokens.explicit),
            (Some(100_000), Some(None))
        );
        assert_eq!((r.max_cost_usd(), r.cost.explicit), (Some(1.0), Some(None)));
        // Alone, the profile is the budget.
        let mut config = config.clone();
        config.global = LevelSettings::default();
        let r = resolve(&SpendRequest {
            profile: cheap(),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str(), r.tokens.explicit),
            (Some(100_000), "profiles.cheap.max_tokens", None)
        );
        // The config's `profile` counts too, below the flag's.
        config.profile = Some(("cheap".into(), file("profile")));
        let r = resolve(&SpendRequest::new(&config)).unwrap();
        assert_eq!(r.max_tokens(), Some(100_000));
        let r = resolve(&SpendRequest {
            profile: Some(("strict".into(), Origin::Flag("--profile".into()))),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str()),
            (None, "default")
        );
    }

    #[test]
    fn an_unlimited_profile_bounds_nothing_and_unknown_profiles_contribute_nothing() {
        let mut config = ConfigModel::default();
        config.profiles.insert(
            "open".into(),
            ProfileSettings {
                max_tokens: text("unlimited", file("profiles.open.max_tokens")),
                ..ProfileSettings::default()
            },
        );
        let r = resolve(&SpendRequest {
            flags: flags(Some("700"), None),
            profile: Some(("open".into(), Origin::Flag("--profile".into()))),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str()),
            (Some(700), "--max-tokens")
        );
        let r = resolve(&SpendRequest {
            profile: Some(("nosuch".into(), Origin::Flag("--profile".into()))),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.max_tokens(), None);
    }

    fn with_ceilings(mut config: ConfigModel, tokens: u64, cost: f64) -> ConfigModel {
        config.policy.max_tokens_ceiling = Some((tokens, policy_file("policy.max_tokens_ceiling")));
        config.policy.max_cost_usd_ceiling =
            Some((cost, policy_file("policy.max_cost_usd_ceiling")));
        config
    }

    #[test]
    fn the_ceiling_bounds_every_level_and_names_the_policy() {
        let config = with_ceilings(config(), 300_000, 10.0);
        // The global 500000 / $20 are above the ceiling.
        let r = resolve(&SpendRequest::new(&config)).unwrap();
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str()),
            (
                Some(300_000),
                "policy max_tokens_ceiling (/etc/stepguard/stepguard.toml)"
            )
        );
        assert_eq!(
            r.tokens.source_file.as_deref(),
            Some("/etc/stepguard/stepguard.toml")
        );
        assert_eq!(r.tokens.uncapped, Some(Some(500_000)));
        assert_eq!(
            (r.max_cost_usd(), r.cost.source.as_str()),
            (
                Some(10.0),
                "policy max_cost_usd_ceiling (/etc/stepguard/stepguard.toml)"
            )
        );
        assert_eq!(
            r.warnings,
            [
                "/p/stepguard.toml: max_tokens asks for 500000 tokens, above the policy ceiling \
                 of 300000 set in /etc/stepguard/stepguard.toml: policy.max_tokens_ceiling; \
                 using 300000",
                "/p/stepguard.toml: max_cost_usd asks for $20.00, above the policy ceiling of \
                 $10.00 set in /etc/stepguard/stepguard.toml: policy.max_cost_usd_ceiling; \
                 using $10.00",
            ]
        );
        // Flags, env and unlimited cannot raise it.
        let r = resolve(&SpendRequest {
            flags: flags(Some("unlimited"), Some("12.125")),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_tokens(), r.max_cost_usd()),
            (Some(300_000), Some(10.0))
        );
        assert_eq!(
            (r.tokens.uncapped, r.cost.uncapped),
            (Some(None), Some(Some(12.125)))
        );
        assert_eq!(
            r.warnings,
            [
                "--max-tokens asks for unlimited tokens, above the policy ceiling of 300000 set \
                 in /etc/stepguard/stepguard.toml: policy.max_tokens_ceiling; using 300000",
                "--max-cost-usd asks for $12.125, above the policy ceiling of $10.00 set in \
                 /etc/stepguard/stepguard.toml: policy.max_cost_usd_ceiling; using $10.00",
            ]
        );
        let r = resolve(&SpendRequest {
            env: env(Some("400000"), None),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(r.max_tokens(), Some(300_000));
        assert!(r.warnings[0].starts_with("env STEPGUARD_MAX_TOKENS asks for 400000 tokens"));
    }

    #[test]
    fn budgets_under_the_ceiling_are_untouched_and_no_budget_becomes_it_silently() {
        let config = with_ceilings(config(), 300_000, 10.0);
        let r = resolve(&SpendRequest {
            task_type: Some("review"),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_tokens(), r.tokens.source.as_str(), r.tokens.uncapped),
            (Some(200_000), "task_types.review.max_tokens", None)
        );
        assert_eq!(r.max_cost_usd(), Some(5.0));
        assert!(r.warnings.is_empty());
        // Exactly at the ceiling keeps its own source.
        let r = resolve(&SpendRequest {
            flags: flags(Some("300000"), Some("10")),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.tokens.source.as_str(), r.cost.source.as_str()),
            ("--max-tokens", "--max-cost-usd")
        );
        // With nothing set, the ceiling is the budget, without a warning.
        let config = with_ceilings(ConfigModel::default(), 300_000, 10.0);
        let r = resolve(&SpendRequest::new(&config)).unwrap();
        assert_eq!(
            (r.max_tokens(), r.max_cost_usd()),
            (Some(300_000), Some(10.0))
        );
        assert_eq!(
            r.cost.source,
            "policy max_cost_usd_ceiling (/etc/stepguard/stepguard.toml)"
        );
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn the_ceiling_bounds_a_profile_with_a_warning_naming_it() {
        let mut config = with_ceilings(config(), 50_000, 0.5);
        config.global = LevelSettings::default();
        let r = resolve(&SpendRequest {
            profile: cheap(),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            (r.max_tokens(), r.max_cost_usd()),
            (Some(50_000), Some(0.5))
        );
        assert!(
            r.warnings[0]
                .starts_with("/p/stepguard.toml: profiles.cheap.max_tokens asks for 100000 tokens"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn bad_flag_or_env_values_are_errors_naming_their_source() {
        let config = ConfigModel::default();
        let tokens = [
            ("0", "0 is not a valid budget"),
            ("-3", "-3 is negative"),
            (
                "1000000000001",
                "1000000000001 is above the maximum of 1000000000000",
            ),
            (
                "99999999999999999999",
                "99999999999999999999 is above the maximum of 1000000000000",
            ),
            ("2.5", "\"2.5\" is not a whole number"),
            ("lots", "\"lots\" is not a number"),
            ("", "\"\" is not a number"),
        ];
        for (value, text) in tokens {
            let err = resolve(&SpendRequest {
                flags: flags(Some("5"), None),
                env: env(Some(value), None),
                ..SpendRequest::new(&config)
            })
            .unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid token budget at env STEPGUARD_MAX_TOKENS: {text}; use a whole \
                     number of tokens from 1 to 1000000000000, or \"unlimited\""
                )
            );
            assert!(matches!(
                err,
                LimitError::InvalidValue {
                    limit: LimitName::Tokens,
                    ..
                }
            ));
        }
        let costs = [
            ("0", "0 is not a valid budget"),
            ("0.0", "0.0 is not a valid budget"),
            ("-1.5", "-1.5 is negative"),
            ("1000000.01", "1000000.01 is above the maximum of 1000000"),
            ("0.00001", "0.00001 has more than 4 decimals"),
            ("2.12345", "2.12345 has more than 4 decimals"),
            ("$2.50", "\"$2.50\" is not a number"),
            ("1e3", "\"1e3\" is not a number"),
            ("inf", "\"inf\" is not a number"),
            ("NaN", "\"NaN\" is not a number"),
            ("two", "\"two\" is not a number"),
        ];
        for (value, text) in costs {
            let err = resolve(&SpendRequest {
                flags: flags(None, Some(value)),
                ..SpendRequest::new(&config)
            })
            .unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid cost budget at --max-cost-usd: {text}; use a number of US dollars \
                     above 0 and at most 1000000 with at most 4 decimals (e.g. 2.50), or \
                     \"unlimited\""
                )
            );
        }
    }

    #[test]
    fn invalid_lower_levels_are_reported_even_when_shadowed() {
        let mut config = config();
        config.task_types.get_mut("review").unwrap().max_cost_usd =
            text("cheap", file("task_types.review.max_cost_usd"));
        let err = resolve(&SpendRequest {
            flags: flags(None, Some("3")),
            task_type: Some("review"),
            ..SpendRequest::new(&config)
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cost budget at /p/stepguard.toml: task_types.review.max_cost_usd: \"cheap\" \
             is not a number; use a number of US dollars above 0 and at most 1000000 with at \
             most 4 decimals (e.g. 2.50), or \"unlimited\""
        );
        // The selected profile's value is checked too.
        let mut config = self::config();
        config.profiles.get_mut("cheap").unwrap().max_tokens =
            int(0, file("profiles.cheap.max_tokens"));
        let err = resolve(&SpendRequest {
            flags: flags(Some("10"), None),
            profile: cheap(),
            ..SpendRequest::new(&config)
        })
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid token budget at /p/stepguard.toml: profiles.cheap.max_tokens: 0 is not a valid budget"),
            "{err}"
        );
    }

    #[test]
    fn raw_token_values_from_files() {
        assert_eq!(parse_max_tokens(&RawValue::Integer(1)), Ok(Some(1)));
        assert_eq!(
            parse_max_tokens(&RawValue::Integer(1_000_000_000_000)),
            Ok(Some(MAX_TOKENS_LIMIT))
        );
        assert_eq!(
            parse_max_tokens(&RawValue::Text(" Unlimited ".into())),
            Ok(None)
        );
        assert_eq!(parse_max_tokens(&RawValue::Text("off".into())), Ok(None));
        assert_eq!(
            parse_max_tokens(&RawValue::Text("250000".into())),
            Ok(Some(250_000))
        );
        let err = |raw: RawValue| parse_max_tokens(&raw).unwrap_err().to_string();
        assert_eq!(
            err(RawValue::Float(1e6)),
            "1000000.0 is a float; use a whole number of tokens from 1 to 1000000000000, or \
             \"unlimited\", written without a decimal point or exponent"
        );
        assert!(err(RawValue::Float(2.5)).starts_with("2.5 is not a whole number; use"));
        assert!(err(RawValue::Float(f64::INFINITY)).starts_with("inf is not a finite number"));
        assert_eq!(
            err(RawValue::Other("a boolean".into())),
            "expected a whole number of tokens from 1 to 1000000000000, or \"unlimited\", \
             found a boolean"
        );
        assert!(err(RawValue::Integer(-1)).starts_with("-1 is negative"));
    }

    #[test]
    fn raw_cost_values_from_files() {
        assert_eq!(parse_max_cost_usd(&RawValue::Float(2.5)), Ok(Some(2.5)));
        assert_eq!(
            parse_max_cost_usd(&RawValue::Float(0.0001)),
            Ok(Some(0.0001))
        );
        assert_eq!(
            parse_max_cost_usd(&RawValue::Float(0.1234)),
            Ok(Some(0.1234))
        );
        assert_eq!(parse_max_cost_usd(&RawValue::Integer(3)), Ok(Some(3.0)));
        assert_eq!(
            parse_max_cost_usd(&RawValue::Integer(1_000_000)),
            Ok(Some(MAX_COST_USD_LIMIT))
        );
        assert_eq!(
            parse_max_cost_usd(&RawValue::Text("2.50".into())),
            Ok(Some(2.5))
        );
        assert_eq!(
            parse_max_cost_usd(&RawValue::Text(".5".into())),
            Ok(Some(0.5))
        );
        assert_eq!(
            parse_max_cost_usd(&RawValue::Text("2.50000".into())),
            Ok(Some(2.5))
        );
        assert_eq!(
            parse_max_cost_usd(&RawValue::Text("unlimited".into())),
            Ok(None)
        );
        let err = |raw: RawValue| parse_max_cost_usd(&raw).unwrap_err().to_string();
        assert!(err(RawValue::Integer(0)).starts_with("0 is not a valid budget; use a number"));
        assert!(err(RawValue::Integer(-2)).starts_with("-2 is negative"));
        assert!(err(RawValue::Integer(1_000_001)).starts_with("1000001 is above the maximum"));
        assert!(err(RawValue::Float(-0.0)).starts_with("-0 is not a valid budget"));
        assert!(err(RawValue::Float(0.12345)).starts_with("0.12345 has more than 4 decimals"));
        assert!(err(RawValue::Float(f64::NAN)).starts_with("NaN is not a finite number"));
        assert!(err(RawValue::Float(1e7)).starts_with("10000000 is above the maximum"));
        assert!(err(RawValue::Other("an array".into())).ends_with("found an array"));
    }

    #[test]
    fn ceilings_are_validated() {
        assert_eq!(parse_max_tokens_ceiling(&RawValue::Integer(5000)), Ok(5000));
        assert_eq!(parse_max_cost_usd_ceiling(&RawValue::Float(7.5)), Ok(7.5));
        assert_eq!(parse_max_cost_usd_ceiling(&RawValue::Integer(7)), Ok(7.0));
        let cases: [(RawValue, &str); 4] = [
            (RawValue::Integer(0), "0 is not a valid ceiling"),
            (
                RawValue::Text("unlimited".into()),
                "\"unlimited\" is not a valid ceiling",
            ),
            (RawValue::Float(2.5), "2.5 is not a valid ceiling"),
            (
                RawValue::Other("a boolean".into()),
                "a boolean is not a valid ceiling",
            ),
        ];
        for (raw, text) in cases {
            assert_eq!(
                parse_max_tokens_ceiling(&raw).unwrap_err().to_string(),
                format!("{text}; use a whole number of tokens from 1 to 1000000000000")
            );
        }
        assert_eq!(
            parse_max_cost_usd_ceiling(&RawValue::Text("off".into()))
                .unwrap_err()
                .to_string(),
            "\"off\" is not a valid ceiling; use a number of US dollars above 0 and at most \
             1000000 with at most 4 decimals"
        );
        // A model built by hand with an out-of-range ceiling is refused, not applied.
        let config = with_ceilings(ConfigModel::default(), 0, 1.0);
        let err = resolve(&SpendRequest::new(&config)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid token budget at /etc/stepguard/stepguard.toml: policy.max_tokens_ceiling: 0 \
             is not a valid ceiling; use a whole number of tokens from 1 to 1000000000000"
        );
        let config = with_ceilings(ConfigModel::default(), 10, f64::NAN);
        assert!(resolve(&SpendRequest::new(&config)).is_err());
    }

    #[test]
    fn resolved_spend_serializes_with_null_for_no_budget() {
        let config = ConfigModel::default();
        let r = resolve(&SpendRequest {
            flags: flags(Some("1000"), None),
            ..SpendRequest::new(&config)
        })
        .unwrap();
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({
                "tokens": {"value": 1000, "source": "--max-tokens", "source_file": null},
                "cost": {"value": null, "source": "default", "source_file": null},
                "warnings": []
            })
        );
    }

    #[test]
    fn dollars_show_cents() {
        assert_eq!(dollars(2.5), "$2.50");
        assert_eq!(dollars(3.0), "$3.00");
        assert_eq!(dollars(0.125), "$0.125");
    }
}
