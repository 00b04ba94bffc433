//! Pointing an agent CLI at the gateway: find the base URL the user configured for it (the
//! upstream), and give the CLI the gateway's URL in its place, as the plugin's manifest says.

use std::path::Path;

use serde_json::{Map, Value};
use stepguard_plugin_api::{BaseUrlRule, ModelEndpoint};

/// How the agent's command and environment change so that its model calls reach the gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointing {
    /// The agent's command, with any arguments that point it at the gateway.
    pub command: Vec<String>,
    /// Environment variables to set for the agent.
    pub env: Vec<(String, String)>,
    /// The base URL the CLI would have used: where the gateway forwards to.
    pub upstream: String,
    /// Where the upstream came from, for messages (`ANTHROPIC_BASE_URL`, `the default`, …).
    pub upstream_source: String,
    /// The environment variables that may hold the CLI's API key (the manifest's, and the one
    /// a chosen provider names), in order: the agent gets a per-run key in their place.
    pub keys: Vec<String>,
}

/// Why the CLI cannot be pointed at the gateway.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PointError {
    /// The provider's plugin declares no way to give its CLI a base URL.
    #[error("the provider declares no model endpoint, so its CLI cannot be pointed at a gateway")]
    NoRule,
    /// A rule applies but the base URL it names is not in the command or the config.
    #[error("{0}")]
    Missing(String),
    /// A config file could not be read or parsed.
    #[error("cannot read {file}: {reason}")]
    Config {
        /// The file.
        file: String,
        /// What went wrong.
        reason: String,
    },
    /// The upstream is not an `http://` or `https://` URL.
    #[error("the model base URL `{0}` is not an http:// or https:// URL")]
    BadUrl(String),
}

/// Points `command` at `gateway_url` by the first of `endpoint`'s rules that applies; `env`
/// reads the agent's environment, and `cwd` is where it runs.
pub fn point(
    endpoint: &ModelEndpoint,
    command: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
    gateway_url: &str,
) -> Result<Pointing, PointError> {
    for rule in &endpoint.base_url {
        let found = match rule {
            BaseUrlRule::Env { name } => Some(by_env(endpoint, name, command, env, gateway_url)),
            BaseUrlRule::ConfigFlag {
                flag,
                selector,
                key,
                files,
            } => {
                let file = cli_config(files, env)?;
                let flags = FlagRule {
                    flag,
                    key,
                    file: file.as_ref(),
                };
                if selector.is_empty() {
                    Some(built_in(endpoint, &flags, command, gateway_url))
                } else {
                    config_flag(endpoint, &flags, selector, command, gateway_url)?
                }
            }
            BaseUrlRule::JsonConfig {
                file,
                env: var,
                model_flags,
                key,
            } => {
                json_config(file, var, model_flags, key, command, env, cwd, gateway_url)?.map(|p| {
                    Pointing {
                        keys: endpoint.api_key_env.clone(),
                        ..p
                    }
                })
            }
            // A rule of a newer protocol: the next one may apply.
            _ => None,
        };
        if let Some(p) = found {
            check_url(&p.upstream)?;
            return Ok(p);
        }
    }
    Err(PointError::NoRule)
}

fn check_url(url: &str) -> Result<(), PointError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(PointError::BadUrl(url.to_owned()))
    }
}

fn by_env(
    endpoint: &ModelEndpoint,
    name: &str,
    command: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    gateway_url: &str,
) -> Pointing {
    let (upstream, upstream_source) = match env(name).filter(|v| !v.trim().is_empty()) {
        Some(v) => (v.trim().to_owned(), name.to_owned()),
        None => (
            endpoint.default_upstream.clone(),
            "the provider's default".to_owned(),
        ),
    };
    Pointing {
        command: command.to_vec(),
        env: vec![(name.to_owned(), gateway_url.to_owned())],
        upstream,
        upstream_source,
        keys: endpoint.api_key_env.clone(),
    }
}

/// The values given to `flag` (`-c K=V`, `--config K=V`, `-cK=V`), with their positions.
fn flag_values<'a>(flag: &str, command: &'a [String]) -> Vec<(usize, &'a str)> {
    let long = (flag == "-c").then_some("--config");
    let mut out = Vec::new();
    let mut i = 1;
    while i < command.len() {
        let arg = command[i].as_str();
        if arg == flag || Some(arg) == long {
            if let Some(v) = command.get(i + 1) {
                out.push((i + 1, v.as_str()));
            }
            i += 2;
            continue;
        }
        if let Some(v) = long
            .and_then(|l| arg.strip_prefix(l))
            .and_then(|r| r.strip_prefix('='))
        {
            out.push((i, v));
        } else if let Some(v) = arg
            .strip_prefix(flag)
            .filter(|v| !v.is_empty() && flag.len() == 2)
        {
            out.push((i, v));
        }
        i += 1;
    }
    out
}

