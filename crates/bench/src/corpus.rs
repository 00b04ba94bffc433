//! A realistic corpus of agent streams, and `count`'s throughput on it.
//!
//! `corpus` writes many streams one after another, each shaped like the real recordings in
//! `tests/fixtures/real/` (Claude Code 2.1, codex-cli 0.169, Gemini CLI 0.61, OpenCode 1.18):
//! ids as the CLIs print them and unique per stream (`msg_…`/`toolu_…`, `item_N` per process,
//! `NAME__fc_…`, `prt_…`/`call_…`, uuids), tool calls and their long results, usage, reasoning,
//! sub-agents (Claude), parallel calls, and one terminal event per stream. It is seeded, so the
//! same arguments write the same bytes, and the number of steps the provider's default unit
//! counts is known by construction.
//!
//! `count-corpus` generates one corpus per provider (or reuses one of the right size), checks
//! that `stepguard count` reports exactly the steps it was built with, and times `count`
//! (with loop detection, as by default, and with `--loop-limit off`), `wc -l` and the jq
//! one-liner a user would write, in the same run, with peak memory.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::{median, timed};

/// `/usr/bin/time`, which gives a command's CPU time and peak memory exactly.
const GNU_TIME: &str = "/usr/bin/time";

/// The providers the generator writes streams of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Provider {
    /// `claude -p --output-format stream-json --verbose` (unit `message`).
    Claude,
    /// `codex exec --json` (unit `item`).
    Codex,
    /// `gemini -p … --output-format stream-json` (unit `tool_use`).
    Gemini,
    /// `opencode run --format json` (the example plugin, unit `step`).
    Opencode,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::Claude => "claude",
            Provider::Codex => "codex",
            Provider::Gemini => "gemini",
            Provider::Opencode => "opencode",
        }
    }

    /// The jq one-liner a user would write to count this provider's steps (piped to `wc -l`).
    fn jq_filter(self) -> &'static str {
        match self {
            Provider::Claude => r#"select(.type=="assistant")"#,
            Provider::Codex => r#"select(.type=="item.completed")"#,
            Provider::Gemini => r#"select(.type=="tool_use")"#,
            Provider::Opencode => r#"select(.type=="step_start")"#,
        }
    }
}

/// What a generated corpus holds, by construction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Expected {
    /// Steps of the provider's default unit.
    pub steps: u64,
    /// Streams written.
    pub streams: u64,
    /// Lines written.
    pub lines: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// A small, seeded generator (xorshift64*): the same corpus for the same seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // Never zero, which xorshift would keep.
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// `n` lowercase hex digits.
    fn hex(&mut self, n: usize) -> String {
        self.chars(n, b"0123456789abcdef")
    }

    /// `n` base62 characters.
    fn base62(&mut self, n: usize) -> String {
        self.chars(
            n,
            b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
        )
    }

    fn chars(&mut self, n: usize, alphabet: &[u8]) -> String {
        (0..n).map(|_| char::from(self.pick(alphabet))).collect()
    }

    fn uuid(&mut self) -> String {
        format!(
            "{}-{}-{}-{}-{}",
            self.hex(8),
            self.hex(4),
            self.hex(4),
            self.hex(4),
            self.hex(12)
        )
    }
}

/// Lines of the tools' output the streams carry (file contents, test runs, listings).
const OUTPUT_LINES: &[&str] = &[
    "use serde_json::Value;",
    "fn count_steps(lines: &[Value]) -> usize {",
    "    lines.iter().filter(|l| l[\"type\"] == \"assistant\").count()",
    "}",
    "test stream::tests::counts_claude_messages ... ok",
    "test stream::tests::dedups_split_messages ... ok",
    "warning: unused variable: `budget`",
    "   --> src/budget.rs:42:9",
    "error[E0308]: mismatched types",
    "    Finished `test` profile [unoptimized + debuginfo] target(s) in 4.21s",
    "/home/dev/project/src/main.rs",
    "/home/dev/project/src/stream.rs",
    "-rw-r--r-- 1 dev dev  4096 Nov 22 09:38 Cargo.toml",
    "\tpub(crate) const MAX_LINE_BYTES: usize = 64 << 20; // \\n-terminated",
    "diff --git a/src/claude.rs b/src/claude.rs",
    "@@ -12,7 +12,9 @@ impl Counter {",
    "+        if self.seen.insert(id) { self.steps += 1; }",
    "Ran 214 tests in 3.118s: OK",
];

