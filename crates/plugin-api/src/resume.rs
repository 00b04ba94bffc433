//! How a provider's CLI resumes a session (protocol 1.8): the manifest's [`ResumeTemplate`]
//! and how `stepguard resume` builds the resumed command from it and the original command.
//!
//! The resumed command is the template's arguments, with `{session}` replaced by the session
//! id, `{prompt}` by the prompt and `{flags}` by the original command's flags that the template
//! keeps (at the end when the template has no `{flags}`). Everything else of the original
//! command is left behind: its prompt, its subcommand, a native limit (the host adds the new
//! budget's again) and flags the template does not name. The program is the original's first
//! word (its path kept), which must be the template's program.

use serde::{Deserialize, Serialize};

/// How a provider's CLI resumes a session its stream named (protocol 1.8).
///
/// ```
/// use stepguard_plugin_api::ResumeTemplate;
///
/// let template = ResumeTemplate::new(&["claude", "-p", "{prompt}", "--resume", "{session}", "{flags}"])
///     .keep_flags(&["--verbose"])
///     .keep_options(&["--output-format", "--model"]);
/// let original: Vec<String> = [
///     "/opt/bin/claude", "-p", "fix it", "--output-format", "stream-json", "--verbose",
///     "--max-turns", "5", "--model=opus",
/// ].map(String::from).into();
/// assert_eq!(
///     template.command(&original, "0a1b-2c", "go on").unwrap(),
///     ["/opt/bin/claude", "-p", "go on", "--resume", "0a1b-2c",
///      "--output-format", "stream-json", "--verbose", "--model=opus"]
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResumeTemplate {
    /// The resumed command, its program's file name first: `{session}` stands for the session
    /// id, `{prompt}` for the prompt, `{flags}` for the kept flags (appended when absent).
    pub args: Vec<String>,
    /// Flags of the original command carried over alone (`--verbose`, `--json`).
    #[serde(default)]
    pub keep_flags: Vec<String>,
    /// Flags of the original command carried over with their value, written `FLAG VALUE` or
    /// `FLAG=VALUE` (`--output-format`, `--model`, `-c`).
    #[serde(default)]
    pub keep_options: Vec<String>,
}

/// Why a resumed command cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The template has no arguments.
    #[error("the provider's resume template is empty")]
    EmptyTemplate,
    /// The original command does not run the template's program (a wrapper, another CLI).
    #[error(
        "the run's command runs `{found}`, not `{program}`: only the provider's own CLI can be resumed"
    )]
    OtherProgram {
        /// The template's program.
        program: String,
        /// The original command's program.
        found: String,
    },
    /// The session id is not one a CLI gives: empty, starting with `-`, or with characters
    /// other than letters, digits, `-`, `_`, `.` and `:`.
    #[error("the session id {0:?} is not a CLI's session id")]
    BadSession(String),
    /// The prompt is empty or starts with `-` (the CLI would take it for a flag).
    #[error("the prompt is empty or starts with `-`, which the CLI would take for a flag")]
    BadPrompt,
}

fn file_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// Returns true when `id` looks like a CLI's session id, so that a stream cannot slip a flag
/// into the resumed command through it.
pub fn is_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

impl ResumeTemplate {
    /// Creates a template from the resumed command's arguments (`{session}`, `{prompt}`,
    /// `{flags}` as in [`ResumeTemplate::args`]), keeping no flags yet.
    pub fn new(args: &[&str]) -> Self {
        ResumeTemplate {
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            keep_flags: Vec::new(),
            keep_options: Vec::new(),
        }
    }

    /// Adds flags carried over alone.
    pub fn keep_flags(mut self, flags: &[&str]) -> Self {
        self.keep_flags
            .extend(flags.iter().map(|s| (*s).to_owned()));
        self
    }

    /// Adds flags carried over with their value.
    pub fn keep_options(mut self, flags: &[&str]) -> Self {
        self.keep_options
            .extend(flags.iter().map(|s| (*s).to_owned()));
        self
    }

    /// The template's program (its file name), if it has one.
    pub fn program(&self) -> Option<&str> {
        self.args.first().map(|p| file_name(p))
    }

    /// Returns the original command's flags the template keeps, in their order.
    pub fn kept(&self, original: &[String]) -> Vec<String> {
        let mut kept = Vec::new();
        let mut args = original.iter().skip(1);
        while let Some(arg) = args.next() {
            if arg == "--" {
                break;
            }
            if self.keep_flags.iter().any(|f| f == arg) {
                kept.push(arg.clone());
            } else if self.keep_options.iter().any(|f| f == arg) {
                if let Some(value) = args.next() {
                    kept.extend([arg.clone(), value.clone()]);
                }
            } else if self.keep_options.iter().any(|f| {
                arg.strip_prefix(f.as_str())
                    .is_some_and(|r| r.starts_with('='))
            }) {
                kept.push(arg.clone());
            }
        }
        kept
    }

