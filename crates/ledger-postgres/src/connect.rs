//! Where the ledger is and how to reach it: the URL, the standard `PG*` variables, a passfile,
//! TLS through rustls, and a bound on how long connecting may take.
//!
//! libpq's rules, as far as they go here: a setting in the URL wins over its variable
//! (`PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`, `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGPASSFILE`, `PGCONNECT_TIMEOUT`, `PGAPPNAME`); the password comes from the URL, else
//! `PGPASSWORD`, else the passfile (`passfile=` in the URL, else `PGPASSFILE`, else
//! `~/.pgpass`), whose first matching `host:port:database:user:password` line is taken. Where
//! stepguard is stricter than libpq: TLS always verifies the server's certificate and name
//! (`sslmode=require` means what `verify-full` does; the roots are `sslrootcert`, else the
//! system's), a passfile readable by others is refused rather than skipped, and a server is
//! always named (no default socket).

use std::error::Error;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use postgres::{Client, Config, NoTls};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::passfile;

/// How long connecting may take, unless the URL (`connect_timeout`) or `PGCONNECT_TIMEOUT`
/// says otherwise: TCP, TLS and authentication together.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The environment as connecting reads it (tests give their own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Why the ledger could not be reached: what to say, and the driver's error.
#[derive(Debug)]
pub(crate) struct ConnectError {
    pub(crate) reason: String,
    pub(crate) source: Option<Box<dyn Error + Send + Sync>>,
}

impl ConnectError {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            source: None,
        }
    }

    fn with(reason: impl Into<String>, source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            reason: reason.into(),
            source: Some(source.into()),
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// A resolved connection target: the driver's configuration, TLS, and the bound.
#[derive(Clone)]
pub(crate) struct Target {
    config: Config,
    tls: Option<rustls::ClientConfig>,
    timeout: Duration,
    describe: String,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("ledger", &self.describe)
            .field("tls", &self.tls.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The settings stepguard reads itself before the driver parses the rest of the URL.
#[derive(Debug, Default)]
struct OwnParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    passfile: Option<String>,
}

impl Target {
    /// Resolves `url` (a `postgres://` URL or libpq's `key=value` form) with the environment.
    pub(crate) fn resolve(url: &str, env: Env<'_>) -> Result<Self, ConnectError> {
        let (rest, own) = split_own_params(url)?;
        let rest = match env("PGPORT") {
            Some(port) => with_default_port(&rest, &port)?,
            None => rest,
        };
        let mut config = Config::from_str(&rest).map_err(|e| {
            ConnectError::with(
                "the ledger URL is not valid; write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                e,
            )
        })?;
        fill_from_env(&mut config, env)?;
        let timeout = match config.get_connect_timeout() {
            Some(t) => *t,
            None => match env("PGCONNECT_TIMEOUT") {
                Some(v) => parse_timeout(&v)?,
                None => DEFAULT_CONNECT_TIMEOUT,
            },
        };
        // The TCP part of the bound; the whole of it is kept by `connect`.
        config.connect_timeout(timeout);
        config.tcp_user_timeout(Duration::from_secs(10));
        config.keepalives_idle(Duration::from_secs(10));
        config.keepalives_interval(Duration::from_secs(3));
        config.keepalives_retries(3);
        if config.get_application_name().is_none() {
            config.application_name(&env("PGAPPNAME").unwrap_or_else(|| "stepguard".into()));
        }
        if config.get_password().is_none() {
            password_from_passfile(&mut config, own.passfile.as_deref(), env)?;
        }
        let mode = own.sslmode.or_else(|| env("PGSSLMODE"));
        let tls = tls_for(
            &mut config,
            mode.as_deref(),
            own.sslrootcert.or_else(|| env("PGSSLROOTCERT")),
        )?;
        let describe = describe(&config);
        Ok(Target {
            config,
            tls,
            timeout,
            describe,
        })
    }

    /// The ledger as messages name it: the URL without its password.
    pub(crate) fn describe(&self) -> &str {
        &self.describe
    }

    /// The bound on connecting.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Connects within the bound: TCP, TLS and authentication together. The driver bounds only
    /// the TCP part, so the rest runs on a thread of its own that is left behind if the server
    /// never answers (it ends with the TCP keepalives, or the process).
    pub(crate) fn connect(&self) -> Result<Client, ConnectError> {
        let (tx, rx) = mpsc::channel();
        let config = self.config.clone();
        let tls = self.tls.clone();
        std::thread::Builder::new()
            .name("stepguard-pg-connect".into())
            .spawn(move || {
                let result = match tls {
                    Some(tls) => config.connect(MakeRustlsConnect::new(tls)),
                    None => config.connect(NoTls),
                };
                // The receiver may have given up: then nobody wants the answer.
                let _ = tx.send(result);
            })
            .map_err(|e| ConnectError::with("could not start a thread to connect", e))?;
        match rx.recv_timeout(self.timeout) {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(explain(e)),
            Err(_) => Err(ConnectError::new(format!(
                "no answer within {} s (connect_timeout); check that the server is up and reachable",
                self.timeout.as_secs_f64()
            ))),
        }
    }
}

/// Takes out of the URL's query the settings the driver does not know (`sslrootcert`,
/// `passfile`) or that stepguard reads its own way (`sslmode`).
fn split_own_params(url: &str) -> Result<(String, OwnParams), ConnectError> {
    let mut own = OwnParams::default();
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if !is_url {
        if url.contains("://") {
            return Err(ConnectError::new(format!(
                "the ledger URL must start with postgres:// or postgresql:// (got {})",
                redact(url)
            )));
        }
        return Ok((url.to_owned(), own));
    }
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), own));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|e| ConnectError::with(format!("the URL's {key} is not UTF-8"), e))?
            .into_owned();
        match key {
            "sslmode" => own.sslmode = Some(decoded),
            "sslrootcert" => own.sslrootcert = Some(decoded),
            "passfile" => own.passfile = Some(decoded),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, own))
}

