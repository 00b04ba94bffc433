//! The real agent CLIs under `stepguard run`, offline, against the scripted model server.
//!
//! The CLIs come from npm, installed by `.ci/install-agent-clis` into `target/agent-clis`
//! (or wherever `STEPGUARD_AGENT_CLIS` points: a directory holding `claude`, `codex`, `gemini`
//! and `opencode`). Every test that needs them is `#[ignore]`d, so a plain `cargo nextest run`
//! reports them as skipped; `--run-ignored all` (what README.md's test command and `.ci/run`
//! use) runs them, and then missing CLIs fail the test with how to install them. Every CLI gets a
//! fresh HOME and config pointing at the model server on 127.0.0.1; proxies and the npm registry
//! point at a closed port on 127.0.0.1, so a stray outbound request fails instead of leaving the
//! machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;
use stepguard_modelserver::{ModelServer, Script};

use crate::harness::{Run, STEPGUARD, target_dir, workspace};

/// How to get the CLIs, said whenever they are missing.
const INSTALL_HINT: &str = "run `.ci/install-agent-clis` with the same CARGO_TARGET_DIR as the tests (or set STEPGUARD_AGENT_CLIS to a directory holding claude, codex, gemini and opencode); without `--run-ignored` these tests are skipped";

/// An agent CLI under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cli {
    Claude,
    Codex,
    Gemini,
    OpenCode,
}

impl Cli {
    /// The executable's name, also stepguard's provider name.
    pub fn name(self) -> &'static str {
        match self {
            Cli::Claude => "claude",
            Cli::Codex => "codex",
            Cli::Gemini => "gemini",
            Cli::OpenCode => "opencode",
        }
    }
}

