//! The JSON payloads that cross the boundary; they evolve under [`crate::PROTOCOL_VERSION`].
//!
//! Rules for evolving them: new fields get `#[serde(default)]`; nothing uses
//! `deny_unknown_fields`; fields are never removed or retyped within a protocol major version.
//!
//! Every struct here is `#[non_exhaustive]`, so that a minor release can add a field without
//! breaking a plugin's source: build them with their constructors and builder methods
//! ([`Manifest::new`], [`Terminal::failed`], [`Tokens::new`], [`CounterRequest::new`] …), or
//! from `Default::default()` and then assign the public fields, as with [`CounterStats`].

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resume::ResumeTemplate;

/// What a provider plugin declares about itself.
///
/// Built with [`Manifest::new`] and its builder methods. Its `protocol` is the *oldest* protocol
/// the plugin needs, so that a plugin rebuilt against a newer API crate still loads in older
/// hosts unless it uses something new: see [`Manifest::min_protocol`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Manifest {
    /// Provider name, as given to `--provider` (lowercase, e.g. `codex`).
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The oldest protocol version the plugin needs (`major.minor.0`).
    ///
    /// [`Manifest::new`] starts it at `1.0.0` and [`Manifest::requires_protocol`] raises it;
    /// when the manifest is sent to the host it is raised to what the manifest's own fields
    /// need ([`Manifest::min_protocol`]). A host refuses a plugin whose protocol it does not
    /// speak.
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
    /// What the counted stream looks like, in a few words, for messages when none of the
    /// agent's output is recognised, e.g. "JSONL events of `codex exec --json`" (protocol 1.2).
    #[serde(default)]
    pub expects: String,
    /// Checks of the agent's command line before it starts: a command that cannot produce the
    /// counted stream is refused with the fix (protocol 1.2).
    #[serde(default)]
    pub preflight: Vec<PreflightRule>,
    /// Whether the counters report tool calls (name and argument fingerprint) for loop
    /// detection (protocol 1.3); hosts before 1.3 ignore it.
    #[serde(default)]
    pub tool_calls: bool,
    /// Whether the counters report tool results ([`crate::StepCounter::take_tool_results`]),
    /// so that loop detection judges repeats by progress (protocol 1.6); hosts before 1.6
    /// ignore it, and a plugin without it keeps the rule of identical calls.
    #[serde(default)]
    pub tool_results: bool,
    /// How the provider's CLI reaches its model, so that stepguard's model gateway can sit in
    /// between (`--wrap-up`; protocol 1.4); hosts before 1.4 ignore it.
    #[serde(default)]
    pub model_endpoint: Option<ModelEndpoint>,
    /// Whether the counters report token usage as the stream shows it
    /// ([`crate::StepCounter::take_usage`]), for token and cost budgets (protocol 1.5); hosts
    /// before 1.5 ignore it.
    #[serde(default)]
    pub reports_usage: bool,
    /// How to pass a token budget to the provider CLI's own token limit, if it has one:
    /// `{max_tokens}` in its arguments is replaced by the budget (protocol 1.5).
    #[serde(default)]
    pub native_token_limit: Option<NativeLimit>,
    /// How to pass a cost budget to the provider CLI's own cost limit, if it has one:
    /// `{max_cost_usd}` in its arguments is replaced by the budget in US dollars (protocol 1.5).
    #[serde(default)]
    pub native_cost_limit: Option<NativeLimit>,
    /// How soon the provider's CLI prints its first event, in milliseconds: no recognised
    /// event within this long of the start stops the run as `unrecognized_stream`, so that a
    /// CLI that prints nothing (a text mode behind a wrapper) is not left to run unseen. `None`:
    /// [`DEFAULT_FIRST_EVENT_MS`]. Additive: hosts that do not know it ignore it, so it needs
    /// no newer protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_event_ms: Option<u64>,
    /// How the provider's CLI resumes a session its stream named
    /// ([`CounterStats::session_id`]), for `stepguard resume` (protocol 1.8); hosts before 1.8
    /// ignore it, and a provider without it cannot be resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeTemplate>,
}

/// How soon a provider's first event must come when its manifest does not say
/// ([`Manifest::first_event_ms`]): 60 s.
pub const DEFAULT_FIRST_EVENT_MS: u64 = 60_000;

/// The program a command runs: the file name of its first word (`/usr/bin/codex` → `codex`),
/// the name pre-flight rules and native limits are matched against.
///
/// ```
/// use stepguard_plugin_api::program_name;
///
/// let command: Vec<String> = ["/usr/local/bin/codex", "exec"].map(String::from).into();
/// assert_eq!(program_name(&command), Some("codex"));
/// assert_eq!(program_name(&[]), None);
/// ```
pub fn program_name(command: &[String]) -> Option<&str> {
    let program = command.first()?;
    Some(program.rsplit('/').next().unwrap_or(program))
}

/// The first protocol version, which every host speaks.
const FIRST_PROTOCOL: &str = "1.0.0";

fn default_protocol() -> String {
    FIRST_PROTOCOL.to_owned()
}

/// Parses a protocol version written `major.minor` or `major.minor.patch`.
fn parse_protocol(text: &str) -> Option<semver::Version> {
    let text = text.trim();
    semver::Version::parse(text)
        .or_else(|_| semver::Version::parse(&format!("{text}.0")))
        .ok()
}

