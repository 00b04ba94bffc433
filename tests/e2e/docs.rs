//! The manual: README.md and the mdBook under `docs/`.
//!
//! Every relative link points at an existing file and every `#anchor` at a heading of its page
//! (GitHub's and mdBook's slug rule); `docs/SUMMARY.md` lists every page; every `stepguard …`
//! command in a `sh`/`console` block runs against the built binary with the exit code its
//! trailing `# exit N` comment names (else 0), unless the block is marked
//! `<!-- not run: REASON -->` on the line above it.

use crate::harness::{Sandbox, workspace};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The marker, on the line above a code block, of a block whose commands are not run.
const NOT_RUN: &str = "<!-- not run:";

/// Returns README.md and every Markdown page under `docs/`, sorted.
fn doc_files() -> Vec<PathBuf> {
    let root = workspace();
    let mut files = vec![root.join("README.md")];
    files.extend(markdown_under(&root.join("docs")));
    files
}

/// Returns every `.md` file under `dir`, recursively, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Returns the path of `file` relative to the workspace, for messages.
fn shown(file: &Path) -> String {
    let root = workspace();
    file.strip_prefix(&root)
        .unwrap_or(file)
        .display()
        .to_string()
}

/// One line of a Markdown file, and whether it is inside a fenced code block.
struct Line<'a> {
    number: usize,
    text: &'a str,
    in_code: bool,
}

/// Splits `text` into lines, each marked as prose or code (fences of ``` or ~~~ included).
fn lines(text: &str) -> Vec<Line<'_>> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, text) in text.lines().enumerate() {
        let trimmed = text.trim_start();
        let opens = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
        let in_code = match (fence, opens) {
            (None, Some(f)) => {
                fence = Some(f);
                true
            }
            (Some(f), Some(g)) if f == g && trimmed.trim_end() == f => {
                fence = None;
                true
            }
            (Some(_), _) => true,
            (None, None) => false,
        };
        out.push(Line {
            number: i + 1,
            text,
            in_code,
        });
    }
    out
}

