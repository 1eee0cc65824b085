//! The proxy a run with an allowlist reaches the network through: HTTP `CONNECT` (checked
//! against the TLS ClientHello's server name) and plain-HTTP forwarding (checked against the
//! Host header, one request per connection: its body is passed on to its end and nothing
//! after it), each target checked against the allowlist, resolved once by the proxy, and
//! connected to at the address it checked. It stops with the run.
//!
//! Where it listens depends on the run's [`Route`]: inside the run's network namespace (the
//! listener comes from the run's supervisor), or, mediated, on an ephemeral port of the host's
//! loopback that takes only the connections correx itself made for the run (every other
//! client is closed unread).

use super::http1::{self, Framing};
use super::policy::{split_port, Host, Refusal, Rules};
use super::tls;
use crate::confine::Route;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The port the proxy listens on inside the run's namespace.
pub(crate) const PROXY_PORT: u16 = 3128;
/// Connections open at once (each takes two threads while it lasts).
const MAX_OPEN: u32 = 64;
/// The largest request head read.
const MAX_HEAD: usize = 64 * 1024;
/// How long a client may take to send its request head or ClientHello.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may be idle both ways before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a waiting read looks at the connection's idle time and the stop flag.
const IDLE_CHECK: Duration = Duration::from_secs(5);
/// How long the proxy tries to reach an allowed host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Refusals kept for the record; more are counted.
const MAX_DENIALS: usize = 256;

/// One refused request, as recorded in `tool.network_denied`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Denial {
    pub host: String,
    pub port: u16,
    pub reason: &'static str,
}

#[derive(Debug, Default)]
struct Tally {
    connections: u64,
    up: u64,
    down: u64,
}

/// What the run did through its proxy.
#[derive(Debug, Default)]
pub(crate) struct Report {
    allowed: BTreeMap<(String, u16), Tally>,
    pub denied: Vec<Denial>,
    /// Refusals past [`MAX_DENIALS`], not kept.
    pub denied_dropped: u64,
}

impl Report {
    /// As the run's result data and its outcome event carry it.
    pub(crate) fn to_json(&self) -> Value {
        let (mut connections, mut up, mut down) = (0, 0, 0);
        let allowed: Vec<Value> = self
            .allowed
            .iter()
            .map(|((host, port), t)| {
                connections += t.connections;
                up += t.up;
                down += t.down;
                json!({"host": host, "port": port, "connections": t.connections,
                       "bytes_up": t.up, "bytes_down": t.down})
            })
            .collect();
        let denied: Vec<Value> = self
            .denied
            .iter()
            .map(|d| json!({"host": d.host, "port": d.port, "reason": d.reason}))
            .collect();
        json!({
            "proxy": format!("127.0.0.1:{PROXY_PORT}"),
            "connections": connections,
            "bytes_up": up,
            "bytes_down": down,
            "allowed": allowed,
            "denied": denied,
            "denied_dropped": self.denied_dropped,
        })
    }
}

struct Shared {
    rules: Arc<Rules>,
    stop: AtomicBool,
    /// Connections accepted in all.
    opened: AtomicU32,
    bytes: AtomicU64,
    report: parking_lot::Mutex<Report>,
    /// The client and upstream sockets open now (each open while registered: its guard
    /// leaves before it closes), to shut when the run ends.
    sockets: parking_lot::Mutex<BTreeMap<u64, RawFd>>,
    next_socket: AtomicU64,
    /// When the proxy started: connections' last activity is counted from it.
    start: Instant,
    /// The listener's descriptor once received, to shut when the run ends.
    listener: parking_lot::Mutex<Option<Arc<TcpListener>>>,
    /// Mediated: the local addresses of the run's sockets correx connected to the listener,
    /// each let in once; `None` in a network namespace, where only the run can connect.
    expected: Option<parking_lot::Mutex<BTreeSet<SocketAddr>>>,
}

