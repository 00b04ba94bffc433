//! Credentials and the upstream out of the agent's reach: a stand-in agent reads what the same
//! user can read (its own environment and command line, every ancestor's `environ`, `cmdline`
//! and open files in `/proc`, and a key file on disk), then tries the upstream and the gateway
//! with whatever it found. The scripted upstream must see the real key only through the
//! gateway, and the agent must find neither the key nor where the upstream is.

use std::path::Path;

use serde_json::Value;
use stepguard_modelserver::{ModelServer, RecordedRequest, Script};

use crate::agents::{Agent, Cli};
use crate::harness::Sandbox;

/// The real API key of the tests: only stepguard and the upstream may see it.
const REAL_KEY: &str = "sk-real-4a1c9e7b2f";

/// The attacker. Arguments: its report file, the stream to print at the end (`-`: none, when it
/// is a tool the real CLI runs), a key file the
/// same user can read (as `~/.codex/auth.json` would be). It writes a JSON report: everything
/// it read, and each attempt (url, which key, status).
const SNOOP: &str = r#"
import json, os, re, stat, sys, urllib.request, urllib.error
report_path, stream, key_file = sys.argv[-3:]
seen = []
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b"\n").decode("utf-8", "replace")
    except Exception as e:
        return ""
seen.append("@@@ env\n" + "\n".join(f"{k}={v}" for k, v in os.environ.items()))
seen.append("@@@ argv\n" + "\n".join(sys.argv))
pid, chain = os.getpid(), []
while pid > 1:
    chain.append(pid)
    for part in ("environ", "cmdline"):
        seen.append(f"@@@ {pid} {part}\n" + read(f"/proc/{pid}/{part}"))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except Exception:
        fds = []
    for fd in fds:
        # Files and memfds only: opening a pipe or a terminal would block or steal input.
        path = f"/proc/{pid}/fd/{fd}"
        try:
            info = os.stat(path)
        except Exception:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size < 10_000_000:
            seen.append(f"@@@ {pid} fd {fd} {os.readlink(path)}\n" + read(path))
    line = read(f"/proc/{pid}/stat")
    pid = int(line.rsplit(")", 1)[1].split()[1]) if line else 1
text = "\n".join(seen)
urls = sorted(set(u.rstrip("/") for u in re.findall(r"https?://[0-9A-Za-z.:/_-]+", text)
                  if "127.0.0.1" in u and not u.endswith(":9")))
keys = {"none": None, "found": None, "forged": "sg-run-" + "0" * 32,
        "on_disk": open(key_file).read().strip()}
for k, v in os.environ.items():
    if "KEY" in k and v:
        keys["found"] = v
attempts = []
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": False,
                   "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                   "messages": [{"role": "user", "content": "run it"}],
                   "input": [{"role": "user", "content": "run it"}]}).encode()
n = 0
for url in urls:
    for kind, key in keys.items():
        for path, header in (("/v1/messages", "x-api-key"), ("/responses", "authorization")):
            n += 1
            headers = {"content-type": "application/json", "anthropic-version": "2023-06-01",
                       "x-attempt": str(n)}
            if key is not None:
                headers[header] = key if header == "x-api-key" else "Bearer " + key
            req = urllib.request.Request(url + path, data=body, headers=headers)
            try:
                status = urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as e:
                status = e.code
            except Exception as e:
                status = str(e)
            attempts.append({"n": n, "url": url, "key": kind, "status": status})
with open(report_path, "w") as f:
    json.dump({"chain": chain, "text": text, "urls": urls, "attempts": attempts}, f)
if stream != "-":
    with open(stream) as f:
        sys.stdout.write(f.read())
"#;

/// Skips (with the reason) when the stand-in agent cannot run here.
#[expect(clippy::print_stderr, reason = "a skipped test says why")]
fn python() -> bool {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: python3 is not installed; the stand-in agent needs it");
    }
    found
}

