//! The governor's log events: exactly one warning per failed attempt, one error per failed session.

use stepguard_core::FailureSlug;

use crate::attempt::AttemptReport;
use crate::conversation::ModelResponse;

/// The largest model response carried in a warning event.
pub const MAX_LOGGED_RESPONSE: usize = 128 * 1024;

/// Returns the response as JSON, cut to [`MAX_LOGGED_RESPONSE`] bytes (on a char boundary), and
/// whether it was cut.
pub fn capped_response(response: &ModelResponse) -> (String, bool) {
    let mut json = serde_json::to_string(response).unwrap_or_default();
    if json.len() <= MAX_LOGGED_RESPONSE {
        return (json, false);
    }
    let mut cut = MAX_LOGGED_RESPONSE;
    while !json.is_char_boundary(cut) {
        cut -= 1;
    }
    json.truncate(cut);
    (json, true)
}

/// Emits the one warning event of a failed attempt: its slugs and the complete model response.
/// This is the only place that emits it.
pub fn failed_attempt(agent: &str, attempt: &AttemptReport, response: &ModelResponse) {
    let (response, truncated) = capped_response(response);
    let slugs: Vec<&str> = attempt.slugs.iter().map(|s| s.as_str()).collect();
    tracing::warn!(
        target: "stepguard_governor::attempt",
        agent,
        step = attempt.step,
        turn = attempt.turn,
        attempt = attempt.attempt,
        slugs = %slugs.join(","),
        response = %response,
        truncated,
        "attempt failed"
    );
}

/// Emits the one error event of a failed session.
pub fn failed_session(agent: &str, slug: FailureSlug, status: &str) {
    tracing::error!(target: "stepguard_governor::session", agent, slug = slug.as_str(), status, "session failed");
}
