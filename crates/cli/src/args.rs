//! Command-line arguments of `stepguard`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use stepguard_core::ExitCode;

/// One step budget for every coding agent CLI.
#[derive(Debug, Parser)]
#[command(name = "stepguard", version, about, after_long_help = exit_codes_help(), after_help = exit_codes_help())]
pub(crate) struct Cli {
    /// Use exactly this config file instead of discovering stepguard.toml files.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Load provider plugins from this directory (repeatable; searched before
    /// STEPGUARD_PLUGIN_PATH, the user data dir and the `plugins/` dir beside the executable).
    #[arg(long, global = true, value_name = "DIR")]
    pub plugin_dir: Vec<PathBuf>,

    /// The history database, where the local ledger of pools is too (default:
    /// stepguard/history.db in the user's data directory, $XDG_DATA_HOME or ~/.local/share).
    /// `history`, `show` and `stats` need it to exist; `run` creates it, but only in a
    /// directory that exists.
    #[arg(long, global = true, value_name = "PATH", env = "STEPGUARD_DB")]
    pub db: Option<PathBuf>,

    /// The fleet ledger (a PostgreSQL URL) that keeps the pools, over STEPGUARD_LEDGER_URL and
    /// `[ledger] url` (docs/fleet.md). It is stepguard's: never given to the agent, and hidden
    /// from the run's command line.
    #[arg(long, global = true, value_name = "URL")]
    pub ledger: Option<String>,

    /// Let a plugin file replace a built-in provider of the same name (named in the run record).
    #[arg(long, global = true)]
    pub allow_override: bool,

    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// When to colour stderr: auto (a terminal, and NO_COLOR unset), always, never.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = clap::ColorChoice::Auto)]
    pub color: clap::ColorChoice,

    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
// Parsed once per process: the size of `run`'s arguments costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    /// Show the effective budget, where it came from, provider options and warnings.
    Config(ConfigArgs),
    /// Check every config file in effect; exit 0 when valid, 2 otherwise.
    Validate(ValidateArgs),
    /// Run an agent CLI under a step budget: pass its output through, count steps, stop it.
    #[command(after_help = exit_codes_help(), after_long_help = exit_codes_help())]
    Run(RunArgs),
    /// Resume a recorded run's session with the agent CLI's own resume, in the run's directory,
    /// with its provider, flags and pools, under a new step budget.
    #[command(after_help = exit_codes_help(), after_long_help = exit_codes_help())]
    Resume(ResumeArgs),
    /// Count the steps of recorded provider streams.
    Count(CountArgs),
    /// List recorded runs, newest first.
    History(HistoryArgs),
    /// Show one recorded run in full.
    Show(ShowArgs),
    /// Figures over recorded runs: success rate, failure slugs, steps, tokens and cost per run,
    /// budget suggestions.
    Stats(StatsArgs),
    /// List provider plugins, or explain whether a plugin file loads.
    Plugins(PluginsArgs),
    /// Run the agent-loop governor against a scripted scenario and print the JSON transcript
    /// (exit 0 when its expectations are met, 1 when not).
    Simulate(SimulateArgs),
    /// Print where the prices `--max-cost-usd` uses come from (genai-prices' bundled data, its
    /// version and date) and a template for a `--prices` file; with MODEL names, what each
    /// costs; every model as JSON with `--json`.
    Prices(PricesArgs),
    /// Each pool of the config: spent and cap per limit, runs now in it, when the window frees
    /// what.
    Pools(PoolsArgs),
    /// The checkpoints of the repository here (`run --checkpoint git`): list them, or put one's
    /// work tree back.
    Checkpoint(CheckpointArgs),
    /// Print a shell completion script on stdout (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout, or write one page per command into a directory.
    Man(ManArgs),
}