const COMMANDS: &[&str] = &[
    "cargo test -p stepguard-jsonl",
    "rg -n \"fn feed\" crates",
    "sed -n '1,160p' src/stream.rs",
    "ls -la src",
    "git diff --stat",
    "cargo build --all-targets",
    "cat Cargo.toml",
    "grep -rn \"max_steps\" src | head -20",
    "python3 -m pytest -q tests/test_stream.py",
    "npm test -- --runInBand",
];

const FILES: &[&str] = &[
    "src/main.rs",
    "src/stream.rs",
    "src/budget.rs",
    "src/claude.rs",
    "src/codex.rs",
    "tests/stream.rs",
    "README.md",
];

const PROSE: &[&str] = &[
    "I'll start by mapping the crate.",
    "The counter reads every line twice; one pass is enough.",
    "Tests pass. Next, the budget check.",
    "That failed because the id is quoted; trimming it.",
    "Let me look at how the stream splits messages.",
    "**Planning the step-counter refactor**",
    "All done: the counter now deduplicates by message id.",
];

/// A tool's output: `lines` lines of code and logs, as JSON string content (escaped).
fn output(rng: &mut Rng, lines: u64) -> String {
    let mut text = String::new();
    for i in 0..lines {
        if i > 0 {
            text.push('\n');
        }
        text.push_str(rng.pick(OUTPUT_LINES));
    }
    text
}

/// `s` as a JSON string literal.
fn js(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A tool result's output: mostly a few lines, sometimes a long file or log.
fn tool_output(rng: &mut Rng) -> String {
    let lines = match rng.below(100) {
        0..60 => rng.range(1, 8),
        60..90 => rng.range(8, 60),
        _ => rng.range(60, 400),
    };
    output(rng, lines)
}

/// Rounds of one stream: mostly a few dozen, sometimes hundreds.
fn rounds(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..70 => rng.range(2, 25),
        70..95 => rng.range(25, 120),
        _ => rng.range(120, 600),
    }
}

/// One stream's lines, and its steps of the default unit.
struct Stream {
    text: String,
    steps: u64,
}

impl Stream {
    fn line(&mut self, line: std::fmt::Arguments<'_>) {
        // Writing to a String cannot fail.
        let _ = self.text.write_fmt(line);
        self.text.push('\n');
    }
}