impl Shared {
    /// A proxy's state before anything connected; `own_listener` is the mediated route's.
    fn new(rules: Arc<Rules>, own_listener: Option<Arc<TcpListener>>) -> Shared {
        Shared {
            rules,
            stop: AtomicBool::new(false),
            opened: AtomicU32::new(0),
            bytes: AtomicU64::new(0),
            report: parking_lot::Mutex::new(Report::default()),
            sockets: parking_lot::Mutex::new(BTreeMap::new()),
            next_socket: AtomicU64::new(0),
            start: Instant::now(),
            expected: own_listener
                .as_ref()
                .map(|_| parking_lot::Mutex::new(BTreeSet::new())),
            listener: parking_lot::Mutex::new(own_listener),
        }
    }

    fn deny(&self, host: &str, port: u16, why: Refusal) {
        let mut r = self.report.lock();
        if r.denied.len() < MAX_DENIALS {
            r.denied.push(Denial {
                // What a run wrote: no control character reaches a log or a terminal.
                host: host
                    .chars()
                    .take(200)
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect(),
                port,
                reason: why.as_str(),
            });
        } else {
            r.denied_dropped += 1;
        }
    }

    /// Keeps `s` in a guard registered while it lives, so a stop can shut it; the guard shuts
    /// it when its connection is done (a clone would otherwise keep it open).
    fn track(&self, s: TcpStream) -> Tracked<'_> {
        let id = self.next_socket.fetch_add(1, Ordering::SeqCst);
        self.sockets.lock().insert(id, s.as_raw_fd());
        Tracked {
            shared: self,
            id,
            stream: s,
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// A socket registered while it lives. It owns the socket, so the socket is unregistered and
/// shut before it closes: a descriptor number shut after its close may be another socket's by
/// then (a run's next mediated connect got EPIPE that way, when the guard outlived a socket
/// moved elsewhere).
struct Tracked<'a> {
    shared: &'a Shared,
    id: u64,
    stream: TcpStream,
}

impl std::ops::Deref for Tracked<'_> {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.stream
    }
}

impl std::ops::DerefMut for Tracked<'_> {
    fn deref_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        // The stream closes after this returns, with the number no longer registered.
        if let Some(fd) = self.shared.sockets.lock().remove(&self.id) {
            crate::sys::net::shut(fd);
        }
    }
}

/// A run's proxy: started before the run, stopped (every connection closed) after it.
pub(crate) struct RunProxy {
    shared: Arc<Shared>,
    /// The socket the listener (or, mediated, the filter's listener) arrives on; shut to stop
    /// a wait for it.
    receiver: Arc<OwnedFd>,
    acceptor: Option<JoinHandle<()>>,
    /// Mediated: the thread that makes the run's connects.
    mediator: Option<JoinHandle<()>>,
}

impl RunProxy {
    /// Starts the proxy for a run kept to it by `route`. In a namespace, a thread waits for
    /// the listener the run's supervisor sends on `receiver`, then serves it. Mediated, the
    /// proxy listens on the host's loopback, and a thread waits for the run's seccomp
    /// listener on `receiver`, then answers the run's connects.
    pub(crate) fn start(
        rules: Arc<Rules>,
        receiver: OwnedFd,
        route: Route,
    ) -> io::Result<RunProxy> {
        let own_listener = match route {
            Route::Namespace => None,
            Route::Mediated => Some(Arc::new(TcpListener::bind("127.0.0.1:0")?)),
        };
        let shared = Arc::new(Shared::new(rules, own_listener.clone()));
        let receiver = Arc::new(receiver);
        let mut proxy = RunProxy {
            shared: shared.clone(),
            receiver: receiver.clone(),
            acceptor: None,
            mediator: None,
        };
        match own_listener {
            None => {
                proxy.acceptor = Some(
                    std::thread::Builder::new()
                        .name("correx-proxy".into())
                        .spawn(move || {
                            if let Some(l) = receive_listener(&shared, &receiver) {
                                accept_loop(&shared, &l);
                            }
                        })?,
                );
            }
            Some(listener) => {
                let port = listener.local_addr()?.port();
                let s = shared.clone();
                proxy.acceptor = Some(
                    std::thread::Builder::new()
                        .name("correx-proxy".into())
                        .spawn(move || accept_loop(&s, &listener))?,
                );
                proxy.mediator = Some(
                    std::thread::Builder::new()
                        .name("correx-proxy-connects".into())
                        .spawn(move || mediate(&shared, &receiver, port))?,
                );
            }
        }
        Ok(proxy)
    }

