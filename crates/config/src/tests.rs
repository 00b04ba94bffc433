use super::*;

fn parse(text: &str) -> ParsedFile {
    parse_str("/p/stepguard.toml", text).unwrap()
}

fn messages(diags: &[Diagnostic]) -> Vec<String> {
    diags.iter().map(ToString::to_string).collect()
}

#[test]
fn parses_every_level_and_provider_options() {
    let f = parse(
        r#"
max_steps = 40
profile = "strict"
[task_types.review]
max_steps = 20
max_turns = 10
[profiles.strict]
max_steps = 12
[codex]
max_steps_unit = "actionable"
"#,
    );
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let m = &f.model;
    assert_eq!(
        m.global.max_steps.as_ref().unwrap().value,
        RawValue::Integer(40)
    );
    assert_eq!(
        m.task_types["review"].max_turns.as_ref().unwrap().value,
        RawValue::Integer(10)
    );
    assert_eq!(
        m.profiles["strict"].max_steps.as_ref().unwrap().value,
        RawValue::Integer(12)
    );
    assert_eq!(m.profile.as_ref().unwrap().0, "strict");
    let (value, origin) = &m.providers["codex"]["max_steps_unit"];
    assert_eq!(value, &serde_json::json!("actionable"));
    assert_eq!(
        origin.to_string(),
        "/p/stepguard.toml: codex.max_steps_unit"
    );
}

#[test]
fn defaults_table_is_the_global_level() {
    let f = parse("[defaults]\nmax_steps = 7\nmax_turns = 3\n");
    let g = &f.model.global;
    assert_eq!(
        g.max_steps.as_ref().unwrap().origin.label(),
        "defaults.max_steps"
    );
    assert_eq!(
        g.max_turns.as_ref().unwrap().origin.label(),
        "defaults.max_turns"
    );
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let err = parse_str("/p/stepguard.toml", "max_steps = 3\n[task_types\nx = 1\n").unwrap_err();
    match &err {
        ConfigError::Parse {
            path, line, column, ..
        } => {
            assert_eq!((path.as_str(), *line), ("/p/stepguard.toml", 2));
            assert!(*column >= 1);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().starts_with("/p/stepguard.toml:2:"), "{err}");
}

#[test]
fn unknown_keys_warn_with_did_you_mean() {
    let f = parse("max_step = 3\n[defualts]\nmax_steps = 4\n[task_types.review]\nmax_stpes = 2\n");
    assert_eq!(
        messages(&f.diagnostics),
        [
            "warning: /p/stepguard.toml: defualts: unknown key `defualts`; did you mean `defaults`?",
            "warning: /p/stepguard.toml: max_step: unknown key `max_step`; did you mean `max_steps`?",
            "warning: /p/stepguard.toml: task_types.review.max_stpes: unknown key `max_stpes`; did you mean `max_steps`?",
        ]
    );
    // The typo'd table is not mistaken for provider options.
    assert!(f.model.providers.is_empty());
}

#[test]
fn misspelled_provider_table_is_a_warning_but_plugin_providers_are_accepted() {
    let f = parse("[codx]\nmax_steps_unit = \"tool\"\n[opencode]\nmax_steps_unit = \"step\"\n");
    assert_eq!(
        messages(&f.diagnostics),
        ["warning: /p/stepguard.toml: codx: unknown key `codx`; did you mean `codex`?"]
    );
    assert!(f.model.providers.contains_key("opencode"));
}

#[test]
fn wrong_shapes_are_errors() {
    let f = parse("profile = 3\ntask_types = 5\n[profiles]\nstrict = \"x\"\n");
    assert_eq!(
        messages(&f.diagnostics),
        [
            "error: /p/stepguard.toml: profile: expected a profile name (a string), found an integer",
            "error: /p/stepguard.toml: profiles.strict: expected a table, found a string",
            "error: /p/stepguard.toml: task_types: expected a table, found an integer",
        ]
    );
}

#[test]
fn load_refuses_files_with_errors_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("stepguard.toml");
    std::fs::write(&bad, "profile = 3\n").unwrap();
    assert!(matches!(
        load(&[source(&bad, FileRole::Project)]),
        Err(ConfigError::Invalid(_))
    ));
    let missing = dir.path().join("nope.toml");
    let err = load(&[source(&missing, FileRole::Project)]).unwrap_err();
    assert!(
        err.to_string().starts_with("failed to read config file "),
        "{err}"
    );
}

fn source(path: &Path, role: FileRole) -> ConfigSource {
    ConfigSource {
        path: path.to_path_buf(),
        role,
    }
}

fn search(user: &Path, system: &Path, policy: Option<&Path>) -> SearchPaths {
    SearchPaths {
        user: Some(user.to_path_buf()),
        system: Some(system.to_path_buf()),
        policy: policy.map(Path::to_path_buf),
    }
}

#[test]
fn discovery_walks_up_and_adds_the_user_file() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("repo");
    let nested = project.join("src/deep");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(project.join(PROJECT_FILE), "max_steps = 1\n").unwrap();
    let user = dir.path().join("user.toml");
    std::fs::write(&user, "max_steps = 2\n").unwrap();
    let absent = dir.path().join("absent.toml");
    let found = discover_sources(&nested, None, &search(&user, &absent, None));
    assert_eq!(
        found,
        vec![
            source(&project.join(PROJECT_FILE), FileRole::Project),
            source(&user, FileRole::User)
        ]
    );
    // No project file: only the user file; no user file: nothing.
    assert_eq!(
        discover_sources(dir.path(), None, &search(&user, &absent, None)),
        vec![source(&user, FileRole::User)]
    );
    assert!(discover_sources(dir.path(), None, &search(&absent, &absent, None)).is_empty());
}