/// Parses `key=value` as TOML (a bare value is a string, as Codex reads it).
fn toml_pair(text: &str) -> Option<(String, toml::Value)> {
    let (key, value) = text.split_once('=')?;
    let key = key.trim().to_owned();
    let value = value.trim();
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    Some((key, parsed))
}

/// A config-flag rule as it applies to one command: the flag, the base URL's key, and the
/// CLI's own config file when it has one.
struct FlagRule<'a> {
    flag: &'a str,
    key: &'a str,
    file: Option<&'a CliConfig>,
}

/// The CLI's own config file, parsed.
struct CliConfig {
    path: String,
    table: toml::Table,
}

impl CliConfig {
    /// The string at a dot-separated path of the file.
    fn string(&self, path: &str) -> Option<String> {
        let mut parts = path.split('.');
        let mut value = self.table.get(parts.next()?)?;
        for part in parts {
            value = value.get(part)?;
        }
        value.as_str().map(str::to_owned)
    }
}

/// Reads the CLI's config file: the first of `files` whose variable is set (`$VAR/…`, `~/…`
/// under `HOME`); a file that does not exist sets nothing.
fn cli_config(
    files: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<CliConfig>, PointError> {
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    let path = files.iter().find_map(|candidate| {
        if let Some(rest) = candidate.strip_prefix('$') {
            let (var, tail) = rest.split_once('/').unwrap_or((rest, ""));
            set(var).map(|dir| format!("{}/{tail}", dir.trim_end_matches('/')))
        } else if let Some(tail) = candidate.strip_prefix("~/") {
            set("HOME").map(|home| format!("{}/{tail}", home.trim_end_matches('/')))
        } else {
            Some(candidate.clone())
        }
    });
    let Some(path) = path else { return Ok(None) };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(PointError::Config {
                file: path,
                reason: e.to_string(),
            });
        }
    };
    let table = text
        .parse::<toml::Table>()
        .map_err(|e| PointError::Config {
            file: path.clone(),
            reason: e.message().to_owned(),
        })?;
    Ok(Some(CliConfig { path, table }))
}

fn config_flag(
    endpoint: &ModelEndpoint,
    rule: &FlagRule<'_>,
    selector: &str,
    command: &[String],
    gateway_url: &str,
) -> Result<Option<Pointing>, PointError> {
    let flag = rule.flag;
    let values = flag_values(flag, command);
    let pairs: Vec<(usize, String, toml::Value)> = values
        .iter()
        .filter_map(|(i, v)| toml_pair(v).map(|(k, v)| (*i, k, v)))
        .collect();
    let from_command = pairs
        .iter()
        .rev()
        .find(|(_, k, _)| k == selector)
        .and_then(|(_, _, v)| v.as_str().map(str::to_owned));
    let Some(name) = from_command.or_else(|| rule.file.and_then(|f| f.string(selector))) else {
        return Ok(None);
    };
    let full_key = rule.key.replace("{}", &name);
    let upstream = provider_value(rule, &pairs, &full_key);
    // The variable the chosen provider reads its key from, when it names one.
    let mut keys = endpoint.api_key_env.clone();
    if let Some(env_key) = &endpoint.api_key_env_key
        && let Some((var, _)) = provider_value(rule, &pairs, &env_key.replace("{}", &name))
        && !keys.contains(&var)
    {
        keys.push(var);
    }
    let Some((upstream, upstream_source)) = upstream else {
        return Err(PointError::Missing(format!(
            "the command selects model provider `{name}` ({selector}={name}) but gives no \
             base URL for it; add `{flag} {full_key}=\"https://…\"` so stepguard knows where to \
             forward"
        )));
    };
    // The override goes right after the last one the command has, so it wins.
    let last = pairs.iter().map(|(i, _, _)| *i).max().unwrap_or(0);
    let mut command = command.to_vec();
    let value = format!("{full_key}={}", toml::Value::String(gateway_url.to_owned()));
    let at = (last + 1).min(command.len());
    command.splice(at..at, [flag.to_owned(), value]);
    scrub(&mut command, flag, &upstream, gateway_url);
    Ok(Some(Pointing {
        command,
        env: Vec::new(),
        upstream,
        upstream_source,
        keys,
    }))
}

