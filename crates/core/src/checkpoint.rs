//! The checkpoint of a run's work tree as the run record holds it (`checkpoint`): the ref that
//! keeps the work tree at the stop, the files changed since the run began, the files left out,
//! or why no checkpoint was written. Taking one is `stepguard-checkpoint`'s job.

use serde::{Deserialize, Serialize};

/// At most this many changed files are listed in a record (`changed_total` counts them all).
pub const MAX_LISTED_CHANGES: usize = 1000;

/// The checkpoint of a run (`--checkpoint git`): null when checkpoints were off or the run
/// succeeded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Checkpoint {
    /// The ref holding the work tree at the stop (`refs/stepguard/runs/ID`); null when none
    /// was written.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    /// The commit the ref names (its parent: `HEAD` at the stop).
    pub commit: Option<String>,
    /// The files changed since the run began (the work tree at the start, else its `HEAD`),
    /// at most 1000.
    pub changed: Vec<ChangedPath>,
    /// How many files changed since the run began.
    pub changed_total: u64,
    /// Files left out because they are over the size cap (`[run] checkpoint_max_file_mb`).
    pub left_out: Vec<LeftOutPath>,
    /// Why no checkpoint was written (not a repository, a rebase under way, the bound …); null
    /// when one was.
    pub error: Option<String>,
}

/// One file a run changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChangedPath {
    /// Its path from the top of the work tree.
    pub path: String,
    /// How it changed.
    pub change: PathChange,
}

/// How a file changed between a run's start and its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PathChange {
    /// New.
    Added,
    /// Its content or mode changed.
    Modified,
    /// Gone.
    Deleted,
    /// A file became a link, or the other way round.
    TypeChanged,
}

/// A file left out of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LeftOutPath {
    /// Its path from the top of the work tree.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_reads_back_with_its_wire_names() {
        let c = Checkpoint {
            reference: Some("refs/stepguard/runs/4".into()),
            commit: Some("abc".into()),
            changed: vec![ChangedPath {
                path: "src/a.rs".into(),
                change: PathChange::TypeChanged,
            }],
            changed_total: 1,
            left_out: vec![LeftOutPath {
                path: "big".into(),
                bytes: 3,
            }],
            error: None,
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(
            text,
            r#"{"ref":"refs/stepguard/runs/4","commit":"abc","changed":[{"path":"src/a.rs","change":"type_changed"}],"changed_total":1,"left_out":[{"path":"big","bytes":3}],"error":null}"#
        );
        assert_eq!(serde_json::from_str::<Checkpoint>(&text).unwrap(), c);
    }
}
