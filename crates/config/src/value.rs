//! Values before and after validation: a raw value with where it was set, why a value of any
//! limit was refused, and the one error of the precedence ladder ([`LimitError`]).
//!
//! Every limit (steps, tokens, cost, loop limit) refuses bad values with the same
//! error type: [`LimitError::InvalidValue`] names the limit, where the value was set and why it
//! was refused ([`InvalidValue`], whose texts say what the limit accepts).

use std::fmt;

/// A value as it arrived from a flag, an environment variable or a config file, before validation.
#[derive(Clone, Debug, PartialEq)]
pub enum RawValue {
    /// An integer (TOML integer).
    Integer(i64),
    /// A float (TOML float).
    Float(f64),
    /// Text (flags, env vars, TOML strings such as `"unlimited"`).
    Text(String),
    /// Anything else, named by its type (e.g. `"a boolean"`).
    Other(String),
}

impl RawValue {
    /// Shows the value in a message: numbers as written, text quoted, other types by name.
    pub fn shown(&self) -> String {
        match self {
            RawValue::Integer(n) => n.to_string(),
            RawValue::Float(f) => f.to_string(),
            RawValue::Text(s) => format!("{s:?}"),
            RawValue::Other(kind) => kind.clone(),
        }
    }
}

/// Where a setting came from, precise enough to point a user at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag such as `--max-steps`.
    Flag(String),
    /// An environment variable such as `STEPGUARD_MAX_STEPS`.
    Env(String),
    /// A key in a config file, e.g. `task_types.review.max_steps` in `/repo/stepguard.toml`.
    File {
        /// Path of the config file, as displayed.
        path: String,
        /// Dotted key path inside the file.
        key: String,
    },
}

impl Origin {
    /// Returns the short source label used in `config --json`, e.g. `env STEPGUARD_MAX_STEPS`.
    pub fn label(&self) -> String {
        match self {
            Origin::Flag(flag) => flag.clone(),
            Origin::Env(var) => format!("env {var}"),
            Origin::File { key, .. } => key.clone(),
        }
    }

    /// Returns the config file path, when the setting came from a file.
    pub fn file(&self) -> Option<&str> {
        match self {
            Origin::File { path, .. } => Some(path),
            _ => None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => f.write_str(flag),
            Origin::Env(var) => write!(f, "env {var}"),
            Origin::File { path, key } => write!(f, "{path}: {key}"),
        }
    }
}

/// A raw value together with where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    /// The unvalidated value.
    pub value: RawValue,
    /// Where it was set.
    pub origin: Origin,
}

impl Setting {
    /// Creates a setting from a flag or env value given as text.
    pub fn text(value: impl Into<String>, origin: Origin) -> Self {
        Setting {
            value: RawValue::Text(value.into()),
            origin,
        }
    }
}

/// Which limit a value is for, as error messages name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitName {
    /// `max_steps` (and the legacy `max_turns`): "budget".
    Steps,
    /// `max_tokens`: "token budget".
    Tokens,
    /// `max_cost_usd`: "cost budget".
    Cost,
    /// `loop_limit` / `loops.limit`: "loop limit".
    LoopLimit,
}

impl fmt::Display for LimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitName::Steps => "budget",
            LimitName::Tokens => "token budget",
            LimitName::Cost => "cost budget",
            LimitName::LoopLimit => "loop limit",
        })
    }
}