impl Manifest {
    /// Creates a manifest with no units yet, needing protocol 1.0 until its fields or
    /// [`Manifest::requires_protocol`] say otherwise.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Manifest {
            name: name.into(),
            version: version.into(),
            protocol: default_protocol(),
            description: String::new(),
            units: Vec::new(),
            options: Vec::new(),
            native_limit: None,
            expects: String::new(),
            preflight: Vec::new(),
            tool_calls: false,
            tool_results: false,
            model_endpoint: None,
            reports_usage: false,
            native_token_limit: None,
            native_cost_limit: None,
            first_event_ms: None,
            resume: None,
        }
    }

    /// Declares how the provider's CLI resumes a session (protocol 1.8).
    pub fn resume(mut self, template: ResumeTemplate) -> Self {
        self.resume = Some(template);
        self
    }

    /// Declares how soon the provider's CLI prints its first event
    /// ([`Manifest::first_event_ms`]).
    pub fn first_event_within(mut self, within: std::time::Duration) -> Self {
        self.first_event_ms = Some(u64::try_from(within.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Returns how soon the provider's first event must come: the manifest's
    /// [`Manifest::first_event_ms`], else [`DEFAULT_FIRST_EVENT_MS`].
    pub fn first_event_deadline(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.first_event_ms.unwrap_or(DEFAULT_FIRST_EVENT_MS))
    }

    /// Returns true when the manifest names `program` (a file name) as its CLI: in a pre-flight
    /// rule or as a native limit's [`NativeLimit::program`].
    pub fn names_program(&self, program: &str) -> bool {
        let limits = [
            &self.native_limit,
            &self.native_token_limit,
            &self.native_cost_limit,
        ];
        self.preflight.iter().any(|rule| rule.program == program)
            || limits
                .into_iter()
                .flatten()
                .any(|l| l.program.as_deref() == Some(program))
    }

    /// Returns the program that takes `limit`'s arguments: the limit's own
    /// [`NativeLimit::program`], else the program of the manifest's first pre-flight rule;
    /// `None` when neither says (then the host adds nothing).
    ///
    /// ```
    /// use stepguard_plugin_api::{Manifest, NativeLimit, PreflightRule};
    ///
    /// let limit = NativeLimit::new(&["--max-turns", "{max_steps}"], &["--max-turns"]);
    /// let manifest = Manifest::new("claude", "1.0.0")
    ///     .preflight(PreflightRule::new("claude", &["-p"], "add `-p`"));
    /// assert_eq!(manifest.native_program(&limit), Some("claude"));
    /// assert_eq!(manifest.native_program(&limit.clone().for_program("claude-code")), Some("claude-code"));
    /// assert_eq!(Manifest::new("bare", "1.0.0").native_program(&limit), None);
    /// ```
    pub fn native_program<'m>(&'m self, limit: &'m NativeLimit) -> Option<&'m str> {
        limit
            .program
            .as_deref()
            .or_else(|| self.preflight.first().map(|rule| rule.program.as_str()))
    }

    /// Declares that the plugin's counters report token usage
    /// ([`crate::StepCounter::take_usage`]) for token and cost budgets (protocol 1.5).
    pub fn reports_usage(mut self) -> Self {
        self.reports_usage = true;
        self
    }

    /// Declares how the provider CLI takes a token budget of its own, `{max_tokens}` standing
    /// for the budget (protocol 1.5).
    pub fn native_token_limit(mut self, limit: NativeLimit) -> Self {
        self.native_token_limit = Some(limit);
        self
    }

    /// Declares how the provider CLI takes a cost budget of its own, `{max_cost_usd}` standing
    /// for the budget in US dollars (protocol 1.5).
    pub fn native_cost_limit(mut self, limit: NativeLimit) -> Self {
        self.native_cost_limit = Some(limit);
        self
    }

    /// Declares how the provider's CLI reaches its model (protocol 1.4).
    pub fn model_endpoint(mut self, endpoint: ModelEndpoint) -> Self {
        self.model_endpoint = Some(endpoint);
        self
    }

    /// Adds a unit with the cost of a tool-less model reply in it (protocol 1.4): 1 for units
    /// that count messages or items, 0 for units that count tool calls.
    pub fn unit_costing(
        mut self,
        name: &str,
        description: &str,
        default: bool,
        reply: u64,
    ) -> Self {
        let mut unit = UnitInfo::new(name, description, default);
        unit.reply_cost = Some(reply);
        self.units.push(unit);
        self
    }

    /// Declares that the plugin's counters report tool calls ([`crate::StepCounter::take_tool_calls`])
    /// for loop detection (protocol 1.3).
    pub fn reports_tool_calls(mut self) -> Self {
        self.tool_calls = true;
        self
    }

    /// Declares that the plugin's counters report tool results, each naming the call it answers
    /// ([`crate::StepCounter::take_tool_results`]), for loop detection by progress
    /// (protocol 1.6); it implies [`Manifest::reports_tool_calls`].
    pub fn reports_tool_results(mut self) -> Self {
        self.tool_calls = true;
        self.tool_results = true;
        self
    }

    /// Declares that the plugin needs at least protocol `version` (`"1.1"` or `"1.1.0"`), for
    /// what the manifest cannot show, such as a counter that fills
    /// [`CounterStats::sub_agent_steps`] (protocol 1.1).
    ///
    /// It only ever raises the protocol. A version that does not parse is kept as written, so
    /// that the host refuses the plugin with a clear message instead of guessing.
    pub fn requires_protocol(mut self, version: &str) -> Self {
        self.protocol = match (parse_protocol(version), parse_protocol(&self.protocol)) {
            (Some(asked), Some(current)) => asked.max(current).to_string(),
            (None, _) => version.to_owned(),
            (Some(_), None) => self.protocol,
        };
        self
    }

    /// Returns the oldest protocol this manifest needs: the larger of its `protocol` field and
    /// what its fields need (1.0; `native_limit` 1.1; `expects` or `preflight` 1.2;
    /// `tool_calls` 1.3; `model_endpoint` or a unit's `reply_cost` 1.4; `reports_usage`,
    /// `native_token_limit`, `native_cost_limit` or a native limit placed
    /// [after the program](NativeLimit::after_program) 1.5; `tool_results` 1.6; a model
    /// endpoint's `api_key_env` or `api_key_env_key` 1.7; `resume` 1.8).
    ///
    /// This is the `protocol` the plugin sends to the host (the adapter fills it in when it
    /// serialises the manifest), so setting a field directly cannot understate it.
    ///
    /// ```
    /// use stepguard_plugin_api::{Manifest, NativeLimit};
    ///
    /// let plain = Manifest::new("lines", "0.1.0").unit("line", "every line", true);
    /// assert_eq!(plain.min_protocol(), "1.0.0");
    /// let sub_agents = plain.clone().requires_protocol("1.1");
    /// assert_eq!(sub_agents.min_protocol(), "1.1.0");
    /// let limited = plain.native_limit(NativeLimit::new(&["--max-steps", "{max_steps}"], &[]));
    /// assert_eq!(limited.clone().min_protocol(), "1.1.0");
    /// let checked = limited.expects("JSON lines");
    /// assert_eq!(checked.min_protocol(), "1.2.0");
    /// assert_eq!(checked.reports_usage().min_protocol(), "1.5.0");
    /// ```
    pub fn min_protocol(&self) -> String {
        let after_program = [
            &self.native_limit,
            &self.native_token_limit,
            &self.native_cost_limit,
        ]
        .into_iter()
        .any(|l| l.as_ref().is_some_and(|l| l.after_program));
        let keys = self
            .model_endpoint
            .as_ref()
            .is_some_and(|e| !e.api_key_env.is_empty() || e.api_key_env_key.is_some());
        let minor = if self.resume.is_some() {
            8
        } else if keys {
            7
        } else if self.tool_results {
            6
        } else if self.reports_usage
            || self.native_token_limit.is_some()
            || self.native_cost_limit.is_some()
            || after_program
        {
            5
        } else if self.model_endpoint.is_some() || self.units.iter().any(|u| u.reply_cost.is_some())
        {
            4
        } else if self.tool_calls {
            3
        } else if !self.expects.is_empty() || !self.preflight.is_empty() {
            2
        } else if self.native_limit.is_some() {
            1
        } else {
            0
        };
        let needed = semver::Version::new(1, minor, 0);
        match parse_protocol(&self.protocol) {
            Some(declared) => match declared.cmp_precedence(&needed) {
                Ordering::Less => needed.to_string(),
                _ => declared.to_string(),
            },
            // Unparseable: sent as written, and the host refuses it.
            None => self.protocol.clone(),
        }
    }

    /// Says what the counted stream looks like (for messages; protocol 1.2).
    pub fn expects(mut self, text: impl Into<String>) -> Self {
        self.expects = text.into();
        self
    }

    /// Adds a pre-flight check of the agent's command line (protocol 1.2).
    pub fn preflight(mut self, rule: PreflightRule) -> Self {
        self.preflight.push(rule);
        self
    }

    /// Returns the first pre-flight rule `command` breaks, if any.
    pub fn preflight_failure(&self, command: &[String]) -> Option<&PreflightRule> {
        self.preflight.iter().find(|rule| !rule.accepts(command))
    }

    /// Sets the description.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = text.into();
        self
    }

    /// Adds a unit; `default` marks the one used when none is asked for.
    pub fn unit(mut self, name: &str, description: &str, default: bool) -> Self {
        self.units.push(UnitInfo::new(name, description, default));
        self
    }

    /// Declares an accepted provider option.
    pub fn option(mut self, name: &str, description: &str) -> Self {
        self.options.push(OptionInfo::new(name, description));
        self
    }

    /// Declares the native budget adapter (protocol 1.1).
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
#[non_exhaustive]
pub struct UnitInfo {
    /// Unit name (public interface, e.g. `item`).
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
    /// Whether this is the default unit.
    #[serde(default)]
    pub default: bool,
    /// What a model reply without tool calls costs in this unit: 1 when the unit counts
    /// messages or items, 0 when it counts tool calls (protocol 1.4). The gateway makes the
    /// last model call tool-less when no more than this is left of the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_cost: Option<u64>,
}

impl UnitInfo {
    /// Creates a unit; `default` marks the one used when none is asked for.
    pub fn new(name: impl Into<String>, description: impl Into<String>, default: bool) -> Self {
        UnitInfo {
            name: name.into(),
            description: description.into(),
            default,
            reply_cost: None,
        }
    }
}

/// How a provider's CLI reaches its model (protocol 1.4): the wire dialect it speaks, where it
/// goes by default, and how it is pointed elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelEndpoint {
    /// The wire dialect: `anthropic-messages`, `openai-responses`, `gemini` or `openai-chat`.
    pub dialect: String,
    /// The provider's public base URL, used when the user configured none.
    pub default_upstream: String,
    /// How the CLI is given a base URL, tried in order; the first that applies is used.
    pub base_url: Vec<BaseUrlRule>,
    /// The environment variables the CLI reads its API key from (`ANTHROPIC_API_KEY`,
    /// `ANTHROPIC_AUTH_TOKEN`, …), protocol 1.7. With the gateway on, the agent gets a per-run
    /// key in each of those that is set, and the gateway swaps the real key back in when it
    /// forwards, so the real key is never in the agent's environment. It needs protocol 1.7:
    /// an older host would ignore it and leave the real key with the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_key_env: Vec<String>,
    /// For a provider chosen by a [`BaseUrlRule::ConfigFlag`] selector: the config key whose
    /// value names the variable that holds that provider's key; `{}` is the selected name
    /// (Codex: `model_providers.{}.env_key`), protocol 1.7 as [`ModelEndpoint::api_key_env`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env_key: Option<String>,
}

