//! A small HTTP/1.1 client for a plain-`http://` server: kept-alive connections, chunked and
//! length-framed bodies, and a socket a [`CancelToken`] can close.
//!
//! ureq reads a body until it ends or a timeout fires; nothing another thread does interrupts
//! the read, so an abandoned generation kept decoding on the server to `max_tokens`. Here every
//! call registers a `shutdown` of its socket with the token: a cancel wakes the blocked read at
//! once, and the server sees the connection close (llama-server frees the slot). `https://`
//! servers go through ureq (the `tls` feature), where a cancel takes effect at the next chunk.

use crate::cancel::{CancelHook, CancelToken};
use parking_lot::Mutex;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// Why a request got no response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpError {
    /// Nothing listens at the address.
    ConnectionRefused { url: String, detail: String },
    /// Connecting or reading the head took longer than the timeout.
    Timeout { url: String, detail: String },
    /// Any other failure of the connection or of the server's HTTP.
    Transport { url: String, detail: String },
    /// The caller's token was cancelled.
    Cancelled,
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::ConnectionRefused { url, detail } => {
                write!(f, "{url}: connection refused ({detail})")
            }
            HttpError::Timeout { url, detail } => write!(f, "{url}: timed out ({detail})"),
            HttpError::Transport { url, detail } => write!(f, "{url}: {detail}"),
            HttpError::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// The addresses a client may connect to for a host and port (a network policy's answer), or
/// why none.
pub(crate) type Resolver = Arc<dyn Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// One request: its method, path (below the endpoint's prefix, with any query), extra header
/// lines and body.
pub(crate) struct Request<'a> {
    /// `GET`, `POST`, `DELETE`.
    pub method: &'a str,
    /// The path below the endpoint's prefix.
    pub path: &'a str,
    /// Header lines besides `Host` and `Content-Length`; a value holding CR or LF is refused.
    pub headers: &'a [(&'a str, &'a str)],
    /// The body (`Content-Length` is sent unless it is empty and the method is `GET`).
    pub body: &'a [u8],
}

/// Idle connections kept per server: one per concurrent caller in a typical host.
const MAX_IDLE: usize = 8;
/// Longest status line or header line accepted.
const MAX_HEAD_LINE: usize = 16 * 1024;
/// Most header lines accepted.
const MAX_HEADERS: usize = 100;

/// Where a plain-HTTP server listens, parsed from a base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    host: String,
    port: u16,
    /// The path prefix of the base URL, without a trailing slash (often empty).
    prefix: String,
}

