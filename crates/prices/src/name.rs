//! How a model name as an agent reports it is turned into a key of the table.
//!
//! The rules only ever remove parts that do not change which model is meant: the case, a
//! provider's routing prefix, a snapshot's date or a three-digit version. They never shorten a
//! name by a word (`-mini`, `-lite`, `-5`), so `gpt-4o-mini` cannot be priced as `gpt-4o`, nor
//! `claude-sonnet-4-5` as `claude-sonnet-4`.

/// Routing prefixes that name the provider, not the model, stripped (repeatedly) before a
/// second lookup.
pub(crate) const PROVIDER_PREFIXES: &[&str] =
    &["anthropic/", "openai/", "google/", "gemini/", "models/"];

/// Returns the form names are compared in: trimmed and lowercase.
pub(crate) fn fold(name: &str) -> String {
    name.trim().to_lowercase()
}

/// Returns `name` (already folded) without its provider prefixes.
pub(crate) fn strip_provider(mut name: &str) -> &str {
    while let Some(rest) = PROVIDER_PREFIXES
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
    {
        name = rest;
    }
    name
}

/// Returns `name` (already folded) without a snapshot suffix, when it has one: `-YYYYMMDD`
/// (Anthropic), `-YYYY-MM-DD` (OpenAI), `@YYYYMMDD` (Vertex AI) or a three-digit version such
/// as `-001` (Google's stable versions).
pub(crate) fn strip_snapshot(name: &str) -> Option<&str> {
    let (base, tail) = name.rsplit_once(['-', '@'])?;
    if is_compact_date(tail) || is_version(tail) {
        return non_empty(base);
    }
    let (rest, day) = name.rsplit_once('-')?;
    let (rest, month) = rest.rsplit_once('-')?;
    let (base, year) = rest.rsplit_once(['-', '@'])?;
    if is_date(year, month, day) {
        return non_empty(base);
    }
    None
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

fn is_version(s: &str) -> bool {
    s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit())
}

fn is_compact_date(s: &str) -> bool {
    s.len() == 8
        && s.is_char_boundary(4)
        && s.is_char_boundary(6)
        && is_date(&s[..4], &s[4..6], &s[6..])
}

/// Returns true when the three parts are a plausible date of this century (a snapshot date).
fn is_date(year: &str, month: &str, day: &str) -> bool {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let shaped = digits(year, 4) && digits(month, 2) && digits(day, 2);
    if !(shaped && year.starts_with("20")) {
        return false;
    }
    let (Ok(y), Ok(m), Ok(d)) = (year.parse(), month.parse(), day.parse()) else {
        return false;
    };
    valid_date(y, m, d)
}

/// Returns true when `year-month-day` is a day of the Gregorian calendar.
pub(crate) fn valid_date(year: u32, month: u32, day: u32) -> bool {
    let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// Returns a model name as a TOML key segment: bare when TOML allows it, quoted otherwise.
pub(crate) fn key_segment(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bare {
        name.to_owned()
    } else {
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_provider_prefixes_only() {
        assert_eq!(
            strip_provider("anthropic/claude-sonnet-4-5"),
            "claude-sonnet-4-5"
        );
        assert_eq!(strip_provider("openai/gpt-4o"), "gpt-4o");
        assert_eq!(strip_provider("models/gemini-2.5-pro"), "gemini-2.5-pro");
        assert_eq!(
            strip_provider("google/models/gemini-2.5-pro"),
            "gemini-2.5-pro"
        );
        assert_eq!(
            strip_provider("gemini/gemini-2.5-flash"),
            "gemini-2.5-flash"
        );
        // Other hosts may price differently: their prefixes stay.
        assert_eq!(strip_provider("azure/gpt-4o"), "azure/gpt-4o");
        assert_eq!(strip_provider("ft:gpt-4o"), "ft:gpt-4o");
    }

    #[test]
    fn strips_snapshot_dates_and_versions() {
        let cases = [
            ("claude-sonnet-4-5-20250929", Some("claude-sonnet-4-5")),
            ("claude-sonnet-4-5@20250929", Some("claude-sonnet-4-5")),
            ("gpt-4o-2024-08-06", Some("gpt-4o")),
            ("o3-2025-04-16", Some("o3")),
            ("gemini-2.0-flash-001", Some("gemini-2.0-flash")),
            ("gpt-4o-mini-2024-07-18", Some("gpt-4o-mini")),
            // Not snapshots: words, versions of the model, month-day previews, odd dates.
            ("gpt-4o-mini", None),
            ("claude-sonnet-4-5", None),
            ("claude-sonnet-4", None),
            ("gemini-2.5-flash-lite", None),
            ("gemini-2.5-pro-preview-06-05", None),
            ("gpt-3.5-turbo-0125", None),
            ("gpt-4o-2024-13-01", None),
            ("gpt-4o-2024-02-30", None),
            ("claude-x-20251301", None),
            ("claude-x-19991231", None),
            ("gpt-4o-2024-8-6", None),
            ("-20250929", None),
            ("20250929", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(strip_snapshot(name), want, "{name}");
        }
    }

    #[test]
    fn checks_calendar_dates() {
        assert!(valid_date(2024, 2, 29));
        assert!(!valid_date(2025, 2, 29));
        assert!(!valid_date(2100, 2, 29));
        assert!(valid_date(2000, 2, 29));
        assert!(!valid_date(2025, 4, 31));
        assert!(!valid_date(2025, 0, 1));
        assert!(!valid_date(2025, 1, 0));
    }

    #[test]
    fn quotes_key_segments_when_toml_needs_it() {
        assert_eq!(key_segment("gpt-4o"), "gpt-4o");
        assert_eq!(key_segment("gpt-4.1"), "\"gpt-4.1\"");
        assert_eq!(key_segment(""), "\"\"");
        assert_eq!(key_segment("a\"b"), "\"a\\\"b\"");
    }
}