impl ModelEndpoint {
    /// Creates an endpoint for `dialect` whose default upstream is `default_upstream`.
    pub fn new(dialect: &str, default_upstream: &str) -> Self {
        ModelEndpoint {
            dialect: dialect.to_owned(),
            default_upstream: default_upstream.to_owned(),
            base_url: Vec::new(),
            api_key_env: Vec::new(),
            api_key_env_key: None,
        }
    }

    /// Adds a way the CLI takes its base URL.
    pub fn base_url(mut self, rule: BaseUrlRule) -> Self {
        self.base_url.push(rule);
        self
    }

    /// Adds an environment variable the CLI reads its API key from (protocol 1.7).
    pub fn api_key_env(mut self, name: &str) -> Self {
        self.api_key_env.push(name.to_owned());
        self
    }

    /// Names the config key whose value names the key's variable of a provider chosen by a
    /// selector, `{}` standing for its name (protocol 1.7).
    pub fn api_key_env_key(mut self, key: &str) -> Self {
        self.api_key_env_key = Some(key.to_owned());
        self
    }
}

/// One way an agent CLI takes its model base URL (protocol 1.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum BaseUrlRule {
    /// An environment variable holds it, e.g. `ANTHROPIC_BASE_URL`.
    Env {
        /// The variable's name.
        name: String,
    },
    /// Config overrides on the command line select a provider table and set its base URL,
    /// e.g. Codex `-c model_provider=NAME` and `-c model_providers.NAME={base_url="…"}`.
    /// Applies when the command selects a provider (`selector`).
    ///
    /// With an empty `selector` the rule is the CLI's built-in provider and always applies:
    /// `key` is the base URL itself (Codex's `openai_base_url`); the upstream is the command's
    /// own value of it, else the endpoint's default, and the CLI gets an override naming the
    /// gateway. A host that predates this reading finds no selector and goes on to the next
    /// rule, as it did before.
    ConfigFlag {
        /// The override flag (`-c`).
        flag: String,
        /// The key that selects the provider (`model_provider`); empty for the built-in one.
        selector: String,
        /// The key of the base URL; `{}` is the selected name (`model_providers.{}.base_url`).
        key: String,
        /// The CLI's own TOML config file, which may set the same keys (the command's
        /// overrides win): the first candidate whose variable is set is the file (`$VAR/…`
        /// is skipped when `VAR` is unset or empty, `~/…` is under `HOME`), and a file that
        /// does not exist sets nothing. Codex: `$CODEX_HOME/config.toml`,
        /// `~/.codex/config.toml`. Additive: older hosts ignore it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<String>,
    },
    /// A JSON config file in the working directory, merged with inline JSON from an
    /// environment variable, e.g. OpenCode's `opencode.json` and `OPENCODE_CONFIG_CONTENT`. The
    /// provider is the part before `/` of the model, from `model_flags` or the file's `model`.
    JsonConfig {
        /// The file's name in the working directory.
        file: String,
        /// The variable whose inline JSON the CLI merges over the file.
        env: String,
        /// Flags that give the model as `provider/model` (`-m`, `--model`).
        model_flags: Vec<String>,
        /// The JSON path of the base URL, dot-separated; `{}` is the provider
        /// (`provider.{}.options.baseURL`).
        key: String,
    },
}

/// One accepted provider option.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OptionInfo {
    /// Option key in the provider's config table (never one of [`RESERVED_OPTIONS`]).
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
}

impl OptionInfo {
    /// Creates an option declaration.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        OptionInfo {
            name: name.into(),
            description: description.into(),
        }
    }
}

/// Keys of a provider's config table that the host handles itself and never passes to the
/// plugin: `max_steps_unit` picks the unit. A manifest does not declare them; the adapter
/// accepts them without asking the plugin and leaves them out of what the plugin sees.
pub const RESERVED_OPTIONS: &[&str] = &["max_steps_unit"];

/// The provider CLI's own limit, used as a second line of defence (protocol 1.1): of steps
/// ([`Manifest::native_limit`], `{max_steps}`), tokens ([`Manifest::native_token_limit`],
/// `{max_tokens}`) or cost ([`Manifest::native_cost_limit`], `{max_cost_usd}`; both 1.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NativeLimit {
    /// Arguments added to the agent's command; a placeholder (`{max_steps}`, `{max_tokens}`,
    /// `{max_cost_usd}`) is replaced by the budget.
    pub args: Vec<String>,
    /// If the command already carries any of these arguments (or `ARG=…`), nothing is added.
    #[serde(default)]
    pub skip_if_present: Vec<String>,
    /// Where the arguments go: `false` (the default) appends them to the command; `true`
    /// inserts them right after the program (the command's first word), before any
    /// subcommand, prompt or `--`, for a CLI whose options must not follow a `--` (protocol
    /// 1.5: a manifest with such a limit needs a host that places them so).
    #[serde(default, skip_serializing_if = "is_false")]
    pub after_program: bool,
    /// The program whose command takes the arguments, as its file name (`codex`): the host adds
    /// them only when the agent's command runs this program, never to a wrapper (`env`, `npx`,
    /// a script) or another CLI. `None`: the program of the manifest's first pre-flight rule
    /// ([`Manifest::native_program`]). Additive: older hosts ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// A check of the agent's command line: when the program is `program` and the command has
/// one of `when_any` (or `when_any` is empty), it must have one of `require_any`.
///
/// An argument pattern is `FLAG` (matching `FLAG` or `FLAG=…`) or `FLAG=VALUE` (matching
/// `FLAG=VALUE` or `FLAG VALUE`). Protocol 1.2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PreflightRule {
    /// The program's file name (the command's first word, without its directory).
    pub program: String,
    /// The rule applies when the command has any of these (always, when empty).
    #[serde(default)]
    pub when_any: Vec<String>,
    /// What the command must have (any one of them).
    pub require_any: Vec<String>,
    /// What to tell the user, naming the exact fix, e.g. "add `--json` after `codex exec`".
    pub fix: String,
}

