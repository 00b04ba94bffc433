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
        load(std::slice::from_ref(&bad)),
        Err(ConfigError::Invalid(_))
    ));
    let missing = dir.path().join("nope.toml");
    let err = load(&[missing]).unwrap_err();
    assert!(
        err.to_string().starts_with("failed to read config file "),
        "{err}"
    );
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
    let found = discover(&nested, Some(&user));
    assert_eq!(found, vec![project.join(PROJECT_FILE), user.clone()]);
    // No project file: only the user file; no user file: nothing.
    assert_eq!(discover(dir.path(), Some(&user)), vec![user]);
    assert!(discover(dir.path(), Some(&dir.path().join("absent.toml"))).is_empty());
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
    let (loaded, failures) = load_all(&[a, b, c]);
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
