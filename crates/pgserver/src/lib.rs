//! A throwaway PostgreSQL server for the tests and benchmarks of the fleet ledger.
//!
//! [`PgServer::start`] makes a fresh cluster with the installed server binaries (`initdb`,
//! `pg_ctl`; found in `STEPGUARD_PG_BIN`, else the newest `/usr/lib/postgresql/N/bin`, else
//! `PATH`) in a temporary directory under the directory it is given (the tests give one under
//! the cargo target directory; when the `postgres` account cannot reach it, as under root's
//! home, one in the system's temporary directory instead), listening on a free port of 127.0.0.1 only, with
//! `scram-sha-256` password authentication for every connection, so the password in
//! [`PgServer::url`] is really checked. Run as root, the cluster belongs to the `postgres` user
//! (PostgreSQL refuses to run as root) and the binaries run through `runuser`. Dropping the
//! server (also when a test panics) stops it at once and removes its directory.
//! [`PgServer::start_tls`] also serves TLS with a throwaway CA ([`PgServer::ca_pem_path`]).
//!
//! When the binaries are missing, [`PgServer::start`] says so and how to install them
//! ([`INSTALL_HINT`]); the tests that need a server are `#[ignore]`d (reported as skipped by a
//! plain `cargo nextest run`) and fail with that hint under `--run-ignored`. Test support only:
//! not part of the `stepguard` binary.
//!
//! ```no_run
//! let dir = tempfile::tempdir().unwrap();
//! let server = stepguard_pgserver::PgServer::start(dir.path()).unwrap();
//! assert!(server.url().starts_with("postgres://stepguard:"));
//! ```

mod tls;

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

/// How to get the server binaries, said whenever they are missing.
pub const INSTALL_HINT: &str = "install the PostgreSQL server (Debian: `apt-get install postgresql`; `.ci/run` does) or set STEPGUARD_PG_BIN to the directory holding initdb and pg_ctl; without `--run-ignored` the tests needing it are skipped";

/// The user name of the cluster's superuser, in every URL.
pub const USER: &str = "stepguard";

/// The account the server runs as when the tests run as root.
const SERVICE_ACCOUNT: &str = "postgres";

/// A running throwaway PostgreSQL cluster; stopped and removed when dropped.
#[derive(Debug)]
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    password: String,
    run_as: Option<&'static str>,
    running: bool,
    tls: bool,
}

impl PgServer {
    /// Makes and starts a cluster in a new directory under `parent`.
    pub fn start(parent: &Path) -> io::Result<Self> {
        Self::make(parent, false)
    }

    /// As [`PgServer::start`], also serving TLS with a certificate for 127.0.0.1 and localhost
    /// signed by a throwaway CA ([`PgServer::ca_pem_path`]).
    pub fn start_tls(parent: &Path) -> io::Result<Self> {
        Self::make(parent, true)
    }

    fn make(parent: &Path, tls: bool) -> io::Result<Self> {
        let bin = bin_dir()?;
        fs::create_dir_all(parent)?;
        let run_as = rustix::process::geteuid()
            .is_root()
            .then_some(SERVICE_ACCOUNT);
        let parent = reachable_parent(parent, run_as)?;
        reap_orphans(&parent, &bin, run_as);
        let dir = tempfile::Builder::new().prefix("pg-").tempdir_in(&parent)?;
        fs::write(dir.path().join("owner"), std::process::id().to_string())?;
        let mut server = PgServer {
            dir,
            bin,
            port: 0,
            password: fresh_password(),
            run_as,
            running: false,
            tls,
        };
        server.init()?;
        // A port found free can be taken before the server binds it: try a few.
        let mut last = None;
        for _ in 0..5 {
            server.port = free_port()?;
            server.configure()?;
            match server.start_again() {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("the server did not start")))
    }