/// The directory holding the CLIs. The tests calling this are `#[ignore]`d, so they run only when
/// asked for (`--run-ignored all`); then missing CLIs fail the test, saying how to install them.
pub fn cli_dir() -> PathBuf {
    let dir = std::env::var_os("STEPGUARD_AGENT_CLIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("agent-clis/node_modules/.bin"));
    let missing: Vec<&str> = ["claude", "codex", "gemini", "opencode"]
        .into_iter()
        .filter(|c| !dir.join(c).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "agent CLIs {missing:?} not found in {}; {INSTALL_HINT}",
        dir.display()
    );
    dir
}

#[test]
#[ignore = "runs the real agent CLIs: .ci/install-agent-clis, then --run-ignored all"]
fn installed_clis_are_the_pinned_versions() {
    let dir = cli_dir();
    for (cli, package) in [
        ("claude", "@anthropic-ai/claude-code"),
        ("codex", "@openai/codex"),
        ("gemini", "@google/gemini-cli"),
        ("opencode", "opencode-ai"),
    ] {
        let pinned = pinned_version(package);
        let out = Command::new(dir.join(cli))
            .arg("--version")
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let version = String::from_utf8_lossy(&out.stdout);
        assert!(
            version.contains(&pinned),
            "{cli} --version says {version:?}, tests/agent-clis pins {pinned}; {INSTALL_HINT}"
        );
    }
}

/// The version of npm package `package` that `tests/agent-clis/package.json` pins.
fn pinned_version(package: &str) -> String {
    let pins: Value = serde_json::from_slice(
        &std::fs::read(workspace().join("tests/agent-clis/package.json")).unwrap(),
    )
    .unwrap();
    pins["dependencies"][package]
        .as_str()
        .unwrap_or_else(|| panic!("tests/agent-clis/package.json pins no {package}"))
        .to_owned()
}

/// One agent CLI set up in a fresh directory against its own model server.
pub struct Agent {
    pub cli: Cli,
    pub server: ModelServer,
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The CLI's default configuration: its built-in provider, given only a base URL and a
    /// key the way a user of it would (no custom provider).
    default_config: bool,
    /// The model Codex is asked for (`-c model=…`); `None`: Codex's own default.
    codex_model: Option<&'static str>,
    /// A history database shared with other agents (and so their pools); `None`: its own.
    shared_db: Option<PathBuf>,
}

/// What one supervised run did, and when it ended.
pub struct AgentRun {
    pub run: Run,
    pub ended: Instant,
}

impl AgentRun {
    /// The `Steps: X (legacy turns: Y)` numbers from the summary on stderr.
    pub fn steps_and_turns(&self) -> (u64, u64) {
        let line = self
            .run
            .stderr
            .lines()
            .find(|l| l.contains("Steps: "))
            .unwrap_or_else(|| panic!("no summary line in stderr:\n{}", self.run.stderr));
        // `Steps: X (legacy turns: Y)`, or `Steps: X` when both are equal.
        let number = |after: &str| -> Option<u64> {
            let rest = &line[line.find(after)? + after.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let steps = number("Steps: ").unwrap_or_else(|| panic!("no step count in {line:?}"));
        (steps, number("(legacy turns: ").unwrap_or(steps))
    }

    /// Panics with everything useful unless the exit code is `code`.
    pub fn assert_exit(&self, code: i32) {
        assert_eq!(
            self.run.code,
            Some(code),
            "stepguard exit code\nstdout:\n{}\nstderr:\n{}",
            tail(&self.run.stdout),
            tail(&self.run.stderr)
        );
    }
}

fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(6000);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0);
    &s[start..]
}

impl Agent {
    /// Sets `cli` up against a new model server following `script`.
    pub fn start(cli: Cli, script: Script) -> Agent {
        Agent::with_server(
            cli,
            ModelServer::start(script).expect("start the model server"),
        )
    }

    /// Sets `cli` up in its default configuration against a new model server following
    /// `script`. For Codex: its built-in OpenAI provider, given `-c openai_base_url=…` and
    /// `OPENAI_API_KEY` (no custom `model_providers`), asked for gpt-5.5, the model the server
    /// scripts tool calls for ([`Agent::own_model`] leaves Codex's default). Claude's and
    /// Gemini's usual setups already are their default configurations (a base URL variable and
    /// a key; for Gemini the API-key auth type its first start saves).
    pub fn start_default(cli: Cli, script: Script) -> Agent {
        let server = ModelServer::start(script).expect("start the model server");
        Agent::set_up(cli, server, true)
    }

    /// Sets `cli` up against `server` (e.g. one speaking HTTPS).
    pub fn with_server(cli: Cli, server: ModelServer) -> Agent {
        Agent::set_up(cli, server, false)
    }

    fn set_up(cli: Cli, server: ModelServer, default_config: bool) -> Agent {
        let bin = cli_dir().join(cli.name());
        let dir = tempfile::Builder::new()
            .prefix(&format!("sg-{}-", cli.name()))
            .tempdir()
            .expect("tempdir");
        let agent = Agent {
            cli,
            server,
            dir,
            bin,
            default_config,
            codex_model: Some("gpt-5.5"),
            shared_db: None,
        };
        std::fs::create_dir_all(agent.work()).unwrap();
        agent.write_config();
        agent
    }

    /// Leaves Codex's model to Codex (0.169: `gpt-6.1-sol`, whose tools travel as an
    /// `additional_tools` input item, not in `tools`).
    pub fn own_model(mut self) -> Agent {
        self.codex_model = None;
        self
    }

    /// The agent's working directory.
    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The history database of this agent's runs.
    pub fn db(&self) -> PathBuf {
        self.shared_db
            .clone()
            .unwrap_or_else(|| self.dir.path().join("history.db"))
    }

    /// Records this agent's runs in `db`, which other agents may share: runs of several CLIs
    /// then share the pools kept there (the local ledger is the history database).
    pub fn share_db(mut self, db: PathBuf) -> Agent {
        self.shared_db = Some(db);
        self
    }

    fn write(&self, path: PathBuf, contents: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    /// The config files each CLI needs to run offline (`../shared/docs/offline-clis.md`).
    fn write_config(&self) {
        let home = self.home();
        std::fs::create_dir_all(&home).unwrap();
        match self.cli {
            Cli::Claude => {}
            Cli::Codex => std::fs::create_dir_all(home.join(".codex")).unwrap(),
            Cli::Gemini => self.write(
                home.join(".gemini/settings.json"),
                r#"{"security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
                    "general": {"maxAttempts": 3, "enableAutoUpdate": false, "enableAutoUpdateNotification": false},
                    "privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false}}"#,
            ),
            Cli::OpenCode => {
                let url = self.server.url();
                self.write(
                    self.work().join("opencode.json"),
                    &format!(
                        r#"{{"provider": {{"mock": {{"npm": "@ai-sdk/openai-compatible", "name": "Mock",
                              "options": {{"baseURL": "{url}/v1", "apiKey": "dummy"}},
                              "models": {{"mock-model": {{"name": "Mock model", "tool_call": true}}}}}}}},
                            "model": "mock/mock-model"}}"#
                    ),
                );
                // Without this seed OpenCode npm-installs @opencode-ai/plugin on every start.
                let config = home.join(".config/opencode");
                let version = pinned_version("opencode-ai");
                self.write(
                    config.join("package.json"),
                    &format!(r#"{{"dependencies": {{"@opencode-ai/plugin": "{version}"}}}}"#),
                );
                self.write(
                    config.join("package-lock.json"),
                    &format!(
                        r#"{{"name": "opencode", "lockfileVersion": 3, "requires": true, "packages": {{
                              "": {{"dependencies": {{"@opencode-ai/plugin": "{version}"}}}},
                              "node_modules/@opencode-ai/plugin": {{"version": "{version}"}}}}}}"#
                    ),
                );
                self.write(
                    config.join("node_modules/@opencode-ai/plugin/package.json"),
                    &format!(r#"{{"name": "@opencode-ai/plugin", "version": "{version}"}}"#),
                );
            }
        }
    }

    /// Sets OpenCode's own (advisory) step limit, `agent.build.steps`, in its `opencode.json`.
    pub fn set_opencode_steps(&self, steps: u32) {
        let path = self.work().join("opencode.json");
        let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config["agent"] = serde_json::json!({"build": {"steps": steps}});
        std::fs::write(path, config.to_string()).unwrap();
    }

    /// The environment of the agent: a fresh HOME, the model server, nothing of the developer's.
    fn env(&self) -> Vec<(String, String)> {
        let home = self.home().display().to_string();
        let url = self.server.url();
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("HOME".into(), home.clone()),
            ("XDG_CONFIG_HOME".into(), format!("{home}/.config")),
            ("XDG_DATA_HOME".into(), format!("{home}/.local/share")),
            ("XDG_CACHE_HOME".into(), format!("{home}/.cache")),
            ("XDG_STATE_HOME".into(), format!("{home}/.local/state")),
            ("TMPDIR".into(), std::env::temp_dir().display().to_string()),
            ("LANG".into(), "C.UTF-8".into()),
            // Anything that would leave the machine goes to a closed port on loopback instead.
            ("HTTP_PROXY".into(), "http://127.0.0.1:9".into()),
            ("HTTPS_PROXY".into(), "http://127.0.0.1:9".into()),
            ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
            ("npm_config_registry".into(), "http://127.0.0.1:9/".into()),
        ];
        let mut set = |k: &str, v: &str| env.push((k.to_owned(), v.to_owned()));
        match self.cli {
            Cli::Claude => {
                set("IS_SANDBOX", "1");
                set("ANTHROPIC_BASE_URL", &url);
                set("ANTHROPIC_API_KEY", "dummy");
                set("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
                set("DISABLE_TELEMETRY", "1");
                set("DISABLE_AUTOUPDATER", "1");
                set("CLAUDE_CODE_MAX_RETRIES", "2");
            }
            Cli::Codex => {
                set("CODEX_HOME", &format!("{home}/.codex"));
                set(
                    if self.default_config {
                        "OPENAI_API_KEY"
                    } else {
                        "MOCK_API_KEY"
                    },
                    "dummy",
                );
            }
            Cli::Gemini => {
                set("GOOGLE_GEMINI_BASE_URL", &url);
                set("GEMINI_API_KEY", "dummy");
            }
            Cli::OpenCode => {
                for flag in [
                    "MODELS_FETCH",
                    "AUTOUPDATE",
                    "DEFAULT_PLUGINS",
                    "LSP_DOWNLOAD",
                    "SHARE",
                ] {
                    set(&format!("OPENCODE_DISABLE_{flag}"), "1");
                }
            }
        }
        env
    }

    /// The agent command line, as the user would write it after `stepguard run … --`.
    pub fn argv(&self) -> Vec<String> {
        let prompt = "Run the shell commands you are asked to run, one per step, then reply with a one-line summary.";
        let bin = self.bin.display().to_string();
        let url = self.server.url();
        let args: Vec<String> = match self.cli {
            Cli::Claude => vec![
                "-p",
                prompt,
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            Cli::Codex => {
                let provider = format!(
                    r#"model_providers.mock={{name="mock", base_url="{url}/v1", wire_api="responses", env_key="MOCK_API_KEY", request_max_retries=2, stream_max_retries=2}}"#
                );
                let mut v: Vec<String> = [
                    "exec",
                    "--json",
                    "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                ]
                .into_iter()
                .map(String::from)
                .collect();
                // The built-in provider: only its base URL, as `-c openai_base_url` (Codex
                // 0.169 does not read OPENAI_BASE_URL).
                let default_url = format!("openai_base_url={url}/v1");
                let model = self.codex_model.map(|m| format!("model={m}"));
                let routing = if self.default_config {
                    std::iter::once(default_url.as_str())
                        .chain(model.as_deref())
                        .collect()
                } else {
                    vec!["model_provider=mock", "model=gpt-5.5", provider.as_str()]
                };
                for c in routing.into_iter().chain([
                    "features.plugins=false",
                    "features.apps=false",
                    "features.remote_plugin=false",
                    "analytics.enabled=false",
                    "check_for_update_on_startup=false",
                ]) {
                    v.push("-c".into());
                    v.push(c.into());
                }
                v.push(prompt.into());
                v
            }
            Cli::Gemini => ["-p", prompt, "--output-format", "stream-json", "--yolo"]
                .into_iter()
                .map(String::from)
                .collect(),
            Cli::OpenCode => ["run", "--format", "json", prompt]
                .into_iter()
                .map(String::from)
                .collect(),
        };
        std::iter::once(bin).chain(args).collect()
    }

    /// `stepguard run --provider <cli> --db <db> <args> -- <agent>`, stdin from /dev/null,
    /// with a safety timeout so a broken test cannot hang CI.
    pub fn run(&self, args: &[&str]) -> AgentRun {
        self.run_env(args, &[])
    }

    /// [`Agent::run`] with more variables in stepguard's (and so the agent's) environment.
    pub fn run_env(&self, args: &[&str], extra: &[(&str, &str)]) -> AgentRun {
        self.run_full(args, extra, &[])
    }

    /// [`Agent::run`] with more arguments for the agent CLI itself (after its own).
    pub fn run_agent_args(&self, args: &[&str], agent_args: &[&str]) -> AgentRun {
        self.run_full(args, &[], agent_args)
    }

    fn run_full(&self, args: &[&str], extra: &[(&str, &str)], agent_args: &[&str]) -> AgentRun {
        let mut cmd = Command::new(STEPGUARD);
        cmd.env_clear()
            .envs(self.env())
            .envs(extra.iter().copied())
            .current_dir(self.work())
            .stdin(Stdio::null())
            .args([
                "run",
                "--provider",
                self.cli.name(),
                "--quiet",
                "--timeout",
                "150s",
            ])
            .arg("--db")
            .arg(self.db());
        if self.cli == Cli::OpenCode {
            // Not built in: the example third-party plugin, loaded like any other.
            cmd.arg("--plugin-dir")
                .arg(&crate::harness::plugin_dirs().opencode);
        }
        cmd.args(args).arg("--").args(self.argv()).args(agent_args);
        let output = cmd.output().expect("spawn stepguard");
        AgentRun {
            run: output.into(),
            ended: Instant::now(),
        }
    }

    /// `stepguard resume ARGS` in this agent's setting (its environment, directory and history
    /// database), quiet, stdin from /dev/null, with the same safety timeout as a run.
    pub fn resume(&self, args: &[&str]) -> AgentRun {
        let mut cmd = Command::new(STEPGUARD);
        cmd.env_clear()
            .envs(self.env())
            .current_dir(self.work())
            .stdin(Stdio::null())
            .arg("--db")
            .arg(self.db());
        if self.cli == Cli::OpenCode {
            cmd.arg("--plugin-dir")
                .arg(&crate::harness::plugin_dirs().opencode);
        }
        cmd.arg("resume")
            .args(args)
            .args(["--quiet", "--timeout", "150s"]);
        let output = cmd.output().expect("spawn stepguard");
        AgentRun {
            run: output.into(),
            ended: Instant::now(),
        }
    }

    /// `stepguard show ID` as text.
    pub fn show_text(&self, id: &str) -> String {
        let out = Command::new(STEPGUARD)
            .env_clear()
            .env("HOME", self.home())
            .arg("--db")
            .arg(self.db())
            .args(["show", id])
            .current_dir(self.work())
            .output()
            .expect("spawn stepguard");
        let run = Run::from(out);
        assert_eq!(run.code, Some(0), "stepguard show {id}: {}", run.stderr);
        run.stdout
    }

    /// The newest run in the history database, as `stepguard show --json` prints it.
    pub fn last_record(&self) -> Value {
        let history = self.stepguard(&["history", "--json"]);
        let runs = history.as_array().expect("history is an array");
        let id = runs
            .iter()
            .filter_map(|r| r["id"].as_i64())
            .max()
            .expect("at least one recorded run");
        self.stepguard(&["show", "--json", &id.to_string()])
    }

    /// Every run in the history database, as `stepguard history --json` lists them (oldest
    /// first).
    pub fn history_rows(&self) -> Vec<Value> {
        let mut rows = self
            .stepguard(&["history", "--json"])
            .as_array()
            .cloned()
            .unwrap_or_default();
        rows.sort_by_key(|r| r["id"].as_i64());
        rows
    }

    /// `stepguard ARGS --json`-style commands on this agent's history, from its directory (so its
    /// config files apply); their JSON, asserting exit 0.
    pub fn stepguard(&self, args: &[&str]) -> Value {
        let mut cmd = Command::new(STEPGUARD);
        cmd.env_clear()
            .env("HOME", self.home())
            .arg("--db")
            .arg(self.db());
        if self.cli == Cli::OpenCode {
            // Not built in: the example third-party plugin, loaded like any other.
            cmd.arg("--plugin-dir")
                .arg(&crate::harness::plugin_dirs().opencode);
        }
        let out = cmd
            .args(args)
            .current_dir(self.work())
            .output()
            .expect("spawn stepguard");
        let run = Run::from(out);
        assert_eq!(run.code, Some(0), "stepguard {args:?}: {}", run.stderr);
        run.json()
    }

    /// Asserts that no request reached the server after `run` ended (waiting a moment for
    /// stragglers) and that the result of round `round`'s tool calls never did.
    pub fn assert_nothing_after(&self, run: &AgentRun, round: usize) {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let late: Vec<_> = self
            .server
            .requests()
            .into_iter()
            .filter(|r| r.received > run.ended)
            .map(|r| (r.seq, r.target, r.reply))
            .collect();
        assert!(late.is_empty(), "requests after the stop: {late:?}");
        assert!(
            self.server.max_tool_results_seen() < round,
            "the result of round {round} reached the model: the agent went on after the stop"
        );
    }

    /// Live processes whose working directory is inside this agent's directory (the CLI, its
    /// shells and whatever they started).
    pub fn live_processes(&self) -> Vec<String> {
        processes_under(self.dir.path())
    }
}

/// `pid cmdline` of every live process whose cwd is under `dir`.
pub fn processes_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue;
        };
        let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'));
        if cwd.starts_with(dir) && !zombie {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("{pid} {cmdline}"));
        }
    }
    found
}

