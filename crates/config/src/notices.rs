//! The staged notices' setting: `[run] notices`, `--notices`, `STEPGUARD_NOTICES`.
//!
//! With the model gateway, the model is told what is left of a limit when the run crosses a
//! share of it. The setting is a list of thresholds, ascending, each strictly between 0 and 1
//! (`[run] notices = [0.5, 0.8, 0.95]`, `--notices 0.5,0.8`), or `off` (`"off"`, `[]`), or
//! `every` (debugging: every model call carries `this is step X of Y` instead). Unset, the
//! thresholds are [`DEFAULT_THRESHOLDS`].
//!
//! ```
//! use stepguard_config::notices::{NoticeSetting, parse};
//! assert_eq!(parse("0.5,0.9"), Ok(NoticeSetting::Thresholds(vec![0.5, 0.9])));
//! assert_eq!(parse("off"), Ok(NoticeSetting::Thresholds(vec![])));
//! assert!(parse("0.9,0.5").is_err());
//! ```

/// The thresholds when nothing sets them.
pub const DEFAULT_THRESHOLDS: [f64; 3] = [0.5, 0.8, 0.95];

/// What the notices setting says.
#[derive(Clone, Debug, PartialEq)]
pub enum NoticeSetting {
    /// Notices at these shares of each limit (empty: none).
    Thresholds(Vec<f64>),
    /// Every model call carries `system notice: this is step X of Y` (debugging).
    EveryStep,
}

impl NoticeSetting {
    /// The thresholds of the staged notices (none for [`NoticeSetting::EveryStep`]).
    pub fn thresholds(&self) -> &[f64] {
        match self {
            NoticeSetting::Thresholds(t) => t,
            NoticeSetting::EveryStep => &[],
        }
    }

    /// Whether any notice is given at all.
    pub fn is_off(&self) -> bool {
        matches!(self, NoticeSetting::Thresholds(t) if t.is_empty())
    }
}

impl Default for NoticeSetting {
    fn default() -> Self {
        NoticeSetting::Thresholds(DEFAULT_THRESHOLDS.to_vec())
    }
}

/// The fix every message about a bad value ends with.
const EXPECTED: &str = "expected thresholds ascending, each between 0 and 1 (exclusive), \
    e.g. 0.5,0.8,0.95; or `off`";

/// Parses the flag's or the environment's text: `off`, `every`, or thresholds separated by
/// commas. The error says what is wrong, without naming the key (the caller names it).
pub fn parse(text: &str) -> Result<NoticeSetting, String> {
    let text = text.trim();
    match text {
        "off" | "" => return Ok(NoticeSetting::Thresholds(Vec::new())),
        "every" => return Ok(NoticeSetting::EveryStep),
        _ => {}
    }
    let values = text
        .split(',')
        .map(|part| {
            let part = part.trim();
            part.parse::<f64>()
                .map_err(|_| format!("`{part}` is not a number; {EXPECTED}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    check(&values)?;
    Ok(NoticeSetting::Thresholds(values))
}

/// Checks thresholds: each in (0, 1), strictly ascending.
pub fn check(values: &[f64]) -> Result<(), String> {
    if let Some(v) = values.iter().find(|v| !(**v > 0.0 && **v < 1.0)) {
        return Err(format!("{v} is not between 0 and 1; {EXPECTED}"));
    }
    if let Some(w) = values.windows(2).find(|w| w[0] >= w[1]) {
        return Err(format!("{} does not come after {}; {EXPECTED}", w[1], w[0]));
    }
    Ok(())
}

/// Reads `[run] notices` from TOML: an array of numbers, or a string as [`parse`] reads it.
pub fn from_toml(value: &toml::Value) -> Result<NoticeSetting, String> {
    match value {
        toml::Value::String(s) => parse(s),
        toml::Value::Array(items) => {
            let values = items
                .iter()
                .map(|v| match v {
                    toml::Value::Float(f) => Ok(*f),
                    toml::Value::Integer(i) => Ok(*i as f64),
                    other => Err(format!(
                        "found {} in the list; {EXPECTED}",
                        other.type_str()
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            check(&values)?;
            Ok(NoticeSetting::Thresholds(values))
        }
        other => Err(format!("found {}; {EXPECTED}", other.type_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_off_and_every_parse() {
        assert_eq!(
            parse(" 0.5, 0.8 ,0.95"),
            Ok(NoticeSetting::Thresholds(vec![0.5, 0.8, 0.95]))
        );
        assert!(parse("off").unwrap().is_off());
        assert_eq!(parse("every"), Ok(NoticeSetting::EveryStep));
        assert_eq!(NoticeSetting::default().thresholds(), DEFAULT_THRESHOLDS);
    }

    #[test]
    fn bad_thresholds_say_what_is_wrong_and_the_fix() {
        for (bad, says) in [
            ("0", "0 is not between 0 and 1"),
            ("1", "1 is not between 0 and 1"),
            ("0.5,1.5", "1.5 is not between 0 and 1"),
            ("-0.2", "-0.2 is not between 0 and 1"),
            ("0.8,0.5", "0.5 does not come after 0.8"),
            ("0.5,0.5", "0.5 does not come after 0.5"),
            ("half", "`half` is not a number"),
            ("0.5,,0.8", "`` is not a number"),
            ("NaN", "NaN is not between 0 and 1"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.starts_with(says), "{bad}: {e}");
            assert!(e.contains("e.g. 0.5,0.8,0.95"), "{bad}: {e}");
        }
    }

    #[test]
    fn toml_takes_a_list_or_a_string() {
        let v = |s: &str| toml::from_str::<toml::Table>(&format!("n = {s}")).unwrap()["n"].clone();
        assert_eq!(
            from_toml(&v("[0.5, 0.9]")),
            Ok(NoticeSetting::Thresholds(vec![0.5, 0.9]))
        );
        assert!(from_toml(&v("[]")).unwrap().is_off());
        assert!(from_toml(&v("\"off\"")).unwrap().is_off());
        assert!(from_toml(&v("[0.9, 0.5]")).is_err());
        assert!(from_toml(&v("[1]")).is_err());
        assert!(
            from_toml(&v("[\"a\"]"))
                .unwrap_err()
                .contains("found string")
        );
        assert!(from_toml(&v("true")).unwrap_err().contains("found boolean"));
    }
}