fn claude_stream(rng: &mut Rng) -> Stream {
    let mut s = Stream {
        text: String::new(),
        steps: 0,
    };
    let session = rng.uuid();
    let model = "claude-opus-4-8";
    s.line(format_args!(
        r#"{{"type":"system","subtype":"init","cwd":"/home/dev/project","session_id":"{session}","tools":["Task","Bash","Edit","Glob","Grep","Read","Write","WebFetch","WebSearch","TodoWrite"],"mcp_servers":[],"model":"{model}","permissionMode":"bypassPermissions","slash_commands":["compact","review"],"apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"2.1.197","output_style":"default","agents":["general-purpose","Explore"],"uuid":"{}"}}"#,
        rng.uuid()
    ));
    let usage = r#""usage":{"input_tokens":100,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048}"#;
    let rounds = rounds(rng);
    for round in 0..=rounds {
        let msg = format!("msg_{}", rng.hex(24));
        s.steps += 1;
        let head = format!(
            r#"{{"type":"assistant","message":{{"id":"{msg}","type":"message","role":"assistant","model":"{model}","content":["#
        );
        let tail = format!(
            r#"],"stop_reason":null,"stop_sequence":null,{usage},"context_management":null}},"parent_tool_use_id":null,"session_id":"{session}","uuid":"{}"}}"#,
            rng.uuid()
        );
        if rng.chance(40) {
            s.line(format_args!(
                r#"{head}{{"type":"thinking","thinking":{},"signature":"{}"}}{tail}"#,
                js(&output(rng, 3)),
                rng.base62(120)
            ));
        }
        if round == rounds {
            s.line(format_args!(
                r#"{head}{{"type":"text","text":{}}}{tail}"#,
                js(rng.pick(PROSE))
            ));
            break;
        }
        if rng.chance(50) {
            s.line(format_args!(
                r#"{head}{{"type":"text","text":{}}}{tail}"#,
                js(rng.pick(PROSE))
            ));
        }
        let calls: Vec<String> = (0..if rng.chance(15) { rng.range(2, 4) } else { 1 })
            .map(|_| format!("toolu_{}", rng.hex(24)))
            .collect();
        let sub_agent = rng.chance(5);
        for id in &calls {
            let (name, input) = if sub_agent {
                (
                    "Task",
                    r#"{"description":"Survey the parsers","prompt":"List every function that counts steps.","subagent_type":"Explore"}"#.to_owned(),
                )
            } else if rng.chance(60) {
                let command = js(rng.pick(COMMANDS));
                (
                    "Bash",
                    format!(r#"{{"command":{command},"description":"Run it"}}"#),
                )
            } else {
                let file = rng.pick(FILES);
                (
                    "Read",
                    format!(r#"{{"file_path":"/home/dev/project/{file}"}}"#),
                )
            };
            s.line(format_args!(
                r#"{head}{{"type":"tool_use","id":"{id}","name":"{name}","input":{input}}}{tail}"#
            ));
        }
        if sub_agent {
            // A sub-agent's own messages: counted for it, never against the budget.
            for _ in 0..rng.range(1, 4) {
                s.line(format_args!(
                    r#"{{"type":"assistant","message":{{"id":"msg_{}","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{{"type":"tool_use","id":"toolu_{}","name":"Grep","input":{{"pattern":"fn .*step","path":"/home/dev/project/src"}}}}],"stop_reason":null,{usage}}},"parent_tool_use_id":"{}","session_id":"{session}","uuid":"{}"}}"#,
                    rng.hex(24),
                    rng.hex(24),
                    calls[0],
                    rng.uuid()
                ));
            }
        }
        for id in &calls {
            let out = js(&tool_output(rng));
            s.line(format_args!(
                r#"{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"{id}","type":"tool_result","content":{out},"is_error":false}}]}},"parent_tool_use_id":null,"session_id":"{session}","uuid":"{}","timestamp":"2026-11-22T09:38:49.858Z","tool_use_result":{{"stdout":{out},"stderr":"","interrupted":false,"isImage":false}}}}"#,
                rng.uuid()
            ));
        }
    }
    s.line(format_args!(
        r#"{{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":52400,"duration_api_ms":20400,"num_turns":{},"result":"All done.","stop_reason":"end_turn","session_id":"{session}","total_cost_usd":0.41,"usage":{{"input_tokens":{},"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":{}}},"modelUsage":{{"{model}":{{"inputTokens":{},"outputTokens":{},"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.41}}}},"permission_denials":[],"uuid":"{}"}}"#,
        rounds + 1,
        100 * (rounds + 1),
        40 * (rounds + 1),
        100 * (rounds + 1),
        40 * (rounds + 1),
        rng.uuid()
    ));
    s
}

fn codex_stream(rng: &mut Rng) -> Stream {
    let mut s = Stream {
        text: String::new(),
        steps: 0,
    };
    s.line(format_args!(
        r#"{{"type":"thread.started","thread_id":"{}"}}"#,
        rng.uuid()
    ));
    s.line(format_args!(r#"{{"type":"turn.started"}}"#));
    // Ids are `item_N`, per process: every stream starts again at item_0.
    let mut next = 0u64;
    let mut id = || {
        next += 1;
        format!("item_{}", next - 1)
    };
    for _ in 0..rounds(rng) {
        if rng.chance(50) {
            s.steps += 1;
            s.line(format_args!(
                r#"{{"type":"item.completed","item":{{"id":"{}","type":"reasoning","text":{}}}}}"#,
                id(),
                js(rng.pick(PROSE))
            ));
        }
        if rng.chance(30) {
            s.steps += 1;
            s.line(format_args!(
                r#"{{"type":"item.completed","item":{{"id":"{}","type":"agent_message","text":{}}}}}"#,
                id(),
                js(rng.pick(PROSE))
            ));
        }
        s.steps += 1;
        let item = id();
        match rng.below(10) {
            0 => {
                let file = rng.pick(FILES);
                s.line(format_args!(
                    r#"{{"type":"item.completed","item":{{"id":"{item}","type":"file_change","changes":[{{"path":"/home/dev/project/{file}","kind":"update"}}],"status":"completed"}}}}"#
                ));
            }
            1 => {
                let open = format!(
                    r#""type":"mcp_tool_call","server":"docs","tool":"search","arguments":{{"query":{}}}"#,
                    js(rng.pick(PROSE))
                );
                s.line(format_args!(
                    r#"{{"type":"item.started","item":{{"id":"{item}",{open},"result":null,"error":null,"status":"in_progress"}}}}"#
                ));
                s.line(format_args!(
                    r#"{{"type":"item.completed","item":{{"id":"{item}",{open},"result":{{"content":[{{"type":"text","text":{}}}],"structured_content":null}},"error":null,"status":"completed"}}}}"#,
                    js(&tool_output(rng))
                ));
            }
            _ => {
                let command = js(&format!("/bin/bash -lc '{}'", rng.pick(COMMANDS)));
                s.line(format_args!(
                    r#"{{"type":"item.started","item":{{"id":"{item}","type":"command_execution","command":{command},"aggregated_output":"","exit_code":null,"status":"in_progress"}}}}"#
                ));
                let code = u64::from(rng.chance(10));
                s.line(format_args!(
                    r#"{{"type":"item.completed","item":{{"id":"{item}","type":"command_execution","command":{command},"aggregated_output":{},"exit_code":{code},"status":"{}"}}}}"#,
                    js(&tool_output(rng)),
                    if code == 0 { "completed" } else { "failed" }
                ));
            }
        }
    }
    s.steps += 1;
    s.line(format_args!(
        r#"{{"type":"item.completed","item":{{"id":"{}","type":"agent_message","text":{}}}}}"#,
        id(),
        js(rng.pick(PROSE))
    ));
    s.line(format_args!(
        r#"{{"type":"turn.completed","usage":{{"input_tokens":{},"cached_input_tokens":{},"cache_write_input_tokens":0,"output_tokens":{},"reasoning_output_tokens":{}}}}}"#,
        rng.range(10_000, 900_000),
        rng.range(0, 9_000),
        rng.range(1_000, 40_000),
        rng.range(0, 9_000)
    ));
    s
}

fn gemini_stream(rng: &mut Rng) -> Stream {
    let mut s = Stream {
        text: String::new(),
        steps: 0,
    };
    let ts = "2026-11-22T09:39:44.863Z";
    s.line(format_args!(
        r#"{{"type":"init","timestamp":"{ts}","session_id":"{}","model":"auto"}}"#,
        rng.uuid()
    ));
    s.line(format_args!(
        r#"{{"type":"message","timestamp":"{ts}","role":"user","content":"Port the step counter to all three providers and make the test suite pass."}}"#
    ));
    let mut calls = 0u64;
    for _ in 0..rounds(rng) {
        for _ in 0..rng.range(0, 3) {
            s.line(format_args!(
                r#"{{"type":"message","timestamp":"{ts}","role":"assistant","content":{},"delta":true}}"#,
                js(rng.pick(PROSE))
            ));
        }
        let ids: Vec<(&str, String)> = (0..if rng.chance(15) { rng.range(2, 4) } else { 1 })
            .map(|_| {
                let name = rng.pick(&["run_shell_command", "read_file", "replace", "glob"]);
                (name, format!("{name}__fc_{}", rng.hex(24)))
            })
            .collect();
        for (name, id) in &ids {
            s.steps += 1;
            calls += 1;
            let parameters = match *name {
                "run_shell_command" => format!(
                    r#"{{"command":{},"description":"Run it"}}"#,
                    js(rng.pick(COMMANDS))
                ),
                "replace" => format!(
                    r#"{{"file_path":"{}","old_string":"steps++;","new_string":"steps += unit(event);","instruction":"Count steps per unit."}}"#,
                    rng.pick(FILES)
                ),
                _ => format!(r#"{{"file_path":"{}"}}"#, rng.pick(FILES)),
            };
            s.line(format_args!(
                r#"{{"type":"tool_use","timestamp":"{ts}","tool_name":"{name}","tool_id":"{id}","parameters":{parameters}}}"#
            ));
        }
        for (_, id) in &ids {
            s.line(format_args!(
                r#"{{"type":"tool_result","timestamp":"{ts}","tool_id":"{id}","status":"success","output":{}}}"#,
                js(&tool_output(rng))
            ));
        }
    }
    s.line(format_args!(
        r#"{{"type":"message","timestamp":"{ts}","role":"assistant","content":"All done.","delta":true}}"#
    ));
    s.line(format_args!(
        r#"{{"type":"result","timestamp":"{ts}","status":"success","stats":{{"total_tokens":{},"input_tokens":{},"output_tokens":{},"cached":0,"input":{},"duration_ms":35700,"tool_calls":{calls},"models":{{"gemini-3.8-flash":{{"total_tokens":{},"input_tokens":{},"output_tokens":{},"cached":0,"input":{}}}}}}}}}"#,
        600 * (calls + 1),
        500 * (calls + 1),
        100 * (calls + 1),
        500 * (calls + 1),
        600 * (calls + 1),
        500 * (calls + 1),
        100 * (calls + 1),
        500 * (calls + 1),
    ));
    s
}

fn opencode_stream(rng: &mut Rng) -> Stream {
    let mut s = Stream {
        text: String::new(),
        steps: 0,
    };
    let session = format!("ses_{}{}", rng.hex(12), rng.base62(14));
    let ts = 1_795_340_471_853u64 + rng.below(1 << 30);
    let rounds = rounds(rng);
    for round in 0..=rounds {
        let message = format!("msg_{}{}", rng.hex(12), rng.base62(14));
        s.steps += 1;
        s.line(format_args!(
            r#"{{"type":"step_start","timestamp":{ts},"sessionID":"{session}","part":{{"id":"prt_{}{}","messageID":"{message}","sessionID":"{session}","type":"step-start"}}}}"#,
            rng.hex(12),
            rng.base62(14)
        ));
        let reason = if round == rounds {
            s.line(format_args!(
                r#"{{"type":"text","timestamp":{ts},"sessionID":"{session}","part":{{"id":"prt_{}{}","messageID":"{message}","sessionID":"{session}","type":"text","text":{},"time":{{"start":{ts},"end":{ts}}}}}}}"#,
                rng.hex(12),
                rng.base62(14),
                js(rng.pick(PROSE))
            ));
            "stop"
        } else {
            for _ in 0..if rng.chance(15) { rng.range(2, 4) } else { 1 } {
                let command = js(rng.pick(COMMANDS));
                let out = js(&tool_output(rng));
                s.line(format_args!(
                    r#"{{"type":"tool_use","timestamp":{ts},"sessionID":"{session}","part":{{"type":"tool","tool":"bash","callID":"call_{}","state":{{"status":"completed","input":{{"command":{command},"description":"Run it"}},"output":{out},"metadata":{{"output":{out},"exit":0,"truncated":false}},"title":{command},"time":{{"start":{ts},"end":{ts}}}}},"id":"prt_{}{}","sessionID":"{session}","messageID":"{message}"}}}}"#,
                    rng.hex(24),
                    rng.hex(12),
                    rng.base62(14)
                ));
            }
            "tool-calls"
        };
        s.line(format_args!(
            r#"{{"type":"step_finish","timestamp":{ts},"sessionID":"{session}","part":{{"id":"prt_{}{}","reason":"{reason}","messageID":"{message}","sessionID":"{session}","type":"step-finish","tokens":{{"total":120,"input":100,"output":20,"reasoning":0,"cache":{{"write":0,"read":0}}}},"cost":0}}}}"#,
            rng.hex(12),
            rng.base62(14)
        ));
    }
    s
}

/// Writes streams of `provider` to `out` until it holds at least `size` bytes (whole streams
/// only), seeded by `seed`.
pub(crate) fn generate(
    provider: Provider,
    size: u64,
    seed: u64,
    out: &Path,
) -> anyhow::Result<Expected> {
    let file =
        std::fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
    let expected = write_streams(provider, size, seed, &mut writer)?;
    writer.flush()?;
    Ok(expected)
}

/// [`generate`], into any writer.
fn write_streams(
    provider: Provider,
    size: u64,
    seed: u64,
    writer: &mut impl std::io::Write,
) -> anyhow::Result<Expected> {
    let mut rng = Rng::new(seed);
    let mut expected = Expected::default();
    while expected.bytes < size {
        let stream = match provider {
            Provider::Claude => claude_stream(&mut rng),
            Provider::Codex => codex_stream(&mut rng),
            Provider::Gemini => gemini_stream(&mut rng),
            Provider::Opencode => opencode_stream(&mut rng),
        };
        writer.write_all(stream.text.as_bytes())?;
        expected.steps += stream.steps;
        expected.streams += 1;
        expected.lines += stream.text.bytes().filter(|b| *b == b'\n').count() as u64;
        expected.bytes += stream.text.len() as u64;
    }
    Ok(expected)
}

/// Parses a size such as `512MiB`, `1GiB`, `64KiB` or a number of bytes.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size: write e.g. 512MiB, 1GiB or 65536"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" | "K" => 10,
        "MiB" | "M" => 20,
        "GiB" | "G" => 30,
        other => {
            return Err(format!(
                "unknown size unit `{other}`: use B, KiB, MiB or GiB (e.g. 512MiB)"
            ));
        }
    };
    number
        .checked_mul(1 << shift)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`{text}` is not a size from 1 byte to 16 EiB"))
}

/// The plugin directory holding the OpenCode example plugin next to `stepguard`, when built
/// (`cargo build --release -p stepguard-plugin-opencode`).
fn opencode_plugin_dir(stepguard: &Path) -> Option<PathBuf> {
    let dir = stepguard.parent()?;
    dir.join("libstepguard_plugin_opencode.so")
        .is_file()
        .then(|| dir.to_path_buf())
}

/// The steps `count --json` reported for `file`.
fn counted_steps(output: &str) -> anyhow::Result<u64> {
    let record: serde_json::Value =
        serde_json::from_str(output.trim()).context("count --json printed no JSON record")?;
    record["num_steps_computed"]
        .as_u64()
        .context("the record has no num_steps_computed")
}

/// One timed tool: name, median wall time, median CPU time (user + system, all its
/// processes; `None` without `/usr/bin/time`), peak memory (KiB, its largest process).
struct Timing {
    name: String,
    time: Duration,
    cpu: Option<Duration>,
    peak_kib: u64,
}

/// One run of `shell`: wall time, CPU time, peak memory and what it printed. On a loaded
/// machine the CPU time is the steadier figure: the wall time includes waiting for a core.
fn measure(shell: &str) -> anyhow::Result<(Duration, Option<Duration>, u64, String)> {
    if !Path::new(GNU_TIME).is_file() {
        let (t, peak, out) = timed(shell)?;
        return Ok((t, None, peak, out));
    }
    let report = std::env::temp_dir().join(format!("stepguard-bench-time-{}", std::process::id()));
    let start = std::time::Instant::now();
    let output = std::process::Command::new(GNU_TIME)
        .args(["-f", "%U %S %M", "-o"])
        .arg(&report)
        .args(["sh", "-c", shell])
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let wall = start.elapsed();
    let text = std::fs::read_to_string(&report)?;
    let _ = std::fs::remove_file(&report);
    if !output.status.success() {
        bail!("`{shell}` failed: {}", output.status);
    }
    let mut fields = text
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .map(|f| f.parse::<f64>().unwrap_or(0.0));
    let (user, system, peak) = (
        fields.next().unwrap_or(0.0),
        fields.next().unwrap_or(0.0),
        fields.next().unwrap_or(0.0),
    );
    Ok((
        wall,
        Some(Duration::from_secs_f64(user + system)),
        peak as u64,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

fn time_runs(name: String, shell: &str, runs: usize) -> anyhow::Result<(Timing, String)> {
    let mut times = Vec::new();
    let mut cpus = Vec::new();
    let mut peak = 0;
    let mut last = String::new();
    for _ in 0..runs.max(1) {
        let (t, cpu, p, out) = measure(shell)?;
        times.push(t);
        cpus.extend(cpu);
        peak = peak.max(p);
        last = out;
    }
    Ok((
        Timing {
            name,
            time: median(times),
            cpu: (!cpus.is_empty()).then(|| median(cpus)),
            peak_kib: peak,
        },
        last,
    ))
}

/// Options of the `count-corpus` benchmark.
pub(crate) struct CountBench<'a> {
    pub providers: &'a [Provider],
    pub size: u64,
    pub seed: u64,
    pub runs: usize,
    pub stepguard: &'a Path,
    pub dir: &'a Path,
    pub no_jq: bool,
}

/// Generates (or reuses) a corpus per provider, checks `count`'s steps against the known
/// count, and times `count`, `wc -l` and jq on it.
pub(crate) fn count_bench(bench: &CountBench<'_>) -> anyhow::Result<()> {
    if !bench.stepguard.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p stepguard-cli`",
            bench.stepguard.display()
        );
    }
    std::fs::create_dir_all(bench.dir)?;
    let jq = !bench.no_jq
        && std::process::Command::new("jq")
            .arg("--version")
            .output()
            .is_ok();
    if !bench.no_jq && !jq {
        println!("jq not found (apt-get install jq): its column is left out");
    }
    for &provider in bench.providers {
        let sg = bench.stepguard.display();
        let plugin_dir = match provider {
            Provider::Opencode => match opencode_plugin_dir(bench.stepguard) {
                Some(dir) => format!(" --plugin-dir {}", dir.display()),
                None => {
                    println!(
                        "opencode skipped: build its plugin next to stepguard with `cargo build --release -p stepguard-plugin-opencode`"
                    );
                    continue;
                }
            },
            _ => String::new(),
        };
        let file = bench.dir.join(format!(
            "{}-{}MiB-seed{}.jsonl",
            provider.name(),
            bench.size >> 20,
            bench.seed
        ));
        let expected = generate(provider, bench.size, bench.seed, &file)?;
        let path = file.display();
        println!(
            "\n{}: {path}, {:.0} MiB, {} streams, {} lines, {} steps by construction",
            provider.name(),
            expected.bytes as f64 / f64::from(1 << 20),
            expected.streams,
            expected.lines,
            expected.steps
        );
        // Warm the page cache so every tool reads from memory.
        timed(&format!("cat {path} > /dev/null"))?;
        let count = |extra: &str| {
            format!(
                "{sg} count{plugin_dir} -p {} --json{extra} {path}",
                provider.name()
            )
        };
        let mut timings = Vec::new();
        for (label, extra) in [("", ""), (" --loop-limit off", " --loop-limit off")] {
            let (timing, out) = time_runs(
                format!("stepguard count -p {}{label}", provider.name()),
                &count(extra),
                bench.runs,
            )?;
            let steps = counted_steps(&out)?;
            if steps != expected.steps {
                bail!(
                    "`{}` counted {steps} steps, the corpus was built with {}",
                    timing.name,
                    expected.steps
                );
            }
            timings.push(timing);
        }
        timings.push(time_runs("wc -l".into(), &format!("wc -l {path}"), bench.runs)?.0);
        if jq {
            let filter = provider.jq_filter();
            let (timing, out) = time_runs(
                format!("jq -c '{filter}' | wc -l"),
                &format!("jq -c '{filter}' {path} | wc -l"),
                1,
            )?;
            println!(
                "jq's one-liner counts {} (the corpus has {} steps)",
                out.trim(),
                expected.steps
            );
            timings.push(timing);
        }
        report(expected.bytes, &timings);
    }
    Ok(())
}

fn report(bytes: u64, timings: &[Timing]) {
    println!(
        "{:<46} {:>8} {:>8} {:>8} {:>10}",
        "tool", "wall s", "MB/s", "CPU s", "peak MiB"
    );
    let cpu = |t: &Timing| t.cpu.map_or(f64::NAN, |c| c.as_secs_f64());
    for t in timings {
        println!(
            "{:<46} {:>8.3} {:>8.0} {:>8.3} {:>10.1}",
            t.name,
            t.time.as_secs_f64(),
            bytes as f64 / 1e6 / t.time.as_secs_f64(),
            cpu(t),
            t.peak_kib as f64 / 1024.0
        );
    }
    let by_name = |prefix: &str| timings.iter().find(|t| t.name.starts_with(prefix));
    let Some(sg) = timings.first() else { return };
    let ratio = |other: &Timing| {
        format!(
            "{:.1}x by wall time, {:.1}x by CPU time",
            sg.time.as_secs_f64() / other.time.as_secs_f64(),
            cpu(sg) / cpu(other)
        )
    };
    for t in &timings[1..] {
        if t.name.starts_with("stepguard") {
            println!("{} vs {}: {}", sg.name, t.name, ratio(t));
        }
    }
    if let Some(wc) = by_name("wc -l") {
        println!("stepguard count / wc -l: {}", ratio(wc));
    }
    if let Some(jq) = by_name("jq") {
        println!(
            "jq / stepguard count: {:.1}x by wall time, {:.1}x by CPU time",
            jq.time.as_secs_f64() / sg.time.as_secs_f64(),
            cpu(jq) / cpu(sg)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use stepguard_plugin_api::ProviderPlugin;

    /// Steps the provider's own counter finds in a generated corpus, and the corpus's numbers.
    fn count_generated(provider: Provider, seed: u64) -> (u64, Expected, Vec<u8>) {
        let mut bytes = Vec::new();
        let expected = write_streams(provider, 2 << 20, seed, &mut bytes).expect("generate");
        let count = |plugin: &dyn ProviderPlugin, unit: &str| {
            stepguard_plugin_api::testing::count(plugin, unit, &bytes)
                .expect("count")
                .1
        };
        let stats = match provider {
            Provider::Claude => count(&stepguard_provider_claude::ClaudePlugin, "message"),
            Provider::Codex => count(&stepguard_provider_codex::CodexPlugin, "item"),
            Provider::Gemini => count(&stepguard_provider_gemini::GeminiPlugin, "tool_use"),
            Provider::Opencode => count(&stepguard_plugin_opencode::OpenCodePlugin, "step"),
        };
        assert_eq!(stats.noise_lines, 0, "{provider:?}: every line is an event");
        assert_eq!(
            stats.unknown_events, 0,
            "{provider:?}: every event is known"
        );
        (stats.num_steps_computed, expected, bytes)
    }

    #[test]
    fn every_provider_counts_exactly_the_steps_a_corpus_was_built_with() {
        for provider in [
            Provider::Claude,
            Provider::Codex,
            Provider::Gemini,
            Provider::Opencode,
        ] {
            let (steps, expected, bytes) = count_generated(provider, 7);
            assert!(expected.streams > 3, "{provider:?}: many streams");
            assert!(expected.bytes >= 2 << 20 && expected.bytes == bytes.len() as u64);
            assert_eq!(steps, expected.steps, "{provider:?}");
            // Every line is JSON, as jq needs.
            for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                serde_json::from_slice::<serde_json::Value>(line).expect("a JSON line");
            }
        }
    }

    #[test]
    fn a_seed_makes_the_same_corpus_and_another_seed_another() {
        let (_, a, bytes_a) = count_generated(Provider::Codex, 1);
        let (_, b, bytes_b) = count_generated(Provider::Codex, 1);
        let (_, _, bytes_c) = count_generated(Provider::Codex, 2);
        assert_eq!(a, b);
        assert!(bytes_a == bytes_b && bytes_a != bytes_c);
    }

    #[test]
    fn ids_are_unique_within_each_stream_as_the_clis_print_them() {
        let (_, _, bytes) = count_generated(Provider::Claude, 3);
        let text = String::from_utf8(bytes).expect("utf-8");
        let mut ids = std::collections::HashSet::new();
        for line in text.lines().filter(|l| l.contains(r#""type":"tool_use""#)) {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            for block in v["message"]["content"].as_array().expect("content") {
                let id = block["id"].as_str().expect("id");
                assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");
                assert!(ids.insert(id.to_owned()), "{id} repeated");
            }
        }
        assert!(ids.len() > 300, "{} tool calls", ids.len());
    }

    #[test]
    fn sizes_parse_with_units_and_bad_ones_name_the_fix() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").unwrap_err().contains("512MiB"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("0").is_err());
    }
}
