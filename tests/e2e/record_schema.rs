//! One run record everywhere: every command that emits a run emits `RunRecord`, which matches
//! the published schema `docs/run-record.schema.json`; errors under `--json` are objects.

use std::path::PathBuf;

use serde_json::Value;
use stepguard_core::RunRecord;

use crate::harness::{Sandbox, fixture, workspace};

fn schema_path() -> PathBuf {
    workspace().join("docs/run-record.schema.json")
}

/// Regenerate with `STEPGUARD_UPDATE_SCHEMA=1 cargo nextest run -E 'test(published_schema)'`.
#[test]
fn the_published_schema_is_generated_from_the_type() {
    let schema = schemars::schema_for!(RunRecord);
    let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    if std::env::var_os("STEPGUARD_UPDATE_SCHEMA").is_some() {
        std::fs::write(schema_path(), &generated).unwrap();
    }
    let published = std::fs::read_to_string(schema_path()).unwrap_or_default();
    assert!(
        published == generated,
        "docs/run-record.schema.json is stale: regenerate it with \
         STEPGUARD_UPDATE_SCHEMA=1 cargo nextest run -E 'test(published_schema)' \
         and record the change in CHANGELOG.md"
    );
}

/// A script agent printing a Codex stream of `items` items (each a different command, so no
/// loop) then success.
fn agent(sb: &Sandbox, name: &str, items: usize, tail: &str) -> String {
    let mut body = String::from("#!/bin/sh\n");
    for i in 0..items {
        body.push_str(&format!(
            "echo '{{\"type\":\"item.started\",\"item\":{{\"id\":\"item_{i}\",\"type\":\"command_execution\",\"command\":\"echo {i}\"}}}}'\n"
        ));
    }
    body.push_str(tail);
    let path = sb.write(name, body);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn summary_of(sb: &Sandbox, args: &[&str]) -> (Option<i32>, Value) {
    let file = sb.root().join("summary.json");
    let _ = std::fs::remove_file(&file);
    let mut full = vec!["run", "-q", "--summary-file", file.to_str().unwrap()];
    full.extend_from_slice(args);
    let run = sb.run(&full);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("no summary file ({e}); stderr: {}", run.stderr));
    (run.code, serde_json::from_str(&text).unwrap())
}

#[test]
fn every_kind_of_emitted_record_matches_the_schema_with_the_same_keys() {
    let sb = Sandbox::new();
    let done =
        "echo '{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}'\n";
    let mut records: Vec<(String, Value)> = Vec::new();

    // count --json: process fields null.
    let count = sb.run(&[
        "count",
        "-p",
        "codex",
        "--json",
        &fixture("streams/codex/long_run.jsonl"),
        &fixture("streams/codex/error_turn_failed.jsonl"),
        &fixture("edge/empty.jsonl"),
    ]);
    assert_eq!(count.code, Some(0), "{}", count.stderr);
    for line in count.stdout.lines() {
        records.push(("count".into(), serde_json::from_str(line).unwrap()));
    }
    assert_eq!(records.len(), 3);

    // --summary-file: success, budget stop, timeout, an agent that cannot start.
    let ok = agent(&sb, "ok.sh", 2, done);
    let long = agent(&sb, "long.sh", 8, "sleep 30\n");
    let (code, success) = summary_of(&sb, &["-p", "codex", "--max-steps", "5", "--", &ok]);
    assert_eq!(code, Some(0));
    records.push(("summary success".into(), success.clone()));
    let (code, breach) = summary_of(&sb, &["-p", "codex", "--max-steps", "3", "--", &long]);
    assert_eq!(code, Some(3));
    assert_eq!(breach["error_type"], "max_steps");
    assert_eq!(breach["breached_at_step"], 4);
    assert_eq!(breach["on_limit_decisions"], serde_json::json!([]));
    records.push(("summary breach".into(), breach.clone()));
    let (code, timeout) = summary_of(&sb, &["-p", "codex", "--timeout", "200ms", "--", &long]);
    assert_eq!(
        (code, timeout["error_type"].as_str()),
        (Some(124), Some("timeout"))
    );
    records.push(("summary timeout".into(), timeout));
    let (code, spawn) = summary_of(&sb, &["-p", "codex", "--", "/no/such/agent"]);
    assert_eq!(code, Some(2));
    assert_eq!(spawn["error_type"], "spawn_failed");
    assert_eq!(
        spawn["message"],
        "cannot run `/no/such/agent`: command not found: no such file; check the path"
    );
    records.push(("summary spawn_failed".into(), spawn));

    // history --json and show --json: the same runs, read back.
    let history = sb.run(&["history", "--json"]).json();
    let rows = history.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        records.push(("history".into(), r.clone()));
    }
    let id = breach["id"]
        .as_i64()
        .expect("the summary names its history id");
    let show = sb.run(&["show", &id.to_string(), "--json"]).json();
    // A script goes from a summary to `show ID` and finds the very same record.
    assert_eq!(show, breach);
    assert_eq!(
        rows.iter().find(|r| r["id"] == success["id"]),
        Some(&success)
    );
    records.push(("show".into(), show));

    let schema: Value = serde_json::from_str(&std::fs::read_to_string(schema_path()).unwrap())
        .expect("the schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let first = keys(&records[0].1);
    for (kind, record) in &records {
        let errors: Vec<String> = validator
            .iter_errors(record)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{kind}: {errors:?}\n{record}");
        assert_eq!(keys(record), first, "{kind} has other keys");
        assert_eq!(record["schema_version"], 1, "{kind}");
    }
}