#[test]
fn discovery_adds_system_and_policy_files_and_keeps_their_policy_under_explicit_config() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, "").unwrap();
        path
    };
    let (user, system, policy, explicit) = (
        write("user.toml"),
        write("system.toml"),
        write("policy.toml"),
        write("explicit.toml"),
    );
    let paths = search(&user, &system, Some(&policy));
    assert_eq!(
        discover_sources(dir.path(), None, &paths),
        vec![
            source(&user, FileRole::User),
            source(&system, FileRole::System),
            source(&policy, FileRole::PolicyOnly),
        ]
    );
    // --config replaces the settings of discovery, not the policy.
    assert_eq!(
        discover_sources(dir.path(), Some(&explicit), &paths),
        vec![
            source(&explicit, FileRole::Project),
            source(&user, FileRole::PolicyOnly),
            source(&system, FileRole::PolicyOnly),
            source(&policy, FileRole::PolicyOnly),
        ]
    );
    // --config naming the user's file is the user's file; a named policy file that is missing
    // is still listed, so loading it fails.
    let missing = dir.path().join("missing.toml");
    assert_eq!(
        discover_sources(
            dir.path(),
            Some(&user),
            &search(&user, &missing, Some(&missing))
        ),
        vec![
            source(&user, FileRole::User),
            source(&missing, FileRole::PolicyOnly)
        ]
    );
    assert!(matches!(
        load(&[source(&missing, FileRole::PolicyOnly)]),
        Err(ConfigError::Read { .. })
    ));
}

#[test]
fn project_file_beats_user_file_key_by_key() {
    let project = parse_str(
        "/repo/stepguard.toml",
        "[task_types.review]\nmax_steps = 5\n[codex]\nmax_steps_unit = \"tool\"\n",
    )
    .unwrap();
    let user = parse_str(
        "/home/u/.config/stepguard/stepguard.toml",
        "max_steps = 9\n[task_types.review]\nmax_steps = 99\nmax_turns = 4\n[codex]\nmax_steps_unit = \"item\"\nextra = 1\n",
    )
    .unwrap();
    let loaded = merge(vec![project, user]);
    let m = &loaded.model;
    let review = &m.task_types["review"];
    assert_eq!(
        review.max_steps.as_ref().unwrap().value,
        RawValue::Integer(5)
    );
    assert_eq!(
        review.max_turns.as_ref().unwrap().value,
        RawValue::Integer(4)
    );
    assert_eq!(
        m.global.max_steps.as_ref().unwrap().origin.file(),
        Some("/home/u/.config/stepguard/stepguard.toml")
    );
    assert_eq!(
        m.providers["codex"]["max_steps_unit"].0,
        serde_json::json!("tool")
    );
    assert_eq!(m.providers["codex"]["extra"].0, serde_json::json!(1));
    assert_eq!(loaded.project_dir(), Some(PathBuf::from("/repo")));
}

#[test]
fn validate_reports_invalid_values_everywhere_with_file_and_key() {
    let loaded = merge(vec![parse(
        "max_steps = 0\n[task_types.a]\nmax_steps = \"ten\"\n[task_types.b]\nmax_turns = -1\n[profiles.fast]\nmax_steps = 1.5\n",
    )]);
    let diags = validate(&loaded, false);
    let errors: Vec<String> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(ToString::to_string)
        .collect();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("error: /p/stepguard.toml: max_steps: 0 is not a valid budget"))
    );
    assert!(errors.iter().any(|e| {
        e.starts_with("error: /p/stepguard.toml: task_types.a.max_steps: \"ten\" is not a number")
    }));
    assert!(errors.iter().any(|e| {
        e.starts_with("error: /p/stepguard.toml: task_types.b.max_turns: -1 is negative")
    }));
    assert!(errors.iter().any(|e| e.starts_with(
        "error: /p/stepguard.toml: profiles.fast.max_steps: \"1.5\" is not a whole number"
    )));
}

#[test]
fn validate_flags_conflicts_as_warnings_and_errors_when_strict() {
    let loaded = merge(vec![parse(
        "max_steps = 10\nmax_turns = 5\n[task_types.x]\nmax_steps = 3\nmax_turns = 3\n",
    )]);
    let diags = validate(&loaded, false);
    assert_eq!(
        messages(&diags),
        [
            "warning: /p/stepguard.toml: max_turns: `max_steps` (10) and `max_turns` (5) are both set at one level; `max_steps` wins. Remove `max_turns`."
        ]
    );
    let strict = validate(&loaded, true);
    assert_eq!(strict.len(), 1);
    assert_eq!(strict[0].severity, Severity::Error);
}

#[test]
fn validate_warns_about_deprecated_max_turns_and_unknown_profiles() {
    let loaded = merge(vec![parse(
        "profile = \"fastest\"\n[task_types.x]\nmax_turns = 3\n",
    )]);
    assert_eq!(
        messages(&validate(&loaded, false)),
        [
            "warning: /p/stepguard.toml: task_types.x.max_turns: `max_turns` is deprecated; use `max_steps`.",
            "error: /p/stepguard.toml: profile: unknown profile `fastest`",
        ]
    );
}

#[test]
fn validate_says_why_a_task_types_max_turns_under_the_global_max_steps_is_unused() {
    let loaded = merge(vec![
        parse("[task_types.migrate]\nmax_turns = 60\n"),
        parse_str("/u/stepguard.toml", "max_steps = 40\n").unwrap(),
    ]);
    assert_eq!(
        messages(&validate(&loaded, false)),
        [
            "warning: /p/stepguard.toml: task_types.migrate.max_turns: ignored: `max_steps = 40` \
             in /u/stepguard.toml (global) takes precedence; rename it to \
             `task_types.migrate.max_steps` to apply it"
        ]
    );
}

#[test]
fn validate_checks_values_shadowed_by_the_top_level() {
    let loaded = merge(vec![parse("max_steps = 10\n[defaults]\nmax_steps = 0\n")]);
    let msgs = messages(&validate(&loaded, false));
    assert!(msgs.contains(&"error: /p/stepguard.toml: defaults.max_steps: 0 is not a valid budget; use a whole number from 1 to 100000, or \"unlimited\"".to_owned()), "{msgs:#?}");
}

