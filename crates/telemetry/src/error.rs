//! What can go wrong exporting: only the export itself (configuration problems are warnings).

use std::fmt;
use std::time::Duration;

/// Exporting failed; the run it describes is unaffected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// One or both signals were not exported within the bound.
    #[error("{}", describe(.failures, *.bound))]
    Export {
        /// Each signal that failed, traces first.
        failures: Vec<ExportFailure>,
        /// The bound the export was given.
        bound: Duration,
    },
}

/// One signal that could not be exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportFailure {
    /// `traces` or `metrics`.
    pub signal: &'static str,
    /// The URL posted to.
    pub endpoint: String,
    /// Why, in the exporter's words (`no answer` when the bound ran out first).
    pub cause: String,
}

impl fmt::Display for ExportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.signal, self.cause)
    }
}

/// `could not export to URL within 2s: cause`, naming every endpoint and, when the causes
/// differ, each signal's.
fn describe(failures: &[ExportFailure], bound: Duration) -> String {
    let mut endpoints: Vec<&str> = failures.iter().map(|f| f.endpoint.as_str()).collect();
    endpoints.dedup();
    let mut causes: Vec<&str> = failures.iter().map(|f| f.cause.as_str()).collect();
    causes.dedup();
    let why = if causes.len() == 1 {
        causes.join("")
    } else {
        failures
            .iter()
            .map(ExportFailure::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "could not export to {} within {}: {why}",
        endpoints.join(" and "),
        humantime::format_duration(bound)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(signal: &'static str, cause: &str) -> ExportFailure {
        ExportFailure {
            signal,
            endpoint: format!("http://c:4318/v1/{signal}"),
            cause: cause.to_owned(),
        }
    }

    #[test]
    fn one_cause_is_said_once_and_different_ones_per_signal() {
        let bound = Duration::from_secs(2);
        let same = vec![
            failure("traces", "no answer"),
            failure("metrics", "no answer"),
        ];
        assert_eq!(
            describe(&same, bound),
            "could not export to http://c:4318/v1/traces and http://c:4318/v1/metrics within \
             2s: no answer"
        );
        let different = vec![
            failure("traces", "refused"),
            failure("metrics", "no answer"),
        ];
        assert!(
            describe(&different, bound).ends_with(": traces: refused, metrics: no answer"),
            "{}",
            describe(&different, bound)
        );
    }
}