    /// The URL of the cluster's `postgres` database, with the user and password.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/postgres",
            self.password, self.port
        )
    }

    /// The cluster's superuser password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate (PEM file) that signed the server's certificate, when serving TLS.
    pub fn ca_pem_path(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.path().join("ca.crt"))
    }

    /// A directory of the server's own for the test's files (a passfile, a CA), removed with it.
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    /// Stops the server at once (`immediate`: as a crash would, connections cut); the data stay.
    pub fn stop(&mut self) -> io::Result<()> {
        if !self.running {
            return Ok(());
        }
        self.running = false;
        let data = self.data_dir();
        self.pg_ctl(&["-D", path_str(&data)?, "-m", "immediate", "-w", "stop"])?;
        Ok(())
    }

    /// Starts the (stopped) server again on the same port, waiting until it takes connections.
    pub fn start_again(&mut self) -> io::Result<()> {
        if self.running {
            return Ok(());
        }
        let data = self.data_dir();
        let log = self.dir.path().join("server.log");
        let (data, log) = (path_str(&data)?, path_str(&log)?);
        match self.pg_ctl(&["-D", data, "-l", log, "-w", "-t", "60", "start"]) {
            Ok(_) => {
                self.running = true;
                Ok(())
            }
            Err(e) => {
                let tail =
                    fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
                Err(io::Error::other(format!("{e}; server log:\n{tail}")))
            }
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `initdb` with the password from a file and password authentication everywhere.
    fn init(&self) -> io::Result<()> {
        let root = self.dir.path();
        let scratch = self.scratch_dir();
        fs::create_dir(&scratch)?;
        let pwfile = root.join("pwfile");
        fs::write(&pwfile, format!("{}\n", self.password))?;
        if let Some(user) = self.run_as {
            let (uid, gid) = account_ids(user)?;
            for path in [root, scratch.as_path(), pwfile.as_path()] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
            }
        }
        let data = self.data_dir();
        let pw_arg = format!("--pwfile={}", path_str(&pwfile)?);
        self.run(
            "initdb",
            &[
                "-D",
                path_str(&data)?,
                "-U",
                USER,
                &pw_arg,
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        )?;
        fs::remove_file(&pwfile)?;
        if self.tls {
            tls::write(root, &data, self.run_as.map(account_ids).transpose()?)?;
        }
        Ok(())
    }

    /// Writes the settings of this start: the port, 127.0.0.1 only, no durability (a test
    /// cluster), enough connections for the concurrency tests, TLS when asked for.
    fn configure(&self) -> io::Result<()> {
        let mut conf = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nfull_page_writes = off\n\
             max_connections = 300\nshared_buffers = 32MB\n",
            self.port,
            path_str(self.dir.path())?
        );
        if self.tls {
            conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        }
        fs::write(self.data_dir().join("postgresql.auto.conf"), conf)?;
        if let Some(user) = self.run_as {
            let (uid, gid) = account_ids(user)?;
            std::os::unix::fs::chown(
                self.data_dir().join("postgresql.auto.conf"),
                Some(uid),
                Some(gid),
            )?;
        }
        Ok(())
    }

    fn pg_ctl(&self, args: &[&str]) -> io::Result<Output> {
        self.run("pg_ctl", args)
    }

    /// Runs one of the server binaries, as the service account when we are root.
    fn run(&self, program: &str, args: &[&str]) -> io::Result<Output> {
        let exe = self.bin.join(program);
        let mut cmd = match self.run_as {
            Some(user) => {
                let mut c = as_user();
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("PGDATA")
            .output()?;
        if out.status.success() {
            return Ok(out);
        }
        Err(io::Error::other(format!(
            "{program} {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Nothing can be reported from a drop; the directory goes with `TempDir` either way.
        let _ = self.stop();
    }
}

/// `parent`, unless the service account cannot reach it (a target directory under root's
/// home, mode 700): then a `stepguard-pg` directory in the system's temporary directory.
fn reachable_parent(parent: &Path, run_as: Option<&str>) -> io::Result<PathBuf> {
    let Some(user) = run_as else {
        return Ok(parent.to_path_buf());
    };
    let reachable = as_user()
        .args(["-u", user, "--", "test", "-x"])
        .arg(parent)
        .status()
        .is_ok_and(|s| s.success());
    if reachable {
        return Ok(parent.to_path_buf());
    }
    let fallback = std::env::temp_dir().join("stepguard-pg");
    fs::create_dir_all(&fallback)?;
    Ok(fallback)
}

/// Stops and removes the servers of test processes that died without dropping theirs (killed
/// by a timeout): their directories name a process that is gone.
fn reap_orphans(parent: &Path, bin: &Path, run_as: Option<&str>) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let is_ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("pg-"));
        let Some(owner) = fs::read_to_string(dir.join("owner"))
            .ok()
            .filter(|_| is_ours)
        else {
            continue;
        };
        if Path::new("/proc").join(owner.trim()).exists() {
            continue;
        }
        let data = dir.join("data");
        let mut cmd = match run_as {
            Some(user) => {
                let mut c = as_user();
                c.args(["-u", user, "--"]).arg(bin.join("pg_ctl"));
                c
            }
            None => Command::new(bin.join("pg_ctl")),
        };
        // A server that is not running makes pg_ctl fail: nothing to stop then.
        let _ = cmd
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = fs::remove_dir_all(&dir);
    }
}

/// A command starting with `runuser` (util-linux), found in PATH or in the system directories
/// a root PATH has but a CI runner's may not (`/usr/sbin`, `/sbin`).
fn as_user() -> Command {
    let in_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let found = in_path
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/usr/sbin"), Path::new("/sbin")])
        .map(|d| d.join("runuser"))
        .find(|p| p.is_file());
    Command::new(found.unwrap_or_else(|| PathBuf::from("runuser")))
}

/// Finds the directory of `initdb` and `pg_ctl`.
pub fn bin_dir() -> io::Result<PathBuf> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("STEPGUARD_PG_BIN").map(PathBuf::from) {
        return if has_both(&dir) {
            Ok(dir)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "STEPGUARD_PG_BIN={} holds no initdb and pg_ctl; {INSTALL_HINT}",
                    dir.display()
                ),
            ))
        };
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, d)| has_both(d))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| has_both(d))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("PostgreSQL server binaries (initdb, pg_ctl) not found; {INSTALL_HINT}"),
            )
        })
}

