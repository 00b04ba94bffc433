//! The runner on its own, without the binary: real agent processes (shell scripts printing a
//! Codex stream), the built-in Codex counter, and every way a run ends.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use stepguard_core::{ExitCode, FailureSlug, Outcome, StepLimit};
use stepguard_gateway::Budget;
use stepguard_plugin_api::{
    CounterRequest, CounterStats, LineReport, Manifest, ProviderPlugin, StepCounter,
};
use stepguard_runner::{
    Breach, ExitStatus, LimitDecision, LimitPolicy, OutsideLimit, Progress, Question, RunObserver,
    RunReport, RunStarted, Runner,
};
use support::{Dir, TURN_COMPLETED, alive, codex, counter_of, item, read_pid, spec};

#[test]
fn under_budget_the_agent_finishes_and_its_output_passes_through_byte_for_byte() {
    let dir = Dir::new();
    let (spec, out) = spec(dir.items(3, "0"), codex(), 5);
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Success);
    assert_eq!(report.stats.outcome, Outcome::Success);
    assert_eq!(report.stats.num_steps_computed, Some(3));
    assert_eq!(report.child_exit, Some(ExitStatus::Code(0)));
    assert_eq!(report.terminated_by, None);
    let want: String = (0..3)
        .map(item)
        .chain([TURN_COMPLETED.to_owned()])
        .map(|l| l + "\n")
        .collect();
    assert_eq!(out.text(), want);
    let r = &report.record;
    assert_eq!(
        (
            r.verdict.exit_code,
            r.verdict.child_exit_code,
            r.verdict.error_type.as_ref().map(|s| s.as_str())
        ),
        (Some(0), Some(0), None)
    );
    assert_eq!(r.step_budget.max_steps, Some(5));
    assert_eq!(r.counts.num_steps_computed, Some(3));
    assert_eq!(r.usage.tokens.map(|t| t.input_tokens), Some(10));
    assert!(r.invocation.started_at.is_some() && r.invocation.ended_at.is_some());
}

#[test]
fn a_breach_stops_the_tree_right_after_the_breaching_line() {
    let dir = Dir::new();
    let pidfile = dir.file("tool.pid");
    // A background "tool" in its own session, outside the agent's group.
    let mut body = format!("setsid sleep 300 & echo $! > {}\n", pidfile.display());
    for i in 0..10 {
        body.push_str(&format!("echo '{}'\nsleep 0.05\n", item(i)));
    }
    let (spec, out) = spec(dir.script("long.sh", &body), codex(), 3);
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::BudgetExceeded);
    assert_eq!(report.stats.slug, Some(FailureSlug::MaxSteps));
    assert_eq!(report.breached_at_step, Some(4));
    assert_eq!(report.stats.num_steps_computed, Some(4));
    assert_eq!(report.terminated_by.map(|t| t.as_str()), Some("budget"));
    // Exactly the breaching line is the last one passed through.
    let lines: Vec<String> = out.text().lines().map(str::to_owned).collect();
    assert_eq!(lines, (0..4).map(item).collect::<Vec<_>>());
    assert_eq!(report.record.supervision.breached_at_step, Some(4));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("budget")
    );
    assert!(report.record.supervision.on_limit_decisions.is_empty());
    assert!(
        report.summary_line().ends_with("| stopped at step 4 of 3"),
        "{}",
        report.summary_line()
    );
    let tool = read_pid(&pidfile);
    assert!(!alive(tool), "the background tool {tool} survived");
    assert!(!alive(report.pid.unwrap()));
    assert_eq!(report.stop.map(|s| s.survivors), Some(0));
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
    let dir = Dir::new();
    let mut body = String::from("trap '' TERM\n");
    for i in 0..5 {
        body.push_str(&format!("echo '{}'\n", item(i)));
    }
    body.push_str("while :; do sleep 0.1; done\n");
    let (mut spec, _) = spec(dir.script("stubborn.sh", &body), codex(), 2);
    spec.clocks.grace = Duration::from_millis(300);
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::BudgetExceeded);
    assert_eq!(report.child_exit, Some(ExitStatus::Signal(9)));
    assert_eq!(report.record.verdict.child_signal, Some(9));
    assert!(report.stop.is_some_and(|s| s.killed && s.survivors == 0));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn the_timeout_stops_the_agent() {
    let dir = Dir::new();
    let body = format!("echo '{}'\nsleep 30\n", item(0));
    let (mut spec, _) = spec(dir.script("slow.sh", &body), codex(), 10);
    spec.clocks.timeout = Some(Duration::from_millis(300));
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Timeout);
    assert_eq!(report.stats.slug, Some(FailureSlug::Timeout));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("timeout")
    );
    assert_eq!(report.stats.num_steps_computed, Some(1));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!alive(report.pid.unwrap()));
}

