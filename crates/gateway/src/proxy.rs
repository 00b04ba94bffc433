//! The HTTP side: accept the CLI's requests, pace the main ones, forward to the one upstream and
//! stream the replies back.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as Legacy;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};

use crate::usage::UsageScanner;
use crate::{Dialect, GatewayEvent, Held, MAX_MODEL_REQUEST, Plan, REFUSAL_TEXT, Shared, Slot};

type GBody = BoxBody<Bytes, hyper::Error>;
pub(crate) type Client = Legacy<HttpsConnector<HttpConnector>, GBody>;

/// How much of the last reply is kept for its text.
const KEEP_REPLY: usize = 1024 * 1024;

/// Headers that belong to one connection, never forwarded either way.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Parts of header names that mark credentials: such headers are never written to recordings.
const SECRET_HEADER_PARTS: [&str; 7] = [
    "auth",
    "key",
    "token",
    "secret",
    "cookie",
    "organization",
    "account",
];

fn secret_header(name: &str) -> bool {
    SECRET_HEADER_PARTS.iter().any(|p| name.contains(p))
}

/// An HTTPS-or-HTTP client with the system's trust roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`
/// override them, as for other tools).
pub(crate) fn client(connect_timeout: Duration) -> std::io::Result<Client> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => b,
        Err(e) => {
            // No roots at all: plain-HTTP upstreams still work, HTTPS ones fail to verify.
            tracing::warn!("no trusted TLS roots found ({e}); https:// model upstreams will fail");
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
                .with_safe_default_protocol_versions()
                .map_err(std::io::Error::other)?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    let https = builder.https_or_http().enable_http1().wrap_connector(http);
    Ok(Legacy::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https))
}

struct Ctx {
    shared: Arc<Shared>,
    client: Client,
    upstream: Uri,
}