/// Removes inline code spans (any run of backticks up to the next run of the same length).
fn strip_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Returns the targets of the inline links `[text](target)` in one line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let prose = strip_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// Returns the anchor of a heading: lower case, spaces to `-`, only letters, digits, `-`, `_`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Returns the anchors of a page's headings; a repeated heading gets `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in lines(text).iter().filter(|l| !l.in_code) {
        let hashes = line.text.len() - line.text.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line.text[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line.text[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Whether `path` (an existing file) is inside the directory `dir`.
fn inside(path: &Path, dir: &Path) -> bool {
    let canonical = |p: &Path| p.canonicalize().unwrap();
    canonical(path).starts_with(canonical(dir))
}

/// Returns every broken relative link of `file`; a page of the book (a file under a directory
/// with a `SUMMARY.md`) may link only inside the book, as `FILE:LINE: TARGET: why`.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let book = file
        .ancestors()
        .skip(1)
        .find(|d| d.join("SUMMARY.md").exists());
    let mut problems = Vec::new();
    for line in lines(&text).iter().filter(|l| !l.in_code) {
        for target in link_targets(line.text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.to_path_buf()
            } else {
                file.parent().unwrap().join(path)
            };
            let why = if !dest.exists() {
                Some("no such file".to_string())
            } else if book.is_some_and(|b| !inside(&dest, b)) {
                Some("leaves docs/: the book has no other files".to_string())
            } else if anchor.is_empty() {
                None
            } else if dest.extension().is_none_or(|e| e != "md") {
                Some("an anchor into a file that is not Markdown".to_string())
            } else if !anchors(&std::fs::read_to_string(&dest).unwrap()).contains(anchor) {
                Some(format!("no heading `#{anchor}` in {}", shown(&dest)))
            } else {
                None
            };
            if let Some(why) = why {
                problems.push(format!("{}:{}: {target}: {why}", shown(file), line.number));
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_points_at_a_file_and_a_heading() {
    let files = doc_files();
    assert!(files.len() > 10, "the manual is missing: {files:?}");
    let problems: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// Returns the 1-based numbers of the lines of `text` that a merge left behind
/// (`<<<<<<< `, `=======`, `>>>>>>> ` at the start of a line).
fn conflict_markers(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("<<<<<<< ") || *l == "=======" || l.starts_with(">>>>>>> "))
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn no_page_holds_a_merge_conflict_marker() {
    let root = workspace();
    let mut files = doc_files();
    files.extend(["CHANGELOG.md", "ARCHITECTURE.md", "crates/README.md"].map(|f| root.join(f)));
    let found: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            conflict_markers(&text)
                .into_iter()
                .map(move |n| format!("{}:{n}", shown(f)))
        })
        .collect();
    assert!(
        found.is_empty(),
        "merge conflict markers left in:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_conflict_check_finds_each_marker_and_nothing_else() {
    let text = "a\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n== not one\n";
    assert_eq!(conflict_markers(text), vec![2, 4, 6]);
    assert!(conflict_markers("| a |\n|---|\n=====\n").is_empty());
}

#[test]
fn the_link_check_finds_a_missing_file_and_a_missing_heading() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("b.md"),
        "# Page B\n\n## The `run` command\n\n```sh\n# not a heading\n```\n",
    )
    .unwrap();
    let a = dir.path().join("a.md");
    std::fs::write(
        &a,
        "[ok](b.md#the-run-command) [gone](missing.md) [bad](b.md#not-a-heading)\n\
         `[in code](missing.md)` [self](#page-a)\n\n# Page A\n",
    )
    .unwrap();
    let problems = broken_links(&a);
    assert_eq!(problems.len(), 2, "{problems:?}");
    std::fs::create_dir(dir.path().join("book")).unwrap();
    std::fs::write(dir.path().join("book/SUMMARY.md"), "- [Page](page.md)\n").unwrap();
    let page = dir.path().join("book/page.md");
    std::fs::write(&page, "[out](../b.md) [in](SUMMARY.md)\n").unwrap();
    let problems_in_book = broken_links(&page);
    assert_eq!(problems_in_book.len(), 1, "{problems_in_book:?}");
    assert!(
        problems_in_book[0].contains("leaves docs/"),
        "{problems_in_book:?}"
    );
    assert!(
        problems[0].contains("missing.md: no such file"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("no heading `#not-a-heading`"),
        "{problems:?}"
    );
}

#[test]
fn anchors_follow_the_github_and_mdbook_slug_rule() {
    let text = "# Wrap-up: the agent ends\n## `stepguard run`\n## Run records\n## Run records\n";
    let got: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(
        got,
        [
            "run-records",
            "run-records-1",
            "stepguard-run",
            "wrap-up-the-agent-ends"
        ]
    );
}

#[test]
fn the_summary_lists_every_page() {
    let docs = workspace().join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = lines(&summary)
        .iter()
        .filter(|l| !l.in_code)
        .flat_map(|l| link_targets(l.text))
        .map(|t| docs.join(t.split('#').next().unwrap_or("")))
        .collect();
    let pages: BTreeSet<PathBuf> = markdown_under(&docs)
        .into_iter()
        .filter(|p| !p.ends_with("SUMMARY.md"))
        .collect();
    let missing: Vec<String> = pages.difference(&listed).map(|p| shown(p)).collect();
    assert!(
        missing.is_empty(),
        "pages not in docs/SUMMARY.md: {missing:?}"
    );
    for page in [
        "run",
        "budgets",
        "loops",
        "wrap-up",
        "plugins",
        "history",
        "telemetry",
    ] {
        assert!(listed.contains(&docs.join(format!("{page}.md"))), "{page}");
    }
}

/// Environment assignments before a command (`NAME=value stepguard …`).
type Env = Vec<(String, String)>;

/// One example command of the manual, to run.
#[derive(Debug, PartialEq)]
struct Example {
    /// Where it is, as `FILE:LINE`.
    place: String,
    /// Environment assignments before the command (`NAME=value stepguard …`).
    env: Env,
    /// The arguments after `stepguard`.
    args: Vec<String>,
    /// The exit code its `# exit N` comment names, else 0.
    exit: i32,
}

/// What the examples of one file are: the ones to run, and the commands that cannot be run
/// although nothing marks them.
#[derive(Debug, Default)]
struct Examples {
    run: Vec<Example>,
    not_run: usize,
    unmarked: Vec<String>,
}

/// Splits a shell command line into words (quotes honoured) and its trailing comment; `None`
/// for the words when the line uses shell syntax beyond words (pipes, redirections, `&&`, `$`).
fn shell_words(line: &str) -> (Option<Vec<String>>, String) {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut plain = true;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '#') if word.is_none() => return (plain.then_some(words), chars.collect()),
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, '|' | '&' | ';' | '<' | '>' | '$' | '`' | '(' | ')' | '\\') => {
                plain = false;
                word.get_or_insert_default().push(c);
            }
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    (plain.then_some(words), String::new())
}

/// Returns the environment assignments and the stepguard arguments of a command line, or
/// `None` when it does not run stepguard (`stepguard …` or `cargo run -q -p stepguard-cli -- …`).
fn stepguard_args(words: &[String]) -> Option<(Env, Vec<String>)> {
    let assigns = words
        .iter()
        .take_while(|w| w.split_once('=').is_some_and(|(k, _)| is_env_name(k)))
        .count();
    let env = words[..assigns]
        .iter()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let command = &words[assigns..];
    let cargo = ["cargo", "run", "-q", "-p", "stepguard-cli", "--"];
    let args = if command.first().is_some_and(|w| w == "stepguard") {
        &command[1..]
    } else if command.len() >= cargo.len() && command[..cargo.len()] == cargo {
        &command[cargo.len()..]
    } else {
        return None;
    };
    Some((env, args.to_vec()))
}

/// Whether `name` is a shell variable name.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether a command line (its first word after any assignments) runs stepguard.
fn mentions_stepguard(line: &str) -> bool {
    line.split_whitespace()
        .find(|w| !w.split_once('=').is_some_and(|(k, _)| is_env_name(k)))
        .is_some_and(|w| w == "stepguard" || w == "cargo")
        && (line.contains("stepguard ") || line.contains("stepguard-cli --"))
}

/// Returns the exit code a trailing comment names (`# exit 3`), else 0.
fn expected_exit(comment: &str) -> i32 {
    let comment = comment.trim();
    comment
        .strip_prefix("exit ")
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Returns the command lines of a `sh`/`console` block (continuations joined, `$ ` dropped).
fn command_lines(block: &[Line<'_>], console: bool) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for line in block {
        let mut text = line.text.trim().to_string();
        if pending.is_none() && console {
            match text.strip_prefix("$ ") {
                Some(rest) => text = rest.to_string(),
                None => continue,
            }
        }
        let (number, mut joined) = pending.take().unwrap_or((line.number, String::new()));
        match text.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                pending = Some((number, joined));
            }
            None => {
                joined.push_str(&text);
                out.push((number, joined));
            }
        }
    }
    out.extend(pending);
    out
}

