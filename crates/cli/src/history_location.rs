//! Where the run history (and the local ledger of pools) lives: `--db`/`STEPGUARD_DB`, else the
//! user's data directory, one history for every run of the user. A project database of the old
//! default location (`.stepguard/history.db` beside the config in effect, else in the working
//! directory) is imported into it once, and renamed `history.db.imported`.

use std::path::{Path, PathBuf};

use etcetera::BaseStrategy as _;

use crate::exit::UsageError;
use crate::output;

/// The history database of this invocation, with the project database to import first, if any.
pub(crate) struct HistoryLocation {
    /// The database.
    pub path: PathBuf,
    /// A project database at the old default location, not imported yet.
    pub legacy: Option<PathBuf>,
}

/// Finds the history database: `named` (`--db`/`STEPGUARD_DB`), else `stepguard/history.db` in
/// the user's data directory (`$XDG_DATA_HOME`, else `~/.local/share`). A relative data
/// directory (a relative HOME) would put the history in the working directory, a repository's to
/// fill: refused, naming the fix.
pub(crate) fn locate(
    named: Option<&Path>,
    project_dir: Option<&Path>,
    cwd: &Path,
) -> anyhow::Result<HistoryLocation> {
    if let Some(path) = named {
        return Ok(HistoryLocation {
            path: path.to_path_buf(),
            legacy: None,
        });
    }
    let data_dir = etcetera::choose_base_strategy()
        .ok()
        .map(|base| base.data_dir())
        .filter(|d| d.is_absolute())
        .ok_or_else(|| {
            UsageError(
                "cannot find the user's data directory for the run history (HOME and \
                 XDG_DATA_HOME are unset or relative): set one, or name a database with --db \
                 or STEPGUARD_DB"
                    .into(),
            )
        })?;
    let legacy = stepguard_store::legacy_location(project_dir, cwd);
    Ok(HistoryLocation {
        path: stepguard_store::default_location(None, &data_dir),
        legacy: legacy.is_file().then_some(legacy),
    })
}

impl HistoryLocation {
    /// Imports the project database, if there is one, saying so once on stderr; a failed import
    /// leaves the project database where it was and is a warning (the run is recorded anyway).
    pub(crate) fn import_legacy(&self) {
        let Some(old) = &self.legacy else { return };
        let imported =
            stepguard_store::Store::open(&self.path).and_then(|mut store| store.import_legacy(old));
        match imported {
            // Another stepguard imported it a moment ago, and said so.
            Ok(None) => {}
            Ok(Some(n)) => output::note(format!(
                "the run history now lives in {} (one for all your runs, so pools see them \
                 all): imported {n} run(s) from {}, renamed {}.{}",
                self.path.display(),
                old.display(),
                old.display(),
                stepguard_store::IMPORTED_SUFFIX
            )),
            Err(e) => output::diag(
                "warning",
                format!(
                    "cannot import the project history {} into {}: {e}; it stays where it is",
                    old.display(),
                    self.path.display()
                ),
            ),
        }
    }
}