impl Command {
    /// Returns true when the command was asked for JSON output (`--json`).
    pub(crate) fn wants_json(&self) -> bool {
        match self {
            Command::Config(a) => a.json,
            Command::Count(a) => a.json,
            Command::History(a) => a.json,
            Command::Show(a) => a.json,
            Command::Stats(a) => a.json,
            Command::Plugins(a) => a.json,
            Command::Prices(a) => a.json,
            Command::Pools(a) => a.json,
            Command::Checkpoint(a) => {
                matches!(&a.command, CheckpointCommand::List { json: true, .. })
            }
            Command::Completions(_) | Command::Man(_) => false,
            Command::Validate(a) => a.json,
            Command::Run(_) | Command::Resume(_) | Command::Simulate(_) => false,
        }
    }
}

/// Whether a run that does not succeed saves its work tree (`--checkpoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CheckpointKind {
    /// A commit on `refs/stepguard/runs/ID` in the repository the run works in.
    Git,
    /// No checkpoint.
    None,
}

/// Arguments of `stepguard checkpoint`.
#[derive(Debug, Args)]
pub(crate) struct CheckpointArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CheckpointCommand,
}

/// The subcommands of `stepguard checkpoint`.
#[derive(Debug, Subcommand)]
pub(crate) enum CheckpointCommand {
    /// The repository's checkpoints, newest first: id, date, commit, how the run ended.
    List {
        /// The repository (default: the current directory).
        #[arg(long, short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print a JSON array on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Put the work tree of run ID's checkpoint back: its files are written and tracked files
    /// it does not hold are removed; HEAD, the index and the branches stay as they are.
    Restore {
        /// The run's id (`stepguard checkpoint list`), or its ref.
        id: String,
        /// The repository (default: the current directory).
        #[arg(long, short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Restore even over changes of the work tree that are in no commit.
        #[arg(long)]
        force: bool,
    },
}

/// What to do when the budget is exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OnLimit {
    /// Stop the agent's whole process tree.
    Stop,
    /// Pause the agent and ask on the terminal (stop, allow N more, continue); `stop` without one.
    Ask,
}

/// What to do with a stream none of which is recognised as the provider's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Unrecognized {
    /// Stop the agent (slug `unrecognized_stream`, exit 2): nothing could be counted.
    Stop,
    /// Warn once and let the run go on uncounted.
    Warn,
}

/// How the agent's processes are contained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ContainmentArg {
    /// A cgroup of the run's own when possible, else the process walk.
    Auto,
    /// A cgroup of the run's own, or the run does not start (exit 2).
    Cgroup,
    /// Process group, subreaper and the /proc walk only.
    ProcessWalk,
}

/// Where the agent's standard input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StdinMode {
    /// stepguard's own standard input.
    Inherit,
    /// /dev/null (Codex reads stdin to EOF and would wait on an open pipe).
    Null,
}

