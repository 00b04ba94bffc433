//! `stepguard prices`: the model prices a cost budget is kept with.

use std::io::Write as _;

use stepguard_core::ExitCode;
use stepguard_prices::BUILTIN_TOML;

use crate::args::PricesArgs;
use crate::output;

/// Runs `stepguard prices`: the shipped table as TOML (a template for `--prices` files), or with
/// `--json` every model of the table in effect.
pub(crate) fn run(args: &PricesArgs) -> anyhow::Result<ExitCode> {
    let table = crate::settings::price_table(args.prices.as_deref())?;
    if args.json {
        let models: Vec<_> = table.models().collect();
        output::json(&serde_json::json!({"taken": table.taken(), "models": models}))?;
        return Ok(ExitCode::Success);
    }
    if args.prices.is_some() {
        for p in table.models() {
            output::line(format!(
                "{}: ${}/Mtok in, ${}/Mtok out{} ({})",
                p.name(),
                p.input_per_mtok(),
                p.output_per_mtok(),
                p.cached_input_per_mtok()
                    .map(|c| format!(", ${c}/Mtok cached in"))
                    .unwrap_or_default(),
                p.origin()
            ))?;
        }
        return Ok(ExitCode::Success);
    }
    let mut out = std::io::stdout().lock();
    out.write_all(BUILTIN_TOML.as_bytes())?;
    out.flush()?;
    Ok(ExitCode::Success)
}
