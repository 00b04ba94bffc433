//! Reading a prices file's text into a [`PriceTable`], checking every key.

use std::collections::BTreeMap;

use toml::Value;

use crate::name::{fold, key_segment, valid_date};
use crate::{Price, PriceError, PriceTable};

const TOP_KEYS: &[&str] = &["taken", "models"];
const MODEL_KEYS: &[&str] = &[
    "input_per_mtok",
    "output_per_mtok",
    "cached_input_per_mtok",
    "cache_write_per_mtok",
    "source",
    "aliases",
];

/// Parses and validates a prices file; errors name `origin` and the key.
pub(crate) fn parse(text: &str, origin: &str) -> Result<PriceTable, PriceError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
        PriceError::Parse {
            origin: origin.to_owned(),
            line,
            column,
            message: e.message().trim().to_owned(),
        }
    })?;
    let file = File { origin };
    file.check_keys("", &table, TOP_KEYS)?;
    let taken = file.taken(&table)?;
    let models = match table.get("models") {
        None => toml::Table::new(),
        Some(Value::Table(t)) => t.clone(),
        Some(other) => return Err(file.wrong_type("models", "a table", other)),
    };

    let mut prices: BTreeMap<String, Price> = BTreeMap::new();
    for (name, value) in &models {
        let key = format!("models.{}", key_segment(name));
        let folded = fold(name);
        if folded.is_empty() {
            return Err(PriceError::EmptyName {
                origin: origin.to_owned(),
                key,
            });
        }
        if let Some(other) = prices.get(&folded) {
            return Err(file.duplicate(key, name, &other.name));
        }
        let Value::Table(fields) = value else {
            return Err(file.wrong_type(&key, "a table", value));
        };
        let price = file.model(&key, name, fields, taken.as_deref())?;
        prices.insert(folded, price);
    }

    // Aliases last, so that one clashing with a model listed later is still caught.
    let mut index: BTreeMap<String, String> = BTreeMap::new();
    for (folded_name, price) in &prices {
        for (i, alias) in price.aliases.iter().enumerate() {
            let key = format!("models.{}.aliases[{i}]", key_segment(&price.name));
            let folded = fold(alias);
            if folded.is_empty() {
                return Err(PriceError::EmptyName {
                    origin: origin.to_owned(),
                    key,
                });
            }
            let other = prices
                .get(&folded)
                .or_else(|| index.get(&folded).and_then(|n| prices.get(n)));
            if let Some(other) = other {
                return Err(file.duplicate(key, alias, &other.name));
            }
            index.insert(folded, folded_name.clone());
        }
    }
    Ok(PriceTable {
        taken,
        models: prices,
        index,
        data: None,
    })
}

struct File<'a> {
    origin: &'a str,
}

