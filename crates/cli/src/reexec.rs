//! Keeps the API keys and the model upstream out of stepguard's own process image, where an
//! agent running as the same user could read them (`/proc/PID/environ`, `/proc/PID/cmdline`).
//!
//! Before a run, stepguard makes itself non-dumpable (`PR_SET_DUMPABLE` 0: its `environ`, `mem`
//! and `fd` in `/proc` are closed to the same user) and, when its environment or arguments hold
//! something secret, executes itself again in place (the same pid): the secret variables
//! ([`is_secret`]) are left out of the new image's environment, arguments that carry a URL and
//! the fleet ledger's `--ledger` value are shown as `<hidden>` in its command line, and the
//! whole original command line and those variables travel in a memfd that the new image reads,
//! then empties. The variables are then
//! held in memory ([`moved`], [`var`]) and given to the agent, where the model gateway replaces
//! the key and the base URL with the run's own.

use std::ffi::{OsStr, OsString};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::process::CommandExt as _;
use std::sync::OnceLock;

/// The first argument of the image stepguard executes itself as: `__stepguard-sealed FD ARGS…`.
pub(crate) const SEALED_ARG: &str = "__stepguard-sealed";

/// What an argument carrying a URL is shown as in the new image's command line.
const HIDDEN: &str = "<hidden>";

/// Environment variables, in order.
type Vars = Vec<(OsString, OsString)>;

/// The variables moved out of the process's environment, held for the agent.
static MOVED: OnceLock<Vars> = OnceLock::new();

/// Why the sealed image could not read what its predecessor passed it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SealError {
    /// The memfd could not be opened or read.
    #[error("cannot read the run's sealed arguments (fd {fd}): {source}")]
    Read {
        /// The descriptor named on the command line.
        fd: String,
        /// Why.
        source: std::io::Error,
    },
    /// Its contents are not what stepguard writes.
    #[error("the run's sealed arguments are malformed; `{SEALED_ARG}` is stepguard's own")]
    Malformed,
}

/// The variables moved out of stepguard's environment (empty when nothing was moved).
pub(crate) fn moved() -> Vars {
    MOVED.get().cloned().unwrap_or_default()
}

/// Variables that are stepguard's alone: moved out of its image and never given to the agent
/// (the fleet ledger's URL, with its password: an agent holding it could rewrite its pools).
const STEPGUARDS_OWN: &[&str] = &["STEPGUARD_LEDGER_URL"];

/// The moved variables the agent gets back: all but [`STEPGUARDS_OWN`].
pub(crate) fn for_agent() -> Vars {
    let mut vars = moved();
    vars.retain(|(k, _)| !STEPGUARDS_OWN.iter().any(|own| k == own));
    vars
}

/// A variable of stepguard's environment as it was given, moved or not.
pub(crate) fn var(name: &str) -> Option<String> {
    MOVED
        .get()
        .and_then(|moved| moved.iter().rev().find(|(k, _)| k == name))
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .or_else(|| std::env::var(name).ok())
}

/// Whether a variable is moved out of the process image: API keys, auth tokens, base URLs and
/// inline configs, by name, and the fleet ledger's URL (stepguard's other `STEPGUARD_*` and
/// `OTEL_*` settings stay).
pub(crate) fn is_secret(name: &OsStr) -> bool {
    let name = name.to_string_lossy().to_ascii_uppercase();
    if STEPGUARDS_OWN.contains(&name.as_str()) {
        return true;
    }
    if name.starts_with("STEPGUARD_") || name.starts_with("OTEL_") {
        return false;
    }
    name.contains("API_KEY")
        || name.contains("AUTH_TOKEN")
        || name.ends_with("_BASE_URL")
        || name.ends_with("_CONFIG_CONTENT")
}

/// Prepares the process before anything else: for `run`, non-dumpable, and executed again
/// without its secrets when it has any (this returns only when that is not needed or failed,
/// with a warning). In the sealed image, reads the original command line back and returns it.
pub(crate) fn seal(argv: Vec<OsString>) -> Result<Vec<OsString>, SealError> {
    if argv.get(1).is_some_and(|a| a == SEALED_ARG) {
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
        return unseal(&argv);
    }
    let helper = argv
        .get(1)
        .is_some_and(|a| a.as_bytes().starts_with(b"__stepguard-"));
    if helper || !is_run(&argv) {
        return Ok(argv);
    }
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let secret: Vars = std::env::vars_os().filter(|(k, _)| is_secret(k)).collect();
    if secret.is_empty() && shown(&argv) == argv[1..] {
        return Ok(argv);
    }
    let err = reexec(&argv, &secret);
    crate::output::diag(
        "warning",
        format!(
            "cannot execute stepguard again without its API keys and model URLs ({err}); the \
             agent may read them from stepguard's command line"
        ),
    );
    Ok(argv)
}

/// Whether the command is `run` (the first word that is not an option, before `--`).
fn is_run(argv: &[OsString]) -> bool {
    argv.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "run")
}

fn carries_url(arg: &OsStr) -> bool {
    arg.as_bytes().windows(3).any(|w| w == b"://")
}

/// The arguments after the program's name as the new image shows them: any carrying a URL,
/// and the fleet ledger's (`--ledger VALUE`, `--ledger=VALUE`, before `--`: its libpq
/// `key=value` form may hold a password too), as [`HIDDEN`].
fn shown(argv: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let (mut after_flag, mut options) = (false, true);
    for a in argv.iter().skip(1) {
        let ledger = options && (after_flag || a.as_bytes().starts_with(b"--ledger="));
        after_flag = options && a == "--ledger";
        options &= a != "--";
        out.push(if ledger || carries_url(a) {
            OsString::from(HIDDEN)
        } else {
            a.clone()
        });
    }
    out
}