#[test]
fn the_process_check_sees_a_process_in_the_directory() {
    // The no-survivor assertions are only as good as this scan: show it finds a live process.
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("sleep")
        .arg("30")
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    let seen = processes_under(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        seen.iter().any(|p| p.starts_with(&child.id().to_string())),
        "{seen:?}"
    );
    assert!(processes_under(dir.path()).is_empty());
}

/// The scenarios every provider module runs, each with that provider's expected counts.
pub mod scenarios {
    use std::ops::RangeInclusive;

    use serde_json::Value;
    use stepguard_modelserver::{Fault, FaultKind, Reply, Script};

    use super::{Agent, AgentRun, Cli};

    /// Checks the history row of the newest run against what the run printed.
    fn assert_recorded(agent: &Agent, run: &AgentRun, exit: i64, slug: Option<&str>) -> Value {
        let (steps, turns) = run.steps_and_turns();
        let rec = agent.last_record();
        assert_eq!(rec["provider"], agent.cli.name(), "{rec}");
        assert_eq!(rec["exit_code"], exit, "{rec}");
        assert_eq!(rec["num_steps_computed"], steps, "{rec}");
        assert_eq!(rec["num_turns_computed"], turns, "{rec}");
        match slug {
            Some(slug) => assert_eq!(rec["error_type"], slug, "{rec}"),
            None => {
                assert_eq!(rec["error_type"], Value::Null, "{rec}");
                assert_eq!(rec["outcome"], "success", "{rec}");
            }
        }
        rec
    }

