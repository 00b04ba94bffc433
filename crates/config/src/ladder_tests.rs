//! Every limit on the one ladder: each level's precedence and the one error for a bad value.

use super::*;

/// The levels every limit has, highest first (the profile bounds, the ceiling caps).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Level {
    Flag,
    Env,
    TaskType,
    Global,
    Profile,
}

const LEVELS: [Level; 5] = [
    Level::Flag,
    Level::Env,
    Level::TaskType,
    Level::Global,
    Level::Profile,
];

/// One limit as the CLI feeds it: its flag, variable and keys, and the error name.
#[derive(Clone, Copy, Debug)]
struct Kind {
    name: LimitName,
    flag: &'static str,
    env: &'static str,
    /// The key in `[task_types.T]` and `[profiles.NAME]`.
    key: &'static str,
    /// The global key.
    global: &'static str,
}

const KINDS: [Kind; 4] = [
    Kind {
        name: LimitName::Steps,
        flag: "--max-steps",
        env: "STEPGUARD_MAX_STEPS",
        key: "max_steps",
        global: "max_steps",
    },
    Kind {
        name: LimitName::Tokens,
        flag: "--max-tokens",
        env: "STEPGUARD_MAX_TOKENS",
        key: "max_tokens",
        global: "max_tokens",
    },
    Kind {
        name: LimitName::Cost,
        flag: "--max-cost-usd",
        env: "STEPGUARD_MAX_COST_USD",
        key: "max_cost_usd",
        global: "max_cost_usd",
    },
    Kind {
        name: LimitName::LoopLimit,
        flag: "--loop-limit",
        env: "STEPGUARD_LOOP_LIMIT",
        key: "loop_limit",
        global: "loops.limit",
    },
];

const POLICY_FILE: &str = "/etc/stepguard/stepguard.toml";

fn file(key: &str) -> Origin {
    Origin::File {
        path: "/p/stepguard.toml".into(),
        key: key.into(),
    }
}

/// Everything a run's limits are resolved from: flags, environment, config.
#[derive(Default)]
struct Scenario {
    flags: LevelSettings,
    env: LevelSettings,
    loop_flag: Option<Setting>,
    loop_env: Option<Setting>,
    config: ConfigModel,
}

impl Scenario {
    fn new() -> Self {
        let mut s = Scenario::default();
        s.config
            .task_types
            .insert("review".into(), LevelSettings::default());
        s.config
            .profiles
            .insert("p".into(), ProfileSettings::default());
        s
    }

    /// Sets `kind` at `level` to `value` (text, as a flag or a file string would give it).
    fn set(&mut self, kind: Kind, level: Level, value: &str) {
        let setting = |origin: Origin| Some(Setting::text(value, origin));
        let origin = match level {
            Level::Flag => Origin::Flag(kind.flag.into()),
            Level::Env => Origin::Env(kind.env.into()),
            Level::TaskType => file(&format!("task_types.review.{}", kind.key)),
            Level::Global => file(kind.global),
            Level::Profile => file(&format!("profiles.p.{}", kind.key)),
        };
        if kind.name == LimitName::LoopLimit {
            // Files hold loop limits validated as parsed; flag and env stay raw.
            let parsed = || {
                let limit = loop_settings::parse_loop_limit(&RawValue::Text(value.into()))
                    .expect("a valid loop limit in a file");
                (limit, origin.clone())
            };
            let loops = &mut self.config.loops;
            match level {
                Level::Flag => self.loop_flag = setting(origin.clone()),
                Level::Env => self.loop_env = setting(origin.clone()),
                Level::TaskType => {
                    loops.task_types.insert("review".into(), parsed());
                }
                Level::Global => loops.limit = Some(parsed()),
                Level::Profile => {
                    loops.profiles.insert("p".into(), parsed());
                }
            }
            return;
        }
        let task = self.config.task_types.get_mut("review").expect("review");
        let profile = self.config.profiles.get_mut("p").expect("p");
        let (level_settings, profile_slot) = match level {
            Level::Flag => (Some(&mut self.flags), None),
            Level::Env => (Some(&mut self.env), None),
            Level::TaskType => (Some(task), None),
            Level::Global => (Some(&mut self.config.global), None),
            Level::Profile => (None, Some(profile)),
        };
        let slot = match (level_settings, profile_slot) {
            (Some(l), _) => match kind.name {
                LimitName::Steps => &mut l.max_steps,
                LimitName::Tokens => &mut l.max_tokens,
                _ => &mut l.max_cost_usd,
            },
            (None, Some(p)) => match kind.name {
                LimitName::Steps => &mut p.max_steps,
                LimitName::Tokens => &mut p.max_tokens,
                _ => &mut p.max_cost_usd,
            },
            (None, None) => unreachable!(),
        };
        *slot = setting(origin);
    }

    /// Sets the policy ceiling of `kind` to `n` (loop limits have none).
    fn cap(&mut self, kind: Kind, n: u32) {
        let origin = Origin::File {
            path: POLICY_FILE.into(),
            key: format!("policy.{}_ceiling", kind.key),
        };
        let policy = &mut self.config.policy;
        match kind.name {
            LimitName::Steps => {
                policy.max_steps_ceiling = Some(Ceiling {
                    max_steps: n,
                    origin,
                });
            }
            LimitName::Tokens => policy.max_tokens_ceiling = Some((u64::from(n), origin)),
            LimitName::Cost => policy.max_cost_usd_ceiling = Some((f64::from(n), origin)),
            _ => unreachable!("no ceiling"),
        }
    }