    /// Stops accepting, closes every connection, waits for the proxy's threads, and says what
    /// the run did through it.
    pub(crate) fn stop(mut self) -> Report {
        self.halt();
        std::mem::take(&mut *self.shared.report.lock())
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        crate::sys::net::shut(self.receiver.as_raw_fd());
        if let Some(l) = self.shared.listener.lock().as_ref() {
            crate::sys::net::shut(l.as_raw_fd());
        }
        for t in [self.acceptor.take(), self.mediator.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

impl Drop for RunProxy {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The listener the run's supervisor makes in the run's namespace; `None` when the run ended
/// first.
fn receive_listener(shared: &Shared, receiver: &OwnedFd) -> Option<Arc<TcpListener>> {
    let listener = match crate::sys::net::recv_fd(receiver) {
        Ok(Some(fd)) => Arc::new(TcpListener::from(fd)),
        Ok(None) => return None,
        Err(e) => {
            log::warn!("shell proxy: no listener from the run: {e}");
            return None;
        }
    };
    *shared.listener.lock() = Some(listener.clone());
    // A stop that came before the listener was stored could not shut it.
    (!shared.stop.load(Ordering::SeqCst)).then_some(listener)
}

/// Mediated: answers the run's connects until it ends. A connect to the proxy's address as
/// the run knows it (`127.0.0.1:3128`) becomes a connect of the run's socket to the proxy's
/// real port; any other is refused and recorded.
fn mediate(shared: &Shared, receiver: &OwnedFd, port: u16) {
    let listener = match crate::sys::net::recv_fd(receiver) {
        Ok(Some(fd)) => fd,
        Ok(None) => return,
        Err(e) => {
            log::warn!("shell proxy: no seccomp listener from the run: {e}");
            return;
        }
    };
    crate::sys::mediate::serve(listener, &shared.stop, |target| {
        let proxy = target.filter(|t| {
            t.port() == PROXY_PORT && t.ip().to_canonical() == IpAddr::from([127, 0, 0, 1])
        });
        let Some(proxy) = proxy else {
            match target {
                Some(t) => shared.deny(&t.ip().to_string(), t.port(), Refusal::Direct),
                None => shared.deny("(not an IP address)", 0, Refusal::Direct),
            }
            return Err(libc::EACCES);
        };
        let Some(expected) = &shared.expected else {
            return Err(libc::EACCES);
        };
        let mut registered = None;
        let connected = crate::sys::mediate::connect_loopback(proxy.is_ipv6(), port, |local| {
            expected.lock().insert(local);
            registered = Some(local);
        });
        if connected.is_err() {
            if let Some(local) = registered {
                expected.lock().remove(&local);
            }
        }
        connected
    });
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let client = match listener.accept() {
            // Mediated: only a connection correx made for the run, each once.
            Ok((c, peer)) => match &shared.expected {
                Some(expected) if !expected.lock().remove(&peer) => continue,
                _ => c,
            },
            Err(_) if shared.stop.load(Ordering::SeqCst) => break,
            // Out of descriptors or memory for a moment: the run's clients wait in the queue.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        handlers.retain(|h| !h.is_finished());
        // Bounded before a thread is spent on it: connections in all, and open at once.
        let opened = shared.opened.fetch_add(1, Ordering::SeqCst) + 1;
        if opened > shared.rules.max_connections || handlers.len() >= MAX_OPEN as usize {
            let mut client = client;
            refuse(shared, &mut client, "", 0, Refusal::TooManyConnections);
            continue;
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("correx-proxy-conn".into())
            .spawn(move || serve(&s, client));
        match spawned {
            Ok(h) => handlers.push(h),
            Err(e) => log::warn!("shell proxy: no thread for a connection: {e}"),
        }
    }
    for fd in shared.sockets.lock().values() {
        crate::sys::net::shut(*fd);
    }
    for h in handlers {
        let _ = h.join();
    }
}

/// What the head of a request says.
struct Request<'a> {
    method: &'a str,
    target: &'a str,
    version: &'a str,
    headers: Vec<(&'a str, &'a str)>,
}

/// A request head, strictly: no control character anywhere (a bare LF would be a line break
/// to some servers and not to us), header names of token characters, no folded lines, at most
/// one Host. How its body is framed is [`http1::framing`]'s to check.
fn parse_head(head: &str) -> Option<Request<'_>> {
    let control = |t: &str| t.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f);
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    let mut lines = head.split("\r\n");
    let first = lines.next()?;
    if control(first) {
        return None;
    }
    let mut parts = first.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || !token(method) {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) || control(line) {
            return None;
        }
        let (k, v) = line.split_once(':')?;
        if !token(k) {
            return None;
        }
        headers.push((k, v.trim()));
    }
    let count = |name: &str| {
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    };
    if count("host") > 1 {
        return None;
    }
    Some(Request {
        method,
        target,
        version,
        headers,
    })
}

/// Reads up to the end of the head; the head, and what came after it.
fn read_head(client: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    // One deadline for the whole head: a byte now and then does not keep a thread.
    let deadline = Instant::now() + HEAD_TIMEOUT;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        client
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        let n = client.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + end;
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            return Some((String::from_utf8(buf).ok()?, rest));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

fn answer(client: &mut TcpStream, status: &str, text: &str) {
    let body = format!("correx proxy: {text}\n");
    let _ = write!(
        client,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn refuse(shared: &Shared, client: &mut TcpStream, host: &str, port: u16, why: Refusal) {
    shared.deny(host, port, why);
    let status = match why {
        Refusal::BadRequest => "400 Bad Request",
        Refusal::Unreachable | Refusal::Unresolved => "502 Bad Gateway",
        Refusal::TooManyConnections | Refusal::ByteLimit => "429 Too Many Requests",
        _ => "403 Forbidden",
    };
    answer(
        client,
        status,
        &format!("{host}:{port} refused ({})", why.as_str()),
    );
}

/// `host:port` of a CONNECT or a URL's authority; `default` when it has no port.
fn authority(text: &str, default: u16) -> Option<(Host, u16)> {
    let (host, port) = split_port(text).ok()?;
    Some((Host::parse(host)?, port.unwrap_or(default)))
}

/// One client connection: its one request, checked, then the bytes both ways.
fn serve(shared: &Arc<Shared>, client: TcpStream) {
    let mut tracked = shared.track(client);
    let client: &mut TcpStream = &mut tracked;
    // No Nagle, here and upstream: the two ends made their own choice, and a relay that waits
    // for an ACK before passing a small segment on adds a delayed ACK (~40 ms) to every flight
    // of a handshake.
    let _ = client.set_nodelay(true);
    // A stop that came while this connection was being accepted could not shut it.
    if shared.stop.load(Ordering::SeqCst) {
        return;
    }
    let Some((head, rest)) = read_head(&mut *client) else {
        return refuse(shared, &mut *client, "", 0, Refusal::BadRequest);
    };
    let Some(req) = parse_head(&head) else {
        return refuse(shared, &mut *client, "", 0, Refusal::BadRequest);
    };
    let connect = req.method.eq_ignore_ascii_case("CONNECT");
    let target = if connect {
        authority(req.target, 443)
    } else {
        req.target
            .strip_prefix("http://")
            .and_then(|t| authority(t.split(['/', '?', '#']).next().unwrap_or(t), 80))
    };
    let Some((host, port)) = target else {
        let shown = req.target.chars().take(200).collect::<String>();
        return refuse(shared, &mut *client, &shown, 0, Refusal::BadRequest);
    };
    let name = host.to_string();
    if let Err(why) = shared.rules.check(&host, port) {
        return refuse(shared, &mut *client, &name, port, why);
    }
    let framing = if connect {
        Framing::None
    } else {
        match http1::framing(req.version, &req.headers) {
            Some(f) => f,
            None => return refuse(shared, &mut *client, &name, port, Refusal::BadRequest),
        }
    };
    if !connect {
        // The Host header must name what the URL names (no fronting on plain HTTP).
        let header = req
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map(|(_, v)| *v);
        if let Some(h) = header {
            if authority(h, 80) != Some((host.clone(), port)) {
                return refuse(shared, &mut *client, &name, port, Refusal::HostMismatch);
            }
        }
    }
    let addresses = match shared.rules.addresses(&host, port) {
        Ok(a) => a,
        Err(why) => return refuse(shared, &mut *client, &name, port, why),
    };
    let to = Target {
        host: &host,
        name,
        port,
        addresses: &addresses,
    };
    if connect {
        tunnel(shared, client, &rest, to);
    } else {
        forward(shared, client, &req, (&rest, framing), to);
    }
}

/// Where a checked request goes: the host as asked, its name as recorded, the port, and the
/// addresses it may be reached at.
struct Target<'a> {
    host: &'a Host,
    name: String,
    port: u16,
    addresses: &'a [IpAddr],
}

/// A CONNECT: the tunnel opens, and the TLS ClientHello must name the host asked for (no ECH,
/// no other SNI) before the bytes go upstream.
fn tunnel(shared: &Arc<Shared>, client: &mut TcpStream, rest: &[u8], to: Target<'_>) {
    let Target {
        host,
        name,
        port,
        addresses,
    } = to;
    if client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let hello = tls::read_client_hello(&mut rest.chain(&mut *client));
    let (raw, hello) = match hello {
        Ok(h) => h,
        Err(_) => return shared.deny(&name, port, Refusal::NoSni),
    };
    let why = match (&hello, host) {
        (None, _) => Some(Refusal::NoSni),
        (Some(h), _) if h.ech => Some(Refusal::EncryptedClientHello),
        (Some(h), Host::Name(n)) => match &h.sni {
            Some(s) if s == n => None,
            Some(_) => Some(Refusal::SniMismatch),
            None => Some(Refusal::NoSni),
        },
        // An address reached by TLS names no host, or names what it is fronting for.
        (Some(h), Host::Address(_)) => h.sni.is_some().then_some(Refusal::SniMismatch),
    };
    if let Some(why) = why {
        // The tunnel is open: nothing to answer on, only to close.
        return shared.deny(&name, port, why);
    }
    let Some(mut upstream) = reach(shared, addresses, port) else {
        return shared.deny(&name, port, Refusal::Unreachable);
    };
    if upstream.write_all(&raw).is_err() {
        return;
    }
    splice(
        shared,
        client,
        upstream,
        (name, port),
        raw.len() as u64,
        None,
    );
}

/// A plain-HTTP request: sent upstream with the Host that was checked, without the
/// hop-by-hop and proxy headers, as the connection's only request: its body (what came after
/// the head, `body.0`, then the client's bytes, framed as `body.1`) to its end, nothing after.
fn forward(
    shared: &Arc<Shared>,
    client: &mut TcpStream,
    req: &Request<'_>,
    body: (&[u8], Framing),
    to: Target<'_>,
) {
    let Target {
        name,
        port,
        addresses,
        ..
    } = to;
    let Some(mut upstream) = reach(shared, addresses, port) else {
        return refuse(shared, client, &name, port, Refusal::Unreachable);
    };
    let path = req
        .target
        .strip_prefix("http://")
        .and_then(|t| t.find('/').map(|i| &t[i..]))
        .unwrap_or("/");
    // The Host the upstream sees is the one checked, whatever the client sent.
    let mut out = format!("{} {path} {}\r\nHost: {name}", req.method, req.version);
    if port != 80 {
        out.push_str(&format!(":{port}"));
    }
    out.push_str("\r\n");
    for (k, v) in &req.headers {
        let dropped = [
            "host",
            "connection",
            "proxy-connection",
            "proxy-authorization",
            "keep-alive",
        ];
        if !dropped.iter().any(|h| k.eq_ignore_ascii_case(h)) {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    // One request per connection: the upstream closes after its answer, and what the
    // client sends after the body is never passed on.
    out.push_str("Connection: close\r\n\r\n");
    if upstream.write_all(out.as_bytes()).is_err() {
        return;
    }
    splice(
        shared,
        client,
        upstream,
        (name, port),
        out.len() as u64,
        Some(body),
    );
}

/// A read that waits out its socket's timeouts while `keep_waiting` says so.
struct Patient<'a, R> {
    inner: R,
    keep_waiting: &'a dyn Fn() -> bool,
}

impl<R: Read> Read for Patient<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && (self.keep_waiting)() => {}
                other => return other,
            }
        }
    }
}