#[test]
fn did_you_mean_only_suggests_close_names() {
    assert_eq!(did_you_mean("defualts", TOP_LEVEL_KEYS), Some("defaults"));
    assert_eq!(did_you_mean("zzz", TOP_LEVEL_KEYS), None);
    assert_eq!(did_you_mean("defaults", TOP_LEVEL_KEYS), None);
}

#[test]
fn load_all_reports_every_broken_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.toml");
    let b = dir.path().join("b.toml");
    let c = dir.path().join("c.toml");
    std::fs::write(&a, "max_steps = [\n").unwrap();
    std::fs::write(&c, "max_steps = 4\n").unwrap();
    let (loaded, failures) = load_all(&[a, b, c].map(|p| source(&p, FileRole::Project)));
    assert_eq!(failures.len(), 2);
    assert!(
        failures[0].message.starts_with("line 1, column"),
        "{}",
        failures[0]
    );
    assert!(
        failures[1]
            .message
            .starts_with("failed to read config file"),
        "{}",
        failures[1]
    );
    assert_eq!(loaded.files.len(), 1);
}

fn parse_as(path: &str, text: &str, role: FileRole) -> ParsedFile {
    parse_file(path, text, role).unwrap()
}

const POLICY: &str = "max_steps = 500\n[policy]\nmax_steps_ceiling = 80\nallow_plugin_override = true\n[policy.codex]\nmax_steps_unit = \"item\"\n";

#[test]
fn policy_is_read_from_policy_bearing_files() {
    for role in [FileRole::User, FileRole::System, FileRole::PolicyOnly] {
        let f = parse_as("/etc/stepguard/stepguard.toml", POLICY, role);
        assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
        let p = &f.model.policy;
        let ceiling = p.max_steps_ceiling.as_ref().unwrap();
        assert_eq!(ceiling.max_steps, 80);
        assert_eq!(
            ceiling.origin.to_string(),
            "/etc/stepguard/stepguard.toml: policy.max_steps_ceiling"
        );
        assert_eq!(p.units["codex"].0, "item");
        assert_eq!(
            p.units["codex"].1.to_string(),
            "/etc/stepguard/stepguard.toml: policy.codex.max_steps_unit"
        );
        assert_eq!(p.allow_plugin_override.as_ref().map(|a| a.0), Some(true));
        // Only the policy counts in a policy-only file.
        assert_eq!(
            f.model.global.max_steps.is_some(),
            role != FileRole::PolicyOnly
        );
    }
}

#[test]
fn project_file_policy_is_ignored_with_a_warning() {
    let f = parse(POLICY);
    assert_eq!(
        messages(&f.diagnostics),
        [
            "warning: /p/stepguard.toml: policy: [policy] in a project file is ignored; set policy in the user or system file or STEPGUARD_POLICY"
        ]
    );
    assert!(f.model.policy.is_empty());
    assert!(f.model.global.max_steps.is_some());
    // Not mistaken for provider options either.
    assert!(f.model.providers.is_empty());
    // Bad values in an ignored table are not errors: nothing reads them.
    let f = parse("[policy]\nmax_steps_ceiling = 0\n");
    assert!(
        f.diagnostics
            .iter()
            .all(|d| d.severity == Severity::Warning)
    );
}

#[test]
fn invalid_policy_values_are_errors_naming_file_and_key() {
    let f = parse_as(
        "/u/stepguard.toml",
        "[policy]\nmax_steps_ceiling = \"unlimited\"\nallow_plugin_override = \"yes\"\nmax_step_ceiling = 3\n[policy.codex]\nmax_steps_unit = 1\nunit = \"x\"\n",
        FileRole::User,
    );
    assert_eq!(
        messages(&f.diagnostics),
        [
            "error: /u/stepguard.toml: policy.allow_plugin_override: expected true or false, found a string",
            "error: /u/stepguard.toml: policy.codex.max_steps_unit: expected a unit name (a string), found an integer",
            "warning: /u/stepguard.toml: policy.codex.unit: unknown key `unit`; known keys here: max_steps_unit",
            "warning: /u/stepguard.toml: policy.max_step_ceiling: unknown key `max_step_ceiling`; did you mean `max_steps_ceiling`?",
            "error: /u/stepguard.toml: policy.max_steps_ceiling: \"unlimited\" is not a valid ceiling; use a whole number from 1 to 100000",
        ]
    );
    for bad in ["0", "100001", "-5", "2.5", "true"] {
        let f = parse_as(
            "/u/stepguard.toml",
            &format!("[policy]\nmax_steps_ceiling = {bad}\n"),
            FileRole::User,
        );
        let msgs = messages(&f.diagnostics);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(
            msgs[0].starts_with("error: /u/stepguard.toml: policy.max_steps_ceiling: ")
                && msgs[0].contains("is not a valid ceiling"),
            "{msgs:?}"
        );
    }
}