/// Whether the server binaries are installed (for benchmarks that skip without them).
pub fn available() -> bool {
    bin_dir().is_ok()
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// A password unlike any other server's, with characters a URL carries as they are.
fn fresh_password() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("pw{:x}{:x}", nanos, std::process::id())
}

fn account_ids(user: &str) -> io::Result<(u32, u32)> {
    let id = |flag: &str| -> io::Result<u32> {
        let out = Command::new("id").args([flag, user]).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                io::Error::other(format!(
                    "no account {user:?} to run PostgreSQL as (root cannot)"
                ))
            })
    };
    Ok((id("-u")?, id("-g")?))
}

fn path_str(p: &Path) -> io::Result<&str> {
    p.to_str()
        .ok_or_else(|| io::Error::other(format!("path {} is not UTF-8", p.display())))
}

/// Makes a file readable by its owner only (the server refuses a key others can read).
fn owner_only(path: &Path) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Started under a directory the service account cannot enter (mode 700, as root's home),
    /// the server still starts, elsewhere; it takes TCP connections, and is gone when dropped.
    #[test]
    #[ignore = "needs PostgreSQL's server binaries (initdb, pg_ctl): run with --run-ignored all, as .ci/run does"]
    fn a_server_starts_takes_connections_and_is_removed_when_dropped() {
        let closed = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(closed.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let server = PgServer::start(&closed.path().join("target")).expect("a server");
        let dir = server.dir.path().to_path_buf();
        if rustix::process::geteuid().is_root() {
            assert!(!dir.starts_with(closed.path()), "{}", dir.display());
        }
        assert!(std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, server.port())).is_ok());
        let port = server.port();
        drop(server);
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err());
    }
}
