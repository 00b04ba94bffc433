//! The run's API keys: the agent holds per-run keys only, and the gateway swaps the real key in
//! as it forwards.
//!
//! For every variable that held the CLI's real key, the gateway makes a fresh per-run key (128
//! random bits); the agent gets that in its place. Wherever the provider APIs take a key
//! (`x-api-key`, `Authorization: Bearer`, `x-goog-api-key`, `api-key`, a `key=` query
//! parameter), a per-run key of the run is swapped for its real key; the real key itself (it
//! leaked to the agent, from a file or an ancestor's environment) and a per-run key of another
//! run are refused with 401 and never forwarded. Anything else passes untouched: no key at all,
//! or a credential the gateway did not make (the CLI's own login, such as Codex's ChatGPT token
//! while `OPENAI_API_KEY` is set for other tools), as without per-run keys; every call that
//! passes is counted.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// How every per-run key starts.
const PREFIX: &str = "sg-run-";

/// Headers that carry an API key in one of the dialects (`authorization` as `Bearer KEY`).
const KEY_HEADERS: [&str; 4] = ["x-api-key", "authorization", "x-goog-api-key", "api-key"];

/// The run's keys: `(per-run key, real key)` pairs. Empty when the CLI holds no key in its
/// environment (an OAuth login on disk): then credentials pass through untouched.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunKeys {
    pairs: Vec<(String, String)>,
}

/// Why a request's credentials were refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyRefusal {
    /// The real key itself: it leaked to the agent.
    Real,
    /// A per-run key of another run (or a bad copy of this run's).
    Foreign,
}

impl KeyRefusal {
    /// The text of the 401 answer (never the key itself).
    pub(crate) fn message(&self) -> &'static str {
        match self {
            KeyRefusal::Real => {
                "stepguard gateway: the request carries the real API key, which the agent must \
                 not hold; use the run's key from the agent's environment"
            }
            KeyRefusal::Foreign => {
                "stepguard gateway: the request's API key is another run's; use the run's key \
                 from the agent's environment"
            }
        }
    }
}

impl RunKeys {
    /// Makes a per-run key for each real one; `make` gives fresh random text.
    pub(crate) fn new(
        real: &[String],
        mut make: impl FnMut() -> std::io::Result<String>,
    ) -> std::io::Result<Self> {
        let mut pairs = Vec::new();
        for key in real {
            pairs.push((format!("{PREFIX}{}", make()?), key.clone()));
        }
        Ok(RunKeys { pairs })
    }

    /// The per-run keys, in the order of the real ones.
    pub(crate) fn per_run(&self) -> Vec<String> {
        self.pairs.iter().map(|(run, _)| run.clone()).collect()
    }

    /// What goes upstream in place of `key`: the real key for a per-run one of this run,
    /// `None` to leave it as it is, or the refusal (compared without an early exit).
    fn replace(&self, key: &str) -> Result<Option<&str>, KeyRefusal> {
        let (mut swapped, mut real) = (None, false);
        for (run, secret) in &self.pairs {
            if crate::proxy::same(run.as_bytes(), key.as_bytes()) {
                swapped = Some(secret.as_str());
            }
            real |= crate::proxy::same(secret.as_bytes(), key.as_bytes());
        }
        match swapped {
            Some(secret) => Ok(Some(secret)),
            None if real => Err(KeyRefusal::Real),
            None if key.starts_with(PREFIX) => Err(KeyRefusal::Foreign),
            None => Ok(None),
        }
    }

    /// Swaps the real keys in for this run's per-run keys: in `headers`, and in the `key=`
    /// parameter of `rest`'s query; refuses the real key and another run's. With no keys held,
    /// nothing is checked or changed.
    pub(crate) fn swap(
        &self,
        headers: &mut HeaderMap,
        rest: &mut String,
    ) -> Result<(), KeyRefusal> {
        if self.pairs.is_empty() {
            return Ok(());
        }
        for name in KEY_HEADERS {
            let name = HeaderName::from_static(name);
            let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
            if values.is_empty() {
                continue;
            }
            headers.remove(&name);
            for value in values {
                let swapped = self.header(name.as_str(), &value)?;
                headers.append(name.clone(), swapped);
            }
        }
        if let Some((path, query)) = rest.split_once('?') {
            let mut parts = Vec::new();
            for kv in query.split('&') {
                match kv.strip_prefix("key=").map(|key| self.replace(key)) {
                    Some(Ok(Some(real))) => parts.push(format!("key={}", escape(real))),
                    Some(Err(refused)) => return Err(refused),
                    _ => parts.push(kv.to_owned()),
                }
            }
            *rest = format!("{path}?{}", parts.join("&"));
        }
        Ok(())
    }