/// Arguments of `stepguard run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Provider whose step mapping applies (see `stepguard plugins`).
    #[arg(long, short = 'p', value_name = "P")]
    pub provider: String,
    /// Budget flags.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Step unit (default: `[P] max_steps_unit` from the config, else the provider's default).
    #[arg(long, value_name = "U")]
    pub unit: Option<String>,
    /// Loop detection.
    #[command(flatten)]
    pub loops: LoopArgs,
    /// Stop the agent after this long (e.g. 90s, 30m, 1h30m; at most 30 days); exit 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// Stop the agent when it prints nothing for this long: slug `stalled`, exit 124 (default:
    /// off, since an agent waiting on a long build or test is silent legitimately).
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub idle_timeout: Option<Duration>,
    /// Stop the agent when none of its output is recognised as the provider's stream this long
    /// after the start: slug `startup_hang`, exit 124 (a CLI starting MCP servers can take a
    /// minute before its first event; hung startups last hours).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_timeout)]
    pub startup_timeout: Duration,
    /// Time between SIGTERM and SIGKILL when stopping the agent (at most 1h).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_grace)]
    pub grace: Duration,
    /// What to do at the limit.
    #[arg(long, value_enum, default_value_t = OnLimit::Stop)]
    pub on_limit: OnLimit,
    /// With `--on-limit ask`: how long the prompt waits for an answer before stopping the agent.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_timeout)]
    pub ask_timeout: Duration,
    /// Put a model gateway on 127.0.0.1 between the agent and its model: the budget's last
    /// model call goes out without tools, so the agent ends by itself with a summary, and no
    /// call past the budget reaches the model (default: `[run] wrap_up` from the config).
    #[arg(long, overrides_with = "no_wrap_up")]
    pub wrap_up: bool,
    /// No model gateway, whatever the config says.
    #[arg(long, overrides_with = "wrap_up")]
    pub no_wrap_up: bool,
    /// With the gateway: the shares of each limit (steps, tokens, cost, a pool's share, the
    /// time before `--timeout`) at which the next model call tells the model what is left,
    /// ascending in (0, 1), e.g. `0.5,0.8`; `off` for none; `every` (debugging): every call
    /// carries `system notice: this is step X of Y` (default: `STEPGUARD_NOTICES`, else `[run]
    /// notices` from the config, else 0.5,0.8,0.95).
    #[arg(long, value_name = "LIST", value_parser = stepguard_config::notices::parse)]
    pub notices: Option<stepguard_config::notices::NoticeSetting>,
    /// A price file laid over genai-prices' bundled data for `--max-cost-usd`: stepguard's TOML
    /// (`stepguard prices` prints a template) or genai-prices' JSON data (also
    /// `STEPGUARD_PRICES`).
    #[arg(long, value_name = "FILE", env = "STEPGUARD_PRICES")]
    pub prices: Option<PathBuf>,
    /// With the gateway: write every model request to DIR as JSON, credentials removed (for
    /// debugging; nothing is stored otherwise).
    #[arg(long, value_name = "DIR")]
    pub record_requests: Option<PathBuf>,
    /// Skip the provider's check of the agent command line (e.g. `codex exec` without `--json`).
    #[arg(long)]
    pub no_preflight: bool,
    /// What to do when the agent's output cannot be counted as the provider's stream: none of
    /// it recognised, no event within the provider's first-event time, nothing at all and exit
    /// 0, or mostly not the provider's after a recognised start (default: `[run]
    /// unrecognized_stream` from the config, else `stop`).
    #[arg(long, value_enum, value_name = "WHAT")]
    pub unrecognized: Option<Unrecognized>,
    /// The agent's standard input.
    #[arg(long, value_enum, default_value_t = StdinMode::Inherit)]
    pub stdin: StdinMode,
    /// How the agent's processes are contained: `auto` (a cgroup v2 of the run's own when
    /// stepguard may create one, else the process walk), `cgroup` (or refuse to start), or
    /// `process-walk`.
    #[arg(long, value_enum, default_value_t = ContainmentArg::Auto, value_name = "HOW")]
    pub containment: ContainmentArg,
    /// Do not pass the budget to the provider CLI's own limit (e.g. Claude's --max-turns).
    #[arg(long)]
    pub no_native_limit: bool,
    /// No live status line.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Do not record the run in the history database.
    #[arg(long)]
    pub no_record: bool,
    /// When the run does not succeed, save its work tree as a commit on
    /// `refs/stepguard/runs/ID` without touching HEAD, the index or any branch (`git`), or not
    /// (`none`) (default: `[run] checkpoint`, else none).
    #[arg(long, value_enum, value_name = "KIND")]
    pub checkpoint: Option<CheckpointKind>,
    /// Also join this pool (a `[pools.NAME]` of the config; repeatable), besides the pools
    /// whose `match` the run meets.
    #[arg(long = "pool", value_name = "NAME")]
    pub pools: Vec<String>,
    /// When a pool's concurrency cap is full, wait up to DUR (e.g. 5m) for a slot instead of
    /// refusing the run (`pool_busy`).
    #[arg(long, value_name = "DUR", value_parser = parse_timeout)]
    pub wait_for_pool: Option<std::time::Duration>,
    /// Also write the run's summary as one JSON object to this file.
    #[arg(long, value_name = "PATH")]
    pub summary_file: Option<PathBuf>,
    /// The agent command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
    /// The history id of the run this one resumes (set by `stepguard resume`, never a flag).
    #[arg(skip)]
    pub resumed_from: Option<i64>,
}

