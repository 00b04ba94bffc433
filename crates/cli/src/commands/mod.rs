//! One module per subcommand; each exposes `run(…) -> anyhow::Result<ExitCode>`.

pub(crate) mod checkpoint;
pub(crate) mod completions;
pub(crate) mod config;
pub(crate) mod count;
pub(crate) mod history;
pub(crate) mod plugin_template;
pub(crate) mod plugins;
pub(crate) mod pools;
pub(crate) mod prices;
pub(crate) mod resume;
pub(crate) mod run;
pub(crate) mod simulate;
pub(crate) mod validate;
