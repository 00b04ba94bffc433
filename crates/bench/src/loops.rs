//! `stepguard-bench loops`: precision and recall of loop rules on the labelled corpus in
//! `tests/fixtures/loops/` (its README describes the format).
//!
//! Three rules are compared: today's (identical calls, `repeat` and `cycle`, at the loop limit
//! within the window), Gemini CLI's (five identical consecutive calls) and the rule of
//! progress (`stepguard_core::loops`, with tool results). Recordings are read by the same
//! provider code a run uses; written sequences become calls and results through the same
//! fingerprints (`ToolCall::shell` for shell tools).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use stepguard_core::loops::{
    Call, DEFAULT_LOOP_LIMIT, LoopDetector, LoopFound, LoopSettings, Outcome,
};
use stepguard_plugin_api::{CounterRequest, LineReport, ProviderPlugin, ToolCall, ToolResult};

/// What a sequence is, by its label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// The agent is stuck: a rule should stop it.
    Loop,
    /// Legitimate work: a rule must not stop it.
    NoLoop,
}

/// One event of a sequence, in stream order.
#[derive(Clone, Debug)]
pub enum Event {
    /// A tool call (its `step` set).
    Call(ToolCall),
    /// A tool call's result.
    Result(ToolResult),
}

/// A labelled sequence of tool calls and results.
#[derive(Clone, Debug)]
pub struct Sequence {
    /// Where it comes from: `FILE:NAME` or a recording's path.
    pub name: String,
    /// Loop or not.
    pub label: Label,
    /// A loop the rule of progress is known to miss at its defaults, and why.
    pub expect_miss: Option<String>,
    /// The calls and results.
    pub events: Vec<Event>,
}

/// A loop rule under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Identical calls (stepguard before protocol 1.6).
    Identical,
    /// Gemini CLI's: five identical consecutive calls.
    Gemini,
    /// By progress, with results.
    Progress,
}

impl Rule {
    /// Every rule, in the order of the table.
    pub const ALL: [Rule; 3] = [Rule::Identical, Rule::Gemini, Rule::Progress];

    fn name(self) -> &'static str {
        match self {
            Rule::Identical => "identical calls (before 1.6)",
            Rule::Gemini => "Gemini CLI (5 identical in a row)",
            Rule::Progress => "by progress (1.6)",
        }
    }
}

/// Returns the first loop `rule` finds in `events` under `settings` (the Gemini rule has none).
pub fn first_loop(rule: Rule, settings: &LoopSettings, events: &[Event]) -> Option<LoopFound> {
    match rule {
        Rule::Gemini => gemini(events),
        Rule::Identical => {
            let mut detector = LoopDetector::new(settings.clone());
            events.iter().find_map(|e| match e {
                Event::Call(c) => detector.observe(&c.tool, &c.fingerprint, c.step.unwrap_or(0)),
                Event::Result(_) => None,
            })
        }
        Rule::Progress => {
            let mut detector = LoopDetector::new(settings.clone());
            events.iter().find_map(|e| match e {
                Event::Call(c) => detector.call(Call {
                    program: c.program.clone(),
                    id: c.id.clone(),
                    ..Call::new(&c.tool, &c.fingerprint, c.step.unwrap_or(0))
                }),
                Event::Result(r) => detector.result(&Outcome {
                    call_id: r.call_id.clone(),
                    fingerprint: r.fingerprint.clone(),
                    failed: r.failed,
                }),
            })
        }
    }
}

/// Gemini CLI's tool-call loop rule: the same call (name and arguments) five times in a row.
fn gemini(events: &[Event]) -> Option<LoopFound> {
    let calls: Vec<&ToolCall> = events
        .iter()
        .filter_map(|e| match e {
            Event::Call(c) => Some(c),
            Event::Result(_) => None,
        })
        .collect();
    calls.windows(5).find_map(|w| {
        w.iter()
            .all(|c| c.fingerprint == w[0].fingerprint)
            .then(|| LoopFound {
                tool: w[0].tool.clone(),
                count: 5,
                kind: stepguard_core::loops::LoopKind::Repeat,
                first_step: w[0].step.unwrap_or(0),
            })
    })
}