/// Arguments of `stepguard resume`.
#[derive(Debug, Args)]
pub(crate) struct ResumeArgs {
    /// The run to resume (see `stepguard history`).
    pub id: i64,
    /// The step budget of the whole chain (the runs this one resumes and itself): the resumed
    /// run gets what the chain has left.
    #[arg(long, value_name = "N", conflicts_with = "more_steps")]
    pub max_steps: Option<u32>,
    /// The resumed run's own step budget (default: the resumed run's budget again).
    #[arg(long, value_name = "N")]
    pub more_steps: Option<u32>,
    /// What the agent is told (default: its budget was reached; finish what is left). Needed
    /// to resume a run that succeeded.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Stop the resumed agent after this long, as `run --timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// No live status line.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Print the `stepguard run` the resume makes (one argument a line) and exit, running
    /// nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Arguments of `stepguard history`.
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// Only the N newest runs.
    #[arg(long, value_name = "N", global = true)]
    pub last: Option<usize>,
    /// Only this provider.
    #[arg(long, value_name = "P", global = true)]
    pub provider: Option<String>,
    /// Only this task type.
    #[arg(long, value_name = "T", global = true)]
    pub task_type: Option<String>,
    /// Only runs in this git repository: its remote URL or top-level path as recorded, or `.`
    /// for the repository of the working directory.
    #[arg(long, value_name = "REPO", global = true)]
    pub repo: Option<String>,
    /// Only runs whose working directory was DIR (relative to the working directory).
    #[arg(long, value_name = "DIR", global = true)]
    pub dir: Option<PathBuf>,
    /// Only runs that did not succeed.
    #[arg(long, global = true)]
    pub failed: bool,
    /// Print a JSON array on stdout.
    #[arg(long)]
    pub json: bool,
    /// `export`: the recorded runs as JSON Lines, or to an OpenTelemetry collector (the filters
    /// may come before or after `export`).
    #[command(subcommand)]
    pub action: Option<HistoryAction>,
}

/// Subcommands of `stepguard history`.
#[derive(Debug, Subcommand)]
pub(crate) enum HistoryAction {
    /// Write the recorded runs (oldest first; the filters apply) as JSON Lines of run records
    /// on stdout, or with `--otlp` replay them to the collector OTEL_EXPORTER_OTLP_ENDPOINT (or
    /// `[telemetry]`) names, one span each with the run's own times.
    Export {
        /// Replay to the OTLP collector instead of writing JSON Lines.
        #[arg(long)]
        otlp: bool,
    },
}

/// Arguments of `stepguard show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The run's id (see `stepguard history`).
    pub id: i64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `stepguard stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Only this provider.
    #[arg(long, value_name = "P")]
    pub provider: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `stepguard simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// The scenario file (format: docs/scenarios.md).
    pub scenario: PathBuf,
}

/// Arguments of `stepguard count`.
#[derive(Debug, Args)]
pub(crate) struct CountArgs {
    /// Provider whose step mapping applies (see `stepguard plugins`).
    #[arg(long, short = 'p', value_name = "P")]
    pub provider: String,
    /// Step unit (default: `[P] max_steps_unit` from the config, else the provider's default).
    #[arg(long, value_name = "U")]
    pub unit: Option<String>,
    /// Loop detection (loops are reported, nothing is stopped).
    #[command(flatten)]
    pub loops: LoopArgs,
    /// Print one JSON object per file on stdout.
    #[arg(long)]
    pub json: bool,
    /// Stream files to count; `-` reads stdin.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
}

