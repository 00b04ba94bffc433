//! A small OTLP/HTTP receiver on 127.0.0.1, and collectors that misbehave.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

/// One request as received.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Log = Arc<(Mutex<Vec<Request>>, Condvar)>;

/// Answers the first `ok` trace exports with 200, every later one with 500 (not retried).
type FailAfter = Option<usize>;

/// Accepts OTLP/HTTP posts and answers each with 200 and an empty protobuf body.
pub struct Receiver {
    addr: SocketAddr,
    log: Log,
}

impl Receiver {
    pub fn start() -> Self {
        Self::serving(None)
    }

    /// A collector that takes the first `ok` trace exports, then fails every one (500).
    pub fn failing_after(ok: usize) -> Self {
        Self::serving(Some(ok))
    }

    fn serving(fail_after: FailAfter) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log: Log = Arc::default();
        let shared = Arc::clone(&log);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &log, fail_after));
            }
        });
        Receiver { addr, log }
    }

    /// The base endpoint, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Returns the requests received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.log.0.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until `n` requests have come, and returns them all.
    pub fn wait_for(&self, n: usize) -> Vec<Request> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (lock, arrived) = &*self.log;
        let mut requests = lock.lock().unwrap();
        while requests.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "only {} of {n} requests came",
                requests.len()
            );
            requests = arrived.wait_timeout(requests, left).unwrap().0;
        }
        requests.clone()
    }

    /// Decodes every trace export received.
    pub fn traces(&self) -> Vec<ExportTraceServiceRequest> {
        self.requests()
            .iter()
            .filter(|r| r.path == "/v1/traces")
            .map(|r| ExportTraceServiceRequest::decode(r.body.as_slice()).unwrap())
            .collect()
    }

    /// Decodes every metrics export received.
    pub fn metrics(&self) -> Vec<ExportMetricsServiceRequest> {
        self.requests()
            .iter()
            .filter(|r| r.path == "/v1/metrics")
            .map(|r| ExportMetricsServiceRequest::decode(r.body.as_slice()).unwrap())
            .collect()
    }
}

/// Serves one connection: requests one after the other (keep-alive) until it is closed.
fn serve(stream: TcpStream, log: &Log, fail_after: FailAfter) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                headers.push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
        let length: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .expect("the exporter sends a content length");
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let content_type = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map_or("application/x-protobuf".to_owned(), |(_, v)| v.clone());
        let traces_before = {
            let (lock, arrived) = &**log;
            let mut requests = lock.lock().unwrap();
            let before = requests.iter().filter(|r| r.path == "/v1/traces").count();
            let failing = path == "/v1/traces" && fail_after.is_some_and(|ok| before >= ok);
            requests.push(Request {
                path,
                headers,
                body,
            });
            arrived.notify_all();
            failing
        };
        if traces_before {
            let _ = writer.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 11\r\n\r\nstore full\n",
            );
            continue;
        }
        let empty = if content_type.contains("json") {
            "{}"
        } else {
            ""
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{empty}",
            empty.len()
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// A port nobody listens on: connections are refused.
pub fn refused_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// A collector that accepts connections and never answers (nor reads). Counts connections.
pub struct Silent {
    addr: SocketAddr,
    connections: Arc<Mutex<Vec<TcpStream>>>,
}

impl Silent {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let held = Arc::clone(&connections);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                held.lock().unwrap().push(stream);
            }
        });
        Silent { addr, connections }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.connections.lock().unwrap().len()
    }
}
