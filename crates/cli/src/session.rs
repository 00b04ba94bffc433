//! What a command builds once from the global flags: the config files in effect, the provider
//! registry (on first use), every limit of a run, and where the run history lives.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use stepguard_config::LoadedConfig;
use stepguard_plugin_host::Registry;

use crate::args::{BudgetArgs, Cli};
use crate::providers;
use crate::settings::{self, Limits};

/// One command's view of the config files and plugins, built once and shared by its steps.
pub struct Session<'c> {
    cli: &'c Cli,
    /// The config files in effect, merged, policy included.
    pub config: LoadedConfig,
    registry: OnceCell<Registry>,
}

impl<'c> Session<'c> {
    /// Loads the config files in effect (`--config`, else discovery, and the policy files).
    pub fn load(cli: &'c Cli) -> anyhow::Result<Self> {
        Ok(Session {
            cli,
            config: settings::load_config(cli.config.as_deref())?,
            registry: OnceCell::new(),
        })
    }

    /// Resolves every limit of a run from `budget`'s flags, `--loop-limit` (`loop_limit`), the
    /// environment and the config files.
    pub fn limits(&self, budget: &BudgetArgs, loop_limit: Option<&str>) -> anyhow::Result<Limits> {
        Limits::resolve(budget, loop_limit, &self.config.model)
    }

    /// Returns the providers: the built-in ones and the plugins found, loaded on first use (so a
    /// bad limit is reported before any warning about plugins, as a user reads a command line).
    pub fn registry(&self) -> &Registry {
        self.registry.get_or_init(|| {
            let allow = settings::allow_override(&self.config, self.cli.allow_override);
            providers::load_registry(&self.cli.plugin_dir, allow)
        })
    }

    /// Returns the run history database: `--db` / `STEPGUARD_DB`, else beside the config file in
    /// effect, else in `cwd`.
    pub fn history_db(&self, cwd: &Path) -> PathBuf {
        stepguard_store::default_location(
            self.cli.db.as_deref(),
            self.config.project_dir().as_deref(),
            cwd,
        )
    }
}