/// Why a value of a limit was refused. `value` is the value as given (quoted when it was text
/// that is not a number); `expected` says what the limit accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidValue {
    /// Zero would stop every run before it starts.
    #[error("{value} is not a valid budget; use {expected}")]
    Zero {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Negative amounts mean nothing.
    #[error("{value} is negative; use {expected}")]
    Negative {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Below the smallest value that means something (a loop is a call made at least twice).
    #[error("{value} is below 2 (a loop is a call made at least twice); use {expected}")]
    TooSmall {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Above the limit's maximum.
    #[error("{value} is above the maximum of {max}; use {expected}")]
    TooLarge {
        /// The value given.
        value: String,
        /// The maximum.
        max: &'static str,
        /// What is accepted.
        expected: &'static str,
    },
    /// A step budget above the documented ceiling, for which `unlimited` is the answer.
    #[error("{value} is above the ceiling of {max}; use \"unlimited\" for no limit")]
    AboveCeiling {
        /// The value given.
        value: String,
        /// The ceiling.
        max: &'static str,
    },
    /// A fractional number.
    #[error("{value} is not a whole number; use {expected}")]
    NotWhole {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A fractional step budget (said without the accepted range, as it always was).
    #[error("{value} is not a whole number")]
    Fractional {
        /// The value given, quoted.
        value: String,
    },
    /// A whole number written as a TOML float (`1e6`, `1000.0`) where a float is refused.
    #[error("{value} is a float; use {expected}, written without a decimal point or exponent")]
    Float {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A cost finer than the decimals accepted.
    #[error("{value} has more than 4 decimals; use {expected}")]
    TooPrecise {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// `inf` or `nan` (TOML allows both).
    #[error("{value} is not a finite number; use {expected}")]
    NotFinite {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Text that is not a number nor a word the limit accepts (`unlimited`, `off`).
    #[error("{value} is not a number; use {expected}")]
    NotANumber {
        /// The value given, quoted.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A value of the wrong type (a boolean, an array …).
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The type found, e.g. `a boolean`.
        found: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A policy ceiling that is not a valid amount; `unlimited` is refused too, since it would
    /// bound nothing.
    #[error("{value} is not a valid ceiling; use {expected}")]
    InvalidCeiling {
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

/// A limit that could not be resolved: the one error of the precedence ladder, for every limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// A value is present but invalid.
    #[error("invalid {limit} at {origin}: {reason}")]
    InvalidValue {
        /// Which limit.
        limit: LimitName,
        /// Where the bad value was set.
        origin: Origin,
        /// What is wrong with it.
        #[source]
        reason: InvalidValue,
    },
    /// A profile name that is neither built in nor defined in `[profiles.NAME]`.
    #[error("unknown profile `{name}` (from {origin}); known profiles: {known}")]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// Where it was asked for.
        origin: Origin,
        /// Comma-separated known names.
        known: String,
    },
}

impl LimitError {
    /// Returns the error for a bad value of `limit` set at `origin`.
    pub fn invalid(limit: LimitName, origin: &Origin, reason: InvalidValue) -> Self {
        LimitError::InvalidValue {
            limit,
            origin: origin.clone(),
            reason,
        }
    }
}

/// A loop limit: the same call (or cycle) this many times is a loop, or no loop detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopLimit {
    /// This many recurrences are a loop (2 to 1000, `loop_settings::MAX_LOOP_SETTING`).
    Limited(u32),
    /// No loop detection.
    Off,
}

impl LoopLimit {
    /// Returns the finite limit, or `None` when off.
    pub const fn get(self) -> Option<u32> {
        match self {
            LoopLimit::Limited(n) => Some(n),
            LoopLimit::Off => None,
        }
    }

    /// Returns the tighter of two limits (`off` is the loosest).
    pub fn min(self, other: LoopLimit) -> LoopLimit {
        match (self, other) {
            (LoopLimit::Limited(a), LoopLimit::Limited(b)) => LoopLimit::Limited(a.min(b)),
            (LoopLimit::Limited(a), LoopLimit::Off) | (LoopLimit::Off, LoopLimit::Limited(a)) => {
                LoopLimit::Limited(a)
            }
            (LoopLimit::Off, LoopLimit::Off) => LoopLimit::Off,
        }
    }
}

impl fmt::Display for LoopLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoopLimit::Limited(n) => write!(f, "{n}"),
            LoopLimit::Off => f.write_str("off"),
        }
    }
}

impl serde::Serialize for LoopLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LoopLimit::Limited(n) => s.serialize_u32(*n),
            LoopLimit::Off => s.serialize_none(),
        }
    }
}
