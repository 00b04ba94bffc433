//! Records as JSON text, for `history export`: each written as it is stored, with its id, when
//! that is exactly what reading and re-serializing it would give.
//!
//! Every row's record was written by [`crate::to_json`] with no id (`"id":null`), and changed
//! since only by `json_set` of keys it already has (the live step count, the `interrupted`
//! mark), which keeps the keys' order and every other value's text. Such a record, read as a
//! [`RunRecord`] and serialized again, comes back byte for byte, but for its id: so it is
//! written through with the id put in place of the null, which is what makes an export of a
//! million runs cost about what reading them costs. A record whose keys are not the current
//! record's, in its order (one written by another stepguard version, or edited by hand), is
//! read and re-serialized as before, so that every line has every key of the current record.

use std::fmt::Write as _;

use rusqlite::Row;
use serde::Deserializer as _;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use stepguard_core::{Outcome, RECORD_SCHEMA_VERSION, RunRecord};

/// Reads `id, record` as the line [`crate::Store::export`] writes, without copying the stored
/// text out of SQLite.
pub(crate) fn line<'e>(row: &Row<'_>, exporter: &'e mut Exporter) -> rusqlite::Result<&'e str> {
    let id: i64 = row.get(0)?;
    let stored = row.get_ref(1)?.as_str()?;
    exporter.line(id, stored).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// Writes stored records as export lines, reusing one buffer.
pub(crate) struct Exporter {
    /// The current record's keys, in the order it serializes them.
    keys: Vec<String>,
    /// How every stored record written by this version begins: `{"schema_version":1,"id":null,`.
    stored_prefix: String,
    line: String,
}

impl Exporter {
    pub(crate) fn new() -> Self {
        let shape = serde_json::to_string(&RunRecord::new(String::new(), Outcome::Success))
            .unwrap_or_default();
        Exporter {
            keys: top_level_keys(&shape).unwrap_or_default(),
            stored_prefix: format!("{{\"schema_version\":{RECORD_SCHEMA_VERSION},\"id\":null,"),
            line: String::new(),
        }
    }

    /// Returns the record of row `id` as one line of JSON (no newline): `stored` with the id
    /// written in, when its keys are the current record's; else read and serialized again.
    pub(crate) fn line(&mut self, id: i64, stored: &str) -> serde_json::Result<&str> {
        self.line.clear();
        match stored.strip_prefix(self.stored_prefix.as_str()) {
            Some(rest) if has_keys(stored, &self.keys) => {
                // Writing to a String cannot fail.
                let _ = write!(
                    self.line,
                    "{{\"schema_version\":{RECORD_SCHEMA_VERSION},\"id\":{id},{rest}"
                );
            }
            _ => {
                let mut record: RunRecord = serde_json::from_str(stored)?;
                record.id = Some(id);
                self.line = serde_json::to_string(&record)?;
            }
        }
        Ok(&self.line)
    }
}

/// Returns the keys of the JSON object `json`, in order (`None` when it is not one).
fn top_level_keys(json: &str) -> Option<Vec<String>> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut keys = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                keys.push(key);
            }
            Ok(keys)
        }
    }
    serde_json::Deserializer::from_str(json)
        .deserialize_map(Keys)
        .ok()
}

/// Whether `json` is one JSON object whose keys are `keys`, in that order. Its values are
/// skipped structurally (by the scanner of agent streams), not validated: they were written by
/// serde or SQLite's `json_set`.
fn has_keys(json: &str, keys: &[String]) -> bool {
    let mut expected = keys.iter();
    stepguard_jsonl::for_each_member(json.as_bytes(), |key, _| {
        // Compared inline: keys are short, and a `memcmp` call per key is a tenth of the export.
        expected
            .next()
            .is_some_and(|k| k.len() == key.len() && k.bytes().zip(key).all(|(a, b)| a == *b))
    }) && expected.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_record_shape_is_known_and_checked_key_by_key() {
        let e = Exporter::new();
        assert_eq!(e.keys[..2], ["schema_version", "id"]);
        assert!(e.keys.len() > 20, "{:?}", e.keys);
        let record = serde_json::to_string(&RunRecord::new("codex", Outcome::Failed)).unwrap();
        assert!(has_keys(&record, &e.keys));
        // A key missing, one more, two swapped, trailing text, not JSON: not the shape.
        let missing = record.replacen("\"file\":null,", "", 1);
        assert!(!has_keys(&missing, &e.keys));
        let extra = record.replacen('{', "{\"x\":1,", 1);
        assert!(!has_keys(&extra, &e.keys));
        let swapped = record.replacen(
            "\"id\":null,\"file\":null,",
            "\"file\":null,\"id\":null,",
            1,
        );
        assert!(!has_keys(&swapped, &e.keys));
        assert!(!has_keys(&format!("{record} x"), &e.keys));
        assert!(!has_keys(&record.replacen("null", "nul", 1), &e.keys));
        assert!(!has_keys(&record[..record.len() - 1], &e.keys));
    }

    #[test]
    fn a_record_of_the_current_shape_is_written_through_with_its_id() {
        let mut e = Exporter::new();
        let mut record = RunRecord::new("codex", Outcome::Success);
        record.verdict.message = Some("quote \" slash \\ tab \t bell \u{7} — 済".into());
        let stored = serde_json::to_string(&record).unwrap();
        record.id = Some(42);
        assert_eq!(
            e.line(42, &stored).unwrap(),
            serde_json::to_string(&record).unwrap()
        );
        // Written through, not serialized again: a value's text is kept as stored.
        let stored = stored.replacen("\"cost_usd\":null", "\"cost_usd\":1.50", 1);
        assert!(e.line(42, &stored).unwrap().contains("\"id\":42,"));
        assert!(e.line(42, &stored).unwrap().contains("\"cost_usd\":1.50"));
    }

    #[test]
    fn a_record_of_another_shape_is_read_and_written_again() {
        let mut e = Exporter::new();
        let record = RunRecord::new("claude", Outcome::Failed);
        let full = serde_json::to_string(&record).unwrap();
        // As an older stepguard wrote it (no `sub_agent_steps` yet), and with a key it does not know.
        let older = full.replacen(",\"sub_agent_steps\":null", "", 1);
        let newer = full.replacen('}', ",\"later\":true}", 1);
        let mut expected = record.clone();
        expected.id = Some(7);
        let expected = serde_json::to_string(&expected).unwrap();
        assert_eq!(e.line(7, &older).unwrap(), expected);
        assert_eq!(e.line(7, &newer).unwrap(), expected);
        assert!(e.line(7, "{\"schema_version\":1,\"id\":null,").is_err());
    }
}