/// The counts of one rule on the corpus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    /// Loops found.
    pub true_positives: usize,
    /// Non-loops stopped.
    pub false_positives: usize,
    /// Loops missed.
    pub false_negatives: usize,
    /// Non-loops let through.
    pub true_negatives: usize,
}

impl Score {
    /// Of the sequences stopped, the share that were loops.
    pub fn precision(&self) -> f64 {
        ratio(
            self.true_positives,
            self.true_positives + self.false_positives,
        )
    }

    /// Of the loops, the share stopped.
    pub fn recall(&self) -> f64 {
        ratio(
            self.true_positives,
            self.true_positives + self.false_negatives,
        )
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// Scores `rule` on `corpus` under `settings`.
pub fn score(rule: Rule, settings: &LoopSettings, corpus: &[Sequence]) -> Score {
    let mut s = Score::default();
    for seq in corpus {
        let found = first_loop(rule, settings, &seq.events).is_some();
        match (seq.label, found) {
            (Label::Loop, true) => s.true_positives += 1,
            (Label::Loop, false) => s.false_negatives += 1,
            (Label::NoLoop, true) => s.false_positives += 1,
            (Label::NoLoop, false) => s.true_negatives += 1,
        }
    }
    s
}

/// Loads the corpus under `dir`: `recordings.txt` (recordings read by their provider, paths
/// relative to `root`) and every `*.seq` file (written sequences).
pub fn load(dir: &Path, root: &Path) -> anyhow::Result<Vec<Sequence>> {
    let mut corpus = recordings(dir, root)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seq"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let stem = file.file_stem().unwrap_or_default().to_string_lossy();
        corpus.extend(parse_sequences(&stem, &text).with_context(|| file.display().to_string())?);
    }
    Ok(corpus)
}

/// Reads `recordings.txt`: `LABEL PROVIDER PATH [expect-miss: REASON]` per line.
fn recordings(dir: &Path, root: &Path) -> anyhow::Result<Vec<Sequence>> {
    let list = dir.join("recordings.txt");
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("cannot read {}", list.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (line, expect_miss) = match line.split_once("expect-miss:") {
            Some((head, why)) => (head.trim(), Some(why.trim().to_owned())),
            None => (line, None),
        };
        let [label, provider, path] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            bail!("{}:{}: want `LABEL PROVIDER PATH`", list.display(), n + 1);
        };
        let bytes =
            std::fs::read(root.join(path)).with_context(|| format!("cannot read {path}"))?;
        out.push(Sequence {
            name: path.to_owned(),
            label: parse_label(label)?,
            expect_miss,
            events: recorded_events(provider, &bytes)?,
        });
    }
    Ok(out)
}

fn parse_label(text: &str) -> anyhow::Result<Label> {
    match text {
        "loop" => Ok(Label::Loop),
        "no_loop" => Ok(Label::NoLoop),
        other => bail!("unknown label `{other}`: write `loop` or `no_loop`"),
    }
}

/// The calls and results a provider reports for a recorded stream, each call with its step.
pub fn recorded_events(provider: &str, stream: &[u8]) -> anyhow::Result<Vec<Event>> {
    let plugin: Box<dyn ProviderPlugin> = match provider {
        "claude" => Box::new(stepguard_provider_claude::ClaudePlugin),
        "codex" => Box::new(stepguard_provider_codex::CodexPlugin),
        "gemini" => Box::new(stepguard_provider_gemini::GeminiPlugin),
        "opencode" => Box::new(stepguard_plugin_opencode::OpenCodePlugin),
        other => bail!("unknown provider `{other}`"),
    };
    let unit = plugin
        .manifest()
        .units
        .iter()
        .find(|u| u.default)
        .map(|u| u.name.clone())
        .unwrap_or_default();
    let mut counter = plugin
        .open_counter(&CounterRequest::new(&unit))
        .map_err(anyhow::Error::msg)?;
    let mut steps = 0;
    let mut events = Vec::new();
    for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let report = counter.feed(line).map_err(anyhow::Error::msg)?;
        steps += u64::from(report.steps_begun);
        if report.has(LineReport::TOOL_CALL) {
            events.extend(counter.take_tool_calls().into_iter().map(|mut c| {
                c.step = Some(steps);
                Event::Call(c)
            }));
        }
        if report.has(LineReport::TOOL_RESULT) {
            events.extend(counter.take_tool_results().into_iter().map(Event::Result));
        }
    }
    Ok(events)
}