impl PreflightRule {
    /// Creates a rule for `program`: the command must have one of `require_any`.
    pub fn new(program: &str, require_any: &[&str], fix: &str) -> Self {
        PreflightRule {
            program: program.to_owned(),
            when_any: Vec::new(),
            require_any: require_any.iter().map(|s| (*s).to_owned()).collect(),
            fix: fix.to_owned(),
        }
    }

    /// Limits the rule to commands that have one of `args`.
    pub fn when_any(mut self, args: &[&str]) -> Self {
        self.when_any = args.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Returns false when `command` breaks the rule.
    pub fn accepts(&self, command: &[String]) -> bool {
        let Some(name) = program_name(command) else {
            return true;
        };
        if name != self.program {
            return true;
        }
        let args = &command[1..];
        let applies = self.when_any.is_empty() || self.when_any.iter().any(|p| has_arg(args, p));
        !applies || self.require_any.iter().any(|p| has_arg(args, p))
    }
}

/// Returns true when `args` has `pattern` (`FLAG`, `FLAG=…`, or `FLAG=VALUE` / `FLAG VALUE`).
fn has_arg(args: &[String], pattern: &str) -> bool {
    match pattern.split_once('=') {
        None => args.iter().any(|a| {
            a == pattern
                || a.strip_prefix(pattern)
                    .is_some_and(|rest| rest.starts_with('='))
        }),
        Some((flag, value)) => args.iter().enumerate().any(|(i, a)| {
            a == pattern || (a == flag && args.get(i + 1).is_some_and(|v| v == value))
        }),
    }
}

impl NativeLimit {
    /// Creates a native limit: `args` are appended to the agent's command (`{max_steps}` is
    /// replaced by the budget) unless it already carries one of `skip_if_present`.
    ///
    /// ```
    /// use stepguard_plugin_api::NativeLimit;
    ///
    /// let limit = NativeLimit::new(&["--max-turns", "{max_steps}"], &["--max-turns"]);
    /// let command = ["claude".to_owned(), "-p".to_owned()];
    /// assert_eq!(limit.args_for(&command, 7), Some(vec!["--max-turns".to_owned(), "7".to_owned()]));
    /// ```
    pub fn new(args: &[&str], skip_if_present: &[&str]) -> Self {
        NativeLimit {
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            skip_if_present: skip_if_present.iter().map(|s| (*s).to_owned()).collect(),
            after_program: false,
            program: None,
        }
    }

    /// Names the program whose command takes the arguments ([`NativeLimit::program`]).
    pub fn for_program(mut self, program: &str) -> Self {
        self.program = Some(program.to_owned());
        self
    }

    /// Places the arguments right after the program instead of at the end (protocol 1.5), for
    /// a CLI that takes no options after a `--` or a positional argument.
    ///
    /// ```
    /// use stepguard_plugin_api::NativeLimit;
    ///
    /// let limit = NativeLimit::new(&["-c", "limit={max_tokens}"], &["limit"]).after_program();
    /// let command: Vec<String> = ["codex", "exec", "--json", "--", "fix it"].map(String::from).into();
    /// assert_eq!(
    ///     limit.command_for_tokens(&command, 5000).unwrap(),
    ///     ["codex", "-c", "limit=5000", "exec", "--json", "--", "fix it"]
    /// );
    /// ```
    pub fn after_program(mut self) -> Self {
        self.after_program = true;
        self
    }

    /// Returns true when `command` already carries one of [`NativeLimit::skip_if_present`]
    /// (as `ARG` or `ARG=…`).
    pub fn is_present(&self, command: &[String]) -> bool {
        command.iter().any(|arg| {
            self.skip_if_present.iter().any(|flag| {
                arg == flag
                    || arg
                        .strip_prefix(flag.as_str())
                        .is_some_and(|r| r.starts_with('='))
            })
        })
    }

    /// Returns the arguments for `max_steps` (`{max_steps}` replaced), or `None` when the
    /// command already carries the limit. They go at the end of the command unless
    /// [`NativeLimit::after_program`] is set: [`NativeLimit::command_with`] places them.
    pub fn args_for(&self, command: &[String], max_steps: u32) -> Option<Vec<String>> {
        self.args_with(command, &[("max_steps", &max_steps.to_string())])
    }

    /// Returns the arguments with each `{NAME}` of `values` (`("max_tokens", "5000")`)
    /// replaced, or `None` when the command already carries the limit.
    pub fn args_with(&self, command: &[String], values: &[(&str, &str)]) -> Option<Vec<String>> {
        (!self.is_present(command)).then(|| {
            self.args
                .iter()
                .map(|arg| {
                    values.iter().fold(arg.clone(), |arg, (name, value)| {
                        arg.replace(&format!("{{{name}}}"), value)
                    })
                })
                .collect()
        })
    }

    /// Returns the whole command with the limit's arguments in place (`{NAME}` replaced as in
    /// [`NativeLimit::args_with`]): appended, or right after the program when
    /// [`NativeLimit::after_program`] is set. `None` when the command already carries the
    /// limit or is empty.
    pub fn command_with(&self, command: &[String], values: &[(&str, &str)]) -> Option<Vec<String>> {
        let (program, rest) = command.split_first()?;
        let args = self.args_with(command, values)?;
        let mut out = Vec::with_capacity(command.len() + args.len());
        if self.after_program {
            out.push(program.clone());
            out.extend(args);
            out.extend(rest.iter().cloned());
        } else {
            out.extend(command.iter().cloned());
            out.extend(args);
        }
        Some(out)
    }

    /// [`NativeLimit::command_with`] for a token budget (`{max_tokens}`).
    pub fn command_for_tokens(&self, command: &[String], max_tokens: u64) -> Option<Vec<String>> {
        self.command_with(command, &[("max_tokens", &max_tokens.to_string())])
    }

    /// [`NativeLimit::command_with`] for a cost budget in US dollars (`{max_cost_usd}`, written
    /// as a plain decimal: `2.5`, `0.25`); `None` as well for a value that is not finite or
    /// below zero.
    ///
    /// ```
    /// use stepguard_plugin_api::NativeLimit;
    ///
    /// let limit = NativeLimit::new(&["--max-budget-usd", "{max_cost_usd}"], &["--max-budget-usd"]);
    /// let command: Vec<String> = ["claude", "-p", "fix it"].map(String::from).into();
    /// assert_eq!(
    ///     limit.command_for_cost(&command, 2.5).unwrap(),
    ///     ["claude", "-p", "fix it", "--max-budget-usd", "2.5"]
    /// );
    /// let given: Vec<String> = ["claude", "--max-budget-usd=1"].map(String::from).into();
    /// assert_eq!(limit.command_for_cost(&given, 2.5), None);
    /// ```
    pub fn command_for_cost(&self, command: &[String], max_cost_usd: f64) -> Option<Vec<String>> {
        if !max_cost_usd.is_finite() || max_cost_usd < 0.0 {
            return None;
        }
        self.command_with(command, &[("max_cost_usd", &max_cost_usd.to_string())])
    }
}

/// What the host asks for when opening a counter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CounterRequest {
    /// The unit to count (always one the manifest declares).
    pub unit: String,
    /// Provider options from the config, minus the ones the host handles
    /// ([`RESERVED_OPTIONS`]); only keys the manifest declares reach the plugin.
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
    /// True when the host takes no tool calls and no tool results from this counter (nothing
    /// looks for loops: `--loop-limit off`, or a stream counted without loop detection), so
    /// the counter may skip finding them, and the adapter keeps none (protocol 1.7). Absent,
    /// as from hosts before 1.7, it is false: calls are collected as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_calls_unused: bool,
}