#[test]
fn several_policy_files_merge_to_the_tightest() {
    let files = vec![
        parse_as(
            "/home/u/stepguard.toml",
            "[policy]\nmax_steps_ceiling = 80\nallow_plugin_override = true\n",
            FileRole::User,
        ),
        parse_as(
            "/etc/stepguard/stepguard.toml",
            "[policy]\nmax_steps_ceiling = 60\nallow_plugin_override = false\n[policy.codex]\nmax_steps_unit = \"item\"\n",
            FileRole::System,
        ),
        parse_as(
            "/ci/policy.toml",
            "[policy]\nmax_steps_ceiling = 100\nallow_plugin_override = true\n[policy.codex]\nmax_steps_unit = \"item\"\n",
            FileRole::PolicyOnly,
        ),
    ];
    let loaded = merge(files);
    assert_eq!(loaded.diagnostics().count(), 0);
    let p = &loaded.model.policy;
    let ceiling = p.max_steps_ceiling.as_ref().unwrap();
    assert_eq!(
        (ceiling.max_steps, ceiling.origin.file()),
        (60, Some("/etc/stepguard/stepguard.toml"))
    );
    let (allow, origin) = p.allow_plugin_override.as_ref().unwrap();
    assert_eq!(
        (*allow, origin.file()),
        (false, Some("/etc/stepguard/stepguard.toml"))
    );
    assert_eq!(
        loaded
            .policy_files()
            .map(|f| f.path.as_str())
            .collect::<Vec<_>>(),
        [
            "/home/u/stepguard.toml",
            "/etc/stepguard/stepguard.toml",
            "/ci/policy.toml"
        ]
    );
    assert_eq!(loaded.settings_files().count(), 2);
}

#[test]
fn policy_files_fixing_different_units_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.toml");
    let system = dir.path().join("system.toml");
    std::fs::write(&user, "[policy.codex]\nmax_steps_unit = \"tool\"\n").unwrap();
    std::fs::write(&system, "[policy.codex]\nmax_steps_unit = \"item\"\n").unwrap();
    let err = load(&[
        source(&user, FileRole::User),
        source(&system, FileRole::System),
    ])
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "error: {}: policy.codex.max_steps_unit: policy files disagree on the unit of `codex`: `item` here, `tool` in {}: policy.codex.max_steps_unit",
            system.display(),
            user.display()
        )),
        "{msg}"
    );
}

#[test]
fn load_refuses_a_policy_file_with_an_invalid_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[policy]\nmax_steps_ceiling = 0\n").unwrap();
    let err = load(&[source(&policy, FileRole::PolicyOnly)]).unwrap_err();
    assert!(matches!(err, ConfigError::Invalid(_)));
    assert!(
        err.to_string()
            .contains("policy.max_steps_ceiling: 0 is not a valid ceiling"),
        "{err}"
    );
    // The same table in a project file is only a warning.
    let project = dir.path().join(PROJECT_FILE);
    std::fs::write(&project, "[policy]\nmax_steps_ceiling = 0\n").unwrap();
    let loaded = load(&[source(&project, FileRole::Project)]).unwrap();
    assert!(loaded.model.policy.is_empty());
    assert_eq!(loaded.diagnostics().count(), 1);
}

#[test]
fn project_dir_ignores_system_and_policy_files() {
    let loaded = merge(vec![
        parse_as("/etc/stepguard/stepguard.toml", "", FileRole::System),
        parse_as("/ci/policy.toml", "", FileRole::PolicyOnly),
    ]);
    assert_eq!(loaded.project_dir(), None);
}

#[test]
fn validate_refuses_provider_units_that_contradict_the_policy() {
    let loaded = merge(vec![
        parse("[codex]\nmax_steps_unit = \"tool\"\n[gemini]\nmax_steps_unit = \"turn\"\n"),
        parse_as(
            "/etc/stepguard/stepguard.toml",
            "[policy.codex]\nmax_steps_unit = \"item\"\n[policy.gemini]\nmax_steps_unit = \"turn\"\n",
            FileRole::System,
        ),
    ]);
    assert_eq!(
        messages(&validate(&loaded, false)),
        [
            "error: /p/stepguard.toml: codex.max_steps_unit: unit \"tool\" differs from the unit `item` fixed by policy (/etc/stepguard/stepguard.toml: policy.codex.max_steps_unit)"
        ]
    );
}