/// The tools whose argument is a shell command.
const SHELL_TOOLS: [&str; 4] = ["Bash", "shell", "run_shell_command", "bash"];

/// Parses written sequences: a header `== NAME LABEL [expect-miss: REASON]`, then one call
/// per line, `[Nx] TOOL ARGUMENTS => ok|fail [OUTPUT]` (`Nx`: the same call and result N
/// times); `#` starts a comment line. Each call is a step of its own.
pub fn parse_sequences(file: &str, text: &str) -> anyhow::Result<Vec<Sequence>> {
    let mut out: Vec<Sequence> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("line {}", n + 1);
        if let Some(header) = line.strip_prefix("==") {
            let (header, expect_miss) = match header.split_once("expect-miss:") {
                Some((head, why)) => (head, Some(why.trim().to_owned())),
                None => (header, None),
            };
            let [name, label] = header.split_whitespace().collect::<Vec<_>>()[..] else {
                bail!("{}: want `== NAME LABEL`", at());
            };
            out.push(Sequence {
                name: format!("{file}:{name}"),
                label: parse_label(label).with_context(at)?,
                expect_miss,
                events: Vec::new(),
            });
            continue;
        }
        let seq = out
            .last_mut()
            .with_context(|| format!("{}: a call before any `== NAME LABEL`", at()))?;
        push_calls(&mut seq.events, line).with_context(at)?;
    }
    Ok(out)
}

/// Adds the call (or calls, `Nx`) of one line, each followed by its result.
fn push_calls(events: &mut Vec<Event>, line: &str) -> anyhow::Result<()> {
    let (times, line) = match line.split_once(' ') {
        Some((n, rest)) if n.ends_with('x') && n[..n.len() - 1].parse::<usize>().is_ok() => {
            (n[..n.len() - 1].parse::<usize>()?, rest.trim())
        }
        _ => (1, line),
    };
    let (call, result) = line
        .split_once("=>")
        .context("want `TOOL ARGUMENTS => ok|fail [OUTPUT]`")?;
    let (tool, arguments) = call.trim().split_once(' ').unwrap_or((call.trim(), ""));
    let result = result.trim();
    let (status, output) = result.split_once(' ').unwrap_or((result, ""));
    let failed = match status {
        "ok" => false,
        "fail" => true,
        other => bail!("unknown status `{other}`: write `ok` or `fail`"),
    };
    for _ in 0..times {
        let step = events
            .iter()
            .filter(|e| matches!(e, Event::Call(_)))
            .count() as u64
            + 1;
        let id = format!("call_{step}");
        let mut call = if SHELL_TOOLS.contains(&tool) {
            ToolCall::shell(tool, arguments.trim(), &serde_json::json!({}))
        } else {
            ToolCall::new(tool, &serde_json::json!(arguments.trim()))
        }
        .with_id(id.clone());
        call.step = Some(step);
        events.push(Event::Call(call));
        events.push(Event::Result(ToolResult::new(id, output, failed)));
    }
    Ok(())
}

/// The settings of the rule of progress at stepguard's defaults.
pub fn default_settings() -> LoopSettings {
    LoopSettings::with_limit(DEFAULT_LOOP_LIMIT)
}