    /// Resolves `kind` with the task type `review` and the profile `p`: (value, source, the
    /// explicit value the profile lowered), values as text.
    fn resolve(&self, kind: Kind) -> Result<(String, String, Option<String>), LimitError> {
        let profile = Some(("p".to_owned(), Origin::Flag("--profile".into())));
        let config = &self.config;
        let shown = |v: Option<String>| v.unwrap_or_else(|| "none".into());
        Ok(match kind.name {
            LimitName::Steps => {
                let r = budget::resolve(&BudgetRequest {
                    flags: self.flags.clone(),
                    env: self.env.clone(),
                    profile,
                    task_type: Some("review"),
                    config,
                })?;
                let explicit = r.explicit_max_steps.map(|v| v.to_string());
                (r.max_steps.to_string(), r.source, explicit)
            }
            LimitName::Tokens | LimitName::Cost => {
                let r = spend::resolve(&SpendRequest {
                    flags: self.flags.clone(),
                    env: self.env.clone(),
                    profile,
                    task_type: Some("review"),
                    config,
                })?;
                if kind.name == LimitName::Tokens {
                    let e = r.tokens.explicit.map(|v| shown(v.map(|n| n.to_string())));
                    (
                        shown(r.tokens.value.map(|n| n.to_string())),
                        r.tokens.source,
                        e,
                    )
                } else {
                    let e = r.cost.explicit.map(|v| shown(v.map(|n| n.to_string())));
                    (shown(r.cost.value.map(|n| n.to_string())), r.cost.source, e)
                }
            }
            _ => {
                let r = loop_settings::resolve(&LoopRequest {
                    flag: self.loop_flag.clone(),
                    env: self.loop_env.clone(),
                    profile,
                    task_type: Some("review"),
                    config,
                })?;
                (
                    r.limit.to_string(),
                    r.source,
                    r.explicit.map(|v| v.to_string()),
                )
            }
        })
    }
}

fn label(kind: Kind, level: Level) -> String {
    match level {
        Level::Flag => kind.flag.to_owned(),
        Level::Env => format!("env {}", kind.env),
        Level::TaskType => format!("task_types.review.{}", kind.key),
        Level::Global => kind.global.to_owned(),
        Level::Profile => format!("profiles.p.{}", kind.key),
    }
}

#[test]
fn each_explicit_level_beats_every_level_below_it_for_every_limit() {
    for kind in KINDS {
        // Higher levels get smaller values, so the profile (set to the largest) never bounds.
        for (hi, &high) in LEVELS.iter().enumerate() {
            for &low in &LEVELS[hi + 1..] {
                let mut s = Scenario::new();
                s.set(kind, high, &(10 + hi).to_string());
                s.set(kind, low, "900");
                let (value, source, explicit) = s.resolve(kind).unwrap();
                let case = format!("{kind:?}: {high:?} over {low:?}");
                assert_eq!(value, (10 + hi).to_string(), "{case}");
                assert_eq!(source, label(kind, high), "{case}");
                assert_eq!(explicit, None, "{case}");
            }
            // Alone, each level decides.
            let mut s = Scenario::new();
            s.set(kind, high, "42");
            let (value, source, _) = s.resolve(kind).unwrap();
            assert_eq!(
                (value.as_str(), source),
                ("42", label(kind, high)),
                "{kind:?}"
            );
        }
    }
}

#[test]
fn the_profile_bounds_every_explicit_level_for_every_limit() {
    for kind in KINDS {
        for level in &LEVELS[..4] {
            let mut s = Scenario::new();
            s.set(kind, *level, "40");
            s.set(kind, Level::Profile, "8");
            let (value, source, explicit) = s.resolve(kind).unwrap();
            assert_eq!(
                (value.as_str(), source, explicit.as_deref()),
                ("8", label(kind, Level::Profile), Some("40")),
                "{kind:?} at {level:?}"
            );
        }
    }
}

#[test]
fn with_nothing_set_each_limit_has_its_default() {
    let s = Scenario::new();
    let defaults: Vec<(String, String)> = KINDS
        .iter()
        .map(|k| s.resolve(*k).map(|(v, source, _)| (v, source)).unwrap())
        .collect();
    let expected = [
        ("50", "default"),
        ("none", "default"),
        ("none", "default"),
        ("5", "default"),
    ];
    for ((value, source), (v, src)) in defaults.iter().zip(expected) {
        assert_eq!((value.as_str(), source.as_str()), (v, src));
    }
}

#[test]
fn the_policy_ceiling_bounds_every_level_of_every_limit_that_has_one() {
    for kind in &KINDS[..3] {
        for level in LEVELS {
            let mut s = Scenario::new();
            s.set(*kind, level, "40");
            s.cap(*kind, 7);
            let (value, source, _) = s.resolve(*kind).unwrap();
            assert_eq!(
                (value.as_str(), source),
                ("7", format!("policy {}_ceiling ({POLICY_FILE})", kind.key)),
                "{kind:?} at {level:?}"
            );
        }
    }
}

#[test]
fn a_bad_value_of_any_limit_at_any_raw_level_is_the_one_error_naming_it() {
    for kind in KINDS {
        let levels: &[Level] = if kind.name == LimitName::LoopLimit {
            // A loop limit in a file is refused as the file is parsed (a config error).
            &LEVELS[..2]
        } else {
            &LEVELS
        };
        for &level in levels {
            for bad in ["abc", "0", "-1", "2.5e3", ""] {
                let mut s = Scenario::new();
                s.set(kind, level, bad);
                let err = s.resolve(kind).unwrap_err();
                let LimitError::InvalidValue { limit, origin, .. } = &err else {
                    panic!("{kind:?} at {level:?} = {bad:?}: {err}");
                };
                assert_eq!(*limit, kind.name, "{err}");
                assert_eq!(origin.label(), label(kind, level), "{err}");
                assert!(
                    err.to_string()
                        .starts_with(&format!("invalid {} at ", kind.name)),
                    "{err}"
                );
            }
        }
    }
}