#[test]
fn run_table_sets_what_an_unrecognised_stream_does() {
    let f = parse("[run]\nunrecognized_stream = \"warn\"\n");
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let (what, origin) = f.model.unrecognized_stream.as_ref().unwrap();
    assert_eq!(what, "warn");
    assert_eq!(
        origin.to_string(),
        "/p/stepguard.toml: run.unrecognized_stream"
    );
    let bad = parse("[run]\nunrecognized_stream = \"ignore\"\nunrecognised_stream = 1\n");
    let msgs = messages(&bad.diagnostics);
    assert!(
        msgs.iter().any(|m| m.contains("run.unrecognized_stream")
            && m.contains("\"stop\" or \"warn\", found \"ignore\"")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter().any(|m| m.contains("unrecognised_stream")),
        "{msgs:?}"
    );
    assert!(bad.model.unrecognized_stream.is_none());
}

#[test]
fn loops_table_and_loop_limits_at_every_level_are_parsed() {
    let f = parse(
        r#"
[loops]
limit = 4
window = 12
ignore_tools = ["read", "grep"]
[task_types.review]
loop_limit = "off"
[profiles.strict]
loop_limit = 2
"#,
    );
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let l = &f.model.loops;
    let (limit, origin) = l.limit.as_ref().unwrap();
    assert_eq!(
        (*limit, origin.to_string().as_str()),
        (LoopLimit::Limited(4), "/p/stepguard.toml: loops.limit")
    );
    assert_eq!(l.window.as_ref().map(|w| w.0), Some(12));
    assert_eq!(
        l.ignore_tools.as_ref().map(|t| t.0.clone()),
        Some(vec!["read".to_owned(), "grep".to_owned()])
    );
    let (limit, origin) = &l.task_types["review"];
    assert_eq!(
        (*limit, origin.label().as_str()),
        (LoopLimit::Off, "task_types.review.loop_limit")
    );
    assert_eq!(l.profiles["strict"].0, LoopLimit::Limited(2));
    // A task type that sets only a loop limit is still a known task type.
    let f = parse("[task_types.fix]\nloop_limit = 3\n");
    assert!(f.model.task_types.contains_key("fix"));
}

#[test]
fn bad_loop_values_are_errors_naming_the_key_and_unknown_keys_warn() {
    let f = parse(
        r#"
[loops]
limit = 1
window = "wide"
ignore_tools = ["read", 3]
limt = 3
[task_types.review]
loop_limit = true
loop_limti = 3
[profiles.strict]
loop_limit = 2.5
[defaults]
loop_limit = 3
"#,
    );
    assert_eq!(
        messages(&f.diagnostics),
        [
            "error: /p/stepguard.toml: loops.ignore_tools: expected an array of tool names \
             (strings); item 2 is an integer",
            "error: /p/stepguard.toml: loops.limit: 1 is below 2 (a loop is a call made at least \
             twice); use a whole number from 2 to 1000, or \"off\"",
            "warning: /p/stepguard.toml: loops.limt: unknown key `limt`; did you mean `limit`?",
            "error: /p/stepguard.toml: loops.window: \"wide\" is not a number; use a whole number \
             from 2 to 1000",
            "error: /p/stepguard.toml: profiles.strict.loop_limit: 2.5 is not a whole number; use \
             a whole number from 2 to 1000, or \"off\"",
            "error: /p/stepguard.toml: task_types.review.loop_limit: expected a whole number from \
             2 to 1000, or \"off\", found a boolean",
            "warning: /p/stepguard.toml: task_types.review.loop_limti: unknown key `loop_limti`; \
             did you mean `loop_limit`?",
            "warning: /p/stepguard.toml: defaults.loop_limit: unknown key `loop_limit`; known keys \
             here: max_steps, max_turns, max_tokens, max_cost_usd",
        ]
    );
    assert_eq!(f.model.loops, LoopConfig::default());
    let f = parse("[loops]\nlimit = 6\nwindow = 4\nignore_tools = \"read\"\n");
    assert_eq!(
        messages(&f.diagnostics),
        [
            "error: /p/stepguard.toml: loops.ignore_tools: expected an array of tool names \
             (strings), found a string",
            "error: /p/stepguard.toml: loops.window: 4 is below `loops.limit` (6); the window must \
             hold at least `limit` calls",
        ]
    );
    let f = parse("[loop]\nlimit = 3\n");
    assert_eq!(
        messages(&f.diagnostics),
        ["warning: /p/stepguard.toml: loop: unknown key `loop`; did you mean `loops`?"]
    );
}

#[test]
fn loop_settings_merge_key_by_key_the_project_file_first() {
    let project = parse_str(
        "/repo/stepguard.toml",
        "[loops]\nlimit = 3\n[task_types.review]\nloop_limit = 4\n",
    )
    .unwrap();
    let user = parse_str(
        "/home/u/.config/stepguard/stepguard.toml",
        "[loops]\nlimit = 9\nwindow = 30\nignore_tools = [\"read\"]\n[task_types.review]\nloop_limit = 8\n[profiles.fast]\nloop_limit = 6\n",
    )
    .unwrap();
    let l = merge(vec![project, user]).model.loops;
    assert_eq!(l.limit.as_ref().map(|x| x.0), Some(LoopLimit::Limited(3)));
    assert_eq!(
        l.window.as_ref().and_then(|w| w.1.file()),
        Some("/home/u/.config/stepguard/stepguard.toml")
    );
    assert_eq!(l.ignore_tools.map(|t| t.0), Some(vec!["read".to_owned()]));
    assert_eq!(l.task_types["review"].0, LoopLimit::Limited(4));
    assert_eq!(l.profiles["fast"].0, LoopLimit::Limited(6));
}

#[test]
fn validate_reports_bad_loop_values_and_load_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stepguard.toml");
    std::fs::write(&path, "[loops]\nwindow = 0\n").unwrap();
    let sources = [source(&path, FileRole::Project)];
    assert!(matches!(load(&sources), Err(ConfigError::Invalid(_))));
    let (loaded, failures) = load_all(&sources);
    assert!(failures.is_empty());
    let diags = validate(&loaded, false);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(
        (diags[0].severity, diags[0].key.as_deref()),
        (Severity::Error, Some("loops.window"))
    );
}

#[test]
fn run_table_turns_the_wrap_up_on_and_refuses_non_booleans() {
    let f = parse("[run]\nwrap_up = true\n");
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let (on, origin) = f.model.wrap_up.as_ref().unwrap();
    assert!(*on);
    assert_eq!(origin.to_string(), "/p/stepguard.toml: run.wrap_up");
    let bad = parse("[run]\nwrap_up = \"yes\"\nwrapup = true\n");
    let msgs = messages(&bad.diagnostics);
    assert!(
        msgs.iter()
            .any(|m| m.contains("run.wrap_up")
                && m.contains("expected true or false, found a string")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("wrapup") && m.contains("wrap_up")),
        "{msgs:?}"
    );
    assert!(bad.model.wrap_up.is_none());
}

#[test]
fn token_and_cost_budgets_are_read_wherever_max_steps_is() {
    let f = parse(
        r#"
max_tokens = 500000
max_cost_usd = 20
[task_types.review]
max_tokens = "unlimited"
max_cost_usd = 2.5
[profiles.cheap]
max_tokens = 100000
max_cost_usd = "0.75"
"#,
    );
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let m = &f.model;
    let global = m.global.max_tokens.as_ref().unwrap();
    assert_eq!(
        (&global.value, global.origin.to_string().as_str()),
        (&RawValue::Integer(500_000), "/p/stepguard.toml: max_tokens")
    );
    assert_eq!(
        m.global.max_cost_usd.as_ref().unwrap().value,
        RawValue::Integer(20)
    );
    let review = &m.task_types["review"];
    assert_eq!(
        review.max_tokens.as_ref().unwrap().value,
        RawValue::Text("unlimited".into())
    );
    assert_eq!(
        review.max_cost_usd.as_ref().unwrap().origin.label(),
        "task_types.review.max_cost_usd"
    );
    let cheap = &m.profiles["cheap"];
    assert_eq!(
        cheap.max_tokens.as_ref().unwrap().origin.label(),
        "profiles.cheap.max_tokens"
    );
    assert_eq!(
        cheap.max_cost_usd.as_ref().unwrap().value,
        RawValue::Text("0.75".into())
    );
    // A task type that sets only a spend budget is still a known task type.
    let f = parse("[task_types.fix]\nmax_cost_usd = 1\n");
    assert!(f.model.task_types.contains_key("fix"));
}

