//! `stepguard completions SHELL` and `stepguard man`: generated from the argument definitions, so
//! they never drift from `--help`.

use std::io::Write as _;

use anyhow::Context as _;
use clap::CommandFactory as _;
use stepguard_core::ExitCode;

use crate::args::{Cli, CompletionsArgs, ManArgs};
use crate::output;

/// Runs `stepguard completions SHELL`: the completion script on stdout.
pub(crate) fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "stepguard", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(ExitCode::Success)
}

/// Runs `stepguard man`: `stepguard.1` on stdout, or with `--out-dir DIR` that page and one per
/// subcommand (`stepguard-run.1`, …) written into DIR, each named on stderr.
pub(crate) fn man(args: &ManArgs) -> anyhow::Result<ExitCode> {
    let command = Cli::command();
    let Some(dir) = &args.out_dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(command).render(&mut page)?;
        let mut out = std::io::stdout().lock();
        out.write_all(&page)?;
        out.flush()?;
        return Ok(ExitCode::Success);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("cannot write man pages to {}", dir.display()))?;
    output::note(format!("man pages written to {}", dir.display()));
    Ok(ExitCode::Success)
}