#[test]
fn a_record_that_breaks_the_schema_is_caught() {
    // The validation above can fail: a retyped field is refused.
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(schema_path()).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut record =
        serde_json::to_value(RunRecord::new("codex", stepguard_core::Outcome::Success)).unwrap();
    assert!(validator.is_valid(&record));
    record["on_limit_decisions"] = Value::String("allow:2,stop".into());
    assert!(!validator.is_valid(&record));
    record["on_limit_decisions"] = serde_json::json!([]);
    record["outcome"] = Value::String("maybe".into());
    assert!(!validator.is_valid(&record));
    record["outcome"] = Value::String("success".into());
    assert!(validator.is_valid(&record));
    // The gateway's figures: a text and a count, or null.
    record["final_report"] = Value::String("Done; nothing left.".into());
    record["model_calls"] = serde_json::json!(12);
    assert!(validator.is_valid(&record));
    record["model_calls"] = serde_json::json!(-1);
    assert!(!validator.is_valid(&record));
    record["model_calls"] = Value::String("12".into());
    assert!(!validator.is_valid(&record));
    record["model_calls"] = Value::Null;
    record["final_report"] = serde_json::json!(["Done"]);
    assert!(!validator.is_valid(&record));
    record["final_report"] = Value::Null;
    assert!(validator.is_valid(&record));
    // The token and cost budgets: a count and an amount with their sources, or null; usage per
    // sub-agent in the shape of `tokens`.
    record["max_tokens"] = serde_json::json!(200_000);
    record["max_tokens_source"] = Value::String("--max-tokens".into());
    record["max_cost_usd"] = serde_json::json!(0.5);
    record["max_cost_usd_source"] = Value::String("--max-cost-usd".into());
    record["sub_agent_tokens"] = serde_json::json!({
        "task-1": {"input_tokens": 300, "output_tokens": 40, "cached_input_tokens": 100}
    });
    assert!(validator.is_valid(&record));
    record["max_tokens"] = serde_json::json!(-1);
    assert!(!validator.is_valid(&record));
    record["max_tokens"] = serde_json::json!(0.5);
    assert!(!validator.is_valid(&record));
    record["max_tokens"] = Value::Null;
    record["max_cost_usd"] = Value::String("0.5".into());
    assert!(!validator.is_valid(&record));
    record["max_cost_usd"] = Value::Null;
    record["sub_agent_tokens"] = serde_json::json!({"task-1": 340});
    assert!(!validator.is_valid(&record));
    record["sub_agent_tokens"] = serde_json::json!({"task-1": {"input_tokens": 300}});
    assert!(!validator.is_valid(&record));
    record["sub_agent_tokens"] = Value::Null;
    assert!(validator.is_valid(&record));
    // Every key is always present, null when unknown.
    record.as_object_mut().unwrap().remove("id");
    assert!(!validator.is_valid(&record));
}