#[test]
fn defaults_table_holds_spend_budgets_below_the_top_level_ones() {
    let f = parse("[defaults]\nmax_tokens = 9000\nmax_cost_usd = 1.25\n");
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let g = &f.model.global;
    assert_eq!(
        g.max_tokens.as_ref().unwrap().origin.label(),
        "defaults.max_tokens"
    );
    assert_eq!(
        g.max_cost_usd.as_ref().unwrap().origin.label(),
        "defaults.max_cost_usd"
    );
    let loaded = merge(vec![parse(
        "max_tokens = 8000\n[defaults]\nmax_tokens = 9000\n",
    )]);
    assert_eq!(
        loaded.model.global.max_tokens.as_ref().unwrap().value,
        RawValue::Integer(8000)
    );
    assert_eq!(
        messages(&validate(&loaded, false)),
        [
            "warning: /p/stepguard.toml: defaults.max_tokens: set both at the top level and in \
             [defaults]; the top-level value wins"
        ]
    );
}

#[test]
fn bad_spend_values_are_errors_naming_the_file_key_and_expected_form() {
    let f = parse(
        r#"
max_tokens = 0
max_cost_usd = -1
[defaults]
max_tokens = 2.5
[task_types.review]
max_tokens = "lots"
max_cost_usd = 0.00001
[profiles.cheap]
max_tokens = true
max_cost_usd = "$3"
"#,
    );
    const TOKENS: &str = "use a whole number of tokens from 1 to 1000000000000, or \"unlimited\"";
    const COST: &str = "use a number of US dollars above 0 and at most 1000000 with at most 4 \
                        decimals (e.g. 2.50), or \"unlimited\"";
    assert_eq!(
        messages(&f.diagnostics),
        [
            format!("error: /p/stepguard.toml: max_cost_usd: -1 is negative; {COST}"),
            format!("error: /p/stepguard.toml: max_tokens: 0 is not a valid budget; {TOKENS}"),
            "error: /p/stepguard.toml: profiles.cheap.max_cost_usd: \"$3\" is not a number; use \
             a number of US dollars above 0 and at most 1000000 with at most 4 decimals (e.g. \
             2.50), or \"unlimited\""
                .to_owned(),
            "error: /p/stepguard.toml: profiles.cheap.max_tokens: expected a whole number of \
             tokens from 1 to 1000000000000, or \"unlimited\", found a boolean"
                .to_owned(),
            format!(
                "error: /p/stepguard.toml: task_types.review.max_cost_usd: 0.00001 has more than 4 \
                 decimals; {COST}"
            ),
            format!(
                "error: /p/stepguard.toml: task_types.review.max_tokens: \"lots\" is not a number; \
                 {TOKENS}"
            ),
            format!(
                "error: /p/stepguard.toml: defaults.max_tokens: 2.5 is not a whole number; {TOKENS}"
            ),
        ]
    );
    // Bad values are left out of the model, and `load` refuses the file.
    assert_eq!(f.model.global, LevelSettings::default());
    assert_eq!(f.model.profiles["cheap"], ProfileSettings::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stepguard.toml");
    std::fs::write(&path, "[task_types.review]\nmax_cost_usd = 0\n").unwrap();
    let sources = [source(&path, FileRole::Project)];
    let err = load(&sources).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "{}: task_types.review.max_cost_usd: 0 is not a valid budget",
            path.display()
        )),
        "{err}"
    );
    // `validate` reports it once.
    let (loaded, _) = load_all(&sources);
    let diags = validate(&loaded, false);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(
        diags[0].key.as_deref(),
        Some("task_types.review.max_cost_usd")
    );
}

#[test]
fn misspelled_spend_keys_get_a_suggestion() {
    let f = parse(
        "max_token = 5\nmax_cost = 1\n[task_types.x]\nmax_cost_us = 1\n[profiles.p]\nmax_tokes = 1\n[defaults]\nmax_tokns = 3\n",
    );
    assert_eq!(
        messages(&f.diagnostics),
        [
            "warning: /p/stepguard.toml: max_cost: unknown key `max_cost`; did you mean `max_cost_usd`?",
            "warning: /p/stepguard.toml: max_token: unknown key `max_token`; did you mean `max_tokens`?",
            "warning: /p/stepguard.toml: profiles.p.max_tokes: unknown key `max_tokes`; did you mean `max_tokens`?",
            "warning: /p/stepguard.toml: task_types.x.max_cost_us: unknown key `max_cost_us`; did you mean `max_cost_usd`?",
            "warning: /p/stepguard.toml: defaults.max_tokns: unknown key `max_tokns`; did you mean `max_tokens`?",
        ]
    );
    let f = parse_as(
        "/u/stepguard.toml",
        "[policy]\nmax_token_ceiling = 5\nmax_cost_ceiling = 1\n",
        FileRole::User,
    );
    assert_eq!(
        messages(&f.diagnostics),
        [
            "warning: /u/stepguard.toml: policy.max_cost_ceiling: unknown key `max_cost_ceiling`; did you mean `max_cost_usd_ceiling`?",
            "warning: /u/stepguard.toml: policy.max_token_ceiling: unknown key `max_token_ceiling`; did you mean `max_tokens_ceiling`?",
        ]
    );
}