/// Serves until `stop` fires; connections still open are cut when the runtime ends.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    client: Client,
    upstream: Uri,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("the model gateway cannot listen: {e}");
            return;
        }
    };
    let ctx = Arc::new(Ctx {
        shared,
        client,
        upstream,
    });
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let ctx = Arc::clone(&ctx);
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let ctx = Arc::clone(&ctx);
                        async move { Ok::<_, Infallible>(handle(&ctx, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

fn full(bytes: impl Into<Bytes>) -> GBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn plain(status: StatusCode, text: &str) -> Response<GBody> {
    let mut resp = Response::new(full(format!("{text}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Compares without an early exit, so the token cannot be found byte by byte by timing.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The part of the request target after the token, or `None` when the token is wrong.
fn after_token<'a>(target: &'a str, token: &str) -> Option<&'a str> {
    let rest = target.strip_prefix('/')?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    same(&rest.as_bytes()[..end], token.as_bytes()).then(|| &rest[end..])
}

/// The upstream URL for `rest` (path and query after the token).
fn target(upstream: &Uri, rest: &str) -> Result<Uri, hyper::http::Error> {
    let base = upstream.path().trim_end_matches('/');
    let rest = if rest.starts_with('/') || rest.is_empty() {
        rest.to_owned()
    } else {
        format!("/{rest}")
    };
    let mut pq = format!("{base}{rest}");
    if pq.is_empty() || pq.starts_with('?') {
        pq.insert(0, '/');
    }
    let mut parts = upstream.clone().into_parts();
    parts.path_and_query = Some(pq.parse()?);
    Ok(Uri::from_parts(parts)?)
}

/// The path after the token made canonical, so that the path classified is the path the
/// upstream sees: escapes of unreserved characters decoded (`%6D` is `m`), repeated and trailing
/// slashes dropped. What could make the upstream read another path is refused: dot segments,
/// any other escape (`%2F`, `%2E`, `%00`…), path parameters (`;x`), characters no model API path
/// uses. The query is kept as it came.
fn canonical(rest: &str) -> Result<String, String> {
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let mut out = String::with_capacity(path.len());
    let mut bytes = path.bytes();
    while let Some(b) = bytes.next() {
        let c = match b {
            b'%' => {
                let hex = [bytes.next(), bytes.next()];
                let hex = hex.map(|h| h.map(char::from).and_then(|h| h.to_digit(16)));
                let [Some(hi), Some(lo)] = hex else {
                    return Err(format!("a bad escape in the path {path}"));
                };
                let c = (hi * 16 + lo) as u8;
                if !unreserved(c) || c == b'.' {
                    return Err(format!(
                        "escapes other than of letters, digits and `-_~` are not forwarded ({path})"
                    ));
                }
                c
            }
            b'/' if out.ends_with('/') => continue,
            b';' => return Err(format!("path parameters (`;`) are not forwarded ({path})")),
            b'/' | b':' | b'@' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b','
            | b'=' => b,
            c if unreserved(c) => c,
            _ => return Err(format!("a character no model API path uses in {path}")),
        };
        out.push(char::from(c));
    }
    while out.len() > 1 && out.ends_with('/') {
        out.pop();
    }
    if out.split('/').any(|seg| seg == "." || seg == "..") {
        return Err("dot segments are not forwarded".to_owned());
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

/// RFC 3986's unreserved characters: the same escaped or not.
fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

fn forward_headers(from: &HeaderMap, to: &mut HeaderMap, drop_length: bool) {
    for (name, value) in from {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || (drop_length && n == "content-length") {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

async fn handle(ctx: &Ctx, mut req: Request<Incoming>) -> Response<GBody> {
    let shared = &ctx.shared;
    let target_text = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let Some(rest) = after_token(&target_text, &shared.token) else {
        return plain(
            StatusCode::FORBIDDEN,
            "stepguard gateway: this URL is not the run's gateway URL",
        );
    };
    // What is classified is what is forwarded: the path made canonical, or refused.
    let mut rest = match canonical(rest) {
        Ok(rest) => rest,
        Err(why) => {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("stepguard gateway: {why}"),
            );
        }
    };
    // Only this run's per-run key goes in; the real key goes out in its place.
    if let Err(refused) = shared.keys.swap(req.headers_mut(), &mut rest) {
        return plain(StatusCode::UNAUTHORIZED, refused.message());
    }
    let Ok(uri) = target(&ctx.upstream, &rest) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "stepguard gateway: bad request target",
        );
    };
    // A model call over a WebSocket could be neither counted nor rewritten. 426 (not 404)
    // makes Codex fall back to HTTP at once, without five reconnects and an error item.
    if req.headers().contains_key(header::UPGRADE) {
        return plain(
            StatusCode::UPGRADE_REQUIRED,
            "stepguard gateway: connection upgrades (WebSocket) are not forwarded; use HTTP",
        );
    }
    let dialect = shared.config.dialect;
    let (parts, body) = req.into_parts();
    let is_model = parts.method == Method::POST && dialect.is_model_path(&rest);
    if !is_model {
        record(shared, &parts, &rest, "other", None);
        return forward(ctx, &parts, uri, body.boxed(), false, None).await;
    }
    let mut held = Held::new(shared);
    let bytes = match read_body(body, &parts.headers, &mut held).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    // A model call that cannot be read can be neither counted nor paced: never forwarded.
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.eq_ignore_ascii_case("identity"));
    let probed = match encoded {
        Some(enc) => Err(format!("its body is compressed ({enc})")),
        None => dialect
            .probe(&bytes)
            .ok_or_else(|| "its body is not the JSON of a model request".to_owned()),
    };
    let (tools, model) = match probed {
        Ok(p) => p,
        Err(why) => return unreadable(shared, &rest, &why),
    };
    let model = model
        .or_else(|| Dialect::model_in_path(&rest))
        .unwrap_or_default();
    // Before the first call has settled there is no estimate: calls wait their turn.
    let slot = shared.admit().await;
    if !tools {
        // Side calls cost too: with a cost budget, one that cannot be priced is not made, and
        // none is made once a budget is spent.
        if shared.config.pace.max_cost_usd.is_some() && !shared.config.pace.can_price(&model) {
            return unpriced(shared, &model);
        }
        if shared.side_refused().is_some() {
            return refusal(shared, &parts, &rest, &bytes);
        }
        record(shared, &parts, &rest, "side", Some(&bytes));
        let meter = Meter::new(dialect, &model, (false, false), bytes.len(), slot);
        return forward(ctx, &parts, uri, full(bytes), false, Some(meter)).await;
    }
    main_call(ctx, parts, rest, uri, bytes, &model, slot).await
}

/// Reads a model request's body whole, every byte counted against the gateway's cap on bodies
/// held: past [`MAX_MODEL_REQUEST`] it is refused with 413, past the cap with 503 (the CLI's
/// retry comes when others are done). A declared length is counted before anything is read.
async fn read_body(
    mut body: Incoming,
    headers: &HeaderMap,
    held: &mut Held,
) -> Result<Bytes, Response<GBody>> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "stepguard gateway: a model request may be at most {} MiB",
                MAX_MODEL_REQUEST >> 20
            ),
        )
    };
    if declared.is_some_and(|n| n > MAX_MODEL_REQUEST) {
        return Err(too_large());
    }
    let mut buf = Vec::new();
    if let Some(n) = declared {
        if !held.grow(n) {
            return Err(busy());
        }
        buf.reserve_exact(n);
    }
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            plain(
                StatusCode::BAD_REQUEST,
                &format!("stepguard gateway: cannot read the request body: {e}"),
            )
        })?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > MAX_MODEL_REQUEST || declared.is_some_and(|n| len > n) {
            return Err(too_large());
        }
        if len > buf.capacity() {
            // Grown here, by doubling, so what is held is what is counted.
            let cap = len.max(buf.capacity() * 2).min(MAX_MODEL_REQUEST);
            if !held.grow(cap - buf.capacity()) {
                return Err(busy());
            }
            buf.reserve_exact(cap - buf.len());
        }
        buf.extend_from_slice(data);
    }
    Ok(Bytes::from(buf))
}

