//! What an agent is allowed: its tools, its limits, and the form of its final report.

use serde::{Deserialize, Serialize};
use stepguard_core::StepLimit;

/// How a tool counts toward progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A real tool: calling it (even when it fails) is progress.
    #[default]
    Real,
    /// A progress report: answered, but not progress.
    Progress,
    /// A wrapper around other calls (`{"calls": [{"name", "arguments"}…]}`): not progress itself;
    /// the real calls inside it are.
    Batch,
    /// Starts a sub-agent with its own counters (the caller runs it and reports its outcome).
    SubAgent,
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// JSON Schema of its arguments (absent: any object).
    #[serde(default)]
    pub schema: Option<serde_json::Value>,
    /// How it counts.
    #[serde(default)]
    pub kind: ToolKind,
}

impl ToolSpec {
    /// A real tool accepting any arguments.
    pub fn real(name: &str) -> Self {
        ToolSpec {
            name: name.into(),
            schema: None,
            kind: ToolKind::Real,
        }
    }
}

/// The form the final report must take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum ReportFormat {
    /// Any non-empty text.
    Text,
    /// JSON valid against a JSON Schema.
    Json {
        /// The schema.
        schema: serde_json::Value,
    },
    /// A chat transcript: a JSON object with a required `messages` array.
    Chat,
}

/// An agent (or sub-agent) definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentDef {
    /// Name, for logs.
    #[serde(default = "default_name")]
    pub name: String,
    /// Step budget: one step is one model request. Absent = unlimited; 0 is invalid.
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// Turns allowed (a turn ends when an attempt makes progress).
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// Attempts (model requests) allowed per turn.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Profile whose budget bounds `max_steps` (the foundation's upper-bound rule).
    #[serde(default)]
    pub profile: Option<String>,
    /// Tools offered.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// The final report's form.
    #[serde(default = "default_report")]
    pub final_report: ReportFormat,
}

fn default_name() -> String {
    "agent".into()
}
fn default_max_turns() -> u32 {
    20
}
fn default_max_retries() -> u32 {
    3
}
fn default_report() -> ReportFormat {
    ReportFormat::Text
}

impl Default for AgentDef {
    fn default() -> Self {
        AgentDef {
            name: default_name(),
            max_steps: None,
            max_turns: default_max_turns(),
            max_retries: default_max_retries(),
            profile: None,
            tools: Vec::new(),
            final_report: default_report(),
        }
    }
}

/// An agent definition that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// `max_steps = 0` would forbid even one request.
    #[error("agent `{0}`: max_steps must be at least 1 (leave it out for no limit)")]
    ZeroMaxSteps(String),
    /// `max_turns` or `max_retries` of 0.
    #[error("agent `{agent}`: {field} must be at least 1")]
    Zero {
        /// The agent.
        agent: String,
        /// The field.
        field: &'static str,
    },
    /// A profile that is not built in.
    #[error("agent `{agent}`: unknown profile `{profile}`")]
    UnknownProfile {
        /// The agent.
        agent: String,
        /// The profile.
        profile: String,
    },
    /// A tool's schema or the report schema is not a valid JSON Schema.
    #[error("agent `{agent}`: invalid JSON Schema for {what}: {message}")]
    Schema {
        /// The agent.
        agent: String,
        /// Which schema.
        what: String,
        /// Why.
        message: String,
    },
}

impl AgentDef {
    /// Returns the effective step limit: `max_steps`, bounded by the profile's budget.
    pub fn step_limit(&self) -> Result<StepLimit, DefinitionError> {
        let explicit = match self.max_steps {
            Some(0) => return Err(DefinitionError::ZeroMaxSteps(self.name.clone())),
            Some(n) => Some(StepLimit::Limited(n)),
            None => None,
        };
        let profile = match &self.profile {
            Some(p) => match stepguard_core::budget::builtin_profile(p) {
                Some(b) => Some(StepLimit::Limited(b)),
                None => {
                    return Err(DefinitionError::UnknownProfile {
                        agent: self.name.clone(),
                        profile: p.clone(),
                    });
                }
            },
            None => None,
        };
        Ok(match (explicit, profile) {
            (Some(e), Some(p)) => e.min(p),
            (Some(l), None) | (None, Some(l)) => l,
            (None, None) => StepLimit::Unlimited,
        })
    }

    /// Checks the definition.
    pub fn validate(&self) -> Result<(), DefinitionError> {
        self.step_limit()?;
        for (field, v) in [
            ("max_turns", self.max_turns),
            ("max_retries", self.max_retries),
        ] {
            if v == 0 {
                return Err(DefinitionError::Zero {
                    agent: self.name.clone(),
                    field,
                });
            }
        }
        let schemas = self
            .tools
            .iter()
            .filter_map(|t| t.schema.as_ref().map(|s| (format!("tool `{}`", t.name), s)))
            .chain(match &self.final_report {
                ReportFormat::Json { schema } => Some(("the final report".to_owned(), schema)),
                _ => None,
            });
        for (what, schema) in schemas {
            jsonschema::validator_for(schema).map_err(|e| DefinitionError::Schema {
                agent: self.name.clone(),
                what,
                message: e.to_string(),
            })?;
        }
        Ok(())
    }
}