impl CounterRequest {
    /// Creates a request to count `unit` with no options.
    ///
    /// ```
    /// use stepguard_plugin_api::CounterRequest;
    ///
    /// let request = CounterRequest::new("line").option("strictness", "high");
    /// assert_eq!(request.unit, "line");
    /// assert_eq!(request.options["strictness"], "high");
    /// ```
    pub fn new(unit: impl Into<String>) -> Self {
        CounterRequest {
            unit: unit.into(),
            options: serde_json::Map::new(),
            tool_calls_unused: false,
        }
    }

    /// Says that the host will take no tool calls or results (protocol 1.7): the counter need
    /// not find them, and nothing keeps them.
    ///
    /// ```
    /// use stepguard_plugin_api::CounterRequest;
    ///
    /// assert!(!CounterRequest::new("item").tool_calls_unused);
    /// assert!(CounterRequest::new("item").without_tool_calls().tool_calls_unused);
    /// ```
    pub fn without_tool_calls(mut self) -> Self {
        self.tool_calls_unused = true;
        self
    }

    /// Replaces the options.
    pub fn options(mut self, options: serde_json::Map<String, serde_json::Value>) -> Self {
        self.options = options;
        self
    }

    /// Sets one option.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }
}

/// How the stream said the run ended, when it said.
///
/// ```
/// use stepguard_plugin_api::Terminal;
///
/// let ok = Terminal::success();
/// let limited = Terminal::failed("rate_limited", "429 Too Many Requests".to_owned());
/// let no_text = Terminal::failed("max_steps", None);
/// assert!(ok.success && !limited.success);
/// assert_eq!(no_text.slug.as_deref(), Some("max_steps"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Terminal {
    /// Whether the provider reported success.
    pub success: bool,
    /// The failure slug when it failed: one of [`TERMINAL_SLUGS`] (`max_steps`, `rate_limited`,
    /// `provider_error` …). Any other slug is recorded as `provider_error`, with a warning.
    #[serde(default)]
    pub slug: Option<String>,
    /// The provider's own error text, when it gave one.
    #[serde(default)]
    pub message: Option<String>,
}

impl Terminal {
    /// The provider reported success.
    pub fn success() -> Self {
        Terminal {
            success: true,
            slug: None,
            message: None,
        }
    }

    /// The provider reported a failure: `slug` is one of [`TERMINAL_SLUGS`], `message` the
    /// provider's own error text (a `String`, `Some(String)` or `None`).
    pub fn failed(slug: impl Into<String>, message: impl Into<Option<String>>) -> Self {
        Terminal {
            success: false,
            slug: Some(slug.into()),
            message: message.into(),
        }
    }
}

/// The failure slugs a plugin may put in [`Terminal::slug`]: the reasons a provider's own
/// stream can give for a failed run.
///
/// * `max_steps`: the provider's own turn or step limit ended the run;
/// * `max_tokens`: the provider's own token budget ended it (e.g. Codex's
///   `features.rollout_budget`);
/// * `max_cost`: the provider's own cost budget ended it (e.g. Claude Code's
///   `--max-budget-usd`);
/// * `timeout`: the provider's own time limit ended it;
/// * `provider_error`: an API error, a failed turn, a crash (the catch-all);
/// * `rate_limited`: HTTP 429, a rate-limit event or an exhausted quota;
/// * `context_guard`: the conversation outgrew the model's context window.
///
/// stepguard's other failure slugs are not a stream's to give: the host decides `interrupted`,
/// `killed`, `spawn_failed`, `plugin_error` and `unrecognized_stream` from the process and the
/// plugin, and the rest (`no_tools`, `tool_limit`, `final_report_missing` …) judge single model
/// responses inside the governor's loop. Any other slug is recorded as `provider_error`, with a
/// warning. The list may grow in a minor release; it never shrinks within 1.x.
pub const TERMINAL_SLUGS: &[&str] = &[
    "max_steps",
    "max_tokens",
    "max_cost",
    "timeout",
    "provider_error",
    "rate_limited",
    "context_guard",
];

/// Returns true when `slug` is one of [`TERMINAL_SLUGS`].
///
/// ```
/// use stepguard_plugin_api::is_terminal_slug;
///
/// assert!(is_terminal_slug("rate_limited"));
/// assert!(!is_terminal_slug("plugin_error"));
/// assert!(!is_terminal_slug("Rate_Limited"));
/// ```
pub fn is_terminal_slug(slug: &str) -> bool {
    TERMINAL_SLUGS.contains(&slug)
}

/// Token counts from the stream: a run's totals in [`CounterStats::tokens`], or what a stretch
/// of the stream added to them, as [`crate::StepCounter::take_usage`] reports it (protocol 1.5).
///
/// ```
/// use stepguard_plugin_api::Tokens;
///
/// let tokens = Tokens::new(1200, 300).cached_input_tokens(1000).reasoning_output_tokens(None);
/// assert_eq!((tokens.input_tokens, tokens.cached_input_tokens), (1200, Some(1000)));
/// assert_eq!(tokens.total(), 1500);
/// let more = tokens.saturating_add(Tokens::new(100, 20));
/// assert_eq!((more.total(), more.cached_input_tokens), (1620, Some(1000)));
/// assert_eq!(more.saturating_sub(tokens), Tokens::new(100, 20).cached_input_tokens(0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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

impl Tokens {
    /// Creates token counts; `input_tokens` includes cached ones.
    pub const fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Tokens {
            input_tokens,
            output_tokens,
            cached_input_tokens: None,
            reasoning_output_tokens: None,
        }
    }

    /// Sets the cached input tokens (a number, or `None` when unknown).
    pub fn cached_input_tokens(mut self, tokens: impl Into<Option<u64>>) -> Self {
        self.cached_input_tokens = tokens.into();
        self
    }

    /// Sets the reasoning output tokens (a number, or `None` when unknown).
    pub fn reasoning_output_tokens(mut self, tokens: impl Into<Option<u64>>) -> Self {
        self.reasoning_output_tokens = tokens.into();
        self
    }

    /// Input plus output tokens (cached input included): what a token budget counts.
    pub const fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Returns true when every count is zero or unknown.
    pub fn is_zero(&self) -> bool {
        self.total() == 0
            && self.cached_input_tokens.unwrap_or(0) == 0
            && self.reasoning_output_tokens.unwrap_or(0) == 0
    }

    /// Adds `other` field by field (saturating); a count known on either side is known in
    /// the sum.
    pub fn saturating_add(self, other: Tokens) -> Tokens {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        Tokens {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cached_input_tokens: add(self.cached_input_tokens, other.cached_input_tokens),
            reasoning_output_tokens: add(
                self.reasoning_output_tokens,
                other.reasoning_output_tokens,
            ),
        }
    }

    /// Subtracts `earlier` field by field, stopping at zero: what a running total added since
    /// `earlier`. A count unknown here stays unknown.
    pub fn saturating_sub(self, earlier: Tokens) -> Tokens {
        let sub = |a: Option<u64>, b: Option<u64>| a.map(|a| a.saturating_sub(b.unwrap_or(0)));
        Tokens {
            input_tokens: self.input_tokens.saturating_sub(earlier.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(earlier.output_tokens),
            cached_input_tokens: sub(self.cached_input_tokens, earlier.cached_input_tokens),
            reasoning_output_tokens: sub(
                self.reasoning_output_tokens,
                earlier.reasoning_output_tokens,
            ),
        }
    }

    /// The larger of the two, field by field; a count known on either side is known.
    pub fn max_each(self, other: Tokens) -> Tokens {
        let max = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        };
        Tokens {
            input_tokens: self.input_tokens.max(other.input_tokens),
            output_tokens: self.output_tokens.max(other.output_tokens),
            cached_input_tokens: max(self.cached_input_tokens, other.cached_input_tokens),
            reasoning_output_tokens: max(
                self.reasoning_output_tokens,
                other.reasoning_output_tokens,
            ),
        }
    }
}

