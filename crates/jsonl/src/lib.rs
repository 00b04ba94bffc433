//! Fast, defensive reading of JSONL agent streams.
//!
//! Agent CLIs print one JSON object per line, interleaved at times with non-JSON noise (banners,
//! merged stderr). Counting steps needs a handful of top-level fields per line, at disk speed, so
//! this crate offers:
//!
//! * [`LineSplitter`]: splits bytes on `\n` only (never U+2028), trims a trailing `\r`, and caps
//!   line length so memory stays bounded;
//! * [`scan`]: a structural scanner that validates a line's top-level object and returns the raw
//!   values of the keys asked for (the last one wins for duplicate keys, like `serde_json::Value`),
//!   skipping everything else with `memchr`. Text inside strings can never be mistaken for a key,
//!   because JSON escapes every quote inside a string;
//! * [`IdSet`] and [`IdMap`]: the ids a counter deduplicates by, interned in one arena with a
//!   fixed-size slot each (no allocation per id), memory following the ids held;
//! * [`framing`]: tells a line framed to hide events (packed, `\r`-split, BOM/NUL-prefixed,
//!   escaped or duplicate top-level keys) from one JSON object per line.
//!
//! ```
//! let line = br#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","aggregated_output":"{\"type\":\"item.completed\"}"}}"#;
//! let [ty, item] = stepguard_jsonl::scan(line, ["type", "item"]).unwrap();
//! assert_eq!(ty.unwrap().as_str().as_deref(), Some("item.completed"));
//! let [id, kind] = item.unwrap().fields(["id", "type"]).unwrap();
//! assert_eq!((id.unwrap().as_str().as_deref(), kind.unwrap().as_str().as_deref()), (Some("item_1"), Some("command_execution")));
//! ```
#![forbid(unsafe_code)]

mod ids;
mod scan;
mod split;

pub use ids::{IdMap, IdSet};
pub use scan::{Framing, HostileFraming, RawValue, for_each_member, framing, scan, scan_prefix};
pub use split::{LineSplitter, MAX_LINE_BYTES, SplitChunk, SplitLine};