#[test]
fn an_interrupt_stops_the_tree_with_the_signal_first() {
    let dir = Dir::new();
    let marker = dir.file("got-int");
    let body = format!(
        "trap 'echo int > {}; exit 0' INT\necho '{}'\nwhile :; do sleep 0.05; done\n",
        marker.display(),
        item(0)
    );
    let (spec, _) = spec(dir.script("interruptible.sh", &body), codex(), 10);
    let runner = Runner::new(spec);
    let interrupter = runner.interrupter();
    let poke = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        interrupter.interrupt(2)
    });
    let report = runner.run(&mut []);
    assert!(poke.join().unwrap());
    assert_eq!(report.exit_code, ExitCode::Interrupted);
    assert_eq!(report.stats.slug, Some(FailureSlug::Interrupted));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("signal")
    );
    // SIGINT, not SIGTERM, reached the agent first.
    assert!(marker.exists(), "the agent never saw SIGINT");
}

/// A limit kept outside the run (a pool other runs spent), fed in through the runner's handle:
/// without the gateway the tree is stopped with the measure's slug and the caller's message;
/// a second one changes nothing; a handle used after the run says the run is over.
#[test]
fn an_outside_limit_stops_the_tree_with_its_measures_slug_and_message() {
    let dir = Dir::new();
    let body = format!("echo '{}'\nwhile :; do sleep 0.05; done\n", item(0));
    let (spec, _) = spec(dir.script("long.sh", &body), codex(), 10);
    let runner = Runner::new(spec);
    let limits = runner.outside_limits();
    let started = Instant::now();
    let poke = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let limit = |measure| OutsideLimit {
            name: "daily".into(),
            measure,
            why: "pool `daily` is spent".into(),
        };
        let first = limits.reached(limit(Budget::Tokens));
        let second = limits.reached(limit(Budget::Cost));
        (first, second, limits)
    });
    let report = runner.run(&mut []);
    let (first, second, limits) = poke.join().unwrap();
    assert!(first && second);
    assert_eq!(report.exit_code, ExitCode::BudgetExceeded);
    assert_eq!(report.stats.slug, Some(FailureSlug::MaxTokens));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("tokens")
    );
    assert_eq!(
        report.record.verdict.message.as_deref(),
        Some("pool `daily` is spent; stopped")
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!alive(report.pid.unwrap()));
    assert!(
        !limits.reached(OutsideLimit {
            name: "daily".into(),
            measure: Budget::Steps,
            why: "late".into(),
        }),
        "the run is over"
    );
}

/// A provider whose counter fails on a line containing `BOOM`.
struct Failing;

struct FailingCounter(u64);

impl ProviderPlugin for Failing {
    fn manifest(&self) -> Manifest {
        Manifest::new("failing", "1.0.0").unit("line", "every line", true)
    }

    fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        Ok(Box::new(FailingCounter(0)))
    }
}

impl StepCounter for FailingCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        if line.windows(4).any(|w| w == b"BOOM") {
            return Err("cannot trust this stream any more".into());
        }
        self.0 += 1;
        Ok(LineReport {
            steps_begun: 1,
            ..LineReport::default()
        })
    }

    fn finish(&mut self) -> CounterStats {
        let mut stats = CounterStats::default();
        stats.num_steps_computed = self.0;
        stats
    }
}