/// A connection to the first of `addresses` that answers.
fn reach(shared: &Shared, addresses: &[IpAddr], port: u16) -> Option<TcpStream> {
    addresses.iter().find_map(|a| {
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        let s = TcpStream::connect_timeout(&SocketAddr::new(*a, port), CONNECT_TIMEOUT).ok()?;
        let _ = s.set_nodelay(true);
        Some(s)
    })
}

/// Copies `from` to `to` through a buffer (where splice is refused) until `from` ends, a
/// write fails, `allow` refuses a chunk, or `keep_waiting` says the connection is idle;
/// returns the bytes passed on.
fn copy_by_hand(
    mut from: &TcpStream,
    mut to: &TcpStream,
    allow: impl Fn(u64) -> bool,
    keep_waiting: impl Fn() -> bool,
) -> u64 {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) && keep_waiting() =>
            {
                continue
            }
            Err(_) => break,
        };
        if !allow(n as u64) || to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n as u64;
    }
    total
}

/// Copies both ways until both ends are done, counting bytes against the run's bound. With
/// `body` (a plain request's: what came after its head, and its framing) the client's bytes
/// go up to the body's end only; bytes after it are a refusal (`pipelined`), and the
/// connection ends with the answer.
fn splice(
    shared: &Arc<Shared>,
    client: &TcpStream,
    upstream: TcpStream,
    key: (String, u16),
    already_up: u64,
    body: Option<(&[u8], Framing)>,
) {
    let upstream = shared.track(upstream);
    let upstream: &TcpStream = &upstream;
    if shared.stop.load(Ordering::SeqCst) {
        return;
    }
    shared
        .report
        .lock()
        .allowed
        .entry(key.clone())
        .or_default()
        .connections += 1;
    shared.bytes.fetch_add(already_up, Ordering::SeqCst);
    // Reads wake now and then to look at the connection's last activity, either way.
    for s in [client, upstream] {
        let _ = s.set_read_timeout(Some(IDLE_CHECK));
    }
    // The connection is idle when neither way moved a byte for IDLE_TIMEOUT: a long download
    // to a client that sends nothing is not.
    let last = AtomicU64::new(shared.now_ms());
    let keep_waiting = || {
        !shared.stop.load(Ordering::SeqCst)
            && shared.now_ms().saturating_sub(last.load(Ordering::SeqCst))
                < IDLE_TIMEOUT.as_millis() as u64
    };
    // Counts a chunk against the run's bound before it is passed on.
    let allow = |from: &TcpStream, to: &TcpStream, n: u64| {
        last.store(shared.now_ms(), Ordering::SeqCst);
        let moved = shared.bytes.fetch_add(n, Ordering::SeqCst) + n;
        if moved > shared.rules.max_bytes {
            shared.deny(&key.0, key.1, Refusal::ByteLimit);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return false;
        }
        true
    };
    let copy = |from: &TcpStream, to: &TcpStream| -> u64 {
        let allow = |n| allow(from, to, n);
        // Through a pipe, without a copy in user space; read and write where splice is
        // refused.
        let pumped = crate::sys::net::pump(from.as_raw_fd(), to.as_raw_fd(), allow, keep_waiting);
        let total = pumped.unwrap_or_else(|| copy_by_hand(from, to, allow, keep_waiting));
        let _ = to.shutdown(Shutdown::Write);
        total
    };
    // One request's body, then a look for anything after it.
    let one_body = |from: &TcpStream, to: &TcpStream, (rest, framing): (&[u8], Framing)| {
        let mut input = io::BufReader::new(Patient {
            inner: rest.chain(from),
            keep_waiting: &keep_waiting,
        });
        let mut output = to;
        let sent = http1::copy_body(framing, &mut input, &mut output, &|n| allow(from, to, n));
        let sent = match sent {
            Ok(n) => n,
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    shared.deny(&key.0, key.1, Refusal::BadRequest);
                }
                let _ = from.shutdown(Shutdown::Both);
                let _ = to.shutdown(Shutdown::Both);
                return 0;
            }
        };
        // Waits until the client sends more (refused) or the answer has ended (the client's
        // reads are shut then).
        let mut byte = [0u8; 1];
        if !input.buffer().is_empty() || input.read(&mut byte).is_ok_and(|n| n > 0) {
            shared.deny(&key.0, key.1, Refusal::Pipelined);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        }
        sent
    };
    let (up, down) = std::thread::scope(|s| {
        let up = s.spawn(|| match body {
            None => copy(client, upstream),
            Some(body) => one_body(client, upstream, body),
        });
        let down = copy(upstream, client);
        if body.is_some() {
            // The answer has ended: so has the connection, and the look for more.
            let _ = client.shutdown(Shutdown::Both);
        }
        (up.join().unwrap_or(0), down)
    });
    let mut r = shared.report.lock();
    let t = r.allowed.entry(key).or_default();
    t.up += up + already_up;
    t.down += down;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracked_socket_is_shut_and_unregistered_before_it_closes() -> io::Result<()> {
        let a = super::super::Allowlist {
            allow: vec!["a.example".into()],
            ..Default::default()
        };
        let rules = Arc::new(Rules::new(&a).map_err(io::Error::other)?);
        let shared = Shared::new(rules, None);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let peer = TcpStream::connect(listener.local_addr()?)?;
        let (ours, _) = listener.accept()?;
        let fd = ours.as_raw_fd();
        let guard = shared.track(ours);
        assert_eq!(
            shared.sockets.lock().values().copied().collect::<Vec<_>>(),
            [fd]
        );
        drop(guard);
        assert!(shared.sockets.lock().is_empty(), "still registered");
        let mut byte = [0u8; 1];
        assert_eq!((&peer).read(&mut byte)?, 0, "the peer sees the end");
        // The number is free: the socket that takes it next is nobody's to shut, and works.
        let next = TcpStream::connect(listener.local_addr()?)?;
        let (served, _) = listener.accept()?;
        (&next).write_all(b"x")?;
        assert_eq!((&served).read(&mut byte)?, 1);
        Ok(())
    }

    #[test]
    fn request_heads_and_authorities_parse_strictly() {
        let r = parse_head("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443").expect("head");
        assert_eq!(
            (r.method, r.target, r.version),
            ("CONNECT", "pypi.org:443", "HTTP/1.1")
        );
        assert!(parse_head("GET / HTTP/2\r\n").is_none());
        assert!(parse_head("GET  / HTTP/1.1").is_none());
        assert!(parse_head("GET / HTTP/1.1\r\nno colon").is_none());
        // Smuggling and fronting grounds.
        assert!(
            parse_head("GET http://a/ HTTP/1.1\nHost: b").is_none(),
            "bare LF"
        );
        assert!(parse_head("GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b").is_none());
        assert!(parse_head("GET http://a/ HTTP/1.1\r\nX: 1\r\n folded").is_none());
        assert!(parse_head("GET http://a/ HTTP/1.1\r\nX: a\x1bb").is_none());
        assert!(parse_head("GET http://a/ HTTP/1.1\r\nBad Name: 1").is_none());
        let both = parse_head(
            "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked",
        )
        .expect("a head");
        assert_eq!(http1::framing(both.version, &both.headers), None);
        assert!(parse_head("GET http://a/ HTTP/1.1\r\nX: tab\there").is_some());
        assert_eq!(
            authority("[::1]:8080", 80),
            Some((Host::Address("::1".parse().expect("ip")), 8080))
        );
        assert_eq!(
            authority("Example.COM", 80),
            Some((Host::Name("example.com".into()), 80))
        );
        assert_eq!(authority("a.test:http", 80), None);
        assert_eq!(authority("a b:80", 80), None);
    }
}
