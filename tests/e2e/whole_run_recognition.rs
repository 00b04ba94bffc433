//! Recognition for the whole run (#26 item 8): output after a recognised start is judged too.
//! A run whose output is mostly not the provider's (at least 50 such lines, more than half of
//! all lines) is `unrecognized_stream`, never `success`.

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