/// Arguments of `stepguard plugins`.
#[derive(Debug, Args)]
pub(crate) struct PluginsArgs {
    /// What to do; without one, list every provider.
    #[command(subcommand)]
    pub action: Option<PluginsAction>,
    /// Print a JSON array on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Subcommands of `stepguard plugins`.
#[derive(Debug, Subcommand)]
pub(crate) enum PluginsAction {
    /// Explain whether and why a plugin file loads (exit 0 when it does, 4 otherwise).
    Check {
        /// The plugin file.
        path: PathBuf,
    },
    /// Write a ready-to-build provider plugin crate: Cargo.toml, src/lib.rs with a unit and
    /// tests, a sample stream and a README with the build and install commands.
    New {
        /// The provider's name, as given to `--provider` (lowercase letters, digits, `-`, `_`).
        name: String,
        /// Where to create the crate (default: ./stepguard-plugin-NAME); must not exist or be
        /// empty.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Depend on a local checkout of stepguard-plugin-api (its directory) instead of the
        /// release's git tag.
        #[arg(long, value_name = "PATH")]
        api_path: Option<PathBuf>,
    },
}

/// Flags that decide a run's budget, shared by every command that resolves one.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct BudgetArgs {
    /// Step budget for this run: a whole number, or `unlimited` (beats env and config).
    // Negative numbers reach the budget parser, which says why they are refused.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_steps: Option<String>,
    /// Deprecated spelling of --max-steps.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_turns: Option<String>,
    /// Token budget for this run: input + output tokens, cached input included; a whole number,
    /// or `unlimited` (beats STEPGUARD_MAX_TOKENS and config; default: none).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_tokens: Option<String>,
    /// Cost budget for this run in US dollars, e.g. 2.50 (at most 4 decimals), or `unlimited`
    /// (beats STEPGUARD_MAX_COST_USD and config; default: none).
    #[arg(long, value_name = "USD", allow_negative_numbers = true)]
    pub max_cost_usd: Option<String>,
    /// Task type whose `[task_types.T]` budget applies.
    #[arg(long, value_name = "T", env = "STEPGUARD_TASK_TYPE")]
    pub task_type: Option<String>,
    /// Profile (smoke, strict, fast, yolo, or one defined in [profiles.NAME]).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
}

/// The loop-limit flag, shared by `run`, `count` and `config`.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct LoopArgs {
    /// The loop limit (see `loop_limit_help`).
    // Validated with the other sources of the limit, which say where a bad value came from.
    #[arg(long, value_name = "N|off", allow_negative_numbers = true, help = loop_limit_help())]
    pub loop_limit: Option<String>,
}

fn loop_limit_help() -> String {
    format!(
        "Loop limit: the same tool call N times within the last `[loops] window` calls (default \
         {}), or a short cycle of calls repeated N times, is a loop; `run` stops the agent (slug \
         `loop_detected`, exit 3). A whole number from 2, or `off` (default: \
         STEPGUARD_LOOP_LIMIT, else the config, else the profile's, else {}; a profile's limit \
         is also an upper bound)",
        stepguard_core::loops::LoopSettings::DEFAULT_WINDOW,
        stepguard_core::loops::DEFAULT_LOOP_LIMIT
    )
}

/// Arguments of `stepguard config`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// Budget flags, as `run` takes them.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// The loop-limit flag, as `run` takes it.
    #[command(flatten)]
    pub loops: LoopArgs,
    /// Show only this provider's options (and the pools a run of it would join).
    #[arg(long, value_name = "P")]
    pub provider: Option<String>,
    /// The pools a run would join with `--pool NAME` too.
    #[arg(long = "pool", value_name = "NAME")]
    pub pools: Vec<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `stepguard pools`.