/// Fills what the URL left out from `PGHOST`, `PGPORT`, `PGUSER` (else `USER`), `PGDATABASE`,
/// `PGPASSWORD`.
fn fill_from_env(config: &mut Config, env: Env<'_>) -> Result<(), ConnectError> {
    if config.get_hosts().is_empty() {
        let host = env("PGHOST").ok_or_else(|| {
            ConnectError::new("the ledger URL names no server; write postgres://USER@HOST:PORT/DATABASE or set PGHOST")
        })?;
        for h in host.split(',') {
            config.host(h);
        }
    }
    if config.get_ports().is_empty()
        && let Some(port) = env("PGPORT")
    {
        config.port(parse_port(&port)?);
    }
    if config.get_user().is_none() {
        let user = env("PGUSER").or_else(|| env("USER")).ok_or_else(|| {
            ConnectError::new(
                "the ledger URL names no user; write postgres://USER@HOST/DATABASE or set PGUSER",
            )
        })?;
        config.user(&user);
    }
    if config.get_dbname().is_none()
        && let Some(db) = env("PGDATABASE")
    {
        config.dbname(&db);
    }
    if config.get_password().is_none()
        && let Some(pw) = env("PGPASSWORD")
    {
        config.password(pw);
    }
    Ok(())
}

fn parse_port(port: &str) -> Result<u16, ConnectError> {
    port.parse()
        .map_err(|_| ConnectError::new(format!("PGPORT={port} is not a port number")))
}

/// Gives each host of a URL that names no port the port of `PGPORT` (the driver would give
/// 5432, and a URL's port must still win over the variable).
fn with_default_port(url: &str, port: &str) -> Result<String, ConnectError> {
    parse_port(port)?;
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return Ok(url.to_owned());
    };
    let tail = &url[scheme_end..];
    let end = tail.find(['/', '?']).unwrap_or(tail.len());
    let authority = &tail[..end];
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if hosts.is_empty() {
        return Ok(url.to_owned());
    }
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|h| {
            let has_port = h.rsplit_once(']').map_or(h, |(_, rest)| rest).contains(':');
            if has_port {
                h.to_owned()
            } else {
                format!("{h}:{port}")
            }
        })
        .collect();
    Ok(format!(
        "{}{userinfo}{}{}",
        &url[..scheme_end],
        hosts.join(","),
        &tail[end..]
    ))
}