/// Runs the benchmark from the workspace root: the table of the three rules at the defaults,
/// then the rule of progress over other limits and windows.
pub fn run() -> anyhow::Result<()> {
    let root = Path::new(".");
    let corpus =
        load(&root.join("tests/fixtures/loops"), root).context("run from the workspace root")?;
    let loops = corpus.iter().filter(|s| s.label == Label::Loop).count();
    println!(
        "corpus: {} sequences, {loops} loops, {} non-loops",
        corpus.len(),
        corpus.len() - loops
    );
    let settings = default_settings();
    println!(
        "\nat limit {}, window {}:\n",
        settings.limit, settings.window
    );
    println!("| rule | loops found | non-loops stopped | precision | recall |");
    println!("|---|---|---|---|---|");
    for rule in Rule::ALL {
        let s = score(rule, &settings, &corpus);
        println!(
            "| {} | {}/{} | {}/{} | {:.2} | {:.2} |",
            rule.name(),
            s.true_positives,
            loops,
            s.false_positives,
            corpus.len() - loops,
            s.precision(),
            s.recall()
        );
    }
    println!("\nby progress, other settings (non-loops stopped, recall):\n");
    println!("| limit | window 10 | window 20 | window 40 |");
    println!("|---|---|---|---|");
    for limit in 3..=8 {
        let cells: Vec<String> = [10, 20, 40]
            .iter()
            .map(|window| {
                let settings = LoopSettings {
                    window: (*window).max(limit),
                    ..LoopSettings::with_limit(limit)
                };
                let s = score(Rule::Progress, &settings, &corpus);
                format!("{}, {:.2}", s.false_positives, s.recall())
            })
            .collect();
        println!("| {limit} | {} |", cells.join(" | "));
    }
    for seq in &corpus {
        let found = first_loop(Rule::Progress, &settings, &seq.events);
        let wrong = (seq.label == Label::Loop) != found.is_some();
        if wrong {
            let why = seq.expect_miss.as_deref().unwrap_or("not expected");
            println!("\nmissed or stopped wrongly: {} ({why})", seq.name);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<Sequence> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        load(&root.join("tests/fixtures/loops"), &root).unwrap()
    }

    #[test]
    fn the_corpus_holds_forty_loops_and_forty_non_loops() {
        let corpus = corpus();
        let loops = corpus.iter().filter(|s| s.label == Label::Loop).count();
        assert!(loops >= 40, "{loops} loops");
        assert!(
            corpus.len() - loops >= 40,
            "{} non-loops",
            corpus.len() - loops
        );
        let without: Vec<&str> = corpus
            .iter()
            .filter(|s| !s.events.iter().any(|e| matches!(e, Event::Call(_))))
            .map(|s| s.name.as_str())
            .collect();
        assert!(without.is_empty(), "no tool call in {without:?}");
    }

    #[test]
    fn by_progress_at_the_defaults_stops_no_non_loop_and_every_loop_it_claims() {
        let settings = default_settings();
        for seq in corpus() {
            let found = first_loop(Rule::Progress, &settings, &seq.events);
            match (seq.label, &seq.expect_miss) {
                (Label::NoLoop, _) => assert_eq!(found, None, "{} stopped", seq.name),
                (Label::Loop, None) => assert!(found.is_some(), "{} missed", seq.name),
                (Label::Loop, Some(why)) => {
                    assert_eq!(
                        found, None,
                        "{} said to be missed ({why}) but found",
                        seq.name
                    )
                }
            }
        }
    }

    #[test]
    fn the_rules_differ_where_the_corpus_says() {
        let corpus = corpus();
        let settings = default_settings();
        let identical = score(Rule::Identical, &settings, &corpus);
        let progress = score(Rule::Progress, &settings, &corpus);
        // Identical calls stop test-driven work; by progress stops none and finds more loops.
        assert!(identical.false_positives > 0, "{identical:?}");
        assert_eq!(progress.false_positives, 0);
        assert!(progress.true_positives > identical.true_positives);
        let tdd = corpus
            .iter()
            .find(|s| s.name == "no_loop:tdd_cargo_fewer_failures")
            .expect("the TDD sequence");
        assert!(first_loop(Rule::Identical, &settings, &tdd.events).is_some());
        assert_eq!(first_loop(Rule::Progress, &settings, &tdd.events), None);
    }

    #[test]
    fn written_sequences_parse_and_bad_lines_are_refused() {
        let seqs = parse_sequences(
            "t",
            "# c\n== a loop\n3x Bash FOO=1 make => fail boom\nRead x => ok text\n",
        )
        .unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].events.len(), 8);
        let Event::Call(c) = &seqs[0].events[0] else {
            panic!("a call")
        };
        assert_eq!((c.program.as_deref(), c.step), (Some("make"), Some(1)));
        for bad in [
            "Bash make => ok\n",
            "== a maybe\n",
            "== a loop\nBash make\n",
            "== a loop\nBash make => perhaps\n",
        ] {
            assert!(parse_sequences("t", bad).is_err(), "{bad}");
        }
    }
}
