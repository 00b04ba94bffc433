//! libpq's password file: lines of `hostname:port:database:username:password`, `*` matching
//! anything in the first four fields, `\:` and `\\` escaping, `#` comments; the first matching
//! line wins.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Reads a passfile, refusing one that others can read or write (libpq skips such a file with
/// a warning; a ledger says so and stops).
pub(crate) fn read(path: &Path) -> io::Result<String> {
    let meta = fs::metadata(path)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it is open to others (mode {:o}); run chmod 600 {}",
                meta.permissions().mode() & 0o777,
                path.display()
            ),
        ));
    }
    fs::read_to_string(path)
}

/// The password of the first line matching the connection, if any.
pub(crate) fn lookup(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .filter_map(fields)
        .find(|f| {
            [host, port, db, user]
                .iter()
                .zip(f.iter())
                .all(|(want, have)| have == "*" || have == want)
        })
        .map(|mut f| f.swap_remove(4))
}

/// The five fields of a line, unescaped; `None` for a line with fewer.
fn fields(line: &str) -> Option<Vec<String>> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.last_mut()?.push(chars.next().unwrap_or('\\')),
            // The password is the rest of the line, colons and all.
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut()?.push(c),
        }
    }
    (out.len() == 5).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_line_wins_with_wildcards_and_escapes() {
        let text = "# a comment\n\nshort:line\ndb1:5432:*:alice:one\n*:*:ledger:bob:two\\:parts\n*:*:*:*:any:rest\n";
        assert_eq!(
            lookup(text, "db1", "5432", "x", "alice").as_deref(),
            Some("one")
        );
        assert_eq!(
            lookup(text, "db2", "5432", "ledger", "bob").as_deref(),
            Some("two:parts")
        );
        assert_eq!(
            lookup(text, "db2", "1", "x", "carol").as_deref(),
            Some("any:rest")
        );
        assert_eq!(
            lookup("db1:5432:*:alice:one\n", "db1", "5433", "x", "alice"),
            None
        );
    }

    #[test]
    fn a_passfile_open_to_others_is_refused_naming_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        fs::write(&path, "*:*:*:*:pw\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).unwrap(), "*:*:*:*:pw\n");
    }
}