/// The answer to a request whose body would pass the cap on bodies held at once.
fn busy() -> Response<GBody> {
    let mut resp = plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "stepguard gateway: too many large requests at once (the memory for request bodies is \
         in use); retry shortly",
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The gateway's own final answer to a call it will not make, in the call's dialect.
fn refusal(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    rest: &str,
    bytes: &[u8],
) -> Response<GBody> {
    let count = {
        let mut t = shared.tally();
        t.refused += 1;
        t.refused
    };
    (shared.config.on_event)(GatewayEvent::Refused { count });
    record(shared, parts, rest, "refused", Some(bytes));
    let json: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let (ctype, text) = shared.config.dialect.final_reply(rest, &json, REFUSAL_TEXT);
    let mut resp = Response::new(full(text));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    resp
}

/// The answer to a model call whose body cannot be read: an error, and the run is told.
fn unreadable(shared: &Shared, rest: &str, why: &str) -> Response<GBody> {
    let path = rest.split('?').next().unwrap_or("");
    let why = format!(
        "stepguard gateway: a model call to {path} was not made: {why}, so it could be neither \
         counted nor paced"
    );
    (shared.config.on_event)(GatewayEvent::Unreadable { why: why.clone() });
    let mut resp = Response::new(full(
        json!({"error": {"type": "invalid_request_error", "message": why}}).to_string(),
    ));
    *resp.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The answer to a call whose model has no price while a cost budget is set: an error the CLI
/// shows, never forwarded.
fn unpriced(shared: &Shared, model: &str) -> Response<GBody> {
    (shared.config.on_event)(GatewayEvent::Unpriced {
        model: model.to_owned(),
    });
    let message = format!(
        "stepguard gateway: the model `{model}` has no price, so the cost budget cannot be kept; \
         the call was not made"
    );
    let mut resp = Response::new(full(
        json!({"error": {"type": "invalid_request_error", "message": message}}).to_string(),
    ));
    *resp.status_mut() = StatusCode::BAD_REQUEST;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A model call that offers tools: one step of the agent, paced by the budgets.
async fn main_call(
    ctx: &Ctx,
    parts: hyper::http::request::Parts,
    rest: String,
    uri: Uri,
    bytes: Bytes,
    model: &str,
    slot: Slot,
) -> Response<GBody> {
    let shared = &ctx.shared;
    let dialect = shared.config.dialect;
    let mut slot = slot;
    let reservation = shared.reserve(&mut slot).await;
    let (plan, pending) = shared.plan(model, reservation);
    let pace = &shared.config.pace;
    // Only a call that changes is parsed into a value; the others go out as they came.
    let (label, last, notice) = match plan {
        Plan::Unpriced => return unpriced(shared, model),
        Plan::Refuse => return refusal(shared, &parts, &rest, &bytes),
        Plan::Last { number } => {
            (shared.config.on_event)(GatewayEvent::Forwarded { number, last: true });
            ("last", true, Some(shared.last_notice()))
        }
        Plan::Forward { number } => {
            let notice = pending.or_else(|| {
                let limit = pace.limit.filter(|_| shared.config.notices)?;
                let step = if pace.count_requests {
                    number
                } else {
                    pace.steps.load(std::sync::atomic::Ordering::Relaxed) + 1
                };
                Some(format!("system notice: this is step {step} of {limit}"))
            });
            (shared.config.on_event)(GatewayEvent::Forwarded {
                number,
                last: false,
            });
            ("forward", false, notice)
        }
    };
    let meter = Meter::new(dialect, model, (true, last), bytes.len(), slot);
    // Chat completions stream usage only when asked: with a token or cost budget, ask.
    let spend = pace.max_tokens.is_some() || pace.max_cost_usd.is_some();
    let ask_usage = spend && dialect == Dialect::OpenAiChat;
    let notice = match (notice, ask_usage) {
        (None, true) => Some(String::new()),
        (n, _) => n,
    };
    let Some(notice) = notice else {
        record(shared, &parts, &rest, label, Some(&bytes));
        return forward(ctx, &parts, uri, full(bytes), false, Some(meter)).await;
    };
    let body = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut json) => {
            if last {
                dialect.disable_tools(&mut json);
            }
            if !notice.is_empty() {
                dialect.add_notice(&mut json, &notice);
            }
            if ask_usage && json["stream"] == true {
                json["stream_options"]["include_usage"] = Value::Bool(true);
            }
            Bytes::from(json.to_string())
        }
        // Read by the probe but not into a value (nested past serde_json's 128 levels): a call
        // that cannot be rewritten must not go out as it came, with its tools on.
        Err(e) => {
            shared.settle(last, false);
            let why = format!("its body cannot be rewritten ({e})");
            return unreadable(shared, &rest, &why);
        }
    };
    record(shared, &parts, &rest, label, Some(&body));
    forward(ctx, &parts, uri, full(body), true, Some(meter)).await
}

/// What is read from a model call's reply as it streams back: its usage, and for the last call
/// its text.
struct Meter {
    dialect: Dialect,
    model: String,
    main: bool,
    /// The last call: keep the reply's first MiB for its text.
    keep_text: bool,
    /// The request's size, for an estimate when the reply reports no usage.
    request_bytes: usize,
    /// The call's admission, released when the reply has ended (after its usage is counted).
    slot: Slot,
}

impl Meter {
    /// `(main, last)`: whether the call is a main one, and the last one (its text is kept).
    fn new(
        dialect: Dialect,
        model: &str,
        (main, keep_text): (bool, bool),
        request_bytes: usize,
        slot: Slot,
    ) -> Self {
        Meter {
            dialect,
            model: model.to_owned(),
            main,
            keep_text,
            request_bytes,
            slot,
        }
    }
}

/// Sends the request upstream and streams the reply back; a `meter` reads the reply's usage
/// (and the last call's text) as it passes.
async fn forward(
    ctx: &Ctx,
    parts: &hyper::http::request::Parts,
    uri: Uri,
    body: GBody,
    rewritten: bool,
    meter: Option<Meter>,
) -> Response<GBody> {
    let mut out = Request::new(body);
    *out.method_mut() = parts.method.clone();
    *out.uri_mut() = uri;
    forward_headers(&parts.headers, out.headers_mut(), rewritten);
    if meter.is_some() {
        // Model replies are read for their usage and text: no compression.
        out.headers_mut().insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    match ctx.client.request(out).await {
        Ok(resp) => {
            let (rparts, rbody) = resp.into_parts();
            let streamed = rparts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let body = match meter {
                Some(meter) if rparts.status.is_success() => Tee {
                    inner: rbody,
                    kept: Vec::new(),
                    scanner: Some(UsageScanner::new(meter.dialect, streamed)),
                    reply_bytes: 0,
                    meter,
                    shared: Arc::clone(&ctx.shared),
                    done: false,
                }
                .boxed(),
                Some(meter) => {
                    // Not a success: not a step, nor the last call; a retry takes its place.
                    if meter.main {
                        ctx.shared.settle(meter.keep_text, false);
                    }
                    rbody.boxed()
                }
                None => rbody.boxed(),
            };
            let mut back = Response::new(body);
            *back.status_mut() = rparts.status;
            forward_headers(&rparts.headers, back.headers_mut(), false);
            back
        }
        Err(e) => {
            if let Some(meter) = meter.as_ref().filter(|m| m.main) {
                ctx.shared.settle(meter.keep_text, false);
            }
            let error = describe(&e, &ctx.upstream);
            if e.is_connect() {
                (ctx.shared.config.on_event)(GatewayEvent::UpstreamFailed {
                    error: error.clone(),
                });
            }
            tracing::warn!("{error}");
            let mut resp = Response::new(full(
                json!({"error": {"type": "api_error", "message": error}}).to_string(),
            ));
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
    }
}

/// Says what failed with the upstream, with the innermost cause (no headers, no credentials).
fn describe(e: &hyper_util::client::legacy::Error, upstream: &Uri) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    // Host and port only: an upstream URL may carry `user:password@`.
    let host = match (upstream.host(), upstream.port_u16()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_owned(),
        _ => "?".to_owned(),
    };
    format!(
        "stepguard gateway: cannot reach the model upstream {}://{host}: {cause}",
        upstream.scheme_str().unwrap_or("http")
    )
}

/// Writes one request to the recording directory, without credentials.
fn record(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    rest: &str,
    plan: &str,
    body: Option<&[u8]>,
) {
    let Some(dir) = &shared.config.record_requests else {
        return;
    };
    let n = {
        let mut t = shared.tally();
        t.recorded += 1;
        t.recorded
    };
    let headers: serde_json::Map<String, Value> = parts
        .headers
        .iter()
        .filter(|(k, _)| !secret_header(k.as_str()))
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let body = body.map(|b| {
        serde_json::from_slice::<Value>(b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned()))
    });
    let entry = json!({
        "method": parts.method.as_str(),
        "path": strip_key(rest),
        "plan": plan,
        "headers": headers,
        "body": body,
    });
    let file = dir.join(format!("{n:04}-{plan}.json"));
    // Conversations may hold what the agent read: readable by the user only.
    let written = {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| f.write_all(entry.to_string().as_bytes()))
    };
    if let Err(e) = written {
        tracing::warn!("cannot record a request to {}: {e}", file.display());
    }
}

