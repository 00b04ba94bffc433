//! The config model: everything the config files in effect say, merged, each value remembering
//! its file and key. The parser builds it; the precedence ladder (`ladder`) reads it.

use std::collections::BTreeMap;

use crate::value::{LoopLimit, Origin, Setting};

/// Budget keys that may appear at one level: the current spelling and the legacy one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LevelSettings {
    /// `max_steps` at this level.
    pub max_steps: Option<Setting>,
    /// The legacy `max_turns` at this level.
    pub max_turns: Option<Setting>,
    /// `max_tokens` at this level (resolved by `spend::resolve`).
    pub max_tokens: Option<Setting>,
    /// `max_cost_usd` at this level (resolved by `spend::resolve`).
    pub max_cost_usd: Option<Setting>,
}

/// A `[profiles.NAME]` table from a config file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileSettings {
    /// The profile's budget, overriding the built-in one.
    pub max_steps: Option<Setting>,
    /// The profile's token budget (no built-in profile has one).
    pub max_tokens: Option<Setting>,
    /// The profile's cost budget (no built-in profile has one).
    pub max_cost_usd: Option<Setting>,
}

/// A policy's `max_steps_ceiling`: no budget, whatever its source, may exceed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ceiling {
    /// The most steps any run may be given, 1 to [`stepguard_core::budget::MAX_STEPS_CEILING`].
    pub max_steps: u32,
    /// Where the policy set it.
    pub origin: Origin,
}

/// The `[policy]` in effect, merged from the policy-bearing files (the system file, the user's
/// file, `STEPGUARD_POLICY`): limits the repository's own files, flags and environment cannot
/// loosen. A project file's `[policy]` never reaches this.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicySettings {
    /// `max_steps_ceiling`: the tightest of the policy files.
    pub max_steps_ceiling: Option<Ceiling>,
    /// `[policy.P] max_steps_unit`: the unit provider `P` must count in, with where it was fixed.
    pub units: BTreeMap<String, (String, Origin)>,
    /// `allow_plugin_override`: consent for plugin files replacing built-in providers. Any policy
    /// file saying `false` wins over others saying `true`.
    pub allow_plugin_override: Option<(bool, Origin)>,
    /// `max_tokens_ceiling`: no token budget may exceed it (the lowest of the policy files).
    pub max_tokens_ceiling: Option<(u64, Origin)>,
    /// `max_cost_usd_ceiling`: no cost budget, in US dollars, may exceed it (the lowest of the
    /// policy files).
    pub max_cost_usd_ceiling: Option<(f64, Origin)>,
    /// `locked`: the settings no file, flag or environment variable may loosen (the union of the
    /// policy files), each with where it was locked.
    pub locked: BTreeMap<Lock, Origin>,
}

/// A setting a policy may lock with `locked = [...]`: then nothing may loosen it, the user's and
/// system's files, flags and environment included; it may only be tightened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Lock {
    /// `unrecognized_stream`: no `[run] unrecognized_stream = "warn"`, no
    /// `--unrecognized-stream warn`.
    UnrecognizedStream,
    /// `wrap_up`: where a file turns the wrap-up on, no file below the top nor `--no-wrap-up`
    /// turns it off.
    WrapUp,
    /// `loops`: no loop limit above the default (or the policy files' own), no `off`, no
    /// narrower window, no exempt tools, from any file, flag or environment variable.
    Loops,
    /// `native_limit`: no `--no-native-limit`.
    NativeLimit,
    /// `preflight`: no `--no-preflight`.
    Preflight,
    /// `containment`: no `--containment process-walk`.
    Containment,
}

impl Lock {
    /// Every lock, in the order the docs list them.
    pub const ALL: [Lock; 6] = [
        Lock::UnrecognizedStream,
        Lock::WrapUp,
        Lock::Loops,
        Lock::NativeLimit,
        Lock::Preflight,
        Lock::Containment,
    ];

    /// Returns the name written in `locked = [...]`.
    pub fn name(self) -> &'static str {
        match self {
            Lock::UnrecognizedStream => "unrecognized_stream",
            Lock::WrapUp => "wrap_up",
            Lock::Loops => "loops",
            Lock::NativeLimit => "native_limit",
            Lock::Preflight => "preflight",
            Lock::Containment => "containment",
        }
    }

    /// Returns the lock named `name`.
    pub fn from_name(name: &str) -> Option<Lock> {
        Lock::ALL.into_iter().find(|l| l.name() == name)
    }
}

impl PolicySettings {
    /// Returns true when no policy is set.
    pub fn is_empty(&self) -> bool {
        self.max_steps_ceiling.is_none()
            && self.units.is_empty()
            && self.allow_plugin_override.is_none()
            && self.max_tokens_ceiling.is_none()
            && self.max_cost_usd_ceiling.is_none()
            && self.locked.is_empty()
    }

