//! One module per subcommand; each exposes `run(…) -> anyhow::Result<ExitCode>`.

pub mod completions;
pub mod config;
pub mod count;
pub mod history;
pub mod plugin_template;
pub mod plugins;
pub mod prices;
pub mod run;
pub mod simulate;
pub mod validate;