impl File<'_> {
    /// The file's date: optional (a user's file need not say when its prices were read).
    fn taken(&self, table: &toml::Table) -> Result<Option<String>, PriceError> {
        let Some(value) = table.get("taken") else {
            return Ok(None);
        };
        let bad = |value: String| PriceError::BadDate {
            origin: self.origin.to_owned(),
            key: "taken".to_owned(),
            value,
        };
        match value {
            Value::String(s) if is_iso_date(s) => Ok(Some(s.clone())),
            Value::String(s) => Err(bad(s.clone())),
            // A bare TOML date (`taken = 2025-10-15`) is as good as the string.
            Value::Datetime(dt) => match (dt.date, dt.time, dt.offset) {
                (Some(d), None, None) => {
                    Ok(Some(format!("{:04}-{:02}-{:02}", d.year, d.month, d.day)))
                }
                _ => Err(bad(dt.to_string())),
            },
            other => Err(self.wrong_type("taken", "a date string \"YYYY-MM-DD\"", other)),
        }
    }

    fn model(
        &self,
        key: &str,
        name: &str,
        fields: &toml::Table,
        taken: Option<&str>,
    ) -> Result<Price, PriceError> {
        self.check_keys(key, fields, MODEL_KEYS)?;
        let required = |field: &str| {
            let full = format!("{key}.{field}");
            match fields.get(field) {
                Some(v) => self.price(&full, v),
                None => Err(PriceError::Missing {
                    origin: self.origin.to_owned(),
                    key: full,
                }),
            }
        };
        let input_per_mtok = required("input_per_mtok")?;
        let output_per_mtok = required("output_per_mtok")?;
        let optional = |field: &str| {
            fields
                .get(field)
                .map(|v| self.price(&format!("{key}.{field}"), v))
                .transpose()
        };
        let cached_input_per_mtok = optional("cached_input_per_mtok")?;
        let cache_write_per_mtok = optional("cache_write_per_mtok")?;
        let source = match fields.get("source") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(self.wrong_type(&format!("{key}.source"), "a string (a URL)", other));
            }
        };
        let aliases = match fields.get("aliases") {
            None => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| match item {
                        Value::String(s) => Ok(s.clone()),
                        other => {
                            Err(self.wrong_type(&format!("{key}.aliases[{i}]"), "a string", other))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => {
                return Err(self.wrong_type(
                    &format!("{key}.aliases"),
                    "an array of strings",
                    other,
                ));
            }
        };
        Ok(Price {
            name: name.to_owned(),
            input_per_mtok,
            output_per_mtok,
            cached_input_per_mtok,
            cache_write_per_mtok,
            source,
            aliases_given: aliases.is_some(),
            aliases: aliases.unwrap_or_default(),
            origin: self.origin.to_owned(),
            taken: taken.map(str::to_owned),
        })
    }

    fn price(&self, key: &str, value: &Value) -> Result<f64, PriceError> {
        let n = match value {
            Value::Float(f) => *f,
            Value::Integer(i) => *i as f64,
            other => return Err(self.wrong_type(key, "a number", other)),
        };
        if n.is_finite() && n >= 0.0 {
            Ok(n)
        } else {
            Err(PriceError::BadPrice {
                origin: self.origin.to_owned(),
                key: key.to_owned(),
                value: n,
            })
        }
    }

    fn check_keys(
        &self,
        prefix: &str,
        table: &toml::Table,
        allowed: &[&str],
    ) -> Result<(), PriceError> {
        match table.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(unknown) => Err(PriceError::UnknownKey {
                origin: self.origin.to_owned(),
                key: if prefix.is_empty() {
                    key_segment(unknown)
                } else {
                    format!("{prefix}.{}", key_segment(unknown))
                },
                expected: allowed.join(", "),
            }),
        }
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> PriceError {
        PriceError::WrongType {
            origin: self.origin.to_owned(),
            key: key.to_owned(),
            expected,
            found: type_name(found),
        }
    }

    fn duplicate(&self, key: String, name: &str, other: &str) -> PriceError {
        PriceError::Duplicate {
            origin: self.origin.to_owned(),
            key,
            name: name.to_owned(),
            other: other.to_owned(),
        }
    }
}

