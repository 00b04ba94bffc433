//! The HTTP client exports go through: reqwest's blocking one, remembering why the last request
//! failed (the exporter itself reports only "network error", which tells an operator nothing).

use std::error::Error;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// A blocking HTTP client that keeps the root cause of its last transport failure.
#[derive(Clone, Debug)]
pub(crate) struct Transport {
    client: reqwest::blocking::Client,
    last_failure: Arc<Mutex<Option<String>>>,
}

impl Transport {
    /// A client whose every request (connecting, sending, reading the answer) ends within
    /// `timeout`. Must not be called inside an async runtime (the export threads have none).
    pub fn new(timeout: Duration) -> Result<Self, String> {
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("could not set up the HTTP client: {}", root_cause(&e)))?;
        Ok(Transport {
            client,
            last_failure: Arc::default(),
        })
    }

    /// Returns the exporter's `cause`, with the transport's own reason when the exporter only
    /// says the network failed.
    pub fn explain(&self, cause: String) -> String {
        let last = self
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match last {
            Some(why) if cause.contains("network error") => why,
            _ => cause,
        }
    }
}

#[async_trait]
impl HttpClient for Transport {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let result = self.client.send_bytes(request).await;
        if let Err(e) = &result {
            *self
                .last_failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(root_cause(e.as_ref()));
        }
        result
    }
}

/// The innermost error's message: `Connection refused (os error 111)` rather than
/// `error sending request for url (…)`.
fn root_cause(error: &(dyn Error + 'static)) -> String {
    let mut error = error;
    while let Some(source) = error.source() {
        error = source;
    }
    error.to_string()
}