    /// 3 tool rounds under `--max-steps 10`: exit 0 and `steps` steps, as the server served.
    pub fn under_budget(cli: Cli, steps: u64) {
        let agent = Agent::start(cli, Script::tool_rounds(3));
        let run = agent.run(&["--max-steps", "10"]);
        run.assert_exit(0);
        assert_eq!(agent.server.last_round_served(), 3);
        assert_eq!(agent.server.finals_served(), 1);
        assert_eq!(run.steps_and_turns().0, steps);
        let rec = assert_recorded(&agent, &run, 0, None);
        assert_eq!(rec["max_steps"], 10);
        assert!(
            run.run.stderr.contains(&format!("Steps: {steps} ")),
            "{}",
            run.run.stderr
        );
    }

    /// 2 rounds of 2 parallel calls with text beside them, then the final answer, counted with
    /// `args` (e.g. a `--unit`): exit 0 and `steps` steps; every call ran.
    pub fn parallel_calls_with_text(cli: Cli, args: &[&str], steps: u64) {
        let script = Script::tool_rounds(2)
            .parallel_calls(2)
            .text_beside("Running two commands.");
        let agent = Agent::start(cli, script);
        let args: Vec<&str> = ["--max-steps", "10"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let run = agent.run(&args);
        run.assert_exit(0);
        assert_eq!(agent.server.finals_served(), 1);
        assert_eq!(
            agent.server.max_tool_results_seen(),
            4,
            "all four calls ran"
        );
        assert_eq!(run.steps_and_turns().0, steps);
        assert_recorded(&agent, &run, 0, None);
    }

    /// 12 rounds offered under `--max-steps 5` (plus `extra`): stepguard stops the agent at step
    /// 6, whose tool call is `breaching` (slow, so that stopping in time is observable).
    pub fn over_budget(
        cli: Cli,
        breaching: &str,
        extra: &[&str],
        setup: impl FnOnce(&Agent),
    ) -> (Agent, AgentRun) {
        over_budget_with(
            cli,
            Script::tool_rounds(12).command_at(6, breaching),
            extra,
            setup,
        )
    }

    /// [`over_budget`] with a script of the caller's (12 rounds or more).
    pub fn over_budget_with(
        cli: Cli,
        script: Script,
        extra: &[&str],
        setup: impl FnOnce(&Agent),
    ) -> (Agent, AgentRun) {
        let agent = Agent::start(cli, script);
        setup(&agent);
        let args: Vec<&str> = ["--max-steps", "5"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let run = agent.run(&args);
        run.assert_exit(3);
        assert_eq!(
            run.steps_and_turns().0,
            6,
            "the run stops at the step after the budget"
        );
        assert_eq!(agent.server.last_round_served(), 6);
        assert_eq!(agent.server.finals_served(), 0);
        agent.assert_nothing_after(&run, 6);
        let rec = assert_recorded(&agent, &run, 3, Some("max_steps"));
        assert_eq!(rec["terminated_by"], "budget", "{rec}");
        assert_eq!(rec["max_steps"], 5);
        let left = agent.live_processes();
        assert!(
            left.is_empty(),
            "processes of the run survived the stop: {left:?}"
        );
        (agent, run)
    }

    /// The server asks for the same shell call every round (30 offered) under `--loop-limit 3
    /// --max-steps 30`: stepguard ends the run as a loop long before the budget (exit 3, slug
    /// `loop_detected`, `terminated_by` `loop`), and the summary file and the history record
    /// name `tool` (the CLI's name for its shell tool) as repeated 3 times. Judged by progress,
    /// the third call's result (the same as the first two, nothing new in between) completes the
    /// loop before the CLI's next model call is answered, so the server served at most 3 + 1
    /// rounds.
    pub fn repeated_call_is_a_loop(cli: Cli, tool: &str) {
        let agent = Agent::start(cli, Script::same_call(30, "cat status.txt"));
        std::fs::write(agent.work().join("status.txt"), "still running\n").unwrap();
        let summary_file = agent.work().with_file_name("summary.json");
        let summary_arg = summary_file.display().to_string();
        let run = agent.run(&[
            "--max-steps",
            "30",
            "--loop-limit",
            "3",
            "--summary-file",
            &summary_arg,
        ]);
        run.assert_exit(3);
        let rounds = agent.server.last_round_served();
        assert!(
            (3..=4).contains(&rounds),
            "the server served {rounds} rounds of the same call"
        );
        assert_eq!(agent.server.finals_served(), 0);
        let (steps, _) = run.steps_and_turns();
        assert!(
            steps < 30,
            "stopped by the loop, not the budget: {steps} steps"
        );
        let summary: Value = serde_json::from_slice(
            &std::fs::read(&summary_file).expect("the summary file was written"),
        )
        .unwrap();
        let rec = assert_recorded(&agent, &run, 3, Some("loop_detected"));
        for (source, r) in [("summary file", &summary), ("history", &rec)] {
            assert_eq!(r["error_type"], "loop_detected", "{source}: {r}");
            assert_eq!(r["terminated_by"], "loop", "{source}: {r}");
            let loops = r["loops"]
                .as_array()
                .unwrap_or_else(|| panic!("{source}: {r}"));
            let first = &loops[0];
            assert_eq!(first["tool"], tool, "{source}: {r}");
            assert_eq!(first["count"], 3, "{source}: {r}");
            assert_eq!(first["kind"], "repeat", "{source}: {r}");
            let first_step = first["first_step"].as_u64().unwrap_or(0);
            assert!(
                (1..=steps).contains(&first_step),
                "{source}: first_step {first_step} of {steps} steps"
            );
        }
        let left = agent.live_processes();
        assert!(
            left.is_empty(),
            "processes of the run survived the stop: {left:?}"
        );
    }

    /// `kind` on every request from round 2 on: exit 1 with `slug`, and a step count in `steps`
    /// (round 1's, plus the failing call's where the CLI may announce a step before the reply
    /// fails, which for a broken stream depends on timing): however often the CLI retries.
    fn fails_from_round_2(cli: Cli, kind: FaultKind, slug: &str, steps: RangeInclusive<u64>) {
        let fault = Fault::persistent(2, kind);
        let agent = Agent::start(cli, Script::tool_rounds(3).fault(fault));
        let run = agent.run(&["--max-steps", "10"]);
        run.assert_exit(1);
        assert_eq!(agent.server.last_round_served(), 1);
        let faults = agent.server.count(|r| r.reply == Reply::Fault(kind));
        assert!(faults >= 2, "the CLI retried: {faults} faulty replies");
        let counted = run.steps_and_turns().0;
        assert!(
            steps.contains(&counted),
            "{counted} steps, expected {steps:?}"
        );
        assert_recorded(&agent, &run, 1, Some(slug));
    }

    /// HTTP 429 (Retry-After: 1) from round 2 on: `rate_limited`; see [`fails_from_round_2`].
    pub fn persistent_rate_limit(cli: Cli, steps: RangeInclusive<u64>) {
        let kind = FaultKind::RateLimited {
            retry_after_secs: 1,
        };
        fails_from_round_2(cli, kind, "rate_limited", steps);
    }

    /// A stream that breaks off mid-event from round 2 on: `provider_error`.
    pub fn broken_stream(cli: Cli, steps: RangeInclusive<u64>) {
        fails_from_round_2(cli, FaultKind::BrokenStream, "provider_error", steps);
    }

    /// HTTP 500 from round 2 on: `provider_error`.
    pub fn server_error(cli: Cli, steps: RangeInclusive<u64>) {
        fails_from_round_2(cli, FaultKind::ServerError, "provider_error", steps);
    }

    /// One 429 at round 2, then the script: the CLI retries and the run succeeds with the same
    /// `steps` as [`under_budget`].
    pub fn single_rate_limit_recovers(cli: Cli, steps: u64) {
        let fault = Fault::times(
            2,
            FaultKind::RateLimited {
                retry_after_secs: 1,
            },
            1,
        );
        let agent = Agent::start(cli, Script::tool_rounds(3).fault(fault));
        let run = agent.run(&["--max-steps", "10"]);
        run.assert_exit(0);
        assert_eq!(
            agent.server.count(|r| matches!(r.reply, Reply::Fault(_))),
            1
        );
        assert_eq!(agent.server.last_round_served(), 3);
        assert_eq!(run.steps_and_turns().0, steps);
        assert_recorded(&agent, &run, 0, None);
    }
}
