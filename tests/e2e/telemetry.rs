//! OpenTelemetry export from the binary: a collector stand-in on 127.0.0.1 that records what
//! reaches it (the protobuf itself is decoded in stepguard-telemetry's own tests).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::harness::{Sandbox, fixture};

/// A collector stand-in: answers every POST with 200 and remembers `(path, content type)`.
struct Collector {
    url: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Collector {
    fn start() -> Self {
        Self::on(TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// A collector that takes the first `ok` posts, then answers every one with 500.
    fn failing_after(ok: usize) -> Self {
        Self::serving(TcpListener::bind("127.0.0.1:0").unwrap(), Some(ok))
    }

    fn on(listener: TcpListener) -> Self {
        Self::serving(listener, None)
    }

    fn serving(listener: TcpListener, fail_after: Option<usize>) -> Self {
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    continue;
                }
                let path = request.split_whitespace().nth(1).unwrap_or("").to_owned();
                let (mut length, mut kind) = (0usize, String::new());
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    let lower = header.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if let Some(v) = lower.strip_prefix("content-type:") {
                        kind = v.trim().to_owned();
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let before = {
                    let mut seen = log.lock().unwrap();
                    seen.push((path, kind));
                    seen.len() - 1
                };
                let answer: &[u8] = if fail_after.is_some_and(|ok| before >= ok) {
                    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                };
                let _ = stream.write_all(answer);
            }
        });
        Collector { url, seen }
    }

    fn paths(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(p, _)| p.clone())
            .collect()
    }
}

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// An over-budget run (6 Codex tool steps under a budget of 2) whose agent writes down the
/// TRACEPARENT it was given.
fn over_budget_run(sb: &Sandbox, env: &[(&str, &str)]) -> crate::harness::Run {
    let seen = sb.root().join("traceparent.txt");
    let agent = sb.write(
        "agent.sh",
        format!(
            "#!/usr/bin/env bash\nprintf '%s' \"${{TRACEPARENT:-}}\" > {}\ncat {}\n",
            seen.display(),
            fixture("real/codex/tools12.jsonl")
        ),
    );
    let mut perms = std::fs::metadata(&agent).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&agent, perms).unwrap();
    let mut cmd = sb.cmd(&[
        "run",
        "-p",
        "codex",
        "--unit",
        "tool",
        "--max-steps",
        "2",
        "--",
        agent.to_str().unwrap(),
    ]);
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "TRACEPARENT",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap().into()
}

#[test]
fn a_run_exports_its_span_and_metrics_and_the_agent_runs_under_its_trace() {
    let sb = Sandbox::new();
    let collector = Collector::start();
    let parent = format!("00-{PARENT_TRACE}-00f067aa0ba902b7-01");
    let run = over_budget_run(
        &sb,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str()),
            ("TRACEPARENT", parent.as_str()),
        ],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(!run.stderr.contains("telemetry"), "{}", run.stderr);
    let paths = collector.paths();
    assert!(paths.iter().any(|p| p == "/v1/traces"), "{paths:?}");
    assert!(paths.iter().any(|p| p == "/v1/metrics"), "{paths:?}");
    assert!(
        collector
            .seen
            .lock()
            .unwrap()
            .iter()
            .all(|(_, kind)| kind == "application/x-protobuf"),
        "HTTP/protobuf by default"
    );
    // The agent's TRACEPARENT is in the same trace, under the run's own span.
    let child = std::fs::read_to_string(sb.root().join("traceparent.txt")).unwrap();
    assert!(child.starts_with(&format!("00-{PARENT_TRACE}-")), "{child}");
    assert_ne!(child, parent);
}