#[test]
fn a_plugin_error_fails_closed_and_names_the_error() {
    let dir = Dir::new();
    let body = "echo one\necho BOOM\necho three\nsleep 30\n";
    let counter = counter_of(stepguard_plugin_api::provider_box(Failing), "line");
    let (spec, out) = spec(dir.script("boom.sh", body), counter, 10);
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Plugin);
    assert_eq!(report.stats.slug, Some(FailureSlug::PluginError));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("plugin")
    );
    let message = report.record.verdict.message.clone().unwrap_or_default();
    assert!(
        message.contains("cannot trust this stream any more"),
        "{message}"
    );
    assert!(report.plugin_error.is_some());
    assert!(
        !out.text().contains("BOOM"),
        "an uncounted line passed through"
    );
    assert!(!alive(report.pid.unwrap()));
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Allows `more` steps at the first breach, then stops.
struct AllowOnce {
    more: u32,
    seen: Vec<Breach>,
}

impl LimitPolicy for AllowOnce {
    fn asks(&self) -> bool {
        true
    }

    fn decide(&mut self, breach: &Breach, _question: &Question) -> LimitDecision {
        self.seen.push(*breach);
        if self.seen.len() == 1 {
            LimitDecision::Allow(self.more)
        } else {
            LimitDecision::Stop
        }
    }
}

#[test]
fn an_asking_policy_can_allow_more_steps() {
    let dir = Dir::new();
    let (mut spec, out) = spec(dir.items(10, "0.02"), codex(), 2);
    spec.limits.on_limit = Box::new(AllowOnce {
        more: 2,
        seen: Vec::new(),
    });
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::BudgetExceeded);
    assert_eq!(
        report.decisions,
        [LimitDecision::Allow(2), LimitDecision::Stop]
    );
    assert_eq!(
        report
            .record
            .supervision
            .on_limit_decisions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["allow:2", "stop"]
    );
    // 2 allowed, step 3 breached, 2 more allowed, step 5 breached.
    assert_eq!(report.breached_at_step, Some(3));
    assert_eq!(report.stats.num_steps_computed, Some(5));
    assert_eq!(out.text().lines().count(), 5);
}

#[test]
fn a_command_that_cannot_start_is_spawn_failed() {
    let (spec, _) = spec(vec!["/no/such/agent".into()], codex(), 5);
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Usage);
    assert_eq!(report.stats.slug, Some(FailureSlug::SpawnFailed));
    assert_eq!(
        report.record.verdict.message.as_deref(),
        Some("cannot run `/no/such/agent`: command not found: no such file; check the path")
    );
    assert_eq!(report.pid, None);
    assert_eq!(report.record.counts.noise_lines, None);
}

#[test]
fn a_script_whose_interpreter_cannot_run_is_spawn_failed_naming_the_fix() {
    // Through the trampoline too the agent never starts: not the agent's failure (exit 1).
    let dir = Dir::new();
    let path = dir.file("bad.sh");
    std::fs::write(&path, "#!/no/such/interpreter\necho hi\n").unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (spec, out) = spec(vec![path.display().to_string()], codex(), 5);
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Usage);
    assert_eq!(report.stats.slug, Some(FailureSlug::SpawnFailed));
    let message = report.record.verdict.message.unwrap();
    assert!(
        message.contains("names the interpreter `/no/such/interpreter`")
            && message.contains("fix the #! line"),
        "{message}"
    );
    assert_eq!(out.text(), "");
}