impl Endpoint {
    /// `http://host[:port][/prefix]`; `None` for any other scheme.
    pub(crate) fn parse(base_url: &str) -> Option<Endpoint> {
        let rest = base_url.strip_prefix("http://")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, tail) = v6.split_once(']')?;
            let port = match tail.strip_prefix(':') {
                Some(p) => p.parse().ok()?,
                None if tail.is_empty() => 80,
                None => return None,
            };
            (h.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().ok()?),
                None => (authority.to_owned(), 80),
            }
        };
        if host.is_empty() {
            return None;
        }
        Some(Endpoint {
            host,
            port,
            prefix: path.to_owned(),
        })
    }

    /// The host (a name or an address, without brackets).
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A client for one server, safe to share across threads.
pub(crate) struct HttpClient {
    endpoint: Endpoint,
    host_header: String,
    connect_timeout: Duration,
    read_timeout: Duration,
    idle: Arc<Mutex<Vec<TcpStream>>>,
    /// An `Authorization` header's value; never printed.
    authorization: Option<String>,
    /// Where a host may be reached; `None`: wherever it resolves to.
    resolver: Option<Resolver>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("endpoint", &self.endpoint)
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// A response whose body is read through [`Read`]; the connection goes back to the pool when
/// the body was read to its end, and is closed when the response is dropped before that.
pub(crate) struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type`, lowercased; empty when absent.
    pub content_type: String,
    /// Every header, its name lowercased, its value as sent (trimmed).
    pub headers: Vec<(String, String)>,
    body: Body,
}

impl Response {
    /// The first header named `name` (lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Read for Response {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body.read(buf)
    }
}

enum Framing {
    /// `Content-Length` bytes remain.
    Length(u64),
    /// Chunked; this many bytes remain in the current chunk (0: a size line comes next).
    Chunked { left: u64 },
    /// Until the server closes the connection.
    UntilClose,
    /// The body was read to its end.
    Done,
}

struct Body {
    /// Where the connection goes back once the body was read to its end.
    pool: Arc<Mutex<Vec<TcpStream>>>,
    conn: Option<BufReader<TcpStream>>,
    framing: Framing,
    keep_alive: bool,
    hook: Option<CancelHook>,
}

fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, what.to_owned())
}

fn read_line_limited(r: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<usize> {
    line.clear();
    let n = r.take(MAX_HEAD_LINE as u64 + 1).read_until(b'\n', line)?;
    if n > MAX_HEAD_LINE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a header or chunk-size line is too long",
        ));
    }
    Ok(n)
}

impl Body {
    /// Reads the end of the body: the connection can serve the next call.
    fn finish(&mut self) {
        self.framing = Framing::Done;
        // Unregister first: a cancel arriving now must not shut a pooled connection.
        self.hook = None;
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.buffer().is_empty() {
                let mut idle = self.pool.lock();
                if idle.len() < MAX_IDLE {
                    idle.push(conn.into_inner());
                }
            }
        }
    }

    fn conn(&mut self) -> io::Result<&mut BufReader<TcpStream>> {
        self.conn
            .as_mut()
            .ok_or_else(|| eof("the connection is closed"))
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.framing {
                Framing::Done => return Ok(0),
                Framing::Length(0) => {
                    self.finish();
                    return Ok(0);
                }
                Framing::Length(left) => {
                    let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = self.conn()?.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(eof("the server closed the connection mid-body"));
                    }
                    self.framing = Framing::Length(left - n as u64);
                    return Ok(n);
                }
                Framing::Chunked { left: 0 } => {
                    let mut line = Vec::new();
                    if read_line_limited(self.conn()?, &mut line)? == 0 {
                        return Err(eof("the server closed the connection mid-body"));
                    }
                    let text = String::from_utf8_lossy(&line);
                    let size = text.split(';').next().unwrap_or("").trim();
                    let size = u64::from_str_radix(size, 16).map_err(|_| {
                        io::Error::new(io::ErrorKind::InvalidData, "a bad chunk-size line")
                    })?;
                    if size == 0 {
                        // Trailers, then the blank line that ends the body.
                        loop {
                            if read_line_limited(self.conn()?, &mut line)? == 0 {
                                return Err(eof("the server closed the connection in trailers"));
                            }
                            if line == b"\r\n" || line == b"\n" {
                                break;
                            }
                        }
                        self.finish();
                        return Ok(0);
                    }
                    self.framing = Framing::Chunked { left: size };
                }
                Framing::Chunked { left } => {
                    let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = self.conn()?.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(eof("the server closed the connection mid-chunk"));
                    }
                    let left = left - n as u64;
                    if left == 0 {
                        let mut crlf = Vec::new();
                        read_line_limited(self.conn()?, &mut crlf)?;
                        if crlf != b"\r\n" && crlf != b"\n" {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "a chunk does not end with CRLF",
                            ));
                        }
                    }
                    self.framing = Framing::Chunked { left };
                    return Ok(n);
                }
                Framing::UntilClose => {
                    let n = self.conn()?.read(buf)?;
                    if n == 0 {
                        self.framing = Framing::Done;
                        self.conn = None;
                    }
                    return Ok(n);
                }
            }
        }
    }
}

/// Why a call failed before its body.
fn io_error(url: &str, e: &io::Error, what: &str) -> HttpError {
    let detail = format!("{what}: {e}");
    let url = url.to_owned();
    match e.kind() {
        io::ErrorKind::ConnectionRefused => HttpError::ConnectionRefused { url, detail },
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => HttpError::Timeout { url, detail },
        _ => HttpError::Transport { url, detail },
    }
}

/// Whether a failure on a reused connection means the server had closed it while idle.
fn stale(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

struct Head {
    status: u16,
    content_type: String,
    headers: Vec<(String, String)>,
    framing: Framing,
    keep_alive: bool,
}

fn read_head(conn: &mut BufReader<TcpStream>) -> io::Result<Head> {
    let mut line = Vec::new();
    if read_line_limited(conn, &mut line)? == 0 {
        return Err(eof("the server closed the connection before answering"));
    }
    let status_line = String::from_utf8_lossy(&line).into_owned();
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or_default();
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| version.starts_with("HTTP/1."))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "not an HTTP/1.x status line: {:?}",
                    status_line.chars().take(80).collect::<String>()
                ),
            )
        })?;
    let mut keep_alive = version == "HTTP/1.1";
    let (mut length, mut chunked, mut content_type) = (None, false, String::new());
    let mut headers = Vec::new();
    for _ in 0..MAX_HEADERS {
        if read_line_limited(conn, &mut line)? == 0 {
            return Err(eof("the server closed the connection in the headers"));
        }
        if line == b"\r\n" || line == b"\n" {
            let framing = if chunked {
                Framing::Chunked { left: 0 }
            } else if let Some(n) = length {
                Framing::Length(n)
            } else if status == 204 || status == 304 {
                Framing::Length(0)
            } else {
                keep_alive = false;
                Framing::UntilClose
            };
            return Ok(Head {
                status,
                content_type,
                headers,
                framing,
                keep_alive,
            });
        }
        let text = String::from_utf8_lossy(&line);
        let Some((name, value)) = text.split_once(':') else {
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        headers.push((name.clone(), value.trim().to_owned()));
        let value = value.trim().to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                length = Some(value.parse().map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "a bad Content-Length")
                })?)
            }
            "transfer-encoding" => chunked = value.split(',').any(|v| v.trim() == "chunked"),
            "connection" => {
                if value.contains("close") {
                    keep_alive = false
                } else if value.contains("keep-alive") {
                    keep_alive = true
                }
            }
            "content-type" => content_type = value,
            _ => {}
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "too many header lines",
    ))
}

impl HttpClient {
    pub(crate) fn new(
        endpoint: Endpoint,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> HttpClient {
        HttpClient {
            host_header: endpoint.host_header(),
            endpoint,
            connect_timeout,
            read_timeout,
            idle: Arc::new(Mutex::new(Vec::new())),
            authorization: None,
            resolver: None,
        }
    }

    /// This client connecting only where `resolver` says a host may be reached.
    pub(crate) fn with_resolver(mut self, resolver: Resolver) -> HttpClient {
        self.resolver = Some(resolver);
        self
    }

    /// This client sending `Authorization: <value>` with every request.
    pub(crate) fn with_authorization(mut self, value: Option<String>) -> HttpClient {
        self.authorization = value;
        self
    }

    /// The full URL of `path` on this server, for messages.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}{path}", self.host_header, self.endpoint.prefix)
    }

    /// An idle connection the server has not closed. llama-server closes a connection after a
    /// streamed answer (its `Keep-Alive` header notwithstanding); the FIN has arrived by the
    /// next call, so a non-blocking peek finds it without a failed request.
    fn pooled(&self) -> Option<TcpStream> {
        loop {
            let s = self.idle.lock().pop()?;
            let open = s.set_nonblocking(true).is_ok()
                && matches!(s.peek(&mut [0u8; 1]), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
                && s.set_nonblocking(false).is_ok();
            if open {
                return Some(s);
            }
        }
    }

    fn connect(&self) -> io::Result<TcpStream> {
        let addrs: Vec<SocketAddr> = match &self.resolver {
            Some(resolve) => resolve(&self.endpoint.host, self.endpoint.port)?,
            None => (self.endpoint.host.as_str(), self.endpoint.port)
                .to_socket_addrs()?
                .collect(),
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.connect_timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// POSTs `body` as JSON to `path` and reads the response head; see [`HttpClient::send`].
    ///
    /// # Errors
    /// Connection, timeout and protocol failures; [`HttpError::Cancelled`].
    pub(crate) fn post(
        &self,
        path: &str,
        body: &[u8],
        token: &CancelToken,
    ) -> Result<Response, HttpError> {
        let headers = [
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream, application/json"),
        ];
        self.send(
            &Request {
                method: "POST",
                path,
                headers: &headers,
                body,
            },
            token,
            None,
        )
    }

    /// Sends `request` and reads the response head, within `timeout` (the client's read
    /// timeout when `None`; it also bounds each read of the body). A cancel of `token` while
    /// the call or the body read blocks shuts the socket down. A kept-alive connection the
    /// server had closed is retried once on a fresh one.
    ///
    /// # Errors
    /// Connection, timeout and protocol failures; [`HttpError::Cancelled`].
    pub(crate) fn send(
        &self,
        request: &Request<'_>,
        token: &CancelToken,
        timeout: Option<Duration>,
    ) -> Result<Response, HttpError> {
        let url = self.url(request.path);
        let timeout = timeout
            .unwrap_or(self.read_timeout)
            .max(Duration::from_millis(1));
        let mut head = format!(
            "{} {}{} HTTP/1.1\r\nHost: {}\r\n",
            request.method, self.endpoint.prefix, request.path, self.host_header
        );
        for (name, value) in request.headers {
            if value.contains(['\r', '\n']) || name.contains(['\r', '\n', ':']) {
                return Err(HttpError::Transport {
                    url,
                    detail: format!("the header {name:?} holds a line break"),
                });
            }
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(a) = &self.authorization {
            head.push_str(&format!("Authorization: {a}\r\n"));
        }
        if request.method != "GET" || !request.body.is_empty() {
            head.push_str(&format!("Content-Length: {}\r\n", request.body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(request.body);
        for attempt in 0..2 {
            if token.is_cancelled() {
                return Err(HttpError::Cancelled);
            }
            let pooled = if attempt == 0 { self.pooled() } else { None };
            let reused = pooled.is_some();
            let stream = match pooled {
                Some(s) => s,
                None => self
                    .connect()
                    .map_err(|e| io_error(&url, &e, "connecting"))?,
            };
            stream
                .set_read_timeout(Some(timeout))
                .and_then(|()| stream.set_write_timeout(Some(timeout)))
                .map_err(|e| io_error(&url, &e, "setting socket timeouts"))?;
            let waker = stream
                .try_clone()
                .map_err(|e| io_error(&url, &e, "duplicating the socket"))?;
            let hook = token.on_cancel(move || {
                let _ = waker.shutdown(Shutdown::Both);
            });
            let mut conn = BufReader::new(stream);
            let sent = conn.get_mut().write_all(&bytes);
            let head = sent.and_then(|()| read_head(&mut conn));
            match head {
                Ok(head) => {
                    return Ok(Response {
                        status: head.status,
                        content_type: head.content_type,
                        headers: head.headers,
                        body: Body {
                            pool: self.idle.clone(),
                            conn: Some(conn),
                            framing: head.framing,
                            keep_alive: head.keep_alive,
                            hook: Some(hook),
                        },
                    })
                }
                Err(_) if token.is_cancelled() => return Err(HttpError::Cancelled),
                Err(e) if reused && stale(&e) => continue,
                Err(e) => return Err(io_error(&url, &e, "reading the answer")),
            }
        }
        Err(HttpError::Transport {
            url,
            detail: "the server closed a fresh connection before answering".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_host_port_and_prefix() {
        let e = Endpoint::parse("http://127.0.0.1:10000").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("127.0.0.1", 10000, "")
        );
        let e = Endpoint::parse("http://models.lan/llm/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("models.lan", 80, "/llm")
        );
        let e = Endpoint::parse("http://[::1]:8080").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 8080));
        assert_eq!(e.host_header(), "[::1]:8080");
        for bad in [
            "https://x",
            "http://",
            "http://h:notaport",
            "ftp://h",
            "http://[::1",
        ] {
            assert_eq!(Endpoint::parse(bad), None, "{bad}");
        }
    }
}