/// Removes a `key=` query parameter (Gemini accepts its API key there).
fn strip_key(rest: &str) -> String {
    let Some((path, query)) = rest.split_once('?') else {
        return rest.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.starts_with("key="))
        .collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// A reply body passed through frame by frame, of which the first MiB is kept for its text.
struct Tee {
    inner: Incoming,
    kept: Vec<u8>,
    scanner: Option<UsageScanner>,
    /// Bytes of the reply so far.
    reply_bytes: usize,
    meter: Meter,
    shared: Arc<Shared>,
    done: bool,
}

impl Tee {
    fn finish(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if self.meter.keep_text {
            let text = self.meter.dialect.reply_text(&self.kept);
            if !text.trim().is_empty() {
                self.shared.tally().final_text = Some(text);
            }
        }
        let pace = &self.shared.config.pace;
        let spend = pace.max_tokens.is_some() || pace.max_cost_usd.is_some();
        let usage = self
            .scanner
            .take()
            .and_then(UsageScanner::finish)
            .or_else(|| {
                // A reply that reports no usage is still paid for: with a budget, count it at about
                // four bytes a token rather than as nothing.
                spend.then_some(crate::CallUsage {
                    input: (self.meter.request_bytes / 4) as u64,
                    cached_input: 0,
                    output: (self.reply_bytes / 4) as u64,
                })
            });
        if let Some(usage) = usage {
            self.meter.slot.actual =
                self.shared
                    .account(&self.meter.model, self.meter.main, &usage);
        }
        if self.meter.main {
            self.shared.settle(self.meter.keep_text, true);
        }
    }
}

impl Body for Tee {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.reply_bytes = this.reply_bytes.saturating_add(data.len());
                    if this.meter.keep_text {
                        let room = KEEP_REPLY.saturating_sub(this.kept.len());
                        this.kept.extend_from_slice(&data[..data.len().min(room)]);
                    }
                    if let Some(scanner) = this.scanner.as_mut() {
                        scanner.feed(data);
                    }
                }
            }
            Poll::Ready(None) => this.finish(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_must_be_the_whole_first_segment() {
        assert_eq!(after_token("/abc/v1/messages", "abc"), Some("/v1/messages"));
        assert_eq!(after_token("/abc?x=1", "abc"), Some("?x=1"));
        assert_eq!(after_token("/abc", "abc"), Some(""));
        assert_eq!(after_token("/abcd/v1", "abc"), None);
        assert_eq!(after_token("/ab/v1", "abc"), None);
        assert_eq!(after_token("/v1/messages", "abc"), None);
        assert_eq!(after_token("/", "abc"), None);
    }

    #[test]
    fn targets_join_the_upstream_path_and_keep_the_query() {
        let up: Uri = "http://127.0.0.1:5/v1".parse().unwrap();
        assert_eq!(
            target(&up, "/responses").unwrap().to_string(),
            "http://127.0.0.1:5/v1/responses"
        );
        let up: Uri = "https://api.example.com".parse().unwrap();
        assert_eq!(
            target(&up, "/v1beta/models/m:streamGenerateContent?alt=sse")
                .unwrap()
                .to_string(),
            "https://api.example.com/v1beta/models/m:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            target(&up, "").unwrap().to_string(),
            "https://api.example.com/"
        );
        assert_eq!(
            target(&up, "?x").unwrap().to_string(),
            "https://api.example.com/?x"
        );
    }

    #[test]
    fn paths_are_made_canonical_or_refused_before_they_are_classified() {
        let ok = |p: &str| canonical(p).unwrap();
        assert_eq!(ok("/v1/messages/"), "/v1/messages");
        assert_eq!(ok("/v1//messages//"), "/v1/messages");
        assert_eq!(ok("/v1/%6Dessages"), "/v1/messages");
        assert_eq!(ok("/v1/MESSAGE%53"), "/v1/MESSAGES");
        assert_eq!(ok("/v1/messages?beta=true"), "/v1/messages?beta=true");
        assert_eq!(
            ok("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"),
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        );
        assert_eq!(ok(""), "");
        assert_eq!(ok("?x=1"), "?x=1");
        assert_eq!(ok("/"), "/");
        for bad in [
            "/v1/messages;x",
            "/v1/messages;",
            "/v1/%2e%2e/admin",
            "/v1/%2E./admin",
            "/v1/../admin",
            "/v1/./messages",
            "/v1%2Fmessages",
            "/v1/messages%00",
            "/v1/messages%3B",
            "/v1/messages%",
            "/v1/messages%6",
            "/v1/messages%zz",
            "/v1/messages\\x",
            "/v1/mess ages",
            "/v1/messagés",
        ] {
            assert!(canonical(bad).is_err(), "{bad}");
        }
        // Every dialect classifies the canonical form.
        assert!(Dialect::AnthropicMessages.is_model_path(&ok("/v1/messages/")));
        assert!(Dialect::OpenAiResponses.is_model_path(&ok("/v1/respons%65s")));
        assert!(Dialect::OpenAiChat.is_model_path(&ok("/v1/chat//completions/")));
    }

    #[test]
    fn recorded_paths_lose_their_api_key() {
        assert_eq!(strip_key("/m:gen?key=SECRET&alt=sse"), "/m:gen?alt=sse");
        assert_eq!(strip_key("/m:gen?key=SECRET"), "/m:gen");
        assert_eq!(strip_key("/m"), "/m");
    }
}