/// Executes this binary again with `secret` out of its environment and URLs out of its
/// command line, both passed in a memfd. Returns only on failure.
fn reexec(argv: &[OsString], secret: &[(OsString, OsString)]) -> std::io::Error {
    let fd = match rustix::fs::memfd_create("stepguard-sealed", rustix::fs::MemfdFlags::empty()) {
        Ok(fd) => fd,
        Err(e) => return e.into(),
    };
    let mut file = std::fs::File::from(fd);
    let payload = encode(argv, secret);
    if let Err(e) = file.write_all(&payload).and_then(|()| file.rewind()) {
        return e;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return e,
    };
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = argv.first() {
        cmd.arg0(arg0);
    }
    cmd.arg(SEALED_ARG)
        .arg(file.as_raw_fd().to_string())
        .args(shown(argv));
    for (name, _) in secret {
        cmd.env_remove(name);
    }
    cmd.exec()
}

/// Reads the original command line and the moved variables back, then empties the memfd (the
/// descriptor itself stays open, empty, in this image and its children).
fn unseal(argv: &[OsString]) -> Result<Vec<OsString>, SealError> {
    let fd = argv
        .get(2)
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let read = |fd: &str| -> std::io::Result<Vec<u8>> {
        let n: u32 = fd.parse().map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{n}"))?;
        let mut payload = Vec::new();
        file.read_to_end(&mut payload)?;
        file.set_len(0)?;
        Ok(payload)
    };
    let payload = read(&fd).map_err(|source| SealError::Read {
        fd: fd.clone(),
        source,
    })?;
    let (original, moved) = decode(&payload).ok_or(SealError::Malformed)?;
    let _ = MOVED.set(moved);
    Ok(original)
}

/// `argv` and `env` as length-prefixed items: the count of each, then every item.
fn encode(argv: &[OsString], env: &[(OsString, OsString)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut item = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    item(&(argv.len() as u64).to_le_bytes());
    for a in argv {
        item(a.as_bytes());
    }
    item(&(env.len() as u64).to_le_bytes());
    for (k, v) in env {
        item(k.as_bytes());
        item(v.as_bytes());
    }
    out
}

/// The inverse of [`encode`]; `None` for anything it did not write.
fn decode(mut bytes: &[u8]) -> Option<(Vec<OsString>, Vars)> {
    let mut item = || -> Option<Vec<u8>> {
        let (len, rest) = bytes.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        let (it, rest) = (rest.get(..len)?, rest.get(len..)?);
        bytes = rest;
        Some(it.to_vec())
    };
    let count = |it: Vec<u8>| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(it.try_into().ok()?)).ok()
    };
    let n = count(item()?)?;
    let argv = (0..n)
        .map(|_| item().map(OsString::from_vec))
        .collect::<Option<Vec<_>>>()?;
    let n = count(item()?)?;
    let env = (0..n)
        .map(|_| Some((OsString::from_vec(item()?), OsString::from_vec(item()?))))
        .collect::<Option<Vec<_>>>()?;
    Some((argv, env))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_encoded_decodes_and_anything_else_is_refused() {
        let argv: Vec<OsString> = [
            "stepguard",
            "run",
            "",
            "--",
            "codex",
            "-c",
            "a=\"http://x\"",
        ]
        .map(OsString::from)
        .into();
        let env = vec![
            (OsString::from("OPENAI_API_KEY"), OsString::from("sk-1=2")),
            (
                OsString::from("X_BASE_URL"),
                OsString::from_vec(vec![0xff, b'a']),
            ),
        ];
        let bytes = encode(&argv, &env);
        assert_eq!(decode(&bytes), Some((argv, env)));
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(b""), None);
        assert_eq!(decode(&[0xff; 16]), None);
    }

    #[test]
    fn keys_tokens_and_base_urls_are_secret_and_stepguards_own_settings_are_not() {
        for name in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "openai_api_key",
            "MOCK_API_KEY",
            "GEMINI_API_KEY",
            "ANTHROPIC_BASE_URL",
            "GOOGLE_GEMINI_BASE_URL",
            "OPENCODE_CONFIG_CONTENT",
            "STEPGUARD_LEDGER_URL",
        ] {
            assert!(is_secret(OsStr::new(name)), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "STEPGUARD_API_KEY",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "NO_PROXY",
        ] {
            assert!(!is_secret(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn only_run_is_sealed() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(is_run(&v(&["sg", "--color", "never", "run", "--", "x"])));
        assert!(!is_run(&v(&["sg", "history"])));
        assert!(!is_run(&v(&["sg", "count", "--", "run"])));
        assert!(carries_url(OsStr::new(
            "model_providers.m.base_url=http://h/v1"
        )));
        assert!(!carries_url(OsStr::new("--max-steps")));
    }

    #[test]
    fn the_ledger_flag_is_hidden_in_any_form_and_only_stepguards() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            shown(&v(&[
                "sg",
                "--ledger",
                "host=db password=pw",
                "run",
                "--ledger=host=db password=pw",
                "--pool",
                "x",
                "--",
                "agent",
                "--ledger",
                "kept",
                "http://h",
            ])),
            v(&[
                "--ledger", "<hidden>", "run", "<hidden>", "--pool", "x", "--", "agent",
                "--ledger", "kept", "<hidden>",
            ])
        );
        let plain = v(&["sg", "run", "--", "agent"]);
        assert_eq!(shown(&plain), plain[1..]);
    }
}