/// Collects the example commands of one Markdown file.
fn examples(name: &str, text: &str) -> Examples {
    let all = lines(text);
    let mut found = Examples::default();
    let mut i = 0;
    while i < all.len() {
        let open = all[i].text.trim_start();
        let info = open.trim_start_matches('`').trim();
        if !all[i].in_code || !open.starts_with("```") {
            i += 1;
            continue;
        }
        let end = (i + 1..all.len())
            .find(|&j| all[j].text.trim() == "```")
            .unwrap_or(all.len());
        if ["sh", "console", "bash", "shell"].contains(&info) {
            let marker = all[..i].iter().rev().find(|l| !l.text.trim().is_empty());
            let reason = marker.and_then(|l| l.text.trim().strip_prefix(NOT_RUN));
            let commands = command_lines(&all[i + 1..end], info == "console");
            block_examples(name, all[i].number, reason, commands, &mut found);
        }
        i = end + 1;
    }
    found
}

/// Sorts the commands of one block into `found`: run, marked not run, or unrunnable.
fn block_examples(
    name: &str,
    opened_at: usize,
    not_run: Option<&str>,
    commands: Vec<(usize, String)>,
    found: &mut Examples,
) {
    let mut any = false;
    for (number, line) in commands {
        let place = format!("{name}:{number}");
        let (words, comment) = shell_words(&line);
        let parsed = words.as_deref().and_then(stepguard_args);
        if parsed.is_none() && !mentions_stepguard(&line) {
            continue;
        }
        any = true;
        match (not_run, parsed) {
            (Some(_), _) => found.not_run += 1,
            (None, Some((env, args))) => found.run.push(Example {
                place,
                env,
                args,
                exit: expected_exit(&comment),
            }),
            (None, None) => found.unmarked.push(format!(
                "{place}: `{line}` uses shell syntax the docs test does not run; \
                 mark its block `{NOT_RUN} REASON -->`"
            )),
        }
    }
    match not_run.map(|r| r.trim_end_matches("-->").trim()) {
        Some("") => found.unmarked.push(format!(
            "{name}:{opened_at}: a `{NOT_RUN}` marker without a reason"
        )),
        Some(_) if !any => found.unmarked.push(format!(
            "{name}:{opened_at}: marked not run, but the block has no stepguard command"
        )),
        _ => {}
    }
}