/// Where in the snoop's text `needle` was: the source's heading and the text around it.
fn source(text: &str, needle: &str) -> String {
    let at = text.find(needle).unwrap_or(0);
    let heading = text[..at].rfind("@@@ ").map_or("?", |h| {
        let line = &text[h..];
        &line[..line.find('\n').unwrap_or(line.len())]
    });
    let around: String = text[at..].chars().take(240).collect();
    format!("{heading}: …{around}…")
}

fn header<'a>(r: &'a RecordedRequest, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// What the attack found and what reached the upstream, checked: nothing secret in what the
/// agent read, the real key at the upstream only through the gateway, and the gateway's
/// refusals of no key, a forged key and the real key from disk.
fn assert_out_of_reach(server: &ModelServer, report: &Path, what: &str) {
    let report: Value = serde_json::from_slice(
        &std::fs::read(report)
            .unwrap_or_else(|e| panic!("{what}: the stand-in agent wrote no report ({e})")),
    )
    .unwrap();
    let text = report["text"].as_str().unwrap();
    let upstream = server.addr().to_string();
    assert!(
        report["chain"].as_array().unwrap().len() >= 2,
        "{what}: the agent walked its ancestors: {}",
        report["chain"]
    );
    assert!(
        !text.contains(REAL_KEY),
        "{what}: the real key was readable in {}",
        source(text, REAL_KEY)
    );
    assert!(
        !text.contains(&upstream),
        "{what}: the upstream {upstream} was readable in {}",
        source(text, &upstream)
    );
    let attempts = report["attempts"].as_array().unwrap();
    assert!(
        attempts
            .iter()
            .all(|a| !a["url"].as_str().unwrap().contains(&upstream)),
        "{what}: {attempts:?}"
    );
    let status = |kind: &str| -> Vec<Value> {
        attempts
            .iter()
            .filter(|a| a["key"] == kind)
            .map(|a| a["status"].clone())
            .collect()
    };
    for kind in ["forged", "on_disk"] {
        let got = status(kind);
        assert!(!got.is_empty(), "{what}: no attempt with {kind}");
        // 401 at the gateway; the agent's other URLs (the refused probe, a closed port) never
        // reach the upstream either.
        assert!(
            got.iter().any(|s| s == 401),
            "{what}: {kind} was not refused: {got:?}"
        );
    }
    let through: Vec<&Value> = attempts
        .iter()
        .filter(|a| a["key"] == "found" && a["status"] == 200)
        .collect();
    assert!(
        !through.is_empty(),
        "{what}: the per-run key works: {attempts:?}"
    );
    let received = server.requests();
    assert!(!received.is_empty(), "{what}: nothing reached the upstream");
    for r in &received {
        let key = header(r, "x-api-key")
            .or_else(|| header(r, "authorization").and_then(|v| v.strip_prefix("Bearer ")));
        // The real CLI's own calls carry no attempt number, and the real key.
        let Some(n) = header(r, "x-attempt") else {
            assert_eq!(key, Some(REAL_KEY), "{what}: {:?}", r.headers);
            continue;
        };
        let attempt = attempts
            .iter()
            .find(|a| a["n"] == n.parse::<u64>().unwrap_or(0));
        // What reached the upstream came through the gateway: the per-run key as the real
        // one, or no key at all (passed as it came, and counted).
        match attempt.map(|a| a["key"].as_str().unwrap_or_default()) {
            Some("found") => assert_eq!(key, Some(REAL_KEY), "{what}: {:?}", r.headers),
            Some("none") => assert_eq!(key, None, "{what}: {:?}", r.headers),
            other => panic!("{what}: attempt {n} ({other:?}) reached the upstream"),
        }
    }
}

