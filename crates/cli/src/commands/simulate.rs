//! `stepguard simulate SCENARIO.json`: the governor against a scripted model.

use anyhow::Context as _;
use stepguard_core::ExitCode;
use stepguard_governor::scenario;

use crate::args::SimulateArgs;
use crate::output;

/// Runs `stepguard simulate`.
pub(crate) fn run(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("cannot read {}", args.scenario.display()))?;
    let parsed = scenario::parse(&text).with_context(|| format!("{}", args.scenario.display()))?;
    let transcript = scenario::run(&parsed)?;
    output::line(serde_json::to_string_pretty(&transcript)?)?;
    if transcript["expectations"]["met"] == true {
        Ok(ExitCode::Success)
    } else {
        output::diag(
            "error",
            format!(
                "{}: expectations not met: {}",
                args.scenario.display(),
                transcript["expectations"]["mismatches"]
            ),
        );
        Ok(ExitCode::AgentFailed)
    }
}