/// A counter's final numbers.
///
/// Start from `Default::default()` and assign the fields you know; that keeps compiling when a
/// minor release adds a field (a struct literal does not, even with `..Default::default()`):
///
/// ```
/// use stepguard_plugin_api::{CounterStats, Terminal};
///
/// let mut stats = CounterStats::default();
/// stats.num_steps_computed = 3;
/// stats.terminal = Some(Terminal::success());
/// assert_eq!(stats.noise_lines, 0);
/// ```
///
/// ```compile_fail,E0639
/// # use stepguard_plugin_api::CounterStats;
/// // Refused outside this crate: the struct is `#[non_exhaustive]`.
/// let stats = CounterStats { num_steps_computed: 3, ..CounterStats::default() };
/// ```
///
/// The step, turn and sub-agent counts duplicate the per-line [`crate::LineReport`]s, which
/// are what the host enforces and records: it checks these fields against the sums of the
/// lines' reports and warns once when they disagree (see the crate docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct CounterStats {
    /// Steps counted by the plugin from the stream; checked against the lines' `steps_begun`.
    pub num_steps_computed: u64,
    /// Steps the provider itself reported, if its stream says.
    pub num_steps_reported: Option<u64>,
    /// Legacy turns the provider reported.
    pub num_turns_reported: Option<u64>,
    /// Legacy turns counted from the stream; checked against the lines' `turns`.
    pub num_turns_computed: Option<u64>,
    /// The terminal event's verdict; `None` when the stream had no terminal event.
    pub terminal: Option<Terminal>,
    /// Token usage, when the stream carries it: the run's totals, sub-agents included. A
    /// plugin that reports usage (protocol 1.5) makes it the sum of what
    /// [`crate::StepCounter::take_usage`] returned.
    pub tokens: Option<Tokens>,
    /// Cost in US dollars, when the stream carries it.
    pub cost_usd: Option<f64>,
    /// Lines that were not events.
    pub noise_lines: u64,
    /// JSON lines of unknown event types (ignored).
    pub unknown_events: u64,
    /// Steps per sub-agent (keyed by the provider's id), never counted against the budget;
    /// their sum is checked against the lines' `sub_agent_steps`. Protocol 1.1: a plugin that
    /// fills it declares [`Manifest::requires_protocol`]`("1.1")`.
    pub sub_agent_steps: BTreeMap<String, u64>,
    /// Token usage per sub-agent, keyed like [`CounterStats::sub_agent_steps`], already
    /// included in [`CounterStats::tokens`] (protocol 1.5).
    #[serde(default)]
    pub sub_agent_tokens: BTreeMap<String, Tokens>,
    /// The CLI's own id of the session the stream belongs to (Claude's `session_id`, Codex's
    /// thread id …), which its [`Manifest::resume`] template resumes (protocol 1.8); `None`
    /// when the stream did not name one. Hosts before 1.8 ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// Returns the failure slug an error text most likely means: `rate_limited` for HTTP 429, rate
/// limits and exhausted quotas, else `provider_error`.
pub fn slug_for_error_text(text: &str) -> &'static str {
    let lower = text.to_ascii_lowercase();
    // `429` as a number of its own: not a port (`127.0.0.1:42927`), an id or a count.
    let status_429 = lower.match_indices("429").any(|(at, _)| {
        let digit_at = |i: Option<usize>| {
            i.and_then(|i| lower.as_bytes().get(i))
                .is_some_and(u8::is_ascii_digit)
        };
        !digit_at(at.checked_sub(1)) && !digit_at(Some(at + 3))
    });
    let rate_limited = status_429
        || [
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

/// One tool call seen in the stream, identified for loop detection (protocol 1.3): the tool's
/// name and a fingerprint of the name and its arguments, so that the same call with its
/// arguments written in another key order or spacing is the same call.
///
/// Protocol 1.6 adds the provider's tool-use `id` (which [`ToolResult`]s answer), the `program`
/// a shell tool ran ([`ToolCall::shell`]) and the `step` it was made in (filled in by the
/// adapter, [`crate::provider_box`] and [`crate::export_plugin!`], not by the plugin).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolCall {
    /// The tool's name, as the provider calls it (`shell`, `Bash`, `read_file` …).
    pub tool: String,
    /// 16 hex digits: the 64-bit FNV-1a hash of the name and the arguments' canonical JSON.
    pub fingerprint: String,
    /// The provider's id of the call, which its result names (protocol 1.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// For a shell tool, the program the command runs (`cargo` in `FOO=1 cargo test`), which
    /// loop detection takes for the tool when it looks for `no_progress` (protocol 1.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// The counter's steps begun up to and including the call's line (protocol 1.6; set by
    /// the adapter, so that the host knows the call's step however the stream was chunked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

impl ToolCall {
    /// Identifies a call of `tool` with `arguments` (any JSON; a string holding JSON, as some
    /// providers send arguments, is parsed first so that its formatting does not matter).
    ///
    /// ```
    /// use stepguard_plugin_api::ToolCall;
    /// use stepguard_plugin_api::serde_json::json;
    ///
    /// let a = ToolCall::new("read", &json!({"path": "a.rs", "limit": 10}));
    /// let b = ToolCall::new("read", &json!("{ \"limit\": 10,\n \"path\": \"a.rs\" }"));
    /// assert_eq!(a, b);
    /// assert_ne!(a, ToolCall::new("read", &json!({"path": "b.rs", "limit": 10})));
    /// assert_ne!(a, ToolCall::new("write", &json!({"path": "a.rs", "limit": 10})));
    /// ```
    pub fn new(tool: impl Into<String>, arguments: &serde_json::Value) -> Self {
        let tool = tool.into();
        let parsed;
        let arguments = match arguments
            .as_str()
            .map(serde_json::from_str::<serde_json::Value>)
        {
            Some(Ok(inner)) => {
                parsed = inner;
                &parsed
            }
            _ => arguments,
        };
        let mut text = String::new();
        canonical_json(arguments, &mut text);
        ToolCall {
            fingerprint: crate::fingerprint::fnv(&[tool.as_bytes(), text.as_bytes()]),
            tool,
            id: None,
            program: None,
            step: None,
        }
    }

    /// Identifies a shell tool's call running `command`, its other arguments (working
    /// directory, timeout …) in `arguments`: the command is normalised
    /// ([`crate::fingerprint::normalise_command`]: a comment, spacing, quoting or an
    /// environment prefix make no different call) and its program is kept (protocol 1.6).
    ///
    /// ```
    /// use stepguard_plugin_api::ToolCall;
    /// use stepguard_plugin_api::serde_json::json;
    ///
    /// let a = ToolCall::shell("Bash", "FOO=1 cargo test  # again", &json!({}));
    /// let b = ToolCall::shell("Bash", "cargo test", &json!({}));
    /// assert_eq!(a.fingerprint, b.fingerprint);
    /// assert_eq!(a.program.as_deref(), Some("cargo"));
    /// assert_ne!(a.fingerprint, ToolCall::shell("Bash", "cargo build", &json!({})).fingerprint);
    /// ```
    pub fn shell(tool: impl Into<String>, command: &str, arguments: &serde_json::Value) -> Self {
        let tool = tool.into();
        let mut text = String::new();
        canonical_json(arguments, &mut text);
        let command_text = crate::fingerprint::normalise_command(command);
        ToolCall {
            fingerprint: crate::fingerprint::fnv(&[
                tool.as_bytes(),
                command_text.as_bytes(),
                text.as_bytes(),
            ]),
            program: crate::fingerprint::program_of(command),
            tool,
            id: None,
            step: None,
        }
    }

    /// Names the provider's id of the call, which its [`ToolResult`] names (protocol 1.6).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
}

/// The result of one tool call, identified for loop detection (protocol 1.6): which call it
/// answers, whether it failed, and a fingerprint of its normalised output, so that the same
/// failing test run twice gives the same fingerprint and a run with one failure fewer does not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolResult {
    /// The id of the [`ToolCall`] it answers.
    pub call_id: String,
    /// 16 hex digits: the 64-bit FNV-1a hash of the status and the normalised output.
    pub fingerprint: String,
    /// Whether the call failed (a non-zero exit status, an error result).
    pub failed: bool,
}