#[test]
fn an_agent_that_snoops_finds_neither_the_key_nor_the_upstream_of_an_env_pointed_cli() {
    if !python() {
        return;
    }
    let server = ModelServer::start(Script::tool_rounds(40)).expect("a model server");
    let sb = Sandbox::new();
    let agent = sb.write("snoop.py", SNOOP).display().to_string();
    let key_file = sb.write("home/.config/key", REAL_KEY).display().to_string();
    let report = sb.root().join("report.json");
    let stream = crate::harness::fixture("streams/claude/success_multi_tool.jsonl");
    let run = sb.run_env(
        &[
            "run",
            "-p",
            "claude",
            "--wrap-up",
            "--max-steps",
            "100",
            "--no-native-limit",
            "--no-preflight",
            "--quiet",
            "--",
            "python3",
            &agent,
            report.to_str().unwrap(),
            &stream,
            &key_file,
        ],
        &[
            ("ANTHROPIC_BASE_URL", &server.url()),
            ("ANTHROPIC_API_KEY", REAL_KEY),
        ],
    );
    assert_out_of_reach(&server, &report, &format!("claude: {}", run.stderr));
}

#[test]
fn an_agent_that_snoops_finds_neither_the_key_nor_the_upstream_of_a_codex_provider_in_argv() {
    if !python() {
        return;
    }
    let server = ModelServer::start(Script::tool_rounds(40)).expect("a model server");
    let sb = Sandbox::new();
    // Named `codex`, so that the gateway points it as Codex (`-c model_providers…`).
    let agent = sb.write("bin/codex", format!("#!/usr/bin/env python3\n{SNOOP}"));
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let key_file = sb
        .write("home/.codex/auth.json", REAL_KEY)
        .display()
        .to_string();
    let report = sb.root().join("report.json");
    let stream = crate::harness::fixture("streams/codex/long_run.jsonl");
    let provider = format!(
        r#"model_providers.mock={{name="mock", base_url="{}/v1", wire_api="responses", env_key="MOCK_API_KEY"}}"#,
        server.url()
    );
    let run = sb.run_env(
        &[
            "run",
            "-p",
            "codex",
            "--wrap-up",
            "--max-steps",
            "1000",
            "--quiet",
            "--",
            agent.to_str().unwrap(),
            "-c",
            &provider,
            "-c",
            "model_provider=mock",
            "exec",
            "--json",
            report.to_str().unwrap(),
            &stream,
            &key_file,
        ],
        &[("MOCK_API_KEY", REAL_KEY)],
    );
    assert_out_of_reach(&server, &report, &format!("codex: {}", run.stderr));
}

/// A real CLI whose model has it run the snoop as a tool (each round): the same checks, with
/// the CLI's own calls at the upstream carrying the real key too.
fn a_tool_of_the_real_cli_finds_nothing(cli: Cli, key_var: &str) {
    if !python() {
        return;
    }
    let tools = tempfile::tempdir().unwrap();
    let snoop = tools.path().join("snoop.py");
    std::fs::write(&snoop, SNOOP).unwrap();
    let key_file = tools.path().join("auth.json");
    std::fs::write(&key_file, REAL_KEY).unwrap();
    let report = tools.path().join("report.json");
    let command = format!(
        "python3 {} {} - {}",
        snoop.display(),
        report.display(),
        key_file.display()
    );
    let agent = Agent::start(cli, Script::tool_rounds(2).command(&command));
    let run = agent.run_env(&["--wrap-up", "--max-steps", "30"], &[(key_var, REAL_KEY)]);
    assert_out_of_reach(
        &agent.server,
        &report,
        &format!("{}: {}", cli.name(), run.run.stderr),
    );
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_tool_claude_runs_finds_neither_the_key_nor_the_upstream() {
    a_tool_of_the_real_cli_finds_nothing(Cli::Claude, "ANTHROPIC_API_KEY");
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn a_tool_codex_runs_finds_neither_the_key_nor_the_upstream() {
    a_tool_of_the_real_cli_finds_nothing(Cli::Codex, "MOCK_API_KEY");
}
