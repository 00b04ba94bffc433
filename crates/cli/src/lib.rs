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

pub mod args;
pub mod commands;
pub mod exit;
pub mod output;
pub mod providers;
pub mod recording;
pub mod settings;
pub mod terminal;

use clap::Parser as _;
use stepguard_core::ExitCode;
use stepguard_supervisor::guard;

use crate::args::{Cli, Command};

/// Runs the binary with the process's arguments.
pub fn main() -> std::process::ExitCode {
    exit::to_process(run(std::env::args_os()))
}

/// Runs stepguard with the given arguments and returns its exit code.
pub fn run<I, T>(argv: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    // The two helper roles `stepguard run` gives its own binary (see stepguard_supervisor::guard).
    match argv.get(1).and_then(|a| a.to_str()) {
        Some(guard::EXEC_ARG) => {
            let err = guard::exec_agent(&argv[2..]);
            output::diag("error", format!("cannot start the agent: {err}"));
            return ExitCode::Usage;
        }
        Some(guard::GUARDIAN_ARG) => {
            if guard::guardian_main(&argv[2..]) {
                output::note(
                    "guardian: the supervising stepguard is gone; the run's processes were stopped",
                );
            }
            return ExitCode::Success;
        }
        _ => {}
    }
    let cli = match Cli::try_parse_from(argv) {
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
    init_logging(cli.verbose);
    let config = cli.config.as_deref();
    let result = match &cli.command {
        Command::Config(a) => commands::config::run(config, a),
        Command::Validate(a) => commands::validate::run(&cli, config, a),
        Command::Run(a) => commands::run::run(&cli, a),
        Command::Count(a) => commands::count::run(&cli, a),
        Command::History(a) => commands::history::history(&cli, a),
        Command::Show(a) => commands::history::show(&cli, a),
        Command::Stats(a) => commands::history::stats(&cli, a),
        Command::Plugins(a) => commands::plugins::run(&cli, a),
        Command::Simulate(a) => commands::simulate::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) if output::is_broken_pipe(&e) => ExitCode::Success,
        Err(e) => {
            if cli.command.wants_json() {
                // Scripts that asked for JSON get JSON, on stdout, with the same exit code.
                let _ = output::json(&exit::error_object(&e));
            } else {
                output::diag("error", format!("{e:#}"));
            }
            exit::exit_code_for(&e)
        }
    }
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}
