//! The JSON payloads that cross the boundary; they evolve under [`crate::PROTOCOL_VERSION`].
//!
//! Rules for evolving them: new fields get `#[serde(default)]`; nothing uses
//! `deny_unknown_fields`; fields are never removed or retyped within a protocol major version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a provider plugin declares about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Provider name, as given to `--provider` (lowercase, e.g. `codex`).
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The protocol version the plugin was built against (filled from the API crate).
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// One line saying what the plugin counts.
    #[serde(default)]
    pub description: String,
    /// The step units the plugin can count; exactly one is the default.
    pub units: Vec<UnitInfo>,
    /// Provider options the plugin accepts (from the provider's table in `stepguard.toml`).
    #[serde(default)]
    pub options: Vec<OptionInfo>,
    /// How to pass the budget to the provider CLI's own limit, if it has one (protocol 1.1).
    #[serde(default)]
    pub native_limit: Option<NativeLimit>,
}

fn default_protocol() -> String {
    "1.0.0".to_owned()
}

impl Manifest {
    /// Creates a manifest for the current protocol with no units yet.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Manifest {
            name: name.into(),
            version: version.into(),
            protocol: crate::PROTOCOL_VERSION.to_owned(),
            description: String::new(),
            units: Vec::new(),
            options: Vec::new(),
            native_limit: None,
        }
    }

    /// Sets the description.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = text.into();
        self
    }

    /// Adds a unit; `default` marks the one used when none is asked for.
    pub fn unit(mut self, name: &str, description: &str, default: bool) -> Self {
        self.units.push(UnitInfo {
            name: name.into(),
            description: description.into(),
            default,
        });
        self
    }

    /// Declares an accepted provider option.
    pub fn option(mut self, name: &str, description: &str) -> Self {
        self.options.push(OptionInfo {
            name: name.into(),
            description: description.into(),
        });
        self
    }

    /// Declares the native budget adapter.
    pub fn native_limit(mut self, limit: NativeLimit) -> Self {
        self.native_limit = Some(limit);
        self
    }

    /// Returns the default unit's name.
    pub fn default_unit(&self) -> Option<&str> {
        self.units
            .iter()
            .find(|u| u.default)
            .or(self.units.first())
            .map(|u| u.name.as_str())
    }

    /// Returns the names of all units, comma-separated, for messages.
    pub fn unit_names(&self) -> String {
        self.units
            .iter()
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One selectable step unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitInfo {
    /// Unit name (public interface, e.g. `item`).
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
    /// Whether this is the default unit.
    #[serde(default)]
    pub default: bool,
}

/// One accepted provider option.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptionInfo {
    /// Option key in the provider's config table.
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
}

/// The provider CLI's own limit, used as a second line of defence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeLimit {
    /// Arguments appended to the agent's command; `{max_steps}` is replaced by the budget.
    pub args: Vec<String>,
    /// If the command already carries any of these arguments (or `ARG=…`), nothing is added.
    #[serde(default)]
    pub skip_if_present: Vec<String>,
}

impl NativeLimit {
    /// Returns the arguments to append for `max_steps`, or `None` when the command already
    /// carries the limit.
    pub fn args_for(&self, command: &[String], max_steps: u32) -> Option<Vec<String>> {
        let present = command.iter().any(|arg| {
            self.skip_if_present.iter().any(|flag| {
                arg == flag
                    || arg
                        .strip_prefix(flag.as_str())
                        .is_some_and(|r| r.starts_with('='))
            })
        });
        (!present).then(|| {
            self.args
                .iter()
                .map(|a| a.replace("{max_steps}", &max_steps.to_string()))
                .collect()
        })
    }
}

/// What the host asks for when opening a counter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterRequest {
    /// The unit to count (always one the manifest declares).
    pub unit: String,
    /// Provider options from the config, minus the ones the host handles (`max_steps_unit`).
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
}

/// How the stream said the run ended, when it said.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Terminal {
    /// Whether the provider reported success.
    pub success: bool,
    /// The failure slug (`max_steps`, `rate_limited`, `provider_error` …) when it failed.
    #[serde(default)]
    pub slug: Option<String>,
    /// The provider's own error text, when it gave one.
    #[serde(default)]
    pub message: Option<String>,
}

/// Token counts from the stream (run totals, not per-line sums).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// Input tokens, including cached ones.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cached input tokens, when known.
    #[serde(default)]
    pub cached_input_tokens: Option<u64>,
    /// Reasoning output tokens, when known.
    #[serde(default)]
    pub reasoning_output_tokens: Option<u64>,
}

/// A counter's final numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CounterStats {
    /// Steps counted by the plugin from the stream.
    pub num_steps_computed: u64,
    /// Steps the provider itself reported, if its stream says.
    pub num_steps_reported: Option<u64>,
    /// Legacy turns the provider reported.
    pub num_turns_reported: Option<u64>,
    /// Legacy turns counted from the stream.
    pub num_turns_computed: Option<u64>,
    /// The terminal event's verdict; `None` when the stream had no terminal event.
    pub terminal: Option<Terminal>,
    /// Token usage, when the stream carries it.
    pub tokens: Option<Tokens>,
    /// Cost in US dollars, when the stream carries it.
    pub cost_usd: Option<f64>,
    /// Lines that were not events.
    pub noise_lines: u64,
    /// JSON lines of unknown event types (ignored).
    pub unknown_events: u64,
    /// Steps per sub-agent (keyed by the provider's id), never counted against the budget
    /// (protocol 1.1).
    pub sub_agent_steps: BTreeMap<String, u64>,
}

/// Returns the failure slug an error text most likely means: `rate_limited` for HTTP 429, rate
/// limits and exhausted quotas, else `provider_error`.
pub fn slug_for_error_text(text: &str) -> &'static str {
    let lower = text.to_ascii_lowercase();
    let rate_limited = [
        "429",
        "rate limit",
        "rate_limit",
        "ratelimit",
        "too many requests",
        "quota",
        "resource_exhausted",
    ]
    .iter()
    .any(|needle| lower.contains(needle));
    if rate_limited {
        "rate_limited"
    } else {
        "provider_error"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_map_to_slugs() {
        assert_eq!(
            slug_for_error_text("exceeded retry limit, last status: 429 Too Many Requests"),
            "rate_limited"
        );
        assert_eq!(
            slug_for_error_text("TerminalQuotaError: You exceeded your quota"),
            "rate_limited"
        );
        assert_eq!(
            slug_for_error_text("stream disconnected before completion"),
            "provider_error"
        );
    }

    #[test]
    fn native_limit_is_added_unless_present() {
        let limit = NativeLimit {
            args: vec!["--max-turns".into(), "{max_steps}".into()],
            skip_if_present: vec!["--max-turns".into()],
        };
        let cmd = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            limit.args_for(&cmd(&["claude", "-p", "x"]), 7),
            Some(cmd(&["--max-turns", "7"]))
        );
        assert_eq!(
            limit.args_for(&cmd(&["claude", "--max-turns", "3"]), 7),
            None
        );
        assert_eq!(limit.args_for(&cmd(&["claude", "--max-turns=3"]), 7), None);
        assert_eq!(
            limit.args_for(&cmd(&["claude", "--max-turnsx"]), 7),
            Some(cmd(&["--max-turns", "7"]))
        );
    }
}
