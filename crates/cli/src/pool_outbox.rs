//! End-of-run pool charges the fleet ledger did not take (it was away when the run ended),
//! kept in a directory beside the history database (`history.db.pool-charges/`, one JSON file
//! per run) and charged by the next stepguard that opens that fleet ledger. A charge is named
//! by the run's key and its sequence number, which the ledger takes once: a file charged again
//! (its removal lost) charges nothing twice. The files name the ledger without its password.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use stepguard_ledger::{ChargeKey, Ledger, RunKey, Usage};

/// The directory of pending charges beside the history database at `history`.
pub(crate) fn dir(history: &Path) -> PathBuf {
    let mut name = history.file_name().unwrap_or_default().to_os_string();
    name.push(".pool-charges");
    history.with_file_name(name)
}

/// One charge waiting for its ledger.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Pending {
    /// The ledger it is owed to, as it describes itself (a URL without its password).
    ledger: String,
    run: String,
    seq: u64,
    tokens: u64,
    cost_micros: u64,
    steps: u64,
}

/// Keeps the charge `key` of `usage` owed to the ledger named `ledger` in the outbox beside
/// `history`; returns the file.
pub(crate) fn keep(
    history: &Path,
    ledger: &str,
    key: &ChargeKey,
    usage: Usage,
) -> std::io::Result<PathBuf> {
    let dir = dir(history);
    std::fs::create_dir_all(&dir)?;
    let pending = Pending {
        ledger: ledger.to_owned(),
        run: key.run.as_str().to_owned(),
        seq: key.seq,
        tokens: usage.tokens,
        cost_micros: usage.cost_micros,
        steps: usage.steps,
    };
    let name: String = format!("{}-{}", key.run.as_str(), key.seq)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let file = dir.join(format!("{name}.json"));
    // Written whole, then renamed: a replay never reads half a file.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(&pending)?)?;
    std::fs::rename(&tmp, &file)?;
    Ok(file)
}

/// Charges every pending charge owed to `ledger` and removes its file, and lets its run leave
/// the pools; returns how many runs had charges taken (a run may have kept more than one: an end
/// charge and a live charge whose answer never came). One the ledger refuses stays for the next time;
/// files owed to another ledger (another [`Ledger::describe`]) are left alone.
pub(crate) fn replay(history: &Path, ledger: &dyn Ledger) -> usize {
    let name = ledger.describe();
    let Ok(entries) = std::fs::read_dir(dir(history)) else {
        return 0;
    };
    let mut charged = std::collections::BTreeSet::new();
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(pending) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Pending>(&b).ok())
        else {
            continue;
        };
        if pending.ledger != name {
            continue;
        }
        let key = ChargeKey {
            run: RunKey::new(pending.run),
            seq: pending.seq,
        };
        let usage = Usage {
            tokens: pending.tokens,
            cost_micros: pending.cost_micros,
            steps: pending.steps,
        };
        let now = SystemTime::now();
        let done = ledger
            .charge(&key, usage, now)
            .and_then(|_| ledger.leave(&key.run, now));
        match done {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                charged.insert(key.run.as_str().to_owned());
            }
            Err(e) => tracing::debug!(file = %path.display(), "pending pool charge kept: {e}"),
        }
    }
    charged.len()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use stepguard_ledger::sqlite::SqliteLedger;
    use stepguard_ledger::{Admission, PoolLimits, PoolSpec, Window};

    use super::*;

    #[test]
    fn a_kept_charge_is_charged_once_by_its_own_ledger_only() {
        let tmp = tempfile::tempdir().unwrap();
        let history = tmp.path().join("history.db");
        let ledger = SqliteLedger::with_lease(&history, Duration::from_secs(30)).unwrap();
        let pool = PoolSpec {
            name: "p".into(),
            limits: PoolLimits {
                max_tokens: Some(1000),
                ..PoolLimits::default()
            },
            window: Window::parse("none", None).unwrap(),
        };
        let run = RunKey::new("host/boot/1/2");
        let now = SystemTime::now();
        assert!(matches!(
            ledger.join(&run, std::slice::from_ref(&pool), now).unwrap(),
            Admission::Admitted(_)
        ));
        let key = ChargeKey { run, seq: 1 };
        let usage = Usage {
            tokens: 300,
            ..Usage::default()
        };
        let name = ledger.describe();
        let file = keep(&history, &name, &key, usage).unwrap();
        assert!(file.starts_with(dir(&history)));
        // Another ledger's charge stays.
        let other = ChargeKey {
            run: RunKey::new("elsewhere"),
            seq: 1,
        };
        let theirs = keep(&history, "postgres://u@b/l", &other, usage).unwrap();
        assert_eq!(replay(&history, &ledger), 1);
        assert!(!file.exists() && theirs.exists());
        // Kept again (as if its removal were lost) and replayed: charged once.
        keep(&history, &name, &key, usage).unwrap();
        assert_eq!(replay(&history, &ledger), 1);
        assert_eq!(replay(&history, &ledger), 0);
        let status = ledger.status(&[pool], SystemTime::now()).unwrap();
        assert_eq!(status[0].measures[0].charged, 300, "{status:?}");
    }
}