#[test]
fn no_event_within_the_providers_first_event_time_is_an_unrecognised_stream() {
    // A CLI in text mode behind a wrapper: nothing on stdout while it works (a tool it started
    // sleeps on), so neither the line rule nor the time-since-first-line rule can fire.
    let dir = Dir::new();
    let pidfile = dir.file("tool.pid");
    let body = format!("sleep 300 & echo $! > {}\nsleep 300", pidfile.display());
    let (mut spec, out) = spec(dir.script("silent.sh", &body), codex(), 5);
    spec.recognition.window.first_event = Duration::from_millis(400);
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Usage);
    assert_eq!(report.stats.slug, Some(FailureSlug::UnrecognizedStream));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("unrecognized")
    );
    let message = report.record.verdict.message.unwrap();
    assert!(
        message.contains("within 400ms of the start (nothing on stdout)"),
        "{message}"
    );
    assert_eq!(out.text(), "");
    assert!(!alive(read_pid(&pidfile)));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_agent_that_prints_nothing_and_exits_0_is_not_a_success() {
    let dir = Dir::new();
    let (silent, _out) = spec(
        dir.script("silent.sh", "echo 'to stderr' >&2\nexit 0"),
        codex(),
        5,
    );
    let report = Runner::new(silent).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Usage);
    assert_eq!(report.stats.outcome, Outcome::Failed);
    assert_eq!(report.stats.slug, Some(FailureSlug::UnrecognizedStream));
    assert_eq!(report.terminated_by, None);
    let message = report.record.verdict.message.unwrap();
    assert!(
        message.contains("printed nothing on stdout and exited 0"),
        "{message}"
    );
    // Silent and failing: the agent's failure, its exit code kept.
    let (failing, _out) = spec(dir.script("fails.sh", "exit 3"), codex(), 5);
    let report = Runner::new(failing).run(&mut []);
    assert_eq!(report.stats.slug, Some(FailureSlug::ProviderError));
    assert_eq!(report.child_exit, Some(ExitStatus::Code(3)));
    // Let through with a warning, as an unrecognised stream is.
    let (mut warned, _out) = spec(dir.script("silent2.sh", "exit 0"), codex(), 5);
    warned.recognition.on_unrecognized = stepguard_runner::OnUnrecognized::Warn;
    assert_eq!(
        Runner::new(warned).run(&mut []).exit_code,
        ExitCode::Success
    );
}

/// Remembers what it saw and names the run, as a history recorder would.
#[derive(Default)]
struct Watcher {
    started: Option<u32>,
    ticks: Vec<Progress>,
    finished: usize,
}

impl RunObserver for Watcher {
    fn started(&mut self, run: &RunStarted<'_>) {
        self.started = Some(run.pid);
        assert_eq!(run.budget, StepLimit::Limited(50));
    }

    fn tick(&mut self, progress: &Progress) {
        self.ticks.push(*progress);
    }

    fn finished(&mut self, report: &mut RunReport) {
        self.finished += 1;
        report.record.id = Some(42);
    }
}

#[test]
fn observers_see_the_start_progress_and_end_in_order() {
    let dir = Dir::new();
    let (spec, _) = spec(dir.items(3, "0.3"), codex(), 50);
    let mut first = Watcher::default();
    let mut second = Watcher::default();
    let report = Runner::new(spec).run(&mut [&mut first, &mut second]);
    assert_eq!(first.started, report.pid);
    assert_eq!((first.finished, second.finished), (1, 1));
    assert_eq!(report.record.id, Some(42));
    assert!(!first.ticks.is_empty(), "no progress tick in ~1 s");
    let steps: Vec<u64> = first.ticks.iter().map(|t| t.steps).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    assert!(steps.iter().all(|s| *s <= 3));
}

#[test]
fn a_command_without_a_program_is_refused() {
    let (spec, _) = spec(Vec::new(), codex(), 5);
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.stats.slug, Some(FailureSlug::SpawnFailed));
    assert_eq!(report.exit_code, ExitCode::Usage);
}

/// A provider whose counter never returns from the line `HANG`.
struct Hanging;

struct HangingCounter;

impl ProviderPlugin for Hanging {
    fn manifest(&self) -> Manifest {
        Manifest::new("hanging", "1.0.0").unit("line", "every line", true)
    }

    fn open_counter(&self, _: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        Ok(Box::new(HangingCounter))
    }
}

impl StepCounter for HangingCounter {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        if line == b"HANG" {
            std::thread::sleep(Duration::from_secs(3600));
        }
        Ok(LineReport {
            steps_begun: 1,
            ..LineReport::default()
        })
    }

    fn finish(&mut self) -> CounterStats {
        CounterStats::default()
    }
}