#[test]
fn errors_under_json_are_one_object_on_stdout_with_the_same_exit_code() {
    let sb = Sandbox::new();
    let cases: [(&[&str], i32, &str, &str); 3] = [
        (
            &["count", "-p", "nosuch", "--json", "x.jsonl"],
            2,
            "unknown_provider",
            "unknown provider `nosuch`",
        ),
        (
            &["config", "--json", "--max-steps", "0"],
            2,
            "budget",
            "0 is not a valid budget",
        ),
        (
            &["history", "--json", "--db", "/no/such/dir/x.db"],
            2,
            "usage",
            "no history database at /no/such/dir/x.db",
        ),
    ];
    for (args, code, kind, words) in cases {
        let run = sb.run(args);
        assert_eq!(run.code, Some(code), "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr, "", "{args:?}");
        let v = run.json();
        assert_eq!(v["error"]["kind"], kind, "{args:?}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{args:?}: {message}");
        assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    }
    // The same error without --json stays a line on stderr.
    let run = sb.run(&["count", "-p", "nosuch", "x.jsonl"]);
    assert_eq!((run.code, run.stdout.as_str()), (Some(2), ""));
    assert!(
        run.stderr
            .starts_with("stepguard: error: unknown provider `nosuch`")
    );
}

mod snapshots;

/// Where the docs list the values of a closed set of the record: the file, the section's
/// heading, and the table row (by its first cell's start) whose second cell's first clause is
/// the list, or none when the whole section is the list. One place to re-point when the docs
/// move.
struct DocList {
    what: &'static str,
    path: &'static str,
    heading: &'static str,
    row: Option<&'static str>,
}

const DOC_LISTS: [DocList; 3] = [
    DocList {
        what: "outcome",
        path: "docs/record.md",
        heading: "# Run records",
        row: Some("| `outcome`,"),
    },
    DocList {
        what: "terminated_by",
        path: "docs/record.md",
        heading: "# Run records",
        row: Some("| `terminated_by`,"),
    },
    DocList {
        what: "failure slug",
        path: "docs/exit-codes.md",
        heading: "## Failure slugs",
        row: None,
    },
];

/// The section under `heading`, up to the next heading of its level or above.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section `{heading}`"))
        + heading.len()
        + 2;
    let level = heading.split(' ').next().unwrap();
    let rest = &text[start..];
    let end = rest
        .match_indices("\n#")
        .find(|(i, _)| {
            let hashes: String = rest[i + 1..].chars().take_while(|c| *c == '#').collect();
            hashes.len() <= level.len()
        })
        .map_or(rest.len(), |(i, _)| i);
    &rest[..end]
}

/// The lowercase values in backticks in `text`, sorted and deduplicated.
fn backticked(text: &str) -> Vec<String> {
    let mut values: Vec<String> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|v| v.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_owned)
        .collect();
    values.sort();
    values.dedup();
    values
}

/// The values `list` documents.
fn documented(list: &DocList) -> Vec<String> {
    // A leading newline, so that a heading on the first line is found like any other.
    let text = format!(
        "\n{}",
        std::fs::read_to_string(workspace().join(list.path)).unwrap()
    );
    let section = section(&text, list.heading);
    let Some(row) = list.row else {
        return backticked(section);
    };
    let line = section
        .lines()
        .find(|l| l.starts_with(row))
        .unwrap_or_else(|| panic!("{}: no row `{row}` under {}", list.what, list.heading));
    let cell = line.split(" | ").nth(1).unwrap();
    backticked(cell.split(';').next().unwrap())
}

fn sorted(values: impl IntoIterator<Item = &'static str>) -> Vec<String> {
    let mut v: Vec<String> = values.into_iter().map(str::to_owned).collect();
    v.sort();
    v
}

#[test]
fn the_docs_list_exactly_the_values_of_the_records_enums() {
    use stepguard_core::{FailureSlug, Outcome, TerminatedBy};
    let mut slugs = sorted(FailureSlug::ALL.iter().map(|s| s.as_str()));
    slugs.push(stepguard_core::slug::LEGACY_MAX_TURNS_SLUG.to_owned());
    slugs.sort();
    let expected = [
        sorted(Outcome::ALL.iter().map(|o| o.as_str())),
        sorted(TerminatedBy::ALL.iter().map(|t| t.as_str())),
        slugs,
    ];
    for (list, want) in DOC_LISTS.iter().zip(expected) {
        assert_eq!(
            documented(list),
            want,
            "{} in {} under `{}`",
            list.what,
            list.path,
            list.heading
        );
    }
}

#[test]
fn a_doc_list_that_misses_a_value_is_caught() {
    let text =
        "# t\n\n## Failure slugs\n\nSlugs: `max_steps`, `timeout` (`MAX_STEPS`).\n\n## Next\n`x`\n";
    assert_eq!(
        backticked(section(text, "## Failure slugs")),
        ["max_steps", "timeout"]
    );
    assert_ne!(
        backticked(section(text, "## Failure slugs")),
        sorted(stepguard_core::FailureSlug::ALL.iter().map(|s| s.as_str()))
    );
}
