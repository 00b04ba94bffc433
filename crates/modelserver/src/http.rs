//! Just enough HTTP/1.1 for a test server: sequential requests on a kept-alive connection, each
//! answered whole or as a chunked event stream that can be cut short on purpose, over any
//! [`Conn`] (plain TCP or TLS).

use std::io::{self, BufRead, Read, Write};
use std::net::{Shutdown, TcpStream};

/// The largest request head accepted (request line plus headers).
const MAX_HEAD: usize = 256 * 1024;
/// The largest request body accepted; agent requests carry whole conversations, so be generous.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A connection the server reads requests from and writes responses to, and can end cleanly or
/// as a broken stream.
pub(crate) trait Conn: Read + Write {
    /// Ends the connection after the last response: `clean` for a proper end (with a TLS
    /// `close_notify`), else abruptly, as a stream that broke off.
    fn end(&mut self, clean: bool);
}

impl Conn for TcpStream {
    fn end(&mut self, clean: bool) {
        let how = if clean {
            Shutdown::Write
        } else {
            Shutdown::Both
        };
        let _ = self.shutdown(how);
    }
}

/// One HTTP request as read off the wire.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) target: String,
    /// The protocol of the request line, such as `HTTP/1.1`.
    pub(crate) version: String,
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

    /// Whether the client may send another request on this connection: HTTP/1.1 unless it
    /// says `Connection: close`, HTTP/1.0 only if it says `Connection: keep-alive`.
    pub(crate) fn keep_alive(&self) -> bool {
        let has = |token: &str| {
            self.header("connection")
                .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        };
        if self.version.eq_ignore_ascii_case("HTTP/1.0") {
            has("keep-alive")
        } else {
            !has("close")
        }
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads one request; `Ok(None)` when the peer closed the connection before sending anything.
pub(crate) fn read_request(stream: &mut impl BufRead) -> io::Result<Option<Request>> {
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
    let version = parts.next().unwrap_or("HTTP/1.0");
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
        version: version.to_owned(),
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

fn read_chunked(stream: &mut impl BufRead) -> io::Result<Vec<u8>> {
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
        /// Filler events made while writing, if any.
        padding: Option<Padding>,
        /// Send this many events, then half of the next one, then drop the connection without
        /// ending the chunked body: a broken stream as a client sees one.
        cut_after: Option<usize>,
    },
}

/// Filler text streamed as many events of about [`PAD_CHUNK`] bytes of text each, made one by
/// one while writing so that a reply of any size takes constant memory.
#[derive(Debug)]
pub(crate) struct Padding {
    /// The filler events go after this many of the response's events.
    pub(crate) after: usize,
    /// Bytes of filler text in all (before JSON escaping).
    pub(crate) bytes: usize,
    /// Each filler event is this, then its text as a JSON string, then [`Padding::suffix`].
    pub(crate) prefix: String,
    /// See [`Padding::prefix`].
    pub(crate) suffix: String,
}

/// Bytes of filler text per filler event.
pub(crate) const PAD_CHUNK: usize = 16 * 1024;

/// [`PAD_CHUNK`] bytes of filler text: lines of 64 bytes, so that no client sees one huge line.
fn pad_text() -> String {
    const LINE: &str = "padding text streamed by the scripted model server, line #";
    let mut text = String::with_capacity(PAD_CHUNK);
    let mut n = 0;
    while text.len() < PAD_CHUNK {
        let line = format!("{LINE}{n:05}\n");
        text.push_str(&line[..line.len().min(PAD_CHUNK - text.len())]);
        n += 1;
    }
    text
}

impl Padding {
    /// Writes the filler events as chunks, flushing after each.
    fn write(&self, stream: &mut impl Write) -> io::Result<()> {
        let text = pad_text();
        let full = serde_json::Value::from(text.as_str()).to_string();
        let mut left = self.bytes;
        while left > 0 {
            let n = left.min(PAD_CHUNK);
            let json = if n == PAD_CHUNK {
                full.clone()
            } else {
                serde_json::Value::from(&text[..n]).to_string()
            };
            let len = self.prefix.len() + json.len() + self.suffix.len();
            write!(stream, "{len:x}\r\n")?;
            stream.write_all(self.prefix.as_bytes())?;
            stream.write_all(json.as_bytes())?;
            stream.write_all(self.suffix.as_bytes())?;
            stream.write_all(b"\r\n")?;
            stream.flush()?;
            left -= n;
        }
        Ok(())
    }
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
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

/// Writes `response`, announcing whether the connection stays open (`keep_alive`); returns
/// whether it may, which a stream cut short on purpose never does.
pub(crate) fn write_response(
    stream: &mut impl Write,
    response: &Response,
    head_only: bool,
    keep_alive: bool,
) -> io::Result<bool> {
    let connection = |open: bool| if open { "keep-alive" } else { "close" };
    match response {
        Response::Full {
            status,
            headers,
            content_type,
            body,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: {}\r\n",
                reason(*status),
                body.len(),
                connection(keep_alive),
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            stream.write_all(out.as_bytes())?;
            if !head_only {
                stream.write_all(body)?;
            }
            stream.flush()?;
            Ok(keep_alive)
        }
        Response::Sse {
            events,
            padding,
            cut_after,
        } => {
            let keep_alive = keep_alive && cut_after.is_none();
            write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: {}\r\n\r\n",
                connection(keep_alive),
            )?;
            for (i, event) in events.iter().enumerate() {
                if let Some(padding) = padding.as_ref().filter(|p| p.after == i) {
                    padding.write(stream)?;
                }
                if *cut_after == Some(i) {
                    let half = &event.as_bytes()[..event.len() / 2];
                    write_chunk(stream, half)?;
                    stream.flush()?;
                    return Ok(false);
                }
                write_chunk(stream, event.as_bytes())?;
                stream.flush()?;
            }
            if let Some(padding) = padding.as_ref().filter(|p| p.after >= events.len()) {
                padding.write(stream)?;
            }
            stream.write_all(b"0\r\n\r\n")?;
            stream.flush()?;
            Ok(keep_alive)
        }
    }
}

fn write_chunk(stream: &mut impl Write, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    write!(stream, "{:x}\r\n", data.len())?;
    stream.write_all(data)?;
    stream.write_all(b"\r\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::BufReader;

    use super::*;

    fn request(head: &str) -> Request {
        read_request(&mut BufReader::new(head.as_bytes()))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        assert!(request("GET / HTTP/1.1\r\n\r\n").keep_alive());
        assert!(!request("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").keep_alive());
        assert!(!request("GET / HTTP/1.0\r\n\r\n").keep_alive());
        assert!(request("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").keep_alive());
    }

    #[test]
    fn padding_is_written_as_chunks_of_the_given_total() {
        let padding = Padding {
            after: 0,
            bytes: 2 * PAD_CHUNK + 5,
            prefix: "data: {\"t\":".to_owned(),
            suffix: "}\n\n".to_owned(),
        };
        let mut out = Vec::new();
        padding.write(&mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let mut total = 0;
        let mut chunks = 0;
        for line in out.lines().filter(|l| l.starts_with("data: ")) {
            let v: serde_json::Value = serde_json::from_str(&line[6..]).unwrap();
            total += v["t"].as_str().unwrap().len();
            chunks += 1;
        }
        assert_eq!((total, chunks), (2 * PAD_CHUNK + 5, 3));
    }
}
