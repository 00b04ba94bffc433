//! `stepguard simulate` end to end over the repository's scenario files.

use crate::harness::{Sandbox, workspace};

#[test]
fn every_bundled_scenario_passes_through_the_cli() {
    let sb = Sandbox::new();
    let dir = workspace().join("crates/governor/scenarios");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let run = sb.run(&["simulate", path.to_str().unwrap()]);
        assert_eq!(run.code, Some(0), "{}: {}", path.display(), run.stderr);
        assert_eq!(run.json()["expectations"]["met"], true);
        count += 1;
    }
    assert!(count >= 20);
}

#[test]
fn unmet_expectations_exit_1_and_bad_files_exit_2() {
    let sb = Sandbox::new();
    let wrong = sb.write("wrong.json", r#"{"name": "w", "kind": "agent", "agent": {"max_steps": 1}, "replies": [{"text": "hi"}], "expect": {"steps_used": 2}}"#);
    let run = sb.run(&["simulate", wrong.to_str().unwrap()]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("expectations not met"),
        "{}",
        run.stderr
    );
    assert_eq!(run.json()["expectations"]["mismatches"][0]["actual"], 1);
    let bad = sb.write(
        "bad.json",
        r#"{"name": "b", "kind": "agent", "agent": {"max_steps": 0}}"#,
    );
    let run = sb.run(&["simulate", bad.to_str().unwrap()]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("max_steps must be at least 1"),
        "{}",
        run.stderr
    );
    assert_eq!(sb.run(&["simulate", "/no/such.json"]).code, Some(2));
}