#[test]
fn a_plugin_call_that_never_returns_is_abandoned_and_the_run_stopped() {
    let dir = Dir::new();
    let counter = counter_of(stepguard_plugin_api::provider_box(Hanging), "line");
    let (mut spec, _) = spec(
        dir.script("hang.sh", "echo one\nsleep 0.2\necho HANG\nsleep 300\n"),
        counter,
        10,
    );
    spec.clocks.plugin = Duration::from_millis(500);
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Plugin);
    assert_eq!(report.stats.slug, Some(FailureSlug::PluginError));
    let message = report.record.verdict.message.clone().unwrap_or_default();
    assert!(
        message.contains("did not return from a call within 500ms"),
        "{message}"
    );
    assert_eq!(report.stats.num_steps_computed, Some(1));
    assert!(!alive(report.pid.unwrap()));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn the_cgroup_or_the_walk_is_named_in_the_record() {
    let dir = Dir::new();
    let (mut spec, _) = spec(dir.items(1, "0"), codex(), 5);
    spec.confinement.containment = stepguard_runner::Containment::ProcessWalk;
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(
        report.record.supervision.containment.map(|t| t.as_str()),
        Some("process-walk")
    );
}

/// Never answers until the question is withdrawn; says what it saw.
struct NeverAnswers(std::sync::mpsc::Sender<&'static str>);

impl LimitPolicy for NeverAnswers {
    fn asks(&self) -> bool {
        true
    }

    fn decide(&mut self, _breach: &Breach, question: &Question) -> LimitDecision {
        while !question.withdrawn() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.send("withdrawn");
        // An answer after the withdrawal is ignored.
        LimitDecision::Unlimited
    }
}

#[test]
fn an_unanswered_question_gives_way_to_an_interrupt_and_is_withdrawn() {
    let dir = Dir::new();
    let (mut spec, _out) = spec(dir.items(10, "0.02"), codex(), 2);
    let (tx, rx) = std::sync::mpsc::channel();
    spec.limits.on_limit = Box::new(NeverAnswers(tx));
    let runner = Runner::new(spec);
    let interrupter = runner.interrupter();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        interrupter.interrupt(15);
    });
    let started = Instant::now();
    let report = runner.run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Interrupted);
    assert_eq!(report.stats.slug, Some(FailureSlug::Interrupted));
    assert!(report.decisions.is_empty(), "{:?}", report.decisions);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("withdrawn"));
    assert!(!alive(report.pid.unwrap()));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_unanswered_question_ends_at_the_ask_timeout_as_a_stop() {
    let dir = Dir::new();
    let (mut spec, _out) = spec(dir.items(10, "0.02"), codex(), 2);
    let (tx, rx) = std::sync::mpsc::channel();
    spec.limits.on_limit = Box::new(NeverAnswers(tx));
    spec.clocks.ask = Some(Duration::from_millis(300));
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::BudgetExceeded);
    assert_eq!(report.decisions, [LimitDecision::Stop]);
    assert_eq!(
        report.record.verdict.message.as_deref(),
        Some("no answer at the limit within 300ms; stopped")
    );
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("withdrawn"));
}

#[test]
fn output_that_stays_unrecognised_is_stopped_after_the_time_window() {
    // One line of text, then silence: the line rule never fires, the time rule does.
    let dir = Dir::new();
    let pidfile = dir.file("tool.pid");
    let body = format!(
        "sleep 300 & echo $! > {}\necho 'Reading prompt from stdin...'\nsleep 300",
        pidfile.display()
    );
    let (mut spec, out) = spec(dir.script("text.sh", &body), codex(), 5);
    spec.recognition.expects = "Codex JSONL".to_owned();
    spec.recognition.window.after = Duration::from_millis(400);
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Usage);
    assert_eq!(report.stats.slug, Some(FailureSlug::UnrecognizedStream));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("unrecognized")
    );
    let message = report.record.verdict.message.unwrap();
    assert!(
        message.contains("in the 400ms since its first line"),
        "{message}"
    );
    assert!(message.contains("expected Codex JSONL"), "{message}");
    assert_eq!(out.text(), "Reading prompt from stdin...\n");
    assert!(!alive(read_pid(&pidfile)));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_unrecognised_stream_can_be_let_through_with_a_warning() {
    let dir = Dir::new();
    let (mut warned, _out) = spec(dir.script("text.sh", "echo hello"), codex(), 5);
    warned.recognition.on_unrecognized = stepguard_runner::OnUnrecognized::Warn;
    let report = Runner::new(warned).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Success);
    let (stopped, _out) = spec(dir.script("text2.sh", "echo hello"), codex(), 5);
    let report = Runner::new(stopped).run(&mut []);
    assert_eq!(report.stats.slug, Some(FailureSlug::UnrecognizedStream));
    // The agent ended by itself: judged, not stopped.
    assert_eq!(report.terminated_by, None);
}