/// Runs one example in `sb` and returns what went wrong, if anything.
fn run_example(sb: &Sandbox, example: &Example) -> Option<String> {
    let args: Vec<&str> = example.args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = example
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let run = sb.run_env(&args, &env);
    (run.code != Some(example.exit)).then(|| {
        format!(
            "{}: `stepguard {}` exited {:?}, the docs say {}\nstderr: {}",
            example.place,
            example.args.join(" "),
            run.code,
            example.exit,
            run.stderr
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / ")
        )
    })
}

/// Returns a sandbox whose project directory sees the repository's `examples/` and `tests/`.
fn docs_sandbox() -> Sandbox {
    let sb = Sandbox::new();
    for dir in ["examples", "tests"] {
        std::os::unix::fs::symlink(workspace().join(dir), sb.project().join(dir)).unwrap();
    }
    sb
}

#[test]
fn every_example_command_runs_or_says_why_not() {
    let mut failures = Vec::new();
    let mut ran = BTreeMap::new();
    for file in doc_files() {
        let name = shown(&file);
        let found = examples(&name, &std::fs::read_to_string(&file).unwrap());
        failures.extend(found.unmarked);
        let sb = docs_sandbox();
        failures.extend(found.run.iter().filter_map(|e| run_example(&sb, e)));
        ran.insert(name, found.run.len());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The README's newcomer command and one example per main feature are among them.
    assert!(ran["README.md"] >= 12, "{ran:?}");
}

#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let root = workspace();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let command = lines(&readme)
        .into_iter()
        .find(|l| l.in_code && l.text.starts_with(".ci/install-agent-clis && cargo test"))
        .expect("README.md has the test command")
        .text;
    assert!(
        ci.lines().any(|l| l.trim() == command),
        "`{command}` is not in .ci/run"
    );
}

#[test]
fn examples_are_parsed_marked_and_refused() {
    let text = "```sh\nstepguard count -p codex 'a b.jsonl'  # exit 3: over\n\
                X_Y=1 stepguard history\ncargo build\nstepguard man | man -l -\n```\n\n\
                <!-- not run: needs the real CLI -->\n```sh\nstepguard run -p claude -- claude\n```\n\
                ```console\n$ cargo run -q -p stepguard-cli -- plugins \\\n    --json\noutput\n```\n";
    let found = examples("t.md", text);
    assert_eq!(found.not_run, 1);
    assert_eq!(found.unmarked.len(), 1, "{:?}", found.unmarked);
    assert!(
        found.unmarked[0].starts_with("t.md:5:"),
        "{:?}",
        found.unmarked
    );
    let got: Vec<(&str, Vec<&str>, i32)> = found
        .run
        .iter()
        .map(|e| {
            let args = e.args.iter().map(String::as_str).collect();
            (e.place.as_str(), args, e.exit)
        })
        .collect();
    assert_eq!(
        got,
        [
            ("t.md:2", vec!["count", "-p", "codex", "a b.jsonl"], 3),
            ("t.md:3", vec!["history"], 0),
            ("t.md:13", vec!["plugins", "--json"], 0),
        ]
    );
    assert_eq!(found.run[1].env, [("X_Y".to_string(), "1".to_string())]);
}

/// Returns the part of `text` from the heading `heading` to the next heading of its level.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(heading).expect("the section") + heading.len();
    let level = heading.len() - heading.trim_start_matches('#').len();
    let next = format!("\n{} ", "#".repeat(level));
    let end = text[start..].find(&next).map_or(text.len(), |i| start + i);
    &text[start..end]
}

/// Returns the numbers in the first column of the Markdown tables in `text`.
fn table_codes(text: &str) -> BTreeSet<u8> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| ")?.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn the_exit_codes_and_slugs_are_the_ones_the_code_defines() {
    use stepguard_core::{ExitCode, FailureSlug};
    let codes: BTreeSet<u8> = ExitCode::ALL.iter().map(|c| c.code()).collect();
    let root = workspace();
    let page = std::fs::read_to_string(root.join("docs/exit-codes.md")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert_eq!(table_codes(section(&page, "## Exit codes")), codes);
    assert_eq!(table_codes(section(&readme, "## Exit codes")), codes);
    for code in ExitCode::ALL {
        let row = format!("| {} | {} |", code.code(), code.meaning());
        let readme_rows = section(&readme, "## Exit codes").replace('`', "");
        assert!(
            readme_rows.contains(&row),
            "README.md's exit codes lack `{row}`"
        );
    }
    let slugs: BTreeSet<&str> = FailureSlug::ALL.iter().map(|s| s.as_str()).collect();
    let listed = section(&page, "## Failure slugs")
        .split("The legacy")
        .next()
        .unwrap_or("")
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect::<BTreeSet<&str>>();
    assert_eq!(listed, slugs);
}
