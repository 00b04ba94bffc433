//! `stepguard plugins new NAME`: a provider plugin crate that builds, tests and loads as written.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use stepguard_core::ExitCode;

use crate::exit::UsageError;
use crate::output;

/// The template's files: (path in the crate, contents with `{{…}}` placeholders).
const FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../templates/plugin/Cargo.toml.tmpl"),
    ),
    (
        "src/lib.rs",
        include_str!("../../templates/plugin/lib.rs.tmpl"),
    ),
    (
        "sample.jsonl",
        include_str!("../../templates/plugin/sample.jsonl"),
    ),
    (
        "README.md",
        include_str!("../../templates/plugin/README.md.tmpl"),
    ),
];

/// Writes the crate for provider `name` into `dir` (default `./stepguard-plugin-NAME`).
pub(crate) fn run(
    name: &str,
    dir: Option<&Path>,
    api_path: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    check_name(name)?;
    let dir = dir.map_or_else(
        || PathBuf::from(format!("stepguard-plugin-{name}")),
        Path::to_owned,
    );
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(UsageError(format!(
            "{} already exists and is not empty; choose another --dir",
            dir.display()
        ))
        .into());
    }
    let found = api_path.map(Path::to_path_buf).or_else(source_checkout_api);
    let dependency = match found.as_deref() {
        Some(path) => {
            let path = std::path::absolute(path)
                .with_context(|| format!("cannot resolve {}", path.display()))?;
            if !path.join("Cargo.toml").is_file() {
                return Err(UsageError(format!(
                    "--api-path {}: no Cargo.toml there (give the stepguard-plugin-api crate's directory)",
                    path.display()
                ))
                .into());
            }
            format!(
                "stepguard-plugin-api = {{ path = \"{}\" }}",
                path.display()
                    .to_string()
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
            )
        }
        None => format!(
            "stepguard-plugin-api = {{ git = \"{}\", tag = \"plugin-api-v{}\" }}",
            stepguard_plugin_api::REPOSITORY,
            stepguard_plugin_api::API_VERSION
        ),
    };
    let lib = name.replace('-', "_");
    for (rel, template) in FILES {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let text = template
            .replace("{{name}}", name)
            .replace("{{lib}}", &lib)
            .replace("{{api_dependency}}", &dependency);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    output::line(dir.display().to_string())?;
    match (api_path, &found) {
        (None, Some(api)) => output::note(format!(
            "stepguard-plugin-api: the source checkout stepguard was built from ({}); pass \
             --api-path to use another",
            api.display()
        )),
        (None, None) => output::diag("warning", placeholder_warning()),
        (Some(_), _) => {}
    }
    output::note(format!(
        "created the `{name}` provider plugin; next: cd {} && cargo test && cargo build --release, then `stepguard count --plugin-dir target/release --provider {name} sample.jsonl` (see its README.md)",
        dir.display()
    ));
    Ok(ExitCode::Success)
}

/// The `stepguard-plugin-api` crate of the source checkout this stepguard was built from, when
/// it is still there (a binary built from source, the way stepguard is installed today).
fn source_checkout_api() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-api");
    dir.join("Cargo.toml")
        .is_file()
        .then(|| dir.canonicalize().ok())
        .flatten()
}

/// What a crate depending on the git tag needs, said when no API crate was found: the tag is
/// not published yet, so its `cargo test` cannot fetch it.
fn placeholder_warning() -> String {
    format!(
        "no stepguard-plugin-api crate found, so Cargo.toml depends on {} (tag \
         plugin-api-v{}), which is not published yet: `cargo test` will fail to fetch it. Pass \
         --api-path DIR (the crates/plugin-api directory of a stepguard checkout) or edit the \
         dependency in Cargo.toml",
        stepguard_plugin_api::REPOSITORY,
        stepguard_plugin_api::API_VERSION
    )
}

/// A provider name is what `--provider` takes and what the library file is named after.
fn check_name(name: &str) -> Result<(), UsageError> {
    let ok = name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(UsageError(format!(
            "`{name}` is not a provider name: use lowercase letters, digits, `-` and `_`, starting with a letter (at most 40)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_are_checked() {
        assert!(check_name("myagent").is_ok());
        assert!(check_name("my-agent_2").is_ok());
        for bad in ["", "MyAgent", "2agent", "my agent", "../x", "a/b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_an_api_crate_the_warning_says_cargo_test_will_fail_and_the_fix() {
        let warning = placeholder_warning();
        for words in [
            "which is not published yet: `cargo test` will fail to fetch it",
            "Pass --api-path DIR (the crates/plugin-api directory of a stepguard checkout)",
            stepguard_plugin_api::REPOSITORY,
        ] {
            assert!(warning.contains(words), "`{words}` in {warning}");
        }
        // This build's checkout is found, so the placeholder is not used here.
        assert!(source_checkout_api().is_some_and(|d| d.ends_with("crates/plugin-api")));
    }
}
