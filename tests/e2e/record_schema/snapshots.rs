//! The run records stepguard emits, byte for byte: every fixture stream counted with its
//! provider, a few `run` outcomes with stand-in agents, and what `history`/`show`/`stats` print.
//! What changes from run to run (times, durations, containment, paths) is normalised; nothing
//! else, so a change in any field's name, order, type or value shows here.

use crate::harness::{Sandbox, plugin_dirs, workspace};
use crate::run_cmd::{fixture, replaying_agent, script};

/// Keys whose values differ from run to run; a non-null value becomes `"[key]"`.
const VOLATILE: [&str; 4] = ["started_at", "ended_at", "duration_ms", "containment"];

/// Replaces volatile values and machine paths in JSON text, keeping every other byte.
fn normalise(text: &str, sb: &Sandbox) -> String {
    let mut out = text
        .replace(
            &workspace().join("tests/fixtures").display().to_string(),
            "[fixtures]",
        )
        .replace(&plugin_dirs().opencode.display().to_string(), "[opencode]")
        .replace(&sb.root().display().to_string(), "[sandbox]");
    for key in VOLATILE {
        out = blank_values(&out, key);
    }
    out
}

/// Replaces every non-null scalar value of `"key":` (pretty or compact) with `"[key]"`.
fn blank_values(text: &str, key: &str) -> String {
    let needle = format!("\"{key}\":");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        let (head, tail) = rest.split_at(at + needle.len());
        out.push_str(head);
        let value = tail.trim_start_matches(' ');
        out.push_str(&tail[..tail.len() - value.len()]);
        let len = if value.starts_with("null") {
            0
        } else if let Some(s) = value.strip_prefix('"') {
            s.find('"').map_or(value.len(), |end| end + 2)
        } else {
            value.find([',', '}', '\n']).unwrap_or(value.len())
        };
        if len > 0 {
            out.push_str(&format!("\"[{key}]\""));
        }
        rest = &value[len..];
    }
    out.push_str(rest);
    out
}

/// Replaces the times, durations and containment of human-readable history lines.
fn normalise_human(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let label = ["Started:", "Ended:", "Duration:", "Containment:"]
            .into_iter()
            .find(|l| trimmed.starts_with(l));
        if let Some(label) = label {
            out.push_str(&format!("{indent}{label} [volatile]\n"));
            continue;
        }
        let words: Vec<String> = line.split(' ').map(volatile_word).collect();
        out.push_str(&words.join(" "));
        out.push('\n');
    }
    out
}

/// `2026-01-02` → `[date]`, `10:11:12` → `[time]`, a run's duration `70ms` / `70ms,` (or, on a
/// loaded machine, `2.1s` / `2.1s,`) → `[ms]`.
fn volatile_word(word: &str) -> String {
    let shape: String = word
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    match shape.as_str() {
        "9999-99-99" => "[date]".into(),
        "99:99:99" => "[time]".into(),
        _ => {
            let (body, comma) = match shape.strip_suffix(',') {
                Some(body) => (body, ","),
                None => (shape.as_str(), ""),
            };
            let number = body
                .strip_suffix("ms")
                .or_else(|| body.strip_suffix('s'))
                .unwrap_or_default();
            let (whole, fraction) = number.split_once('.').unwrap_or((number, "9"));
            let is_number = |part: &str| !part.is_empty() && part.chars().all(|c| c == '9');
            if is_number(whole) && is_number(fraction) {
                format!("[ms]{comma}")
            } else {
                word.to_owned()
            }
        }
    }
}

/// Every `.jsonl` fixture in `dir` (relative to tests/fixtures), sorted.
fn streams_in(dir: &str, prefix: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(workspace().join("tests/fixtures").join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl") && n.starts_with(prefix))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    files.sort();
    files
}

/// `count --json` of every stream of `provider` (shared set, real recordings, our edge cases).
fn count_records(provider: &str) -> String {
    let sb = Sandbox::new();
    let mut files = streams_in(&format!("streams/{provider}"), "");
    files.extend(streams_in(&format!("real/{provider}"), ""));
    if provider == "codex" {
        files.extend(streams_in("edge", ""));
    }
    assert!(files.len() >= 3, "{provider}: {files:?}");
    let paths: Vec<String> = files
        .iter()
        .map(|f| fixture(f).display().to_string())
        .collect();
    let opencode = plugin_dirs().opencode.display().to_string();
    let mut args = vec!["count", "--json", "-p", provider];
    if provider == "opencode" {
        args.extend(["--plugin-dir", &opencode]);
    }
    args.extend(paths.iter().map(String::as_str));
    let run = sb.run(&args);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), files.len(), "{}", run.stdout);
    normalise(&run.stdout, &sb)
}