/// Puts the gateway's URL in place of the upstream in every value of `flag`, so that the
/// agent's own command line does not tell it where the upstream is (the override added after
/// them already wins).
fn scrub(command: &mut [String], flag: &str, upstream: &str, gateway_url: &str) {
    if upstream.is_empty() {
        return;
    }
    let at: Vec<usize> = flag_values(flag, command).iter().map(|(i, _)| *i).collect();
    for i in at {
        if command[i].contains(upstream) {
            command[i] = command[i].replace(upstream, gateway_url);
        }
    }
}

/// The string a chosen provider's `full_key` has: set directly, or inside the provider's table
/// (a later override wins); else the CLI's config file's. With where it came from.
fn provider_value(
    rule: &FlagRule<'_>,
    pairs: &[(usize, String, toml::Value)],
    full_key: &str,
) -> Option<(String, String)> {
    let flag = rule.flag;
    let (table_key, leaf) = full_key.rsplit_once('.').unwrap_or(("", full_key));
    let mut found = None;
    for (_, k, v) in pairs {
        if *k == full_key {
            found = v
                .as_str()
                .map(|s| (s.to_owned(), format!("{flag} {full_key}")));
        } else if *k == table_key
            && let Some(s) = v.get(leaf).and_then(toml::Value::as_str)
        {
            found = Some((s.to_owned(), format!("{flag} {full_key}")));
        }
    }
    found.or_else(|| {
        let file = rule.file?;
        Some((file.string(full_key)?, format!("{} {full_key}", file.path)))
    })
}

/// The CLI's built-in provider, whose base URL is the config key `key` itself (Codex's
/// `openai_base_url`): the upstream is the command's last value of it, else the CLI's config
/// file's, else the endpoint's default; an override naming the gateway goes right after the
/// last one, so it wins.
fn built_in(
    endpoint: &ModelEndpoint,
    rule: &FlagRule<'_>,
    command: &[String],
    gateway_url: &str,
) -> Pointing {
    let (flag, key) = (rule.flag, rule.key);
    let given = flag_values(flag, command)
        .into_iter()
        .rev()
        .filter_map(|(i, v)| toml_pair(v).map(|(k, v)| (i, k, v)))
        .find(|(_, k, _)| k == key);
    let default = || match rule.file.and_then(|f| f.string(key).map(|url| (f, url))) {
        Some((file, url)) => (url, format!("{} {key}", file.path)),
        None => (
            endpoint.default_upstream.clone(),
            "the provider's default".to_owned(),
        ),
    };
    let (at, (upstream, upstream_source)) = match given {
        Some((i, _, toml::Value::String(url))) => (i + 1, (url, format!("{flag} {key}"))),
        // A value that is not a string is the CLI's to refuse; the gateway forwards to the
        // file's or the default meanwhile, and the override below replaces it.
        Some((i, _, _)) => (i + 1, default()),
        None => (1, default()),
    };
    let mut command = command.to_vec();
    let value = format!("{key}={}", toml::Value::String(gateway_url.to_owned()));
    let at = at.min(command.len());
    command.splice(at..at, [flag.to_owned(), value]);
    scrub(&mut command, flag, upstream.trim(), gateway_url);
    Pointing {
        command,
        env: Vec::new(),
        upstream: upstream.trim().to_owned(),
        upstream_source,
        keys: endpoint.api_key_env.clone(),
    }
}

/// Reads the value at a dot-separated path.
fn at_path<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// Sets the value at a dot-separated path, creating objects on the way.
fn set_path(v: &mut Value, path: &str, value: Value) {
    let mut cur = v;
    for k in path.split('.') {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Some(obj) = cur.as_object_mut() else {
            return;
        };
        cur = obj.entry(k).or_insert(Value::Null);
    }
    *cur = value;
}