fn is_iso_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    match (num(0..4), num(5..7), num(8..10)) {
        (Some(y), Some(m), Some(d)) => valid_date(y, m, d),
        _ => false,
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a datetime",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "/home/u/.config/stepguard/prices.toml";

    fn err(text: &str) -> PriceError {
        PriceTable::from_toml(text, ORIGIN).expect_err(text)
    }

    /// Asserts the error names the file and `key`, in its fields and its message.
    fn names(e: &PriceError, key: &str) {
        let shown = e.to_string();
        assert_eq!(e.origin(), ORIGIN, "{shown}");
        assert_eq!(e.key(), Some(key), "{shown}");
        assert!(shown.starts_with(&format!("{ORIGIN}: {key}: ")), "{shown}");
    }

    fn model(fields: &str) -> String {
        format!("taken = \"2025-10-15\"\n[models.\"gpt-4.1\"]\n{fields}\n")
    }

    const OK_PRICES: &str = "input_per_mtok = 2\noutput_per_mtok = 8";

    #[test]
    fn a_minimal_file_parses() {
        let t = PriceTable::from_toml(&model(OK_PRICES), ORIGIN).unwrap();
        assert_eq!(t.taken(), Some("2025-10-15"));
        let p = t.price("gpt-4.1").unwrap();
        assert_eq!((p.input_per_mtok(), p.output_per_mtok()), (2.0, 8.0));
        assert_eq!(p.origin(), ORIGIN);
    }

    #[test]
    fn a_file_without_models_is_an_empty_table() {
        let t = PriceTable::from_toml("taken = \"2025-10-15\"\n", ORIGIN).unwrap();
        assert_eq!(t.models().len(), 0);
        assert!(t.price("gpt-4o").is_none());
    }

    #[test]
    fn taken_may_be_a_bare_toml_date() {
        let t = PriceTable::from_toml("taken = 2025-10-15\n", ORIGIN).unwrap();
        assert_eq!(t.taken(), Some("2025-10-15"));
    }

    #[test]
    fn invalid_toml_names_file_line_and_column() {
        let e = err("taken = \"2025-10-15\"\n[models.x]\ninput_per_mtok = = 3\n");
        let shown = e.to_string();
        assert!(matches!(e, PriceError::Parse { line: 3, .. }), "{shown}");
        assert!(shown.starts_with(&format!("{ORIGIN}:3:")), "{shown}");
        assert!(shown.contains("invalid TOML"), "{shown}");
    }

    #[test]
    fn taken_is_optional() {
        let t = PriceTable::from_toml(
            "[models.x]\ninput_per_mtok = 1\noutput_per_mtok = 1\n",
            ORIGIN,
        )
        .unwrap();
        assert_eq!(t.taken(), None);
        assert_eq!(t.price("x").unwrap().taken(), None);
        assert_eq!(t.price("x").unwrap().cost(1_000_000, 0, 0), 1.0);
    }

    #[test]
    fn bad_taken() {
        for text in [
            "taken = \"yesterday\"",
            "taken = \"2025-13-01\"",
            "taken = \"2025-02-30\"",
            "taken = \"2025-1-15\"",
            "taken = \"2025-10-15T00:00:00\"",
            "taken = 2025-10-15T10:00:00Z",
            "taken = 2025-10-15T10:00:00",
        ] {
            let e = err(text);
            assert!(matches!(e, PriceError::BadDate { .. }), "{text}: {e}");
            names(&e, "taken");
        }
        let e = err("taken = 20251015");
        assert!(
            matches!(
                e,
                PriceError::WrongType {
                    found: "an integer",
                    ..
                }
            ),
            "{e}"
        );
        names(&e, "taken");
    }

    #[test]
    fn unknown_top_level_key() {
        let e = err("taken = \"2025-10-15\"\ntaken_on = \"2025-10-15\"\n");
        assert!(matches!(e, PriceError::UnknownKey { .. }));
        names(&e, "taken_on");
        assert!(
            e.to_string().contains("expected one of: taken, models"),
            "{e}"
        );
    }

    #[test]
    fn models_must_be_tables() {
        let e = err("taken = \"2025-10-15\"\nmodels = 3\n");
        assert!(matches!(e, PriceError::WrongType { .. }));
        names(&e, "models");
        let e = err("taken = \"2025-10-15\"\n[models]\n\"gpt-4.1\" = 2\n");
        assert!(matches!(e, PriceError::WrongType { .. }));
        names(&e, "models.\"gpt-4.1\"");
    }

    #[test]
    fn missing_prices() {
        let e = err(&model("output_per_mtok = 8"));
        assert!(matches!(e, PriceError::Missing { .. }));
        names(&e, "models.\"gpt-4.1\".input_per_mtok");
        let e = err(&model("input_per_mtok = 2"));
        assert!(matches!(e, PriceError::Missing { .. }));
        names(&e, "models.\"gpt-4.1\".output_per_mtok");
        let e = err(&model(""));
        names(&e, "models.\"gpt-4.1\".input_per_mtok");
    }

    #[test]
    fn negative_and_non_finite_prices() {
        for (fields, field) in [
            ("input_per_mtok = -1\noutput_per_mtok = 8", "input_per_mtok"),
            (
                "input_per_mtok = -0.5\noutput_per_mtok = 8",
                "input_per_mtok",
            ),
            (
                "input_per_mtok = nan\noutput_per_mtok = 8",
                "input_per_mtok",
            ),
            (
                "input_per_mtok = 2\noutput_per_mtok = inf",
                "output_per_mtok",
            ),
            (
                "input_per_mtok = 2\noutput_per_mtok = -inf",
                "output_per_mtok",
            ),
            (
                "input_per_mtok = 2\noutput_per_mtok = 8\ncached_input_per_mtok = -0.1",
                "cached_input_per_mtok",
            ),
            (
                "input_per_mtok = 2\noutput_per_mtok = 8\ncached_input_per_mtok = nan",
                "cached_input_per_mtok",
            ),
            (
                "input_per_mtok = 2\noutput_per_mtok = 8\ncache_write_per_mtok = -3",
                "cache_write_per_mtok",
            ),
        ] {
            let e = err(&model(fields));
            assert!(matches!(e, PriceError::BadPrice { .. }), "{fields}: {e}");
            names(&e, &format!("models.\"gpt-4.1\".{field}"));
        }
    }

    #[test]
    fn prices_of_the_wrong_type() {
        let e = err(&model("input_per_mtok = \"2\"\noutput_per_mtok = 8"));
        assert!(matches!(
            e,
            PriceError::WrongType {
                expected: "a number",
                found: "a string",
                ..
            }
        ));
        names(&e, "models.\"gpt-4.1\".input_per_mtok");
    }

    #[test]
    fn unknown_model_key() {
        let e = err(&model(&format!("{OK_PRICES}\ncache_read_per_mtok = 0.5")));
        assert!(matches!(e, PriceError::UnknownKey { .. }));
        names(&e, "models.\"gpt-4.1\".cache_read_per_mtok");
        assert!(e.to_string().contains("cached_input_per_mtok"), "{e}");
    }

    #[test]
    fn source_and_aliases_of_the_wrong_type() {
        let e = err(&model(&format!("{OK_PRICES}\nsource = 1")));
        assert!(matches!(e, PriceError::WrongType { .. }));
        names(&e, "models.\"gpt-4.1\".source");
        let e = err(&model(&format!("{OK_PRICES}\naliases = \"gpt-41\"")));
        assert!(matches!(e, PriceError::WrongType { .. }));
        names(&e, "models.\"gpt-4.1\".aliases");
        let e = err(&model(&format!("{OK_PRICES}\naliases = [\"gpt-41\", 4]")));
        assert!(matches!(e, PriceError::WrongType { .. }));
        names(&e, "models.\"gpt-4.1\".aliases[1]");
    }

    #[test]
    fn empty_names_and_aliases() {
        let e = err(&format!(
            "taken = \"2025-10-15\"\n[models.\" \"]\n{OK_PRICES}\n"
        ));
        assert!(matches!(e, PriceError::EmptyName { .. }));
        names(&e, "models.\" \"");
        let e = err(&model(&format!("{OK_PRICES}\naliases = [\"\"]")));
        assert!(matches!(e, PriceError::EmptyName { .. }));
        names(&e, "models.\"gpt-4.1\".aliases[0]");
    }

    #[test]
    fn names_differing_only_in_case_clash() {
        let text = format!(
            "taken = \"2025-10-15\"\n[models.gpt-4o]\n{OK_PRICES}\n[models.GPT-4o]\n{OK_PRICES}\n"
        );
        let e = err(&text);
        assert!(matches!(e, PriceError::Duplicate { .. }), "{e}");
        // Which of the two is reported second depends on the table's order; both name the file.
        assert!(
            e.key() == Some("models.gpt-4o") || e.key() == Some("models.GPT-4o"),
            "{e}"
        );
        assert!(
            e.to_string().starts_with(&format!("{ORIGIN}: models.")),
            "{e}"
        );
    }

    #[test]
    fn an_alias_may_not_name_another_model_or_repeat() {
        let text = format!(
            "taken = \"2025-10-15\"\n[models.a]\n{OK_PRICES}\naliases = [\"B\"]\n[models.b]\n{OK_PRICES}\n"
        );
        let e = err(&text);
        assert!(
            matches!(e, PriceError::Duplicate { ref other, .. } if other == "b"),
            "{e}"
        );
        names(&e, "models.a.aliases[0]");

        let text = format!(
            "taken = \"2025-10-15\"\n[models.a]\n{OK_PRICES}\naliases = [\"x\"]\n[models.b]\n{OK_PRICES}\naliases = [\"X\"]\n"
        );
        let e = err(&text);
        assert!(
            matches!(e, PriceError::Duplicate { ref other, .. } if other == "a"),
            "{e}"
        );
        names(&e, "models.b.aliases[0]");

        let e = err(&model(&format!("{OK_PRICES}\naliases = [\"GPT-4.1\"]")));
        assert!(matches!(e, PriceError::Duplicate { .. }), "{e}");
        names(&e, "models.\"gpt-4.1\".aliases[0]");
    }

    #[test]
    fn load_file_reads_and_names_the_path() {
        let dir = std::env::temp_dir().join(format!("stepguard-prices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("prices.toml");
        std::fs::write(&good, model(OK_PRICES)).unwrap();
        let t = PriceTable::load_file(&good).unwrap();
        let shown = good.display().to_string();
        assert_eq!(t.price("gpt-4.1").unwrap().origin(), shown);

        let bad = dir.join("bad.toml");
        std::fs::write(&bad, model("input_per_mtok = 2")).unwrap();
        let e = PriceTable::load_file(&bad).unwrap_err();
        assert_eq!(e.origin(), bad.display().to_string());
        assert!(
            e.to_string().starts_with(&format!(
                "{}: models.\"gpt-4.1\".output_per_mtok: ",
                bad.display()
            )),
            "{e}"
        );

        let missing = dir.join("missing.toml");
        let e = PriceTable::load_file(&missing).unwrap_err();
        assert!(matches!(e, PriceError::Read { .. }), "{e}");
        assert_eq!(e.origin(), missing.display().to_string());
        assert!(std::error::Error::source(&e).is_some());
        assert!(
            e.to_string()
                .starts_with(&format!("failed to read prices file {}", missing.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
