//! The run's API keys: the agent holds per-run keys only, and the gateway swaps the real key in
//! as it forwards.
//!
//! For every variable that held the CLI's real key, the gateway makes a fresh per-run key (128
//! random bits); the agent gets that in its place. A request must carry one of them wherever
//! the provider APIs take a key (`x-api-key`, `Authorization: Bearer`, `x-goog-api-key`,
//! `api-key`, a `key=` query parameter), and nothing else there: a request with no key, a key of
//! another run or the real key itself is refused with 401 and never forwarded. The gateway
//! never forwards a credential it did not issue, so a real key that leaked to the agent (from a
//! file, an ancestor's environment) cannot be spent through it unseen either.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

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
    /// No key anywhere a key goes.
    Missing,
    /// A key that is not one of this run's per-run keys.
    Foreign,
}

impl KeyRefusal {
    /// The text of the 401 answer (never the key itself).
    pub(crate) fn message(&self) -> &'static str {
        match self {
            KeyRefusal::Missing => {
                "stepguard gateway: the request carries no API key; the run's key is in the \
                 agent's environment"
            }
            KeyRefusal::Foreign => {
                "stepguard gateway: the request's API key is not this run's key; the gateway \
                 accepts only the per-run key it gave the agent"
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
            pairs.push((format!("sg-run-{}", make()?), key.clone()));
        }
        Ok(RunKeys { pairs })
    }

    /// The per-run keys, in the order of the real ones.
    pub(crate) fn per_run(&self) -> Vec<String> {
        self.pairs.iter().map(|(run, _)| run.clone()).collect()
    }

    /// The real key for a per-run `key` (compared without an early exit).
    fn real(&self, key: &str) -> Option<&str> {
        let mut found = None;
        for (run, real) in &self.pairs {
            if crate::proxy::same(run.as_bytes(), key.as_bytes()) {
                found = Some(real.as_str());
            }
        }
        found
    }

    /// Checks a request's keys and swaps the real ones in: in `headers`, and in the `key=`
    /// parameter of `rest`'s query. With no keys held, nothing is checked or changed.
    pub(crate) fn swap(
        &self,
        headers: &mut HeaderMap,
        rest: &mut String,
    ) -> Result<(), KeyRefusal> {
        if self.pairs.is_empty() {
            return Ok(());
        }
        let mut seen = false;
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
                seen = true;
            }
        }
        if let Some((path, query)) = rest.split_once('?') {
            let mut parts = Vec::new();
            for kv in query.split('&') {
                match kv.strip_prefix("key=") {
                    Some(key) => {
                        let real = self.real(key).ok_or(KeyRefusal::Foreign)?;
                        parts.push(format!("key={}", escape(real)));
                        seen = true;
                    }
                    None => parts.push(kv.to_owned()),
                }
            }
            *rest = format!("{path}?{}", parts.join("&"));
        }
        if seen {
            Ok(())
        } else {
            Err(KeyRefusal::Missing)
        }
    }

    /// One key header with the real key in place of the per-run one.
    fn header(&self, name: &str, value: &HeaderValue) -> Result<HeaderValue, KeyRefusal> {
        let text = value.to_str().map_err(|_| KeyRefusal::Foreign)?.trim();
        let (scheme, key) = match name {
            "authorization" => match text.split_once(' ') {
                Some((s, k)) if s.eq_ignore_ascii_case("bearer") => (Some(s), k.trim()),
                _ => return Err(KeyRefusal::Foreign),
            },
            _ => (None, text),
        };
        let real = self.real(key).ok_or(KeyRefusal::Foreign)?;
        let text = match scheme {
            Some(s) => format!("{s} {real}"),
            None => real.to_owned(),
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| KeyRefusal::Foreign)?;
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
    fn no_key_another_runs_key_or_the_real_key_is_refused() {
        let k = keys();
        let a = k.per_run()[0].clone();
        let refused = |pairs: &[(&'static str, &str)], rest: &str| {
            let mut rest = rest.to_owned();
            k.swap(&mut headers(pairs), &mut rest).unwrap_err()
        };
        assert_eq!(refused(&[], "/v1/messages"), KeyRefusal::Missing);
        assert_eq!(
            refused(&[("x-other", &a)], "/v1/messages?x=1"),
            KeyRefusal::Missing
        );
        assert_eq!(
            refused(
                &[("x-api-key", "sg-run-00000000000000000000000000000009")],
                "/v1"
            ),
            KeyRefusal::Foreign
        );
        assert_eq!(
            refused(&[("x-api-key", "sk-real-a")], "/v1"),
            KeyRefusal::Foreign
        );
        assert_eq!(
            refused(&[("authorization", "Bearer sk-real-a")], "/v1"),
            KeyRefusal::Foreign
        );
        assert_eq!(
            refused(&[("authorization", &a)], "/v1"),
            KeyRefusal::Foreign
        );
        assert_eq!(refused(&[], "/m?key=sk-real-a"), KeyRefusal::Foreign);
        // One good key does not carry a bad one along.
        assert_eq!(
            refused(&[("x-api-key", &a), ("x-goog-api-key", "sk-real-a")], "/v1"),
            KeyRefusal::Foreign
        );
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
