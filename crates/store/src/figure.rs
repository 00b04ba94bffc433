//! Figures read out of a run: its tokens as `--max-tokens` counts them, and a column's number as
//! `stats` takes it (a saturated integer, a finite real).

use rusqlite::types::ValueRef;

use stepguard_core::RunRecord;

/// Returns a run's tokens as `--max-tokens` counts them: input + output.
pub(crate) fn total_tokens(r: &RunRecord) -> Option<i64> {
    r.usage
        .tokens
        .map(|t| i64::try_from(t.input_tokens.saturating_add(t.output_tokens)).unwrap_or(i64::MAX))
}

/// A value read as SQLite gives it: an integer past `i64::MAX` (a sum that overflowed) comes
/// back real and counts as `i64::MAX`, as [`total_tokens`] saturates.
pub(crate) fn int(v: ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(i) => Some(i),
        ValueRef::Real(f) if f >= i64::MAX as f64 => Some(i64::MAX),
        ValueRef::Real(f) => Some(f as i64),
        _ => None,
    }
}

/// A real as SQLite gives it (an integer widened); not finite is none.
pub(crate) fn real(v: ValueRef<'_>) -> Option<f64> {
    match v {
        ValueRef::Integer(i) => Some(i as f64),
        ValueRef::Real(f) => Some(f).filter(|f| f.is_finite()),
        _ => None,
    }
}