fn parse_timeout(v: &str) -> Result<Duration, ConnectError> {
    match v.trim().parse::<u64>() {
        // libpq: zero (or less) waits forever; a ledger never does, so zero is the default.
        Ok(0) => Ok(DEFAULT_CONNECT_TIMEOUT),
        Ok(s) => Ok(Duration::from_secs(s.max(2))),
        Err(_) => Err(ConnectError::new(format!(
            "PGCONNECT_TIMEOUT={v} is not a number of seconds"
        ))),
    }
}

/// Takes the password from the passfile, when one exists and has a matching line.
fn password_from_passfile(
    config: &mut Config,
    named: Option<&str>,
    env: Env<'_>,
) -> Result<(), ConnectError> {
    let explicit = named
        .map(PathBuf::from)
        .or_else(|| env("PGPASSFILE").map(PathBuf::from));
    let path = match (&explicit, env("HOME")) {
        (Some(p), _) => p.clone(),
        (None, Some(home)) => Path::new(&home).join(".pgpass"),
        (None, None) => return Ok(()),
    };
    let text = match passfile::read(&path) {
        Ok(t) => t,
        // A default passfile that is not there is no passfile; a named one must be there.
        Err(e) if e.kind() == io::ErrorKind::NotFound && explicit.is_none() => return Ok(()),
        Err(e) => {
            return Err(ConnectError::with(
                format!("cannot read the passfile {}: {e}", path.display()),
                e,
            ));
        }
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => String::new(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default().to_owned();
    let db = config
        .get_dbname()
        .map_or_else(|| user.clone(), str::to_owned);
    if let Some(pw) = passfile::lookup(&text, &host, &port, &db, &user) {
        config.password(pw);
    }
    Ok(())
}

/// Chooses TLS from `sslmode`: `disable` none, `prefer` (the default) when the server offers
/// it, `require`, `verify-ca` and `verify-full` always; whenever TLS is used, the certificate
/// and the host name are verified against `sslrootcert`, else the system's roots.
fn tls_for(
    config: &mut Config,
    mode: Option<&str>,
    rootcert: Option<String>,
) -> Result<Option<rustls::ClientConfig>, ConnectError> {
    let mode = match mode.unwrap_or("prefer") {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" | "verify-ca" | "verify-full" => SslMode::Require,
        other => {
            return Err(ConnectError::new(format!(
                "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
            )));
        }
    };
    config.ssl_mode(mode);
    if mode == SslMode::Disable {
        return Ok(None);
    }
    let mut roots = RootCertStore::empty();
    match rootcert {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(&path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    ConnectError::with(format!("cannot read sslrootcert {path}: {e}"), e)
                })?;
            if certs.is_empty() {
                return Err(ConnectError::new(format!(
                    "sslrootcert {path} holds no PEM certificate"
                )));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    ConnectError::with(format!("sslrootcert {path} has a bad certificate"), e)
                })?;
            }
        }
        None => {
            // Certificates the system cannot parse are left out, as the gateway does.
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::with("cannot set up TLS", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(tls))
}

/// Says why connecting failed, in words that name the fix.
fn explain(e: postgres::Error) -> ConnectError {
    let reason = match e.as_db_error() {
        Some(db) if db.code().code().starts_with("28") => format!(
            "the server refused the login ({}); check the user and the password (URL, PGPASSWORD or the passfile)",
            db.message()
        ),
        Some(db) if db.code().code() == "3D000" => format!(
            "{}; create the database or name another in the URL",
            db.message()
        ),
        Some(db) => format!("the server refused the connection: {}", db.message()),
        None => {
            let chain = source_chain(&e);
            if chain.contains("certificate") || chain.contains("tls") || chain.contains("TLS") {
                format!(
                    "the TLS handshake failed ({chain}); trust the server's CA with sslrootcert=PATH, or sslmode=disable on a trusted network"
                )
            } else {
                format!(
                    "cannot connect ({chain}); check that the server is up and the host and port are right"
                )
            }
        }
    };
    ConnectError::with(reason, e)
}

