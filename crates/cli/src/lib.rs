//! The `stepguard` command-line tool.
//!
//! This crate is the thin shell around the libraries: it parses arguments ([`args`]), loads
//! configuration ([`settings`]), dispatches to one module per subcommand ([`commands`]), and maps
//! every outcome to the documented exit codes in one place ([`exit`]). Only this crate prints.
//!
//! ```no_run
//! std::process::exit(i32::from(stepguard_cli::run(["stepguard", "validate"]).code()));
//! ```
#![forbid(unsafe_code)]
// Everything but `main` and `run` is internal: `pub` inside says `pub(crate)`.
#![warn(unreachable_pub)]

mod args;
mod checkpointing;
mod commands;
mod exit;
mod history_location;
mod ledger;
mod ledger_pg;
mod output;
mod plan;
mod pool_outbox;
mod pools;
mod providers;
mod recording;
mod reexec;
mod repository;
mod session;
mod settings;
mod terminal;

use std::ffi::OsString;

use clap::{ColorChoice, CommandFactory as _, FromArgMatches as _};
use stepguard_core::ExitCode;
use stepguard_supervisor::guard;

use crate::args::{Cli, Command};

/// Plays the guardian of a run (see `stepguard_supervisor::guard`) and says how it ended, since
/// the supervising stepguard no longer can.
fn guardian(args: &[OsString]) -> ExitCode {
    match guard::guardian_main(args) {
        guard::GuardianEnd::Released => ExitCode::Success,
        guard::GuardianEnd::Stopped => {
            output::note(
                "guardian: the supervising stepguard is gone; the run's processes were stopped",
            );
            ExitCode::Success
        }
        guard::GuardianEnd::Unconfirmed { pids } => {
            let mut why = String::from(
                "guardian: the supervising stepguard is gone; the agent's process group and \
                 descendants were stopped, but without a cgroup a process that left them \
                 (given to another parent when stepguard died, such as a PID hopper in a new \
                 session) cannot be found, so the end is not confirmed (`--containment cgroup` \
                 confirms it)",
            );
            if !pids.is_empty() {
                let list: Vec<String> = pids.iter().map(u32::to_string).collect();
                why.push_str(&format!(
                    "; processes of the run in stepguard's own process group, which others \
                     share, survived (pids {})",
                    list.join(", ")
                ));
            }
            output::diag("warning", why);
            ExitCode::Success
        }
        guard::GuardianEnd::Survivors { pids, cgroup } => {
            let mut why = String::from("guardian: the supervising stepguard is gone; ");
            if !pids.is_empty() {
                let list: Vec<String> = pids.iter().map(u32::to_string).collect();
                why.push_str(&format!(
                    "processes of the run survived SIGKILL (pids {}; uninterruptible?)",
                    list.join(", ")
                ));
            }
            if let Some(dir) = cgroup {
                if !pids.is_empty() {
                    why.push_str("; ");
                }
                why.push_str(&format!("its cgroup {} is left behind", dir.display()));
            }
            output::diag("warning", why);
            // Nobody waits for the guardian's status (its supervisor is gone): the message is
            // what tells.
            ExitCode::Success
        }
    }
}

/// Runs the binary with the process's arguments.
pub fn main() -> std::process::ExitCode {
    // First of all: a run's API keys and model URLs out of this process's image.
    match reexec::seal(std::env::args_os().collect()) {
        Ok(argv) => exit::to_process(run(argv)),
        Err(e) => {
            output::diag("error", e.to_string());
            exit::to_process(ExitCode::Usage)
        }
    }
}

/// Runs stepguard with the given arguments and returns its exit code.
pub fn run<I, T>(argv: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    // The two helper roles `stepguard run` gives its own binary (see stepguard_supervisor::guard).
    match argv.get(1).and_then(|a| a.to_str()) {
        Some(guard::EXEC_ARG) => {
            let err = guard::exec_agent(&argv[2..]);
            output::diag("error", format!("cannot start the agent: {err}"));
            return ExitCode::Usage;
        }
        Some(guard::GUARDIAN_ARG) => return guardian(&argv[2..]),
        _ => {}
    }
    let cli = match parse(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::Usage
            } else {
                ExitCode::Success
            };
        }
    };
    output::set_color(cli.color);
    init_logging(cli.verbose);
    let config = cli.config.as_deref();
    let result = match &cli.command {
        _ if cli.ledger.is_some() && !uses_ledger(&cli.command) => Err(exit::UsageError(
            "--ledger: only `run`, `pools`, `config` and `validate` use the fleet ledger; this \
             command reads this host's history alone (fleet-wide `history`, `show` and `stats` \
             are not there yet); leave out --ledger"
                .into(),
        )
        .into()),
        Command::Config(a) => commands::config::run(&cli, a),
        Command::Validate(a) => commands::validate::run(&cli, config, a),
        Command::Run(a) => commands::run::run(&cli, a),
        Command::Resume(a) => commands::resume::run(&cli, a),
        Command::Count(a) => commands::count::run(&cli, a),
        Command::History(a) => commands::history::history(&cli, a),
        Command::Show(a) => commands::history::show(&cli, a),
        Command::Stats(a) => commands::history::stats(&cli, a),
        Command::Plugins(a) => commands::plugins::run(&cli, a),
        Command::Simulate(a) => commands::simulate::run(a),
        Command::Prices(a) => commands::prices::run(a),
        Command::Pools(a) => commands::pools::run(&cli, a),
        Command::Checkpoint(a) => commands::checkpoint::run(a),
        Command::Completions(a) => commands::completions::completions(a),
        Command::Man(a) => commands::completions::man(a),
    };
    match result {
        Ok(code) => code,
        Err(e) if output::is_broken_pipe(&e) => ExitCode::Success,
        Err(e) => {
            if cli.command.wants_json() {
                // Scripts that asked for JSON get JSON, on stdout, with the same exit code.
                let _ = output::json(&exit::error_object(&e));
            } else {
                output::diag("error", exit::render(&e));
            }
            exit::exit_code_for(&e)
        }
    }
}

/// Parses the arguments, with clap's own messages (usage errors, help) coloured as `--color` says.
/// Whether `command` uses the fleet ledger `--ledger` names: the others refuse the flag rather
/// than answer for this host alone as if for the fleet.
fn uses_ledger(command: &Command) -> bool {
    matches!(
        command,
        Command::Run(_) | Command::Pools(_) | Command::Config(_) | Command::Validate(_)
    )
}

fn parse(argv: Vec<OsString>) -> Result<Cli, clap::Error> {
    let mut command = Cli::command().color(color_arg(&argv));
    let mut matches = command.try_get_matches_from_mut(argv)?;
    Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut command))
}

/// Returns the `--color` given on the command line, read ahead of clap so that clap's own
/// messages follow it too; anything clap would refuse counts as `auto` here.
fn color_arg(argv: &[OsString]) -> ColorChoice {
    let mut choice = ColorChoice::Auto;
    let mut args = argv.iter().skip(1).map(|a| a.to_str().unwrap_or_default());
    while let Some(arg) = args.next() {
        let value = match arg {
            // The agent's own arguments follow `--`.
            "--" => break,
            "--color" => args.next(),
            _ => arg.strip_prefix("--color="),
        };
        choice = match value {
            Some("always") => ColorChoice::Always,
            Some("never") => ColorChoice::Never,
            Some("auto") => ColorChoice::Auto,
            _ => continue,
        };
    }
    choice
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(output::stderr_color())
        .with_writer(output::LogEvent::default)
        .with_target(false)
        .without_time()
        .try_init();
}