#[derive(Debug, Args)]
pub(crate) struct PoolsArgs {
    /// Print a JSON array on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `stepguard validate`.
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Treat every warning as an error.
    #[arg(long)]
    pub strict: bool,
    /// Print one JSON object on stdout: `valid`, `files`, `errors` and `warnings` (each problem
    /// with `file`, `key`, `message`).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `stepguard prices`.
#[derive(Debug, Args)]
pub(crate) struct PricesArgs {
    /// A price file laid over genai-prices' bundled data: stepguard's TOML, or genai-prices'
    /// JSON data, which replaces the bundled data (also `STEPGUARD_PRICES`).
    #[arg(long, value_name = "FILE", env = "STEPGUARD_PRICES")]
    pub prices: Option<PathBuf>,
    /// Every model with its prices, source and origin, as JSON (only the MODELs named, if any).
    #[arg(long)]
    pub json: bool,
    /// Models to price, as an agent reports them (e.g. `claude-opus-4-8`); one unpriced is an
    /// error (exit 2).
    #[arg(value_name = "MODEL")]
    pub models: Vec<String>,
}

/// Arguments of `stepguard completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `stepguard man`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Write stepguard.1 and one page per subcommand (stepguard-run.1, …) into this directory
    /// instead of printing stepguard.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// The longest `--timeout`: a month is beyond any agent run, and far from overflowing a clock.
const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest `--grace`.
const MAX_GRACE: Duration = Duration::from_secs(3600);

/// Parses a humane duration no longer than `max`; `zero_ok` says whether 0 is meaningful.
fn parse_duration(text: &str, max: Duration, zero_ok: bool) -> Result<Duration, String> {
    let bare = text.trim();
    if !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "`{text}` has no unit; add a unit: {bare}s (seconds) or {bare}m (minutes)"
        ));
    }
    let d: Duration = humantime::parse_duration(bare).map_err(|e| {
        // humantime's own words ("expected number at 0") mean little to someone typing a flag.
        let why = match e {
            humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
                " (it has no unit)".to_owned()
            }
            humantime::DurationError::UnknownUnit { unit, .. } => {
                format!(" (unknown unit `{unit}`)")
            }
            humantime::DurationError::NumberOverflow => " (the number is too large)".to_owned(),
            _ => String::new(),
        };
        format!("`{text}` is not a duration{why}; write e.g. 90s, 30m or 1h30m")
    })?;
    if d.is_zero() && !zero_ok {
        return Err(format!(
            "`{text}` is zero; give a positive duration such as 30m"
        ));
    }
    if d > max {
        return Err(format!(
            "`{text}` is longer than the maximum of {}",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    parse_duration(text, MAX_TIMEOUT, false)
}

fn parse_grace(text: &str) -> Result<Duration, String> {
    parse_duration(text, MAX_GRACE, true)
}

fn exit_codes_help() -> String {
    let mut s = String::from("Exit codes:\n");
    for code in ExitCode::ALL {
        s.push_str(&format!("  {:>3}  {}\n", code.code(), code.meaning()));
    }
    s
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_are_checked_before_anything_runs() {
        assert_eq!(parse_timeout("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_grace("0s"), Ok(Duration::ZERO));
        assert!(parse_timeout("0s").unwrap_err().contains("is zero"));
        assert!(
            parse_timeout("18446744073709551615s")
                .unwrap_err()
                .contains("`18446744073709551615s`")
        );
        assert!(
            parse_grace("2h")
                .unwrap_err()
                .contains("longer than the maximum of 1h")
        );
        assert!(
            parse_timeout("abc")
                .unwrap_err()
                .contains("`abc` is not a duration")
        );
        // A bare number names the fix.
        assert_eq!(
            parse_timeout("10").unwrap_err(),
            "`10` has no unit; add a unit: 10s (seconds) or 10m (minutes)"
        );
        assert_eq!(
            parse_grace(" 0 ").unwrap_err(),
            "` 0 ` has no unit; add a unit: 0s (seconds) or 0m (minutes)"
        );
    }
}