/// An error and its causes as one line (the driver's own text is often just "db error").
pub(crate) fn source_chain(e: &(dyn Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// `postgres://user@host:port/db`: what messages and records may show.
fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(
            config
                .get_ports()
                .iter()
                .copied()
                .chain(std::iter::repeat(5432)),
        )
        .map(|(h, p)| match h {
            Host::Tcp(h) => format!("{h}:{p}"),
            Host::Unix(path) => format!("{}:{p}", path.display()),
        })
        .collect();
    let user = config.get_user().unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{}/{db}", hosts.join(","))
}

/// A URL with any password replaced, for an error about the URL itself.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_url_wins_over_the_variables_and_the_password_is_never_described() {
        let env = env_of(&[
            ("PGHOST", "db.invalid"),
            ("PGUSER", "other"),
            ("PGPASSWORD", "envpw"),
        ]);
        let t = Target::resolve(
            "postgres://alice:s3cret@127.0.0.1:6543/ledger?sslmode=disable",
            &env,
        )
        .unwrap();
        assert_eq!(t.describe(), "postgres://alice@127.0.0.1:6543/ledger");
        assert_eq!(t.config.get_password(), Some(&b"s3cret"[..]));
        assert!(t.tls.is_none());
        assert_eq!(t.timeout(), DEFAULT_CONNECT_TIMEOUT);
    }

    #[test]
    fn the_variables_fill_what_the_url_leaves_out() {
        let env = env_of(&[
            ("PGHOST", "10.9.8.7"),
            ("PGPORT", "6000"),
            ("PGUSER", "bob"),
            ("PGDATABASE", "fleet"),
            ("PGPASSWORD", "envpw"),
            ("PGSSLMODE", "disable"),
            ("PGCONNECT_TIMEOUT", "7"),
        ]);
        let t = Target::resolve("postgres://", &env).unwrap();
        assert_eq!(t.describe(), "postgres://bob@10.9.8.7:6000/fleet");
        assert_eq!(t.config.get_password(), Some(&b"envpw"[..]));
        assert_eq!(t.timeout(), Duration::from_secs(7));
    }

    #[test]
    fn bad_urls_and_settings_name_the_fix() {
        let none = env_of(&[]);
        let cases = [
            ("mysql://u:p@h/db", "must start with postgres://"),
            (
                "postgres://u@h/db?sslmode=sometimes",
                "sslmode=sometimes is not one of",
            ),
            (
                "postgres://u@h/db?frobnicate=1",
                "write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            ),
            ("postgres://u@/db", "names no server"),
            (
                "postgres://u@h/db?sslrootcert=/nonexistent/ca.pem",
                "cannot read sslrootcert /nonexistent/ca.pem",
            ),
            (
                "postgres://u@h/db?passfile=/nonexistent/pgpass",
                "cannot read the passfile /nonexistent/pgpass",
            ),
        ];
        for (url, want) in cases {
            let e = Target::resolve(url, &none).unwrap_err();
            assert!(e.reason.contains(want), "{url}: {}", e.reason);
        }
        let e = Target::resolve("postgres://h/db", &none).unwrap_err();
        assert!(e.reason.contains("names no user"), "{}", e.reason);
        let port = env_of(&[("PGPORT", "6001")]);
        let t = Target::resolve("postgres://u@h/db?sslmode=disable", &port).unwrap();
        assert_eq!(t.describe(), "postgres://u@h:6001/db");
        let t = Target::resolve("postgres://u@h:6002/db?sslmode=disable", &port).unwrap();
        assert_eq!(t.describe(), "postgres://u@h:6002/db");
        let bad_port = env_of(&[("PGPORT", "lots")]);
        let e = Target::resolve("postgres://u@h/db", &bad_port).unwrap_err();
        assert!(
            e.reason.contains("PGPORT=lots is not a port number"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn the_passfile_gives_the_password_only_when_none_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(
            &path,
            "# comment\nother:*:*:*:wrong\n127.0.0.1:6543:ledger:alice:from\\:file\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let url = format!(
            "postgres://alice@127.0.0.1:6543/ledger?sslmode=disable&passfile={}",
            path.display()
        );
        let none = env_of(&[]);
        let t = Target::resolve(&url, &none).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"from:file"[..]));
        let with_pw = url.replace("alice@", "alice:inurl@");
        let t = Target::resolve(&with_pw, &none).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"inurl"[..]));
    }

    #[test]
    fn redact_hides_the_password() {
        assert_eq!(redact("postgres://u:pw@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