#[allow(clippy::too_many_arguments)]
fn json_config(
    file: &str,
    var: &str,
    model_flags: &[String],
    key: &str,
    command: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
    gateway_url: &str,
) -> Result<Option<Pointing>, PointError> {
    let path = cwd.join(file);
    let from_file = match std::fs::read_to_string(&path) {
        Ok(text) => Some(
            serde_json::from_str::<Value>(&text).map_err(|e| PointError::Config {
                file: path.display().to_string(),
                reason: e.to_string(),
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(PointError::Config {
                file: path.display().to_string(),
                reason: e.to_string(),
            });
        }
    };
    let inline = match env(var).filter(|v| !v.trim().is_empty()) {
        Some(text) => {
            Some(
                serde_json::from_str::<Value>(&text).map_err(|e| PointError::Config {
                    file: var.to_owned(),
                    reason: e.to_string(),
                })?,
            )
        }
        None => None,
    };
    let mut model = None;
    for (i, arg) in command.iter().enumerate().skip(1) {
        for f in model_flags {
            if arg == f {
                model = command.get(i + 1).cloned();
            } else if let Some(v) = arg
                .strip_prefix(f.as_str())
                .and_then(|r| r.strip_prefix('='))
            {
                model = Some(v.to_owned());
            }
        }
    }
    let model = model.or_else(|| {
        [inline.as_ref(), from_file.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|c| c.get("model").and_then(Value::as_str).map(str::to_owned))
    });
    let Some(provider) = model
        .as_deref()
        .and_then(|m| m.split_once('/'))
        .map(|(p, _)| p)
    else {
        return Ok(None);
    };
    let full_key = key.replace("{}", provider);
    let upstream = [inline.as_ref(), from_file.as_ref()]
        .into_iter()
        .flatten()
        .find_map(|c| {
            at_path(c, &full_key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
    let Some(upstream) = upstream else {
        return Err(PointError::Missing(format!(
            "the model's provider is `{provider}` but neither {file} nor {var} sets `{full_key}`; \
             set it so stepguard knows where to forward"
        )));
    };
    let mut merged = inline.unwrap_or_else(|| Value::Object(Map::new()));
    set_path(
        &mut merged,
        &full_key,
        Value::String(gateway_url.to_owned()),
    );
    Ok(Some(Pointing {
        command: command.to_vec(),
        env: vec![(var.to_owned(), merged.to_string())],
        upstream,
        upstream_source: format!("{file} {full_key}"),
        keys: Vec::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GW: &str = "http://127.0.0.1:9/tok";

    fn cmd(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn claude() -> ModelEndpoint {
        ModelEndpoint::new("anthropic-messages", "https://api.anthropic.com").base_url(
            BaseUrlRule::Env {
                name: "ANTHROPIC_BASE_URL".into(),
            },
        )
    }

    fn codex() -> ModelEndpoint {
        ModelEndpoint::new("openai-responses", "https://api.openai.com/v1")
            .base_url(BaseUrlRule::ConfigFlag {
                flag: "-c".into(),
                selector: "model_provider".into(),
                key: "model_providers.{}.base_url".into(),
                files: codex_files(),
            })
            .base_url(BaseUrlRule::ConfigFlag {
                flag: "-c".into(),
                selector: String::new(),
                key: "openai_base_url".into(),
                files: codex_files(),
            })
            .api_key_env("OPENAI_API_KEY")
            .api_key_env_key("model_providers.{}.env_key")
    }

    fn codex_files() -> Vec<String> {
        vec![
            "$CODEX_HOME/config.toml".into(),
            "~/.codex/config.toml".into(),
        ]
    }

    fn opencode() -> ModelEndpoint {
        ModelEndpoint::new("openai-chat", "https://api.openai.com/v1").base_url(
            BaseUrlRule::JsonConfig {
                file: "opencode.json".into(),
                env: "OPENCODE_CONFIG_CONTENT".into(),
                model_flags: vec!["-m".into(), "--model".into()],
                key: "provider.{}.options.baseURL".into(),
            },
        )
    }

    #[test]
    fn an_env_rule_forwards_to_what_the_user_set_else_the_default() {
        let c = cmd(&["claude", "-p", "hi"]);
        let p = point(&claude(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "https://api.anthropic.com");
        assert_eq!(
            p.env,
            vec![("ANTHROPIC_BASE_URL".to_owned(), GW.to_owned())]
        );
        assert_eq!(p.command, c);
        let set = |k: &str| (k == "ANTHROPIC_BASE_URL").then(|| "http://10.0.0.1:8080".to_owned());
        let p = point(&claude(), &c, &set, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://10.0.0.1:8080");
        assert_eq!(p.upstream_source, "ANTHROPIC_BASE_URL");
        let bad = |_: &str| Some("ftp://x".to_owned());
        assert_eq!(
            point(&claude(), &c, &bad, Path::new("."), GW),
            Err(PointError::BadUrl("ftp://x".into()))
        );
    }

    #[test]
    fn codex_providers_chosen_by_flag_get_an_override_after_the_last_flag() {
        let c = cmd(&[
            "codex",
            "exec",
            "--json",
            "-c",
            "model_provider=mock",
            "-c",
            r#"model_providers.mock={name="mock", base_url="http://127.0.0.1:5/v1", wire_api="responses"}"#,
            "do it",
        ]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:5/v1");
        assert_eq!(
            &p.command[7..9],
            &cmd(&["-c", &format!("model_providers.mock.base_url=\"{GW}\"")])
        );
        assert_eq!(p.command.last().map(String::as_str), Some("do it"));
        assert!(p.env.is_empty());
        // The agent's own command no longer says where the upstream is.
        assert!(
            !p.command.iter().any(|a| a.contains("127.0.0.1:5")),
            "{:?}",
            p.command
        );
        assert!(
            p.command[6].contains(&format!("base_url=\"{GW}\"")),
            "{}",
            p.command[6]
        );
        // A direct key, quoted selector and the long flag.
        let c = cmd(&[
            "codex",
            "--config=model_provider=\"m2\"",
            "-c",
            "model_providers.m2.base_url=https://llm.example/v1",
            "exec",
        ]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "https://llm.example/v1");
        // Chosen but without a URL: the fix is named.
        let err = point(
            &codex(),
            &cmd(&["codex", "-c", "model_provider=x"]),
            &no_env,
            Path::new("."),
            GW,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("model_providers.x.base_url"), "{err}");
    }

    #[test]
    fn the_key_variables_are_the_manifests_and_the_one_a_chosen_provider_names() {
        let c = cmd(&[
            "codex",
            "-c",
            r#"model_providers.m={base_url="http://127.0.0.1:5/v1", env_key="MOCK_KEY"}"#,
            "-c",
            "model_provider=m",
            "exec",
        ]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.keys, ["OPENAI_API_KEY", "MOCK_KEY"]);
        let c = cmd(&[
            "codex",
            "-c",
            "model_provider=m",
            "-c",
            "model_providers.m.base_url=http://x/v1",
            "-c",
            "model_providers.m.env_key=K2",
        ]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.keys, ["OPENAI_API_KEY", "K2"]);
        // The built-in provider: the manifest's variables only.
        let p = point(
            &codex(),
            &cmd(&["codex", "exec"]),
            &no_env,
            Path::new("."),
            GW,
        )
        .unwrap();
        assert_eq!(p.keys, ["OPENAI_API_KEY"]);
        let claude = claude().api_key_env("ANTHROPIC_API_KEY");
        let p = point(&claude, &cmd(&["claude"]), &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.keys, ["ANTHROPIC_API_KEY"]);
    }

    #[test]
    fn codex_built_in_provider_is_pointed_by_its_config_key() {
        let over = format!("openai_base_url=\"{GW}\"");
        // No provider and no URL: the default upstream, and an override right after the program.
        let c = cmd(&["codex", "exec", "--json", "hi"]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "https://api.openai.com/v1");
        assert_eq!(p.upstream_source, "the provider's default");
        assert_eq!(
            p.command,
            cmd(&["codex", "-c", &over, "exec", "--json", "hi"])
        );
        assert!(p.env.is_empty(), "Codex 0.169 ignores OPENAI_BASE_URL");
        // The user's own URL (the last one wins, in any spelling) is the upstream, and the
        // override goes after it.
        let c = cmd(&[
            "codex",
            "exec",
            "-c",
            "openai_base_url=http://127.0.0.1:5/v1",
            "--config=openai_base_url=\"http://127.0.0.1:6/v1\"",
            "-c",
            "model=gpt-5.5",
            "hi",
        ]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:6/v1");
        assert_eq!(p.upstream_source, "-c openai_base_url");
        assert_eq!(&p.command[5..7], &cmd(&["-c", &over]));
        assert_eq!(p.command.last().map(String::as_str), Some("hi"));
        // OPENAI_BASE_URL is not where Codex goes, so it is not the upstream either.
        let set = |k: &str| (k == "OPENAI_BASE_URL").then(|| "http://10.0.0.1:1".to_owned());
        let p = point(&codex(), &cmd(&["codex", "exec"]), &set, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "https://api.openai.com/v1");
        // A URL that is not http(s) is refused, naming it.
        let c = cmd(&["codex", "-c", "openai_base_url=ftp://x", "exec"]);
        assert_eq!(
            point(&codex(), &c, &no_env, Path::new("."), GW),
            Err(PointError::BadUrl("ftp://x".into()))
        );
        // A provider chosen by name is still pointed through its table.
        let c = cmd(&[
            "codex",
            "-c",
            "model_provider=m",
            "-c",
            "model_providers.m.base_url=http://127.0.0.1:7/v1",
        ]);
        let p = point(&codex(), &c, &no_env, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:7/v1");
        assert!(!p.command.iter().any(|a| a.starts_with("openai_base_url")));
    }

    #[test]
    fn codex_config_file_is_read_for_the_upstream_and_the_command_wins() {
        // A base URL in the user's Codex config is where their calls go: the gateway must
        // forward there, not to the public API (their key would go elsewhere).
        let home = std::env::temp_dir().join(format!("sg-point-{}", std::process::id()));
        let codex_home = home.join("ch");
        std::fs::create_dir_all(home.join(".codex")).unwrap();
        std::fs::create_dir_all(&codex_home).unwrap();
        std::fs::write(
            home.join(".codex/config.toml"),
            "openai_base_url = \"http://127.0.0.1:8/v1\"\n",
        )
        .unwrap();
        let (h, ch) = (home.display().to_string(), codex_home.display().to_string());
        let only_home = |k: &str| (k == "HOME").then(|| h.clone());
        let c = cmd(&["codex", "exec", "hi"]);
        let p = point(&codex(), &c, &only_home, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:8/v1");
        assert!(
            p.upstream_source
                .ends_with(".codex/config.toml openai_base_url")
        );
        // The command's own value wins over the file.
        let c = cmd(&[
            "codex",
            "-c",
            "openai_base_url=http://127.0.0.1:9/v1",
            "exec",
        ]);
        let p = point(&codex(), &c, &only_home, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:9/v1");
        // CODEX_HOME set: its config is the only one, and a missing one sets nothing.
        let both = |k: &str| match k {
            "HOME" => Some(h.clone()),
            "CODEX_HOME" => Some(ch.clone()),
            _ => None,
        };
        let c = cmd(&["codex", "exec"]);
        let p = point(&codex(), &c, &both, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "https://api.openai.com/v1");
        // A provider the file selects is pointed through the file's table.
        std::fs::write(
            codex_home.join("config.toml"),
            "model_provider = \"local\"\n[model_providers.local]\nbase_url = \"http://127.0.0.1:4/v1\"\n",
        )
        .unwrap();
        let p = point(&codex(), &c, &both, Path::new("."), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:4/v1");
        let over = format!("model_providers.local.base_url=\"{GW}\"");
        assert_eq!(p.command, cmd(&["codex", "-c", &over, "exec"]));
        // A file that is not TOML is refused, naming it.
        std::fs::write(codex_home.join("config.toml"), "model_provider = [").unwrap();
        assert!(matches!(
            point(&codex(), &c, &both, Path::new("."), GW),
            Err(PointError::Config { .. })
        ));
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn opencode_reads_its_file_and_is_pointed_by_inline_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("opencode.json"),
            r#"{"model": "mock/m", "provider": {"mock": {"options": {"baseURL": "http://127.0.0.1:7/v1"}}}}"#,
        )
        .unwrap();
        let c = cmd(&["opencode", "run", "--format", "json", "hi"]);
        let p = point(&opencode(), &c, &no_env, dir.path(), GW).unwrap();
        assert_eq!(p.upstream, "http://127.0.0.1:7/v1");
        let inline: Value = serde_json::from_str(&p.env[0].1).unwrap();
        assert_eq!(inline["provider"]["mock"]["options"]["baseURL"], GW);
        // A model flag naming another provider that has no URL.
        let c = cmd(&["opencode", "run", "-m", "other/x"]);
        let err = point(&opencode(), &c, &no_env, dir.path(), GW).unwrap_err();
        assert!(
            err.to_string().contains("provider.other.options.baseURL"),
            "{err}"
        );
        // A broken file is named.
        std::fs::write(dir.path().join("opencode.json"), "{").unwrap();
        let err = point(&opencode(), &c, &no_env, dir.path(), GW).unwrap_err();
        assert!(matches!(err, PointError::Config { .. }), "{err}");
        // No model anywhere: no rule applies.
        let empty = tempfile::tempdir().unwrap();
        let c = cmd(&["opencode", "run"]);
        assert_eq!(
            point(&opencode(), &c, &no_env, empty.path(), GW),
            Err(PointError::NoRule)
        );
    }
}