#[test]
fn an_agent_that_goes_quiet_is_stalled() {
    // One event, then silence while a tool it started sleeps on.
    let dir = Dir::new();
    let pidfile = dir.file("tool.pid");
    let body = format!(
        "sleep 300 & echo $! > {}\necho '{}'\nsleep 300",
        pidfile.display(),
        item(0)
    );
    let (mut spec, _out) = spec(dir.script("quiet.sh", &body), codex(), 5);
    spec.clocks.idle = Some(Duration::from_millis(500));
    let started = Instant::now();
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Timeout);
    assert_eq!(report.stats.slug, Some(FailureSlug::Stalled));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("idle")
    );
    assert_eq!(
        report.record.verdict.message.as_deref(),
        Some("no output from the agent for 500ms; stopped")
    );
    assert!(!alive(read_pid(&pidfile)));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_agent_that_never_starts_its_stream_is_a_startup_hang() {
    let dir = Dir::new();
    let (mut spec, _out) = spec(dir.script("hung.sh", "sleep 300"), codex(), 5);
    spec.meta.provider = "codex".to_owned();
    spec.clocks.startup = Some(Duration::from_millis(400));
    // Idle would also fire later; the startup timeout comes first.
    spec.clocks.idle = Some(Duration::from_secs(5));
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Timeout);
    assert_eq!(report.stats.slug, Some(FailureSlug::StartupHang));
    assert_eq!(
        report.record.verdict.terminated_by.map(|t| t.as_str()),
        Some("startup")
    );
    assert!(
        report
            .record
            .verdict
            .message
            .as_deref()
            .is_some_and(|m| m.contains("no recognised codex event from the agent within 400ms")),
        "{:?}",
        report.record.verdict.message
    );
    // A stream that starts in time is not a hang, however long it then takes.
    let (mut spec, _out) = self::spec(dir.items(3, "0.3"), codex(), 5);
    spec.clocks.startup = Some(Duration::from_millis(400));
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.exit_code, ExitCode::Success);
}

/// Takes its time, then allows plenty more steps.
struct SlowToAllow;

impl LimitPolicy for SlowToAllow {
    fn asks(&self) -> bool {
        true
    }

    fn decide(&mut self, _breach: &Breach, _question: &Question) -> LimitDecision {
        std::thread::sleep(Duration::from_millis(900));
        LimitDecision::Allow(100)
    }
}

#[test]
fn a_pause_at_the_limit_is_not_a_stall() {
    let dir = Dir::new();
    let (mut spec, _out) = spec(dir.items(4, "0.05"), codex(), 2);
    spec.limits.on_limit = Box::new(SlowToAllow);
    spec.clocks.idle = Some(Duration::from_millis(500));
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(
        report.exit_code,
        ExitCode::Success,
        "{:?}",
        report.record.verdict.message
    );
    assert_eq!(report.decisions, [LimitDecision::Allow(100)]);
}

#[test]
fn the_spec_adds_variables_to_the_agents_environment() {
    let dir = Dir::new();
    let seen = dir.file("seen.txt");
    let body = format!(
        "printf '%s' \"$TRACEPARENT\" > {}\necho '{}'",
        seen.display(),
        item(0)
    );
    let (mut spec, _out) = spec(dir.script("env.sh", &body), codex(), 5);
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    spec.io.env = vec![("TRACEPARENT".into(), parent.into())];
    let report = Runner::new(spec).run(&mut []);
    assert_eq!(report.child_exit, Some(ExitStatus::Code(0)));
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), parent);
}
