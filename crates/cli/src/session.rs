//! What a command builds once from the global flags: the config files in effect, the provider
//! registry (on first use), every limit of a run, and where the run history lives.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use stepguard_config::LoadedConfig;
use stepguard_plugin_host::{Needed, Registry};

use crate::args::{BudgetArgs, Cli};
use crate::settings::{self, Limits};
use crate::{history_location, providers};

/// One command's view of the config files and plugins, built once and shared by its steps.
pub(crate) struct Session<'c> {
    cli: &'c Cli,
    /// The config files in effect, merged, policy included.
    pub config: LoadedConfig,
    registry: OnceCell<Registry>,
}

impl<'c> Session<'c> {
    /// A session over config already loaded (for a plan made in a test).
    #[cfg(test)]
    pub(crate) fn with_config(cli: &'c Cli, config: LoadedConfig) -> Self {
        Session {
            cli,
            config,
            registry: OnceCell::new(),
        }
    }

    /// Loads the config files in effect (`--config`, else discovery, and the policy files).
    pub(crate) fn load(cli: &'c Cli) -> anyhow::Result<Self> {
        Ok(Session {
            cli,
            config: settings::load_config(cli.config.as_deref())?,
            registry: OnceCell::new(),
        })
    }

    /// Resolves every limit of a run from `budget`'s flags, `--loop-limit` (`loop_limit`), the
    /// environment and the config files.
    pub(crate) fn limits(
        &self,
        budget: &BudgetArgs,
        loop_limit: Option<&str>,
    ) -> anyhow::Result<Limits> {
        Limits::resolve(budget, loop_limit, &self.config.model)
    }

    /// Returns the providers: the built-in ones and every plugin found, loaded on first use (so
    /// a bad limit is reported before any warning about plugins, as a user reads a command line).
    /// After [`Session::registry_for`] it is the providers that one loaded: a run of a built-in
    /// provider opens no plugin file, so its checks know the built-in providers only.
    pub(crate) fn registry(&self) -> &Registry {
        self.registry
            .get_or_init(|| load_registry(self.cli, &self.config, Needed::All))
    }

    /// Returns the providers a command of provider `name` needs, loaded on first use: no plugin
    /// file is opened when `name` is built in and may not be replaced.
    pub(crate) fn registry_for(&self, name: &str) -> &Registry {
        self.registry
            .get_or_init(|| load_registry(self.cli, &self.config, Needed::Provider(name)))
    }

    /// Returns the price table in effect: genai-prices' bundled data, with `--prices FILE`
    /// (`file`) over it.
    pub(crate) fn price_table(
        &self,
        file: Option<&Path>,
    ) -> anyhow::Result<stepguard_prices::PriceTable> {
        settings::price_table(file)
    }

    /// Whether the history database was named (`--db` or `STEPGUARD_DB`) rather than found.
    pub(crate) fn named_db(&self) -> bool {
        self.cli.db.is_some()
    }

    /// Where pools are kept: the fleet ledger `--ledger`, `STEPGUARD_LEDGER_URL` or
    /// `[ledger] url` names (none: the local ledger), and `[ledger] on_ledger_error`.
    pub(crate) fn ledger_choice(&self) -> crate::ledger::Choice {
        crate::ledger::Choice {
            fleet: crate::ledger_pg::chosen(self.cli.ledger.as_deref(), &self.config.model),
            on_error: self.config.model.ledger.on_error.clone(),
        }
    }

    /// Returns the run history database (where the local ledger of pools is too): `--db` /
    /// `STEPGUARD_DB`, else the user's data directory, after importing a project database of
    /// the old default location (beside the config file in effect, else in `cwd`) once.
    pub(crate) fn history_db(&self, cwd: &Path) -> anyhow::Result<PathBuf> {
        let location = history_location::locate(
            self.cli.db.as_deref(),
            self.config.project_dir().as_deref(),
            cwd,
        )?;
        location.import_legacy();
        Ok(location.path)
    }
}

/// Loads the providers for `config`: the built-in ones and the plugins of `--plugin-dir` and the
/// search path, a plugin replacing a built-in one only with consent (see
/// [`settings::allow_override`]). `validate` loads them this way for config it checks itself.
pub(crate) fn load_registry(cli: &Cli, config: &LoadedConfig, needed: Needed<'_>) -> Registry {
    let allow = settings::allow_override(config, cli.allow_override);
    providers::load_registry(&cli.plugin_dir, allow, needed)
}
