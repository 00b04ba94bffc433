//! Step budgets as every crate agrees on them: the [`StepLimit`] value, the default budget, the
//! largest finite budget, and the built-in profiles' budgets.
//!
//! Where a run's budget comes from (flags, environment, config files, profile, policy ceiling)
//! is decided by the precedence ladder of `stepguard-config`; this module holds only what that
//! ladder, the runner, the governor and the run record share.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The budget used when nothing else sets one.
pub const DEFAULT_MAX_STEPS: u32 = 50;

/// The largest finite budget accepted; anything above is almost certainly a typo.
///
/// Use `unlimited` for observe-only runs instead of a huge number.
pub const MAX_STEPS_CEILING: u32 = 100_000;

/// The profiles every stepguard knows, with their built-in budgets.
///
/// * `smoke` (5): enough for an agent to start, act once or twice and answer; for checking wiring.
/// * `strict` (15): a small, reviewable change; runs that need more should say so explicitly.
/// * `fast` (30): ordinary tasks, stopped well before a runaway gets expensive.
/// * `yolo` (250): long autonomous runs; still a hard ceiling, because nothing in stepguard is
///   silently unlimited (say `unlimited` for that).
pub const BUILTIN_PROFILES: &[(&str, u32)] =
    &[("smoke", 5), ("strict", 15), ("fast", 30), ("yolo", 250)];

/// A step limit: at most N steps, or no limit at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepLimit {
    /// At most this many steps may happen; step N+1 beginning is over budget.
    Limited(u32),
    /// No limit: the run is observed and counted but never stopped for its step count.
    Unlimited,
}

impl StepLimit {
    /// Returns the finite limit, or `None` when unlimited.
    pub const fn get(self) -> Option<u32> {
        match self {
            StepLimit::Limited(n) => Some(n),
            StepLimit::Unlimited => None,
        }
    }

    /// Returns the tighter of two limits.
    pub fn min(self, other: StepLimit) -> StepLimit {
        match (self, other) {
            (StepLimit::Limited(a), StepLimit::Limited(b)) => StepLimit::Limited(a.min(b)),
            (StepLimit::Limited(a), StepLimit::Unlimited)
            | (StepLimit::Unlimited, StepLimit::Limited(a)) => StepLimit::Limited(a),
            (StepLimit::Unlimited, StepLimit::Unlimited) => StepLimit::Unlimited,
        }
    }
}

impl fmt::Display for StepLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepLimit::Limited(n) => write!(f, "{n}"),
            StepLimit::Unlimited => f.write_str("unlimited"),
        }
    }
}

impl Serialize for StepLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StepLimit::Limited(n) => s.serialize_u32(*n),
            StepLimit::Unlimited => s.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for StepLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<u32>::deserialize(d)? {
            Some(n) => StepLimit::Limited(n),
            None => StepLimit::Unlimited,
        })
    }
}

/// Returns the built-in budget of a profile, if `name` is one.
pub fn builtin_profile(name: &str) -> Option<u32> {
    BUILTIN_PROFILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_serializes_as_number_or_null() {
        assert_eq!(serde_json::to_string(&StepLimit::Limited(3)).unwrap(), "3");
        assert_eq!(
            serde_json::to_string(&StepLimit::Unlimited).unwrap(),
            "null"
        );
        let back: StepLimit = serde_json::from_str("null").unwrap();
        assert_eq!(back, StepLimit::Unlimited);
    }

    #[test]
    fn the_tighter_limit_wins_and_unlimited_is_the_loosest() {
        let (three, five) = (StepLimit::Limited(3), StepLimit::Limited(5));
        assert_eq!(three.min(five), three);
        assert_eq!(StepLimit::Unlimited.min(five), five);
        assert_eq!(
            StepLimit::Unlimited.min(StepLimit::Unlimited),
            StepLimit::Unlimited
        );
        assert_eq!(builtin_profile("strict"), Some(15));
        assert_eq!(builtin_profile("nope"), None);
    }
}
