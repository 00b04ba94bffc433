//! The window a pool's spend is counted over.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::LedgerError;

/// A calendar unit of a [`Window::Calendar`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalendarUnit {
    /// From midnight to midnight.
    Day,
    /// From Monday midnight to the next.
    Week,
}

/// The window a pool's spend is counted over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// The last `Duration` before now: spend frees as it ages out.
    Rolling(Duration),
    /// The current calendar day or week in a named time zone (IANA, such as `Europe/Paris`;
    /// `UTC` unless one is named, so every host of a fleet agrees): spend frees at its end.
    Calendar {
        /// Day or week.
        unit: CalendarUnit,
        /// The IANA time zone.
        tz: String,
    },
    /// Forever: nothing frees.
    Lifetime,
}

impl Window {
    /// Reads a window as config writes it: a duration (`24h`, `30m`, `7days`) for a rolling
    /// window, `day` or `week` (in `tz`, UTC when `None`), or `none` for a lifetime.
    pub fn parse(text: &str, tz: Option<&str>) -> Result<Window, LedgerError> {
        let bad = |reason: String| LedgerError::Window {
            window: text.to_owned(),
            reason,
        };
        let window = match text.trim() {
            "day" => Window::Calendar {
                unit: CalendarUnit::Day,
                tz: tz.unwrap_or("UTC").to_owned(),
            },
            "week" => Window::Calendar {
                unit: CalendarUnit::Week,
                tz: tz.unwrap_or("UTC").to_owned(),
            },
            "none" => Window::Lifetime,
            other => {
                let span: jiff::Span = other.parse().map_err(|e| {
                    bad(format!(
                        "write a duration such as \"24h\", or \"day\", \"week\" or \"none\" ({e})"
                    ))
                })?;
                let duration = jiff::SignedDuration::try_from(span)
                    .ok()
                    .and_then(|d| Duration::try_from(d).ok())
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| bad("a rolling window is a positive duration of hours or less units (\"24h\", \"168h\")".into()))?;
                Window::Rolling(duration)
            }
        };
        if tz.is_some() && !matches!(window, Window::Calendar { .. }) {
            return Err(bad("a time zone only applies to \"day\" or \"week\"".into()));
        }
        window.check()?;
        Ok(window)
    }

    /// Checks that the window can be computed (its time zone is known).
    pub fn check(&self) -> Result<(), LedgerError> {
        match self {
            Window::Calendar { tz, .. } => zone(tz).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// When the window that holds `now` started: spend charged before it does not count.
    /// `None` for a lifetime window.
    pub fn start(&self, now: SystemTime) -> Result<Option<SystemTime>, LedgerError> {
        match self {
            Window::Rolling(d) => Ok(Some(now.checked_sub(*d).unwrap_or(SystemTime::UNIX_EPOCH))),
            Window::Calendar { unit, tz } => {
                calendar_bounds(*unit, tz, now).map(|(start, _)| Some(start))
            }
            Window::Lifetime => Ok(None),
        }
    }

    /// When spend charged at `at` stops counting: `None` never.
    pub fn frees(&self, at: SystemTime) -> Result<Option<SystemTime>, LedgerError> {
        match self {
            Window::Rolling(d) => Ok(Some(at + *d)),
            Window::Calendar { unit, tz } => {
                calendar_bounds(*unit, tz, at).map(|(_, end)| Some(end))
            }
            Window::Lifetime => Ok(None),
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Window::Rolling(d) => write!(
                f,
                "{:#}",
                jiff::SignedDuration::try_from(*d).unwrap_or(jiff::SignedDuration::MAX)
            ),
            Window::Calendar {
                unit: CalendarUnit::Day,
                tz,
            } => write!(f, "day ({tz})"),
            Window::Calendar {
                unit: CalendarUnit::Week,
                tz,
            } => write!(f, "week ({tz})"),
            Window::Lifetime => f.write_str("none"),
        }
    }
}

fn zone(tz: &str) -> Result<jiff::tz::TimeZone, LedgerError> {
    jiff::tz::TimeZone::get(tz).map_err(|e| LedgerError::Window {
        window: format!("in {tz}"),
        reason: format!("unknown time zone; name one such as \"UTC\" or \"Europe/Paris\" ({e})"),
    })
}

/// The calendar day or week (Monday first) holding `at`, in `tz`.
fn calendar_bounds(
    unit: CalendarUnit,
    tz: &str,
    at: SystemTime,
) -> Result<(SystemTime, SystemTime), LedgerError> {
    let fail = |e: jiff::Error| LedgerError::Window {
        window: format!("{unit:?} in {tz}"),
        reason: e.to_string(),
    };
    let zoned = jiff::Timestamp::try_from(at)
        .map_err(fail)?
        .to_zoned(zone(tz)?);
    let day = zoned.start_of_day().map_err(fail)?;
    let (start, span) = match unit {
        CalendarUnit::Day => (day, jiff::Span::new().days(1)),
        CalendarUnit::Week => {
            let back = i64::from(zoned.weekday().to_monday_zero_offset());
            let monday = day
                .checked_sub(jiff::Span::new().days(back))
                .map_err(fail)?;
            (
                monday.start_of_day().map_err(fail)?,
                jiff::Span::new().weeks(1),
            )
        }
    };
    let end = start
        .checked_add(span)
        .map_err(fail)?
        .start_of_day()
        .map_err(fail)?;
    Ok((
        SystemTime::from(start.timestamp()),
        SystemTime::from(end.timestamp()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        SystemTime::from(text.parse::<jiff::Timestamp>().expect("a timestamp"))
    }

    #[test]
    fn parses_every_form_and_refuses_the_rest() {
        assert_eq!(
            Window::parse("24h", None).ok(),
            Some(Window::Rolling(Duration::from_secs(86_400)))
        );
        assert_eq!(Window::parse("none", None).ok(), Some(Window::Lifetime));
        assert_eq!(
            Window::parse("day", Some("Europe/Paris")).ok(),
            Some(Window::Calendar {
                unit: CalendarUnit::Day,
                tz: "Europe/Paris".into()
            })
        );
        for bad in ["", "daily", "0s", "-1h", "1 fortnight"] {
            assert!(Window::parse(bad, None).is_err(), "{bad:?} accepted");
        }
        assert!(Window::parse("week", Some("Mars/Olympus")).is_err());
        assert!(Window::parse("24h", Some("UTC")).is_err());
    }

    #[test]
    fn calendar_windows_follow_the_zone() {
        // 23:30 UTC on Sunday 2026-03-01 is already Monday 00:30 in Paris.
        let now = at("2026-03-01T23:30:00Z");
        let utc_day = Window::parse("day", None).expect("day");
        assert_eq!(
            utc_day.start(now).expect("start"),
            Some(at("2026-03-01T00:00:00Z"))
        );
        assert_eq!(
            utc_day.frees(now).expect("frees"),
            Some(at("2026-03-02T00:00:00Z"))
        );
        let paris_week = Window::parse("week", Some("Europe/Paris")).expect("week");
        assert_eq!(
            paris_week.start(now).expect("start"),
            Some(at("2026-03-01T23:00:00Z"))
        );
        assert_eq!(
            paris_week.frees(now).expect("frees"),
            Some(at("2026-03-08T23:00:00Z"))
        );
        let rolling = Window::parse("1h", None).expect("1h");
        assert_eq!(
            rolling.start(now).expect("start"),
            Some(at("2026-03-01T22:30:00Z"))
        );
        assert_eq!(Window::Lifetime.frees(now).expect("frees"), None);
    }
}
