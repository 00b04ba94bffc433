//! Just enough HTTP/1.1 for a test server: one request per connection, answered whole or as a
//! chunked event stream that can be cut short on purpose.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// The largest request head accepted (request line plus headers).
const MAX_HEAD: usize = 256 * 1024;
/// The largest request body accepted; agent requests carry whole conversations, so be generous.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One HTTP request as read off the wire.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The request target without its query string.
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads one request; `Ok(None)` when the peer closed the connection before sending anything.
pub(crate) fn read_request(stream: &mut BufReader<TcpStream>) -> io::Result<Option<Request>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = stream.read_until(b'\n', &mut head)?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(bad("connection closed inside the request head"))
            };
        }
        if head.len() > MAX_HEAD {
            return Err(bad("request head too large"));
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            if before == 0 {
                head.clear(); // a stray empty line between requests
                continue;
            }
            break;
        }
    }
    let head = String::from_utf8(head).map_err(|_| bad("request head is not UTF-8"))?;
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(bad(format!("malformed request line {request_line:?}")));
    };
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((k, v)) = line.split_once(':') else {
            return Err(bad(format!("malformed header line {line:?}")));
        };
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let mut request = Request {
        method: method.to_owned(),
        target: target.to_owned(),
        headers,
        body: Vec::new(),
    };
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        request.body = read_chunked(stream)?;
    } else if let Some(len) = request.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| bad(format!("bad content-length {len:?}")))?;
        if len > MAX_BODY {
            return Err(bad("request body too large"));
        }
        request.body = vec![0; len];
        stream.read_exact(&mut request.body)?;
    }
    Ok(Some(request))
}

fn read_chunked(stream: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size_line = String::new();
        stream.read_line(&mut size_line)?;
        let size = size_line.trim().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| bad(format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                let mut line = String::new();
                if stream.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(bad("request body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..])?;
        let mut crlf = [0; 2];
        stream.read_exact(&mut crlf)?;
    }
}

/// What the server sends back.
#[derive(Debug)]
pub(crate) enum Response {
    /// A whole response with a `Content-Length`.
    Full {
        status: u16,
        headers: Vec<(&'static str, String)>,
        content_type: &'static str,
        body: Vec<u8>,
    },
    /// `200` with a chunked `text/event-stream` body of these pre-formatted events.
    Sse {
        events: Vec<String>,
        /// Send this many events, then half of the next one, then drop the connection without
        /// ending the chunked body: a broken stream as a client sees one.
        cut_after: Option<usize>,
    },
}

impl Response {
    /// A JSON response.
    pub(crate) fn json(status: u16, value: &serde_json::Value) -> Self {
        Response::Full {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body: value.to_string().into_bytes(),
        }
    }

    /// Adds a header to a whole response.
    pub(crate) fn with_header(mut self, name: &'static str, value: String) -> Self {
        if let Response::Full { headers, .. } = &mut self {
            headers.push((name, value));
        }
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

/// Writes `response`; the connection is closed afterwards in every case.
pub(crate) fn write_response(
    stream: &mut TcpStream,
    response: &Response,
    head_only: bool,
) -> io::Result<()> {
    match response {
        Response::Full {
            status,
            headers,
            content_type,
            body,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
                reason(*status),
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            stream.write_all(out.as_bytes())?;
            if !head_only {
                stream.write_all(body)?;
            }
            stream.flush()
        }
        Response::Sse { events, cut_after } => {
            stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
            )?;
            for (i, event) in events.iter().enumerate() {
                if *cut_after == Some(i) {
                    let half = &event.as_bytes()[..event.len() / 2];
                    write_chunk(stream, half)?;
                    stream.flush()?;
                    return stream.shutdown(std::net::Shutdown::Both);
                }
                write_chunk(stream, event.as_bytes())?;
                stream.flush()?;
            }
            stream.write_all(b"0\r\n\r\n")?;
            stream.flush()
        }
    }
}

fn write_chunk(stream: &mut TcpStream, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    write!(stream, "{:x}\r\n", data.len())?;
    stream.write_all(data)?;
    stream.write_all(b"\r\n")
}
