//! `stepguard checkpoint list` and `stepguard checkpoint restore ID`: the checkpoints
//! `run --checkpoint git` left in the repository here ([`stepguard_checkpoint`]).

use std::time::Instant;

use stepguard_checkpoint::Settings;
use stepguard_core::ExitCode;

use crate::args::{CheckpointArgs, CheckpointCommand};
use crate::output;

/// Runs `stepguard checkpoint`.
pub(crate) fn run(args: &CheckpointArgs) -> anyhow::Result<ExitCode> {
    // Not a run's end: nothing waits on it, so git gets the time a large restore needs.
    let settings = Settings {
        bound: std::time::Duration::from_secs(600),
        ..Settings::default()
    };
    let here = std::env::current_dir()?;
    let deadline = Instant::now() + settings.bound;
    match &args.command {
        CheckpointCommand::List { dir, json } => {
            let repo =
                stepguard_checkpoint::open(dir.as_deref().unwrap_or(&here), &settings, deadline)?;
            let listed = repo.list()?;
            if *json {
                let rows: Vec<serde_json::Value> = listed
                    .iter()
                    .map(|l| {
                        serde_json::json!({
                            "id": l.id,
                            "ref": format!("{}{}", stepguard_checkpoint::REF_PREFIX, l.id),
                            "commit": l.commit,
                            "date": l.date,
                            "subject": l.subject,
                        })
                    })
                    .collect();
                output::json(&rows)?;
            } else if listed.is_empty() {
                output::note("no checkpoints in this repository");
            } else {
                for l in &listed {
                    let short = l.commit.get(..12).unwrap_or(&l.commit);
                    output::line(format!("{:<28} {}  {short}  {}", l.id, l.date, l.subject))?;
                }
            }
        }
        CheckpointCommand::Restore { id, dir, force } => {
            let repo =
                stepguard_checkpoint::open(dir.as_deref().unwrap_or(&here), &settings, deadline)?;
            let reference = repo.restore(id, *force)?;
            output::note(format!(
                "restored the work tree of {reference} in {} (HEAD and the index are as they were: `git status` shows the run's changes)",
                repo.top().display()
            ));
        }
    }
    Ok(ExitCode::Success)
}