#[test]
fn count_records_of_every_fixture_stream() {
    for provider in ["claude", "codex", "gemini", "opencode"] {
        insta::assert_snapshot!(format!("count_{provider}"), count_records(provider));
    }
}

/// Runs `stepguard run -q --summary-file … ARGS`, returning the exit code and the summary file.
fn summary_file(sb: &Sandbox, args: &[&str]) -> (Option<i32>, String) {
    let file = sb.root().join("summary.json");
    let _ = std::fs::remove_file(&file);
    let mut full = vec!["run", "-q", "--summary-file", file.to_str().unwrap()];
    full.extend_from_slice(args);
    let run = sb.run(&full);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("no summary file ({e}); stderr: {}", run.stderr));
    (run.code, text)
}

fn cat_agent(sb: &Sandbox, name: &str, stream: &str, tail: &str) -> String {
    let path = fixture(stream);
    script(sb, name, &format!("cat {}\n{tail}", path.display()))
}

#[test]
fn run_records_and_what_history_show_and_stats_print() {
    let sb = Sandbox::new();
    let ok = cat_agent(&sb, "ok.sh", "real/codex/tools3.jsonl", "");
    let long = cat_agent(&sb, "long.sh", "streams/codex/long_run.jsonl", "sleep 30");
    let stuck = script(
        &sb,
        "stuck.sh",
        "echo '{\"type\":\"thread.started\",\"thread_id\":\"t1\"}'\nsleep 30",
    );
    let looping = replaying_agent(&sb, &fixture("streams/codex/loop_repeat.jsonl"));
    let cases: [(&str, Vec<&str>, i32); 6] = [
        ("success", vec!["-p", "codex", "--", &ok], 0),
        (
            "max_steps",
            vec!["-p", "codex", "--max-steps", "3", "--", &long],
            3,
        ),
        (
            "unrecognized_stream",
            vec![
                "-p",
                "codex",
                "--",
                "bash",
                "-c",
                "for i in 1 2 3; do echo \"running tool $i\"; done",
            ],
            2,
        ),
        (
            "timeout",
            vec!["-p", "codex", "--timeout", "300ms", "--", &stuck],
            124,
        ),
        (
            "loop_detected",
            vec!["-p", "codex", "--loop-limit", "3", "--", &looping],
            3,
        ),
        (
            "spawn_failed",
            vec!["-p", "codex", "--", "/no/such/agent"],
            2,
        ),
    ];
    for (name, args, code) in cases {
        let (got, text) = summary_file(&sb, &args);
        assert_eq!(got, Some(code), "{name}: {text}");
        insta::assert_snapshot!(format!("run_{name}"), normalise(&text, &sb));
    }
    for (name, args) in [
        ("history", vec!["history", "--json"]),
        ("show", vec!["show", "2", "--json"]),
        ("show_loop", vec!["show", "5", "--json"]),
        ("stats", vec!["stats", "--json"]),
        ("history_human", vec!["history"]),
        ("show_human", vec!["show", "2"]),
    ] {
        let run = sb.run(&args);
        assert_eq!(run.code, Some(0), "{name}: {}", run.stderr);
        let text = normalise(&run.stdout, &sb);
        let text = if name.ends_with("_human") {
            normalise_human(&text)
        } else {
            text
        };
        insta::assert_snapshot!(format!("cli_{name}"), text);
    }
}

#[test]
fn normalising_blanks_only_the_volatile_values() {
    let sb = Sandbox::new();
    let text =
        r#"{"started_at":"2026-01-01T00:00:00.000Z","duration_ms":12,"x":1,"ended_at":null}"#;
    assert_eq!(
        normalise(text, &sb),
        r#"{"started_at":"[started_at]","duration_ms":"[duration_ms]","x":1,"ended_at":null}"#
    );
    assert_eq!(
        normalise_human(
            "#1 2026-11-25 10:29:28 codex/item: Steps: 4 | failed | 70ms, loop\n  Duration: 70ms\n"
        ),
        "#1 [date] [time] codex/item: Steps: 4 | failed | [ms], loop\n  Duration: [volatile]\n"
    );
    assert_eq!(
        normalise_human("#2 2026-11-25 10:29:28 codex/item: | 2.1s, loop | 12s | tokens: 4s\n"),
        "#2 [date] [time] codex/item: | [ms], loop | [ms] | tokens: [ms]\n"
    );
    let pretty = "{\n  \"duration_ms\": 7,\n  \"containment\": \"cgroup\"\n}";
    assert_eq!(
        normalise(pretty, &sb),
        "{\n  \"duration_ms\": \"[duration_ms]\",\n  \"containment\": \"[containment]\"\n}"
    );
}