impl ToolResult {
    /// Identifies the result of call `call_id`: its `output` (normalised,
    /// [`crate::fingerprint::normalise_output`]) and whether it `failed`.
    ///
    /// ```
    /// use stepguard_plugin_api::ToolResult;
    ///
    /// let a = ToolResult::new("c1", "1 failed; finished in 0.4s", true);
    /// let b = ToolResult::new("c9", "1 failed;  finished in 2.1s\n", true);
    /// assert_eq!(a.fingerprint, b.fingerprint);
    /// assert_ne!(a.fingerprint, ToolResult::new("c1", "0 failed; finished in 0.4s", false).fingerprint);
    /// ```
    pub fn new(call_id: impl Into<String>, output: &str, failed: bool) -> Self {
        let status: &[u8] = if failed { b"failed" } else { b"ok" };
        ToolResult {
            call_id: call_id.into(),
            fingerprint: crate::fingerprint::output_fingerprint(status, output),
            failed,
        }
    }
}

/// Writes `value` as JSON with object keys sorted and no whitespace, whatever order the map
/// keeps them in.
fn canonical_json(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(&map[key.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
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
        // A 500 whose text names a gateway on port 42927 (seen with the real Claude Code).
        assert_eq!(
            slug_for_error_text(
                "API Error: 500 Internal server error. check your inference gateway (127.0.0.1:42927)."
            ),
            "provider_error"
        );
        assert_eq!(slug_for_error_text("HTTP 429"), "rate_limited");
        assert_eq!(slug_for_error_text("status=429, retrying"), "rate_limited");
        assert_eq!(
            slug_for_error_text("request 14290 failed"),
            "provider_error"
        );
    }

    #[test]
    fn preflight_rules_name_the_missing_flag() {
        let cmd = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let json = PreflightRule::new("codex", &["--json"], "add `--json`").when_any(&["exec"]);
        assert!(!json.accepts(&cmd(&["codex", "exec", "fix it"])));
        assert!(!json.accepts(&cmd(&["/usr/bin/codex", "exec", "fix it"])));
        assert!(json.accepts(&cmd(&["codex", "exec", "--json", "fix it"])));
        assert!(json.accepts(&cmd(&["codex", "login"])));
        assert!(json.accepts(&cmd(&["./wrapper.sh", "exec"])));
        let format = PreflightRule::new("gemini", &["--output-format=stream-json"], "add it");
        assert!(format.accepts(&cmd(&["gemini", "--output-format", "stream-json"])));
        assert!(format.accepts(&cmd(&["gemini", "--output-format=stream-json"])));
        assert!(!format.accepts(&cmd(&["gemini", "--output-format", "json"])));
        assert!(!format.accepts(&cmd(&["gemini", "-p", "x"])));
        let manifest = Manifest::new("codex", "1").preflight(json);
        assert_eq!(
            manifest
                .preflight_failure(&cmd(&["codex", "exec", "x"]))
                .map(|r| r.fix.as_str()),
            Some("add `--json`")
        );
    }

    #[test]
    fn native_limit_is_added_unless_present() {
        let limit = NativeLimit::new(&["--max-turns", "{max_steps}"], &["--max-turns"]);
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

    #[test]
    fn a_native_limit_knows_its_program_and_old_manifests_still_load() {
        // A manifest as protocol 1.5 plugins send it: no `program`, no `first_event_ms`.
        let old = r#"{"name":"claude","version":"1","protocol":"1.5.0","units":[],
            "native_limit":{"args":["--max-turns","{max_steps}"],"skip_if_present":["--max-turns"]},
            "preflight":[{"program":"claude","require_any":["-p"],"fix":"add -p"}]}"#;
        let manifest: Manifest = serde_json::from_str(old).unwrap();
        let limit = manifest.native_limit.clone().unwrap();
        assert_eq!(limit.program, None);
        assert_eq!(manifest.native_program(&limit), Some("claude"));
        assert_eq!(manifest.first_event_ms, None);
        assert_eq!(
            manifest.first_event_deadline(),
            std::time::Duration::from_secs(60)
        );
        // The new fields round-trip, need no newer protocol, and are left out when unset.
        let new = manifest
            .clone()
            .native_limit(limit.for_program("claude-code"))
            .first_event_within(std::time::Duration::from_secs(5));
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""program":"claude-code""#), "{text}");
        assert!(text.contains(r#""first_event_ms":5000"#), "{text}");
        assert_eq!(serde_json::from_str::<Manifest>(&text).unwrap(), new);
        assert_eq!(new.min_protocol(), manifest.min_protocol());
        assert!(
            !serde_json::to_string(&manifest)
                .unwrap()
                .contains("first_event")
        );
        let bare: Vec<String> = vec!["/opt/bin/claude".into()];
        assert_eq!(program_name(&bare), Some("claude"));
    }

    #[test]
    fn the_declared_protocol_is_the_lowest_the_manifest_needs() {
        let plain = Manifest::new("p", "1").unit("u", "", true);
        assert_eq!(plain.protocol, "1.0.0");
        assert_eq!(plain.min_protocol(), "1.0.0");
        let limit = NativeLimit::new(&["--max", "{max_steps}"], &[]);
        assert_eq!(
            plain.clone().native_limit(limit.clone()).min_protocol(),
            "1.1.0"
        );
        assert_eq!(plain.clone().expects("JSON").min_protocol(), "1.2.0");
        let rule = PreflightRule::new("p", &["--json"], "add `--json`");
        assert_eq!(plain.clone().preflight(rule).min_protocol(), "1.2.0");
        // A field set directly counts too.
        let mut direct = plain.clone();
        direct.native_limit = Some(limit);
        assert_eq!(direct.min_protocol(), "1.1.0");
        // Raising only ever raises; both spellings work; the higher of floor and fields wins.
        let raised = plain
            .clone()
            .requires_protocol("1.1")
            .requires_protocol("1.0.0");
        assert_eq!(raised.protocol, "1.1.0");
        assert_eq!(raised.clone().expects("JSON").min_protocol(), "1.2.0");
        assert_eq!(
            plain.clone().requires_protocol("2.0").min_protocol(),
            "2.0.0"
        );
        // Nonsense is kept as written so that the host refuses it.
        let bad = plain.requires_protocol("one").requires_protocol("1.1");
        assert_eq!(bad.min_protocol(), "one");
    }

    #[test]
    fn the_current_protocol_covers_every_manifest_feature() {
        let everything = Manifest::new("p", "1")
            .native_limit(NativeLimit::new(&[], &[]))
            .expects("JSON")
            .preflight(PreflightRule::new("p", &[], "fix"))
            .reports_tool_calls()
            .model_endpoint(
                ModelEndpoint::new("gemini", "https://example.invalid")
                    .api_key_env("GEMINI_API_KEY"),
            )
            .reports_usage()
            .native_token_limit(NativeLimit::new(&[], &[]).after_program())
            .native_cost_limit(NativeLimit::new(&[], &[]))
            .reports_tool_results()
            .resume(ResumeTemplate::new(&["p", "--resume", "{session}"]));
        // 1.8's `resume` is a manifest feature; its other addition, the stats' `session_id`,
        // is ignored by older hosts.
        assert_eq!(everything.min_protocol(), "1.8.0");
        assert_eq!(crate::PROTOCOL_VERSION, "1.8.0");
    }

    #[test]
    fn a_resume_template_needs_protocol_1_8_and_a_session_id_crosses_as_json() {
        let plain = Manifest::new("p", "1").unit("u", "", true);
        let resumable = plain
            .clone()
            .resume(ResumeTemplate::new(&["p", "--resume", "{session}"]));
        assert_eq!(resumable.min_protocol(), "1.8.0");
        assert_eq!(plain.min_protocol(), "1.0.0");
        // A 1.7 plugin's manifest has no `resume`: no resume, and it still parses.
        let old: Manifest =
            serde_json::from_str(r#"{"name":"p","version":"1","protocol":"1.7.0","units":[]}"#)
                .unwrap();
        assert_eq!(old.resume, None);
        let json = serde_json::to_value(&resumable).unwrap();
        assert_eq!(json["resume"]["args"][2], "{session}");
        // The stats' session id: absent before 1.8, kept when set.
        let stats: CounterStats = serde_json::from_str(r#"{"num_steps_computed":2}"#).unwrap();
        assert_eq!(stats.session_id, None);
        let with = CounterStats {
            session_id: Some("ses_1".into()),
            ..CounterStats::default()
        };
        let back: CounterStats =
            serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
        assert_eq!(back.session_id.as_deref(), Some("ses_1"));
        // Not serialised when unknown, so an older host sees what it always saw.
        assert!(
            !serde_json::to_string(&CounterStats::default())
                .unwrap()
                .contains("session_id")
        );
    }

    #[test]
    fn usage_and_native_budgets_need_protocol_1_5() {
        let plain = Manifest::new("p", "1").unit("u", "", true);
        let limit = NativeLimit::new(&["--budget", "{max_tokens}"], &["--budget"]);
        for manifest in [
            plain.clone().reports_usage(),
            plain.clone().native_token_limit(limit.clone()),
            plain.clone().native_cost_limit(limit.clone()),
            plain.clone().native_limit(limit.clone().after_program()),
        ] {
            assert_eq!(manifest.min_protocol(), "1.5.0", "{manifest:?}");
        }
        // A direct assignment counts too, and a plain step limit stays 1.1.
        let mut direct = plain.clone();
        direct.reports_usage = true;
        assert_eq!(direct.min_protocol(), "1.5.0");
        assert_eq!(plain.native_limit(limit).min_protocol(), "1.1.0");
    }

    #[test]
    fn an_older_manifest_reads_without_the_new_fields() {
        let json = r#"{"name":"p","version":"1","protocol":"1.4.0","units":[{"name":"u"}],
            "native_limit":{"args":["--max","{max_steps}"]}}"#;
        let manifest: Manifest = serde_json::from_str(json).unwrap();
        assert!(!manifest.reports_usage);
        assert_eq!(manifest.native_token_limit, None);
        assert_eq!(manifest.native_cost_limit, None);
        assert!(!manifest.native_limit.unwrap().after_program);
        let stats: CounterStats = serde_json::from_str(r#"{"num_steps_computed":3}"#).unwrap();
        assert!(stats.sub_agent_tokens.is_empty());
        // A limit that appends serialises as before (no `after_program` key).
        let text = serde_json::to_string(&NativeLimit::new(&["-x"], &[])).unwrap();
        assert_eq!(text, r#"{"args":["-x"],"skip_if_present":[]}"#);
    }

    #[test]
    fn native_budget_arguments_take_their_placeholders_and_place() {
        let cmd = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let tokens = NativeLimit::new(
            &[
                "-c",
                "budget.enabled=true",
                "-c",
                "budget.limit={max_tokens}",
            ],
            &["budget.limit", "budget"],
        )
        .after_program();
        assert_eq!(
            tokens.command_for_tokens(&cmd(&["codex", "exec", "--json", "--", "x"]), 9000),
            Some(cmd(&[
                "codex",
                "-c",
                "budget.enabled=true",
                "-c",
                "budget.limit=9000",
                "exec",
                "--json",
                "--",
                "x"
            ]))
        );
        assert_eq!(
            tokens.command_for_tokens(&cmd(&["codex", "-c", "budget.limit=5", "exec"]), 9),
            None
        );
        assert_eq!(tokens.command_for_tokens(&[], 9), None);
        let cost = NativeLimit::new(
            &["--max-budget-usd", "{max_cost_usd}"],
            &["--max-budget-usd"],
        );
        assert_eq!(
            cost.command_for_cost(&cmd(&["claude", "-p", "x"]), 0.25),
            Some(cmd(&["claude", "-p", "x", "--max-budget-usd", "0.25"]))
        );
        assert_eq!(
            cost.command_for_cost(&cmd(&["claude", "-p", "x"]), 3.0),
            Some(cmd(&["claude", "-p", "x", "--max-budget-usd", "3"]))
        );
        assert_eq!(cost.command_for_cost(&cmd(&["claude"]), f64::NAN), None);
        // Other placeholders stay as written; several are replaced at once.
        let both = NativeLimit::new(&["{max_steps}", "{max_tokens}", "{other}"], &[]);
        assert_eq!(
            both.args_with(&cmd(&["x"]), &[("max_tokens", "7"), ("max_steps", "3")]),
            Some(cmd(&["3", "7", "{other}"]))
        );
        assert_eq!(
            both.args_for(&cmd(&["x"]), 4),
            Some(cmd(&["4", "{max_tokens}", "{other}"]))
        );
    }

    #[test]
    fn token_arithmetic_keeps_unknown_counts_unknown() {
        let a = Tokens::new(100, 10).cached_input_tokens(40);
        let b = Tokens::new(50, 5).reasoning_output_tokens(2);
        let sum = a.saturating_add(b);
        assert_eq!(
            sum,
            Tokens::new(150, 15)
                .cached_input_tokens(40)
                .reasoning_output_tokens(2)
        );
        assert_eq!(
            sum.saturating_sub(a),
            Tokens::new(50, 5)
                .cached_input_tokens(0)
                .reasoning_output_tokens(2)
        );
        assert_eq!(
            Tokens::new(1, 1).saturating_sub(Tokens::new(5, 0)),
            Tokens::new(0, 1)
        );
        assert_eq!(
            a.max_each(b),
            Tokens::new(100, 10)
                .cached_input_tokens(40)
                .reasoning_output_tokens(2)
        );
        assert!(Tokens::default().is_zero());
        assert!(Tokens::new(0, 0).cached_input_tokens(0).is_zero());
        assert!(!Tokens::new(0, 0).reasoning_output_tokens(1).is_zero());
        assert_eq!(Tokens::new(u64::MAX, 1).total(), u64::MAX);
    }

    #[test]
    fn terminal_slugs_include_what_the_helpers_produce() {
        for text in ["429", "boom"] {
            assert!(is_terminal_slug(slug_for_error_text(text)));
        }
        assert!(is_terminal_slug("max_steps"));
        for host_side in [
            "interrupted",
            "killed",
            "plugin_error",
            "unrecognized_stream",
        ] {
            assert!(!is_terminal_slug(host_side), "{host_side}");
        }
        assert_eq!(
            Terminal::failed("timeout", None),
            Terminal {
                success: false,
                slug: Some("timeout".into()),
                message: None
            }
        );
        assert_eq!(Terminal::success().slug, None);
    }
}
