//! Recognition for the whole run (#26 item 8): output after a recognised start is judged too.
//! A run whose output is mostly not the provider's (at least 50 such lines, more than half of
//! all lines) is `unrecognized_stream`, never `success`; so is a line framed to hide events
//! (packed, split by `\r`, duplicate or escaped keys, BOM/NUL prefixes); reused ids count.

use crate::harness::Sandbox;
use crate::run_cmd::{run_with_summary, script, summary};

const START: &str = r#"{"type":"thread.started","thread_id":"t"}
{"type":"turn.started"}"#;
const END: &str = r#"{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":0,"output_tokens":1}}"#;

/// A Codex-style agent: a valid start, `lines` lines of `body` (`$i` is the line number), a
/// valid successful end, exit 0.
fn codex_agent(sb: &Sandbox, lines: u32, body: &str) -> String {
    script(
        sb,
        "agent.sh",
        &format!(
            "cat <<'EOF'\n{START}\nEOF\nfor i in $(seq 1 {lines}); do echo \"{body}\"; done\ncat <<'EOF'\n{END}\nEOF"
        ),
    )
}

#[test]
fn a_valid_start_then_plain_text_tool_lines_is_not_a_success() {
    // 49 noise lines: under the rule's 50, whatever their share, the run is counted.
    let sb = Sandbox::new();
    let agent = codex_agent(&sb, 49, "warning: a skill failed to load ($i)");
    let run = run_with_summary(&sb, &["-p", "codex", "--", &agent]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(summary(&sb)["outcome"], "success");

    let sb = Sandbox::new();
    let agent = codex_agent(&sb, 200, "tool: Bash ls -la (call $i)");
    let run = run_with_summary(&sb, &["-p", "codex", "--max-steps", "50", "--", &agent]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let s = summary(&sb);
    assert_eq!(
        (s["outcome"].as_str(), s["error_type"].as_str()),
        (Some("failed"), Some("unrecognized_stream")),
        "{s}"
    );
    assert!(
        run.stderr
            .contains("lines of output were not the provider's events"),
        "{}",
        run.stderr
    );
}

#[test]
fn unknown_events_after_a_valid_start_are_judged_at_the_end() {
    let sb = Sandbox::new();
    let agent = codex_agent(
        &sb,
        120,
        r#"{\"type\":\"tool.call\",\"name\":\"Bash\",\"n\":$i}"#,
    );
    let run = run_with_summary(&sb, &["-p", "codex", "--max-steps", "50", "--", &agent]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let s = summary(&sb);
    assert_eq!(s["error_type"], "unrecognized_stream", "{s}");
    assert_eq!(s["unknown_events"], 120, "{s}");
    assert!(
        run.stderr.contains("120 of the agent's 123 lines"),
        "{}",
        run.stderr
    );
}

#[test]
fn warn_lets_a_mostly_unrecognised_run_go_on_and_says_so_once() {
    let sb = Sandbox::new();
    let agent = codex_agent(&sb, 200, "tool: Bash ls -la (call $i)");
    let run = run_with_summary(
        &sb,
        &["-p", "codex", "--unrecognized", "warn", "--", &agent],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(summary(&sb)["outcome"], "success");
    assert_eq!(
        run.stderr
            .matches("lines of output were not the provider's events")
            .count(),
        1,
        "{}",
        run.stderr
    );
}

/// Runs a Codex-style agent that writes `hidden` between a valid start and a valid end.
fn run_hiding(sb: &Sandbox, hidden: &[u8], max_steps: &str) -> crate::harness::Run {
    let mut stream = format!("{START}\n").into_bytes();
    stream.extend_from_slice(hidden);
    stream.extend_from_slice(format!("\n{END}\n").as_bytes());
    let file = sb.write("stream.jsonl", stream);
    let agent = script(sb, "agent.sh", &format!("cat {}", file.display()));
    run_with_summary(sb, &["-p", "codex", "--max-steps", max_steps, "--", &agent])
}

#[test]
fn lines_framed_to_hide_events_are_refused() {
    let item = |id: &str| {
        format!(
            r#"{{"type":"item.started","item":{{"id":"{id}","type":"command_execution","command":"ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}}}"#
        )
    };
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "packed",
            format!("{}{}", item("a"), item("b")).into_bytes(),
            "more than one JSON value",
        ),
        (
            "split by CR",
            format!("{}\r{}", item("a"), item("b")).into_bytes(),
            "more than one JSON value",
        ),
        (
            "duplicate key",
            item("a")
                .replacen(r#"{"type":"#, r#"{"type":"item.updated","type":"#, 1)
                .into_bytes(),
            "a top-level key given twice",
        ),
        (
            "escaped key",
            item("a")
                .replacen(r#""type":"item"#, r#""typ\u0065":"item"#, 1)
                .into_bytes(),
            "a top-level key written with an escape",
        ),
        (
            "BOM",
            [b"\xEF\xBB\xBF".as_slice(), item("a").as_bytes()].concat(),
            "a byte-order mark",
        ),
        (
            "NUL",
            [b"\0".as_slice(), item("a").as_bytes()].concat(),
            "a byte-order mark or control bytes",
        ),
    ];
    for (name, hidden, says) in cases {
        let sb = Sandbox::new();
        let run = run_hiding(&sb, &hidden, "50");
        assert_eq!(run.code, Some(2), "{name}: {}", run.stderr);
        let s = summary(&sb);
        assert_eq!(s["error_type"], "unrecognized_stream", "{name}: {s}");
        assert!(run.stderr.contains(says), "{name}: {}", run.stderr);
        assert!(
            run.stderr.contains("line 3 of the agent's output"),
            "{name}: {}",
            run.stderr
        );
    }
}

#[test]
fn an_item_id_used_again_is_a_new_step() {
    let sb = Sandbox::new();
    let step = |status: &str| {
        format!(
            r#"{{"type":"item.{status}","item":{{"id":"c1","type":"command_execution","command":"ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}}}"#
        )
    };
    // Three items under one id: Codex gives every item an id of its own.
    let hidden = vec![[step("started"), step("completed")].join("\n"); 3].join("\n");
    let run = run_hiding(&sb, hidden.as_bytes(), "2");
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let s = summary(&sb);
    assert_eq!(
        (s["error_type"].as_str(), s["breached_at_step"].as_u64()),
        (Some("max_steps"), Some(3)),
        "{s}"
    );
}
