//! The fleet ledger's selection: `--ledger URL`, else `STEPGUARD_LEDGER_URL`, else `[ledger] url`
//! in the user's, system's or `STEPGUARD_POLICY` file, names a PostgreSQL database that every
//! host shares pools through (`stepguard-ledger-postgres`); without any, pools stay in the local
//! ledger. Its URL, passwords, TLS and faults are described in `docs/fleet.md`.

use std::time::Duration;

use stepguard_config::{ConfigModel, Origin};
use stepguard_ledger::{Ledger, LedgerError};
use stepguard_ledger_postgres::{Clock, PgLedger, PgOptions};

/// Environment variable naming the fleet ledger (a `postgres://` URL).
pub(crate) const URL_ENV: &str = "STEPGUARD_LEDGER_URL";

/// The flag naming the fleet ledger.
pub(crate) const URL_FLAG: &str = "--ledger";

/// The fleet ledger chosen, and where the choice came from.
#[derive(Clone, Debug)]
pub(crate) struct Fleet {
    /// Its URL, password and all: stepguard's alone.
    pub url: String,
    /// `--ledger`, `env STEPGUARD_LEDGER_URL` or the config key.
    pub origin: Origin,
}

impl Fleet {
    /// The URL without its password, for messages and `config`.
    pub(crate) fn shown(&self) -> String {
        shown(&self.url)
    }
}

/// The fleet ledger in effect: `flag` (`--ledger`), else `STEPGUARD_LEDGER_URL`, else the
/// config's `[ledger] url`; none when none names one (an empty value is none).
pub(crate) fn chosen(flag: Option<&str>, model: &ConfigModel) -> Option<Fleet> {
    let given = |u: &str| !u.trim().is_empty();
    if let Some(url) = flag.filter(|u| given(u)) {
        return Some(Fleet {
            url: url.to_owned(),
            origin: Origin::Flag(URL_FLAG.into()),
        });
    }
    if let Some(url) = crate::reexec::var(URL_ENV).filter(|u| given(u)) {
        return Some(Fleet {
            url,
            origin: Origin::Env(URL_ENV.into()),
        });
    }
    model.ledger.url.as_ref().map(|(url, origin)| Fleet {
        url: url.clone(),
        origin: origin.clone(),
    })
}

/// `url` with its password left out: the user's `:password` in a URL, and any `password=`
/// setting (a URL's query or libpq's `key=value` form) shown as `password=***`.
pub(crate) fn shown(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let head = match (head.find("://"), head.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = head[scheme + 3..at].split(':').next().unwrap_or_default();
            format!("{}{user}{}", &head[..scheme + 3], &head[at..])
        }
        _ => head.to_owned(),
    };
    let hide = |setting: &str, sep: char| -> String {
        setting
            .split(sep)
            .map(|kv| {
                if kv
                    .trim_start()
                    .to_ascii_lowercase()
                    .starts_with("password=")
                {
                    "password=***"
                } else {
                    kv
                }
            })
            .collect::<Vec<_>>()
            .join(&sep.to_string())
    };
    match query {
        Some(q) => format!("{head}?{}", hide(q, '&')),
        None if !head.contains("://") => hide(&head, ' '),
        None => head,
    }
}

/// Connects to the fleet ledger (the `PG*` variables and the passfile fill what the URL leaves
/// out), creating its tables when missing; leases and windows follow the database's clock.
pub(crate) fn open(url: &str, lease: Duration) -> Result<Box<dyn Ledger>, LedgerError> {
    let options = PgOptions {
        lease,
        clock: Clock::Database,
    };
    let ledger = PgLedger::connect_with(url, &|k| std::env::var(k).ok(), options)?;
    Ok(Box::new(ledger))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_url_has_no_password() {
        for (url, seen) in [
            (
                "postgres://fleet:hunter2@db.example:5432/l?sslmode=require",
                "postgres://fleet@db.example:5432/l?sslmode=require",
            ),
            ("postgres://fleet@db/l", "postgres://fleet@db/l"),
            (
                "postgresql://db/l?user=u&password=hunter2&sslmode=disable",
                "postgresql://db/l?user=u&password=***&sslmode=disable",
            ),
            (
                "host=db user=u password=hunter2 dbname=l",
                "host=db user=u password=*** dbname=l",
            ),
            ("postgres://a:b:c@db/l", "postgres://a@db/l"),
        ] {
            assert_eq!(shown(url), seen);
            assert!(!shown(url).contains("hunter2"));
        }
    }

    #[test]
    fn the_flag_beats_the_config() {
        let mut model = ConfigModel::default();
        model.ledger.url = Some((
            "postgres://u@file/l".into(),
            Origin::File {
                path: "/u/stepguard.toml".into(),
                key: "ledger.url".into(),
            },
        ));
        let flag = chosen(Some("postgres://u@flag/l"), &model).unwrap();
        assert_eq!(flag.url, "postgres://u@flag/l");
        assert_eq!(flag.origin, Origin::Flag("--ledger".into()));
        // An empty flag is none: the next source counts (the file, when the variable is unset).
        if crate::reexec::var(URL_ENV).is_none() {
            let file = chosen(Some(" "), &model).unwrap();
            assert_eq!(file.origin.label(), "ledger.url");
            assert!(chosen(None, &ConfigModel::default()).is_none());
        }
    }
}