#[test]
fn spend_budgets_merge_key_by_key_the_project_file_first() {
    let project = parse_str(
        "/repo/stepguard.toml",
        "max_tokens = 1000\n[task_types.review]\nmax_cost_usd = 1\n[profiles.cheap]\nmax_tokens = 50\n",
    )
    .unwrap();
    let user = parse_str(
        "/home/u/stepguard.toml",
        "max_tokens = 9000\nmax_cost_usd = 9\n[task_types.review]\nmax_cost_usd = 5\nmax_tokens = 800\n[profiles.cheap]\nmax_cost_usd = 0.5\n",
    )
    .unwrap();
    let m = merge(vec![project, user]).model;
    let file = |s: &Option<Setting>| s.as_ref().and_then(|s| s.origin.file().map(str::to_owned));
    assert_eq!(
        file(&m.global.max_tokens).as_deref(),
        Some("/repo/stepguard.toml")
    );
    assert_eq!(
        file(&m.global.max_cost_usd).as_deref(),
        Some("/home/u/stepguard.toml")
    );
    let review = &m.task_types["review"];
    assert_eq!(
        review.max_cost_usd.as_ref().unwrap().value,
        RawValue::Integer(1)
    );
    assert_eq!(
        review.max_tokens.as_ref().unwrap().value,
        RawValue::Integer(800)
    );
    let cheap = &m.profiles["cheap"];
    assert_eq!(
        (file(&cheap.max_tokens), file(&cheap.max_cost_usd)),
        (
            Some("/repo/stepguard.toml".to_owned()),
            Some("/home/u/stepguard.toml".to_owned())
        )
    );
}

#[test]
fn spend_ceilings_are_read_from_policy_files_only_and_merge_to_the_lowest() {
    let text =
        "max_tokens = 5\n[policy]\nmax_tokens_ceiling = 200000\nmax_cost_usd_ceiling = 2.5\n";
    let f = parse_as("/etc/stepguard/stepguard.toml", text, FileRole::System);
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let p = &f.model.policy;
    let (tokens, origin) = p.max_tokens_ceiling.as_ref().unwrap();
    assert_eq!(
        (*tokens, origin.to_string().as_str()),
        (
            200_000,
            "/etc/stepguard/stepguard.toml: policy.max_tokens_ceiling"
        )
    );
    assert_eq!(p.max_cost_usd_ceiling.as_ref().map(|c| c.0), Some(2.5));
    assert!(!p.is_empty());
    // A project file's are ignored with the usual warning.
    let f = parse(text);
    assert!(f.model.policy.is_empty());
    assert_eq!(f.diagnostics.len(), 1);
    // Several policy files: the lowest of each wins, each with its own file.
    let loaded = merge(vec![
        parse_as(
            "/home/u/stepguard.toml",
            "[policy]\nmax_tokens_ceiling = 100000\nmax_cost_usd_ceiling = 9\n",
            FileRole::User,
        ),
        parse_as("/etc/stepguard/stepguard.toml", text, FileRole::System),
        parse_as(
            "/ci/policy.toml",
            "[policy]\nmax_cost_usd_ceiling = 4\n",
            FileRole::PolicyOnly,
        ),
    ]);
    let p = &loaded.model.policy;
    let (tokens, origin) = p.max_tokens_ceiling.as_ref().unwrap();
    assert_eq!(
        (*tokens, origin.file()),
        (100_000, Some("/home/u/stepguard.toml"))
    );
    let (cost, origin) = p.max_cost_usd_ceiling.as_ref().unwrap();
    assert_eq!(
        (*cost, origin.file()),
        (2.5, Some("/etc/stepguard/stepguard.toml"))
    );
    assert_eq!(loaded.policy_files().count(), 3);
}

#[test]
fn invalid_spend_ceilings_are_errors_naming_file_and_key() {
    for (key, bad, expected) in [
        (
            "max_tokens_ceiling",
            "0",
            "0 is not a valid ceiling; use a whole number of tokens from 1 to 1000000000000",
        ),
        (
            "max_tokens_ceiling",
            "\"unlimited\"",
            "\"unlimited\" is not a valid ceiling; use a whole number of tokens from 1 to 1000000000000",
        ),
        (
            "max_tokens_ceiling",
            "1e6",
            "1000000 is not a valid ceiling; use a whole number of tokens from 1 to 1000000000000",
        ),
        (
            "max_cost_usd_ceiling",
            "0",
            "0 is not a valid ceiling; use a number of US dollars above 0 and at most 1000000 with at most 4 decimals",
        ),
        (
            "max_cost_usd_ceiling",
            "\"off\"",
            "\"off\" is not a valid ceiling; use a number of US dollars above 0 and at most 1000000 with at most 4 decimals",
        ),
        (
            "max_cost_usd_ceiling",
            "1.23456",
            "1.23456 is not a valid ceiling; use a number of US dollars above 0 and at most 1000000 with at most 4 decimals",
        ),
        (
            "max_cost_usd_ceiling",
            "false",
            "a boolean is not a valid ceiling; use a number of US dollars above 0 and at most 1000000 with at most 4 decimals",
        ),
    ] {
        let f = parse_as(
            "/u/stepguard.toml",
            &format!("[policy]\n{key} = {bad}\n"),
            FileRole::User,
        );
        assert_eq!(
            messages(&f.diagnostics),
            [format!(
                "error: /u/stepguard.toml: policy.{key}: {expected}"
            )]
        );
        assert!(f.model.policy.is_empty());
    }
}

