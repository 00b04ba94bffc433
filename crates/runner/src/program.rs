//! The agent's program, found as `exec` would find it before anything starts: a path or a name
//! on `PATH`, executable, and, for a script, an interpreter its `#!` line can run. What `exec`
//! would refuse is a setup mistake with a fix (exit 2, `spawn_failed`), not the agent's failure:
//! through the trampoline it would otherwise look like an agent that exited with an error.

use std::io::{Error, ErrorKind, Read as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// How much of a script `exec` reads for its `#!` line (Linux's `BINPRM_BUF_SIZE`).
const SHEBANG_MAX: usize = 256;

/// Finds `program` as `exec` would (a path, or a name on `PATH`) and checks that it can run:
/// the error names what is wrong and the fix.
pub(crate) fn resolve(program: &str) -> std::io::Result<()> {
    let path = find(program)?;
    interpreter_runs(&path)
}

/// The file `program` names: itself when it has a `/`, else the first runnable one on `PATH`.
fn find(program: &str) -> std::io::Result<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Err(_) => Err(Error::new(
                ErrorKind::NotFound,
                "command not found: no such file; check the path".to_owned(),
            )),
            Ok(m) if m.is_dir() => Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("`{program}` is a directory, not a program"),
            )),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("permission denied: `{program}` is not executable; `chmod +x {program}`"),
            )),
            Ok(_) => Ok(path),
        };
    }
    if let Some(found) = on_path(program) {
        return Ok(found);
    }
    let here = if Path::new(program).is_file() {
        format!("; it is in the working directory: run it as `./{program}`")
    } else {
        "; check the name, or give its path".to_owned()
    };
    Err(Error::new(
        ErrorKind::NotFound,
        format!("command not found: `{program}` is not a program on PATH{here}"),
    ))
}

/// The first runnable file called `name` in a directory of `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| runnable(p))
}

fn runnable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A script's `#!` line must name an interpreter that exists and runs (and, through `env`, a
/// program on `PATH`); a file without one is left to `exec` (an ELF binary, or a script the C
/// library hands to `/bin/sh`).
fn interpreter_runs(script: &Path) -> std::io::Result<()> {
    let Some(line) = shebang(script) else {
        return Ok(());
    };
    let shown = script.display();
    if line.contains('\r') {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "the #! line of `{shown}` ends in a carriage return (Windows line endings), so \
                 its interpreter cannot be found; convert the file: `sed -i 's/\\r$//' {shown}`"
            ),
        ));
    }
    let mut words = line.split_whitespace();
    let Some(interpreter) = words.next() else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("the #! line of `{shown}` names no interpreter; fix its first line"),
        ));
    };
    if !runnable(Path::new(interpreter)) {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "the #! line of `{shown}` names the interpreter `{interpreter}`, which does not \
                 exist or is not executable; fix the #! line (e.g. `#!/usr/bin/env bash`)"
            ),
        ));
    }
    let is_env = Path::new(interpreter)
        .file_name()
        .is_some_and(|n| n == "env");
    match env_program(words).filter(|_| is_env) {
        Some(program) if !program.contains('/') && on_path(program).is_none() => Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "the #! line of `{shown}` runs `{program}` through env, and `{program}` is not a \
                 program on PATH; install it or fix the #! line"
            ),
        )),
        _ => Ok(()),
    }
}

/// The text after `#!` on a script's first line, when it has one.
fn shebang(path: &Path) -> Option<String> {
    let mut head = [0u8; SHEBANG_MAX];
    let mut file = std::fs::File::open(path).ok()?;
    let n = file.read(&mut head).ok()?;
    let rest = head[..n].strip_prefix(b"#!")?;
    let line = rest.split(|b| *b == b'\n').next().unwrap_or(rest);
    Some(String::from_utf8_lossy(line).into_owned())
}

/// The program `env` runs from a `#!` line's words after `env`: the first that is neither an
/// option (`-S`, `-i`) nor a variable (`NAME=value`).
fn env_program<'a>(words: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    words
        .into_iter()
        .find(|w| !w.starts_with('-') && !w.contains('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str, mode: u32) -> String {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path.display().to_string()
    }

    fn refusal(program: &str) -> (ErrorKind, String) {
        let e = resolve(program).unwrap_err();
        (e.kind(), e.to_string())
    }

    #[test]
    fn what_exec_would_refuse_is_named_with_its_fix() {
        let dir = std::env::temp_dir().join(format!("sg-program-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = script(&dir, "ok.sh", "#!/bin/sh\necho hi\n", 0o755);
        assert!(resolve(&ok).is_ok());
        // No #! at all: exec's C library runs it with /bin/sh.
        assert!(resolve(&script(&dir, "plain.sh", "echo hi\n", 0o755)).is_ok());
        assert!(
            resolve(&script(
                &dir,
                "envok.sh",
                "#!/usr/bin/env -S sh -e\n",
                0o755
            ))
            .is_ok()
        );
        assert!(resolve("sh").is_ok());

        let bad = script(&dir, "bad.sh", "#!/no/such/sh\necho hi\n", 0o755);
        let (kind, text) = refusal(&bad);
        assert_eq!(kind, ErrorKind::NotFound);
        assert!(text.contains("interpreter `/no/such/sh`"), "{text}");
        assert!(text.contains("fix the #! line"), "{text}");

        let crlf = script(&dir, "crlf.sh", "#!/bin/sh\r\necho hi\r\n", 0o755);
        assert!(
            refusal(&crlf).1.contains("carriage return"),
            "{}",
            refusal(&crlf).1
        );

        let env = script(&dir, "env.sh", "#!/usr/bin/env sg-no-such-interp\n", 0o755);
        let text = refusal(&env).1;
        assert!(
            text.contains("`sg-no-such-interp` is not a program on PATH"),
            "{text}"
        );

        let noexec = script(&dir, "noexec.sh", "#!/bin/sh\n", 0o644);
        let (kind, text) = refusal(&noexec);
        assert_eq!(kind, ErrorKind::PermissionDenied);
        assert!(text.contains(&format!("`chmod +x {noexec}`")), "{text}");

        let (kind, text) = refusal(&format!("{}/missing.sh", dir.display()));
        assert_eq!(kind, ErrorKind::NotFound);
        assert!(text.contains("check the path"), "{text}");
        let (kind, text) = refusal("sg-no-such-agent-cli");
        assert_eq!(kind, ErrorKind::NotFound);
        assert!(
            text.contains("not a program on PATH; check the name"),
            "{text}"
        );
        assert!(
            refusal(&dir.display().to_string())
                .1
                .contains("is a directory")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