    /// Returns where one of the policy's settings was made, to name the policy in force in a
    /// message; `None` when no policy is set.
    pub fn origin(&self) -> Option<&Origin> {
        self.max_steps_ceiling
            .as_ref()
            .map(|c| &c.origin)
            .or(self.max_tokens_ceiling.as_ref().map(|(_, o)| o))
            .or(self.max_cost_usd_ceiling.as_ref().map(|(_, o)| o))
            .or(self.allow_plugin_override.as_ref().map(|(_, o)| o))
            .or(self.units.values().next().map(|(_, o)| o))
            .or(self.locked.values().next())
    }

    /// Returns where `lock` was set, when the policy locks it.
    pub fn locks(&self, lock: Lock) -> Option<&Origin> {
        self.locked.get(&lock)
    }
}

/// The `[loops]` table and the `loop_limit` keys of the config files in effect, validated, each
/// value with where it was set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopConfig {
    /// `loops.limit`.
    pub limit: Option<(LoopLimit, Origin)>,
    /// `loops.window`.
    pub window: Option<(u32, Origin)>,
    /// `loops.ignore_tools`.
    pub ignore_tools: Option<(Vec<String>, Origin)>,
    /// `task_types.T.loop_limit`, by task type.
    pub task_types: BTreeMap<String, (LoopLimit, Origin)>,
    /// `profiles.NAME.loop_limit`, by profile.
    pub profiles: BTreeMap<String, (LoopLimit, Origin)>,
}

/// Everything the config files in effect say, merged, each value remembering its file and key.
///
/// Produced by this crate's parser; consumed by the resolvers (`budget::resolve`,
/// `spend::resolve`, `loop_settings::resolve`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigModel {
    /// Global `max_steps` / `max_turns` (top level or `[defaults]`).
    pub global: LevelSettings,
    /// `[task_types.T]` tables.
    pub task_types: BTreeMap<String, LevelSettings>,
    /// `[profiles.NAME]` tables.
    pub profiles: BTreeMap<String, ProfileSettings>,
    /// Top-level `profile = "…"`.
    pub profile: Option<(String, Origin)>,
    /// Provider-scoped options, e.g. `[codex] max_steps_unit = "actionable"`, kept opaque.
    pub providers: BTreeMap<String, BTreeMap<String, (serde_json::Value, Origin)>>,
    /// `[policy]` from the policy-bearing files.
    pub policy: PolicySettings,
    /// `[run] unrecognized_stream`: `"stop"` (the default) or `"warn"`, for a stream none of
    /// which is recognised as the provider's.
    pub unrecognized_stream: Option<(String, Origin)>,
    /// `[run] wrap_up`: whether runs go through the model gateway, which makes the budget's
    /// last model call tool-less so the agent ends with a summary (`--wrap-up`).
    pub wrap_up: Option<(bool, Origin)>,
    /// `[run] notices`: the thresholds of the gateway's staged notices, or off
    /// ([`crate::notices`]).
    pub notices: Option<(crate::notices::NoticeSetting, Origin)>,
    /// `[run] checkpoint`, `checkpoint_max_file_mb` and `checkpoint_timeout`: whether a run
    /// that does not succeed saves its work tree as a git ref, and how.
    pub checkpoint: CheckpointConfig,
    /// `[loops]` and the `loop_limit` keys of task types and profiles (resolved by
    /// `loop_settings::resolve`).
    pub loops: LoopConfig,
    /// `[pools.NAME]`: budgets shared by every run that joins them, merged over the files
    /// ([`crate::pools`]).
    pub pools: BTreeMap<String, crate::pools::PoolConfig>,
    /// `[telemetry]`: OpenTelemetry export settings (`endpoint`, `protocol`, `headers`,
    /// `service_name`, `flush_timeout`), kept as given; the environment overrides them.
    pub telemetry: BTreeMap<String, (serde_json::Value, Origin)>,
    /// `[ledger]`: the fleet ledger (`url`) and `on_ledger_error`, from the user's, the
    /// system's and the `STEPGUARD_POLICY` file only ([`crate::ledger`]).
    pub ledger: crate::ledger::LedgerConfig,
}

/// `[run] checkpoint`, `checkpoint_max_file_mb` and `checkpoint_timeout`, as the files say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointConfig {
    /// `"git"` or `"none"`.
    pub kind: Option<(String, Origin)>,
    /// Files over this many MiB are left out of a checkpoint.
    pub max_file_mb: Option<(u64, Origin)>,
    /// How long one checkpoint may take.
    pub timeout: Option<(std::time::Duration, Origin)>,
}