    /// One key header with the real key in place of a per-run one (others as they came).
    fn header(&self, name: &str, value: &HeaderValue) -> Result<HeaderValue, KeyRefusal> {
        let Ok(text) = value.to_str() else {
            return Ok(value.clone());
        };
        let text = text.trim();
        let (scheme, key) = match (name, text.split_once(' ')) {
            ("authorization", Some((s, k))) => (Some(s), k.trim()),
            ("authorization", None) => (None, text),
            _ => (None, text),
        };
        let Some(real) = self.replace(key)? else {
            return Ok(value.clone());
        };
        let text = match scheme {
            Some(s) => format!("{s} {real}"),
            None => real.to_owned(),
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| KeyRefusal::Real)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// Percent-escapes all but RFC 3986's unreserved characters, for a key in a query.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> RunKeys {
        let mut n = 0;
        RunKeys::new(&["sk-real-a".into(), "real b/+".into()], || {
            n += 1;
            Ok(format!("{n:032}"))
        })
        .unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn per_run_keys_are_swapped_for_the_real_ones_wherever_a_key_goes() {
        let k = keys();
        let [a, b] = [k.per_run()[0].clone(), k.per_run()[1].clone()];
        assert_ne!(a, b);
        let mut h = headers(&[("x-api-key", &a), ("authorization", &format!("Bearer {b}"))]);
        let mut rest = "/v1/messages".to_owned();
        assert_eq!(k.swap(&mut h, &mut rest), Ok(()));
        assert_eq!(h["x-api-key"], "sk-real-a");
        assert_eq!(h["authorization"], "Bearer real b/+");
        let mut h = HeaderMap::new();
        let mut rest = format!("/v1beta/models/m:generateContent?alt=sse&key={a}");
        assert_eq!(k.swap(&mut h, &mut rest), Ok(()));
        assert_eq!(
            rest,
            "/v1beta/models/m:generateContent?alt=sse&key=sk-real-a"
        );
        let mut rest = format!("/m?key={b}");
        assert_eq!(k.swap(&mut h, &mut rest), Ok(()));
        assert_eq!(rest, "/m?key=real%20b%2F%2B");
    }

    #[test]
    fn another_runs_key_and_the_real_key_are_refused_and_other_credentials_pass() {
        let k = keys();
        let a = k.per_run()[0].clone();
        let refused = |pairs: &[(&'static str, &str)], rest: &str| {
            let mut rest = rest.to_owned();
            k.swap(&mut headers(pairs), &mut rest).unwrap_err()
        };
        let other_run = "sg-run-00000000000000000000000000000009";
        assert_eq!(
            refused(&[("x-api-key", other_run)], "/v1"),
            KeyRefusal::Foreign
        );
        assert_eq!(
            refused(&[("x-api-key", "sk-real-a")], "/v1"),
            KeyRefusal::Real
        );
        assert_eq!(
            refused(&[("authorization", "Bearer real b/+")], "/v1"),
            KeyRefusal::Real
        );
        assert_eq!(
            refused(&[("authorization", "sk-real-a")], "/v1"),
            KeyRefusal::Real
        );
        assert_eq!(refused(&[], "/m?key=sk-real-a"), KeyRefusal::Real);
        assert_eq!(
            refused(&[], &format!("/m?key={other_run}")),
            KeyRefusal::Foreign
        );
        // One good key does not carry a bad one along.
        assert_eq!(
            refused(&[("x-api-key", &a), ("x-goog-api-key", "sk-real-a")], "/v1"),
            KeyRefusal::Real
        );
        // No key, and a credential the gateway did not make (a login's token), pass untouched.
        for pairs in [vec![], vec![("authorization", "Bearer oauth-token-1")]] {
            let mut h = headers(&pairs);
            let mut rest = "/v1/responses?x=1".to_owned();
            assert_eq!(k.swap(&mut h, &mut rest), Ok(()));
            assert_eq!(rest, "/v1/responses?x=1");
            assert_eq!(h, headers(&pairs));
        }
    }

    #[test]
    fn without_keys_credentials_pass_untouched() {
        let k = RunKeys::default();
        let mut h = headers(&[("authorization", "Bearer oauth-token")]);
        let mut rest = "/v1/messages".to_owned();
        assert_eq!(k.swap(&mut h, &mut rest), Ok(()));
        assert_eq!(h["authorization"], "Bearer oauth-token");
        let mut h = HeaderMap::new();
        assert_eq!(k.swap(&mut h, &mut rest), Ok(()));
    }
}