#[test]
fn a_dead_collector_changes_nothing_but_one_warning() {
    let sb = Sandbox::new();
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let run = over_budget_run(&sb, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(
        run.stderr
            .lines()
            .filter(|l| l.contains("telemetry"))
            .count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("the run is unaffected"),
        "{}",
        run.stderr
    );
    // The flush is bounded (2 s): a bound, not a speed target.
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

#[test]
fn with_nothing_set_nothing_is_sent() {
    let sb = Sandbox::new();
    // Where the OTLP specification's default endpoint points: an exporter that fell back to it
    // when nothing is set would be heard here.
    let collector = Collector::on(
        TcpListener::bind("127.0.0.1:4318").expect("the OTLP default port 4318 is free"),
    );
    let run = over_budget_run(&sb, &[]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(collector.paths().is_empty());
    // No TRACEPARENT is invented for the agent either.
    assert_eq!(
        std::fs::read_to_string(sb.root().join("traceparent.txt")).unwrap(),
        ""
    );
}

#[test]
fn history_export_writes_json_lines_or_replays_to_the_collector() {
    let sb = Sandbox::new();
    for _ in 0..2 {
        assert_eq!(over_budget_run(&sb, &[]).code, Some(3));
    }
    let lines = sb.run(&["history", "export"]);
    assert_eq!(lines.code, Some(0), "{}", lines.stderr);
    let records: Vec<serde_json::Value> = lines
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    assert!(
        records[0]["id"].as_i64() < records[1]["id"].as_i64(),
        "oldest first"
    );
    assert!(records.iter().all(|r| r["error_type"] == "max_steps"));

    let collector = Collector::start();
    let replay = sb.run_env(
        &["history", "export", "--otlp"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str())],
    );
    assert_eq!(replay.code, Some(0), "{}", replay.stderr);
    assert!(
        replay.stderr.contains("exported 2 runs"),
        "{}",
        replay.stderr
    );
    assert!(collector.paths().iter().any(|p| p == "/v1/traces"));

    let nowhere = sb.run(&["history", "export", "--otlp"]);
    assert_eq!(nowhere.code, Some(2));
    assert!(
        nowhere.stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT"),
        "{}",
        nowhere.stderr
    );
}

/// A history of `n` finished runs, a second apart, written through the store.
fn many_runs(sb: &Sandbox, n: usize) -> String {
    use stepguard_core::{Outcome, RunRecord};
    let db = sb.root().join("many.db");
    let mut store = stepguard_store::Store::open(&db).unwrap();
    let runs = (0..n).map(|i| {
        let mut r = RunRecord::new("codex", Outcome::Success);
        r.invocation.started_at = Some(format!("2026-01-01T00:{:02}:{:02}.000Z", i / 60, i % 60));
        r.invocation.duration_ms = Some(1000);
        r
    });
    store.insert_records(runs).unwrap();
    db.display().to_string()
}

/// `history export --otlp` sends a batch of runs at a time (512 spans to a request) and the
/// metrics once; a collector that fails part-way stops it with exit 2 and a message saying
/// which runs it took.
#[test]
fn history_export_otlp_streams_in_batches_and_says_how_far_a_failing_collector_got() {
    let sb = Sandbox::new();
    let db = many_runs(&sb, 1100);
    let collector = Collector::start();
    let replay = sb.run_env(
        &["--db", &db, "history", "export", "--otlp"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str())],
    );
    assert_eq!(replay.code, Some(0), "{}", replay.stderr);
    assert!(
        replay.stderr.contains("exported 1100 runs"),
        "{}",
        replay.stderr
    );
    let paths = collector.paths();
    assert_eq!(
        paths.iter().filter(|p| *p == "/v1/traces").count(),
        3,
        "{paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| *p == "/v1/metrics").count(),
        1,
        "{paths:?}"
    );

    let failing = Collector::failing_after(1);
    let stopped = sb.run_env(
        &["--db", &db, "history", "export", "--otlp"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", failing.url.as_str())],
    );
    assert_eq!(stopped.code, Some(2), "{}", stopped.stderr);
    assert!(
        stopped.stderr.contains(
            "history export --otlp stopped: the collector took the spans of the 512 oldest runs"
        ),
        "{}",
        stopped.stderr
    );
    assert!(stopped.stderr.contains("/v1/traces"), "{}", stopped.stderr);
    assert!(!stopped.stderr.contains("exported"), "{}", stopped.stderr);
    assert_eq!(failing.paths(), ["/v1/traces", "/v1/traces"]);
}

#[test]
fn the_telemetry_table_in_the_config_turns_export_on_and_is_validated() {
    let sb = Sandbox::new();
    let collector = Collector::start();
    sb.write(
        "project/stepguard.toml",
        format!(
            "[telemetry]\nendpoint = \"{}\"\nservice_name = \"ci-agents\"\nheaders = {{ \"x-team\" = \"infra\" }}\n",
            collector.url
        ),
    );
    let run = over_budget_run(&sb, &[]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(collector.paths().iter().any(|p| p == "/v1/traces"));

    sb.write(
        "project/stepguard.toml",
        "[telemetry]\nendpont = \"http://x\"\nflush_timeout = \"soon\"\n",
    );
    let check = sb.run(&["validate"]);
    assert_eq!(check.code, Some(2));
    assert!(
        check.stdout.contains("telemetry.endpont"),
        "{}",
        check.stdout
    );
    assert!(check.stdout.contains("endpoint"), "{}", check.stdout);
    assert!(
        check.stdout.contains("telemetry.flush_timeout"),
        "{}",
        check.stdout
    );
}