    /// Builds the command that resumes `session` with `prompt` from the `original` command.
    pub fn command(
        &self,
        original: &[String],
        session: &str,
        prompt: &str,
    ) -> Result<Vec<String>, ResumeError> {
        let program = self.program().ok_or(ResumeError::EmptyTemplate)?;
        let found = original.first().map_or("", |p| file_name(p));
        if found != program {
            return Err(ResumeError::OtherProgram {
                program: program.to_owned(),
                found: found.to_owned(),
            });
        }
        if !is_session_id(session) {
            return Err(ResumeError::BadSession(session.to_owned()));
        }
        if prompt.trim().is_empty() || prompt.starts_with('-') {
            return Err(ResumeError::BadPrompt);
        }
        let kept = self.kept(original);
        let mut command = vec![original[0].clone()];
        let mut placed = false;
        for arg in &self.args[1..] {
            match arg.as_str() {
                "{flags}" => {
                    command.extend(kept.iter().cloned());
                    placed = true;
                }
                _ => command.push(
                    arg.replace("{session}", session)
                        .replace("{prompt}", prompt),
                ),
            }
        }
        if !placed {
            command.extend(kept);
        }
        Ok(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    fn codex() -> ResumeTemplate {
        ResumeTemplate::new(&[
            "codex",
            "exec",
            "resume",
            "{flags}",
            "{session}",
            "{prompt}",
        ])
        .keep_flags(&["--json", "--skip-git-repo-check"])
        .keep_options(&["-c", "--config", "-m", "--model"])
    }

    #[test]
    fn kept_flags_go_where_the_template_says_and_the_rest_stays_behind() {
        let original = strings(&[
            "codex",
            "-c",
            "model=x",
            "exec",
            "--json",
            "--sandbox",
            "read-only",
            "--model=m",
            "fix it",
        ]);
        assert_eq!(
            codex().command(&original, "0199-ab", "go on").unwrap(),
            strings(&[
                "codex",
                "exec",
                "resume",
                "-c",
                "model=x",
                "--json",
                "--model=m",
                "0199-ab",
                "go on"
            ])
        );
    }

    #[test]
    fn without_a_flags_placeholder_the_kept_flags_are_appended() {
        let t = ResumeTemplate::new(&["gemini", "--resume", "{session}", "-p", "{prompt}"])
            .keep_flags(&["--yolo"]);
        let original = strings(&["gemini", "--yolo", "-p", "first"]);
        assert_eq!(
            t.command(&original, "s1", "again").unwrap(),
            strings(&["gemini", "--resume", "s1", "-p", "again", "--yolo"])
        );
    }

    #[test]
    fn arguments_after_a_double_dash_are_never_taken_for_flags() {
        let original = strings(&["codex", "exec", "--json", "--", "--json"]);
        assert_eq!(codex().kept(&original), strings(&["--json"]));
        // An option whose value is missing at the end is left out.
        assert!(codex().kept(&strings(&["codex", "-c"])).is_empty());
    }

    #[test]
    fn another_program_a_bad_session_or_prompt_are_refused() {
        let t = codex();
        let wrapped = strings(&["npx", "codex", "exec"]);
        assert_eq!(
            t.command(&wrapped, "s", "p").unwrap_err().to_string(),
            "the run's command runs `npx`, not `codex`: only the provider's own CLI can be resumed"
        );
        let original = strings(&["codex", "exec"]);
        for bad in [
            "",
            "--dangerously-bypass-approvals-and-sandbox",
            "a b",
            "a;b",
        ] {
            assert_eq!(
                t.command(&original, bad, "p"),
                Err(ResumeError::BadSession(bad.to_owned()))
            );
        }
        assert_eq!(t.command(&original, "s", "-x"), Err(ResumeError::BadPrompt));
        assert_eq!(t.command(&original, "s", "  "), Err(ResumeError::BadPrompt));
        assert_eq!(
            ResumeTemplate::new(&[]).command(&original, "s", "p"),
            Err(ResumeError::EmptyTemplate)
        );
    }

    #[test]
    fn the_template_round_trips_as_json_and_defaults_its_lists() {
        let t = codex();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<ResumeTemplate>(&json).unwrap(), t);
        let bare: ResumeTemplate = serde_json::from_str(r#"{"args":["x","{session}"]}"#).unwrap();
        assert!(bare.keep_flags.is_empty() && bare.keep_options.is_empty());
    }
}