#[test]
fn the_user_file_is_placed_by_xdg_then_home_then_passwd_and_never_silently_lost() {
    use std::ffi::OsString;
    let os = |s: &str| Some(OsString::from(s));
    let never = || -> Option<PathBuf> { panic!("passwd asked although HOME is set") };
    let user = |xdg, home, passwd: Option<&str>| {
        user_config_from(xdg, home, || passwd.map(PathBuf::from))
            .map(|p| p.display().to_string())
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        user_config_from(os("/x"), os("/h"), never).unwrap(),
        Path::new("/x/stepguard/stepguard.toml")
    );
    // A relative XDG_CONFIG_HOME is ignored, as the XDG spec says.
    assert_eq!(
        user_config_from(os("rel"), os("/h"), never).unwrap(),
        Path::new("/h/.config/stepguard/stepguard.toml")
    );
    // HOME unset or empty: the passwd entry's home.
    for home in [None, os("")] {
        assert_eq!(
            user(None, home, Some("/pw")),
            Ok("/pw/.config/stepguard/stepguard.toml".to_owned())
        );
    }
    // XDG_CONFIG_HOME alone is enough.
    assert_eq!(
        user(os("/x"), None, None),
        Ok("/x/stepguard/stepguard.toml".to_owned())
    );
    // No home at all, or a relative HOME (under the repository): an error naming the fix.
    assert_eq!(
        user(None, None, None),
        Err(
            "failed to find the user's config file: HOME is unset and the user has no home \
             directory in the passwd database; set HOME or XDG_CONFIG_HOME to an absolute path"
                .to_owned()
        )
    );
    assert_eq!(
        user(os("rel"), os("repo/home"), Some("/pw")),
        Err(
            "failed to find the user's config file: HOME is `repo/home`, not an absolute path; \
             set HOME or XDG_CONFIG_HOME to an absolute path"
                .to_owned()
        )
    );
}

#[test]
fn the_ledger_is_set_by_the_files_a_repository_cannot_edit_and_the_user_wins() {
    let url = "postgres://u:pw@db.example/ledger";
    let ledger = format!("[ledger]\nurl = \"{url}\"\non_ledger_error = \"local\"\n");
    let project = parse_as(
        "/repo/stepguard.toml",
        "[ledger]\nurl = \"postgres://evil.example/x\"\n",
        FileRole::Project,
    );
    assert_eq!(
        messages(&project.diagnostics),
        [format!(
            "warning: /repo/stepguard.toml: ledger: {PROJECT_LEDGER_IGNORED}"
        )]
    );
    let user = parse_as("/u/stepguard.toml", &ledger, FileRole::User);
    let system = parse_as(
        "/etc/stepguard.toml",
        "[ledger]\nurl = \"postgres://system.example/l\"\non_ledger_error = \"refuse\"\n",
        FileRole::System,
    );
    assert!(user.diagnostics.is_empty(), "{:?}", user.diagnostics);
    let merged = merge(vec![project, user, system.clone()]).model.ledger;
    let (got, origin) = merged.url.unwrap();
    assert_eq!(got, url);
    assert_eq!(origin.label(), "ledger.url");
    assert!(matches!(origin, Origin::File { ref path, .. } if path == "/u/stepguard.toml"));
    assert_eq!(merged.on_error.unwrap().0, OnLedgerError::Local);
    // Alone, the system file's values count; the STEPGUARD_POLICY file's too.
    let alone = merge(vec![system]).model.ledger;
    assert_eq!(alone.url.unwrap().0, "postgres://system.example/l");
    assert_eq!(alone.on_error.unwrap().0, OnLedgerError::Refuse);
    let policy = parse_as("/p.toml", &ledger, FileRole::PolicyOnly);
    assert_eq!(merge(vec![policy]).model.ledger.url.unwrap().0, url);
}

#[test]
fn bad_ledger_values_are_errors_naming_the_key() {
    let f = parse_as(
        "/u/stepguard.toml",
        "[ledger]\nurl = \"\"\non_ledger_error = \"fallback\"\nurls = 1\n",
        FileRole::User,
    );
    assert_eq!(
        messages(&f.diagnostics),
        [
            "error: /u/stepguard.toml: ledger.on_ledger_error: expected \"refuse\" or \"local\", found \"fallback\"",
            "error: /u/stepguard.toml: ledger.url: expected the fleet ledger's URL, e.g. \"postgres://stepguard@ledger.example/stepguard\"",
            "warning: /u/stepguard.toml: ledger.urls: unknown key `urls`; did you mean `url`?",
        ]
    );
    assert_eq!(f.model.ledger, LedgerConfig::default());
    let f = parse_as("/u/stepguard.toml", "ledger = 3\n", FileRole::User);
    assert_eq!(
        messages(&f.diagnostics),
        ["error: /u/stepguard.toml: ledger: expected a table, found integer"]
    );
}

#[test]
fn run_table_reads_the_checkpoint_keys_and_refuses_bad_values() {
    let f = parse(
        "[run]\ncheckpoint = \"git\"\ncheckpoint_max_file_mb = 20\ncheckpoint_timeout = \"3s\"\n",
    );
    assert!(f.diagnostics.is_empty(), "{:?}", f.diagnostics);
    let c = &f.model.checkpoint;
    assert_eq!(c.kind.as_ref().map(|k| k.0.as_str()), Some("git"));
    assert_eq!(
        c.kind.as_ref().unwrap().1.to_string(),
        "/p/stepguard.toml: run.checkpoint"
    );
    assert_eq!(c.max_file_mb.as_ref().map(|m| m.0), Some(20));
    assert_eq!(
        c.timeout.as_ref().map(|t| t.0),
        Some(std::time::Duration::from_secs(3))
    );
    let bad = parse(
        "[run]\ncheckpoint = \"svn\"\ncheckpoint_max_file_mb = 0\ncheckpoint_timeout = \"0s\"\ncheckpoints = 1\n",
    );
    let msgs = messages(&bad.diagnostics);
    for (key, says) in [
        (
            "run.checkpoint:",
            "expected \"git\" or \"none\", found \"svn\"",
        ),
        ("run.checkpoint_max_file_mb", "at least 1"),
        ("run.checkpoint_timeout", "a duration above zero"),
        ("checkpoints", "checkpoint"),
    ] {
        assert!(
            msgs.iter().any(|m| m.contains(key) && m.contains(says)),
            "{key}: {msgs:?}"
        );
    }
    assert_eq!(
        bad.model.checkpoint,
        crate::model::CheckpointConfig::default()
    );
}
