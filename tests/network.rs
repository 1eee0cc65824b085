//! Network by name: a run with an allowlist reaches the allowed hosts through its proxy and
//! nothing else. Real clients (curl, openssl, getent, python3) against loopback servers this
//! test starts, every scenario in a network namespace the test makes first (loopback only,
//! with 169.254.169.254 on it and no route out), as root and again as nobody.

use crate::util::{child_test, is_child, TempDir};
use correx::{
    Allowlist, EventStore, NetworkPolicy, SessionId, ShellOptions, ShellTool, Tool, ToolExecutor,
    ToolRequest,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A loopback HTTP server of fixed pages that counts the requests it gets.
struct Site {
    port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Site {
    fn start(addr: &str, pages: BTreeMap<String, Vec<u8>>) -> std::io::Result<Site> {
        Site::serving(addr, pages, None)
    }

    /// As [`Site::start`], and the files beneath `root` by path.
    fn serving(
        addr: &str,
        pages: BTreeMap<String, Vec<u8>>,
        root: Option<std::path::PathBuf>,
    ) -> std::io::Result<Site> {
        let listener = TcpListener::bind(addr)?;
        let port = listener.local_addr()?.port();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (hits, stop) = (hits.clone(), stop.clone());
            let (pages, root) = (Arc::new(pages), Arc::new(root));
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    hits.fetch_add(1, Ordering::SeqCst);
                    // A thread each, as a real server: git fetches several objects at once,
                    // and one connection slow to send its head must not hold the others.
                    let (pages, root) = (pages.clone(), root.clone());
                    std::thread::spawn(move || answer(conn, &pages, root.as_deref()));
                }
            })
        };
        /// Reads one request head and answers it from `pages`, else from a file under `root`.
        fn answer(
            mut conn: TcpStream,
            pages: &BTreeMap<String, Vec<u8>>,
            root: Option<&std::path::Path>,
        ) {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                match conn.read(&mut b) {
                    Ok(1) => head.push(b[0]),
                    _ => break,
                }
            }
            let text = String::from_utf8_lossy(&head);
            let target = text.split(' ').nth(1).unwrap_or("/");
            let path = target.split('?').next().unwrap_or("/").to_owned();
            let file = root
                .filter(|_| !path.contains(".."))
                .and_then(|r| std::fs::read(r.join(path.trim_start_matches('/'))).ok());
            let kind = if path.ends_with('/') {
                "text/html"
            } else {
                "application/octet-stream"
            };
            let reply = match pages.get(&path).cloned().or(file) {
                Some(body) => {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend(body);
                    r
                }
                None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_vec(),
            };
            let _ = conn.write_all(&reply);
        }
        Ok(Site {
            port,
            hits,
            stop,
            thread: Some(thread),
        })
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let ip = if self.port == 80 {
            "169.254.169.254"
        } else {
            "127.0.0.1"
        };
        let _ = TcpStream::connect((ip, self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `openssl s_server -www` on loopback with a fresh self-signed certificate for `name`.
struct TlsSite {
    port: u16,
    cert: std::path::PathBuf,
    server: std::process::Child,
}

impl TlsSite {
    fn start(dir: &std::path::Path, name: &str) -> Result<TlsSite, Box<dyn std::error::Error>> {
        let (cert, key) = (dir.join("tls-cert.pem"), dir.join("tls-key.pem"));
        let made = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "1", "-subj", &format!("/CN={name}")])
            .args(["-addext", &format!("subjectAltName=DNS:{name}"), "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()?;
        assert!(made.status.success(), "openssl req: {made:?}");
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let server = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let site = TlsSite { port, cert, server };
        for _ in 0..500 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(site);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("openssl s_server did not listen within 5 s".into())
    }
}

impl Drop for TlsSite {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// A loopback server that keeps every connection open for more requests (as a shared front
/// does, whatever `Connection: close` says) and records each request it reads, head and body.
struct Front {
    port: u16,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Front {
    fn start() -> std::io::Result<Front> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let seen = seen.clone();
                    std::thread::spawn(move || Front::serve(conn, &seen));
                }
            })
        };
        Ok(Front {
            port,
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// Requests until the client is quiet for a second: each recorded as its head's first
    /// line and Host, and its body; each answered `ok`.
    fn serve(mut conn: TcpStream, seen: &std::sync::Mutex<Vec<String>>) {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut chunk) {
                    Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
            }
            let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end);
            let lower = head.to_ascii_lowercase();
            let length = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            let chunked = lower.contains("transfer-encoding: chunked");
            let complete = |b: &[u8]| match (length, chunked) {
                (Some(n), _) => b.len() >= n,
                (None, true) => b.windows(5).any(|w| w == b"0\r\n\r\n"),
                _ => true,
            };
            while !complete(&buf) {
                match conn.read(&mut chunk) {
                    Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
            let body_len = match (length, chunked) {
                (Some(n), _) => n.min(buf.len()),
                (None, true) => buf
                    .windows(5)
                    .position(|w| w == b"0\r\n\r\n")
                    .map_or(buf.len(), |i| i + 5),
                _ => 0,
            };
            let body = String::from_utf8_lossy(&buf[..body_len]).into_owned();
            buf.drain(..body_len);
            let first = head.lines().next().unwrap_or_default().to_owned();
            let host = head
                .lines()
                .find(|l| l.to_ascii_lowercase().starts_with("host:"))
                .unwrap_or_default()
                .to_owned();
            if let Ok(mut s) = seen.lock() {
                s.push(format!("{first} | {host} | {body}"));
            }
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n");
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Plain HTTP through the proxy carries one request per connection: a second one, pipelined
/// or sent after the first answer, naming another host or the same, never reaches a server
/// (the front here would serve it); a body goes whole, by length or in chunks, and nothing
/// after it; a head two parsers could frame two ways is refused before anything is sent.
fn one_request_scenario() -> TestResult {
    let work = TempDir::new("net-one-request");
    let front = Front::start()?;
    let port = front.port;
    let t = shell(
        Allowlist {
            allow: vec![format!("a.test:{port}"), format!("b.test:{port}")],
            resolve: pinned(&["a.test", "b.test"]),
            ..Allowlist::default()
        },
        work.path(),
    );
    let req = |method: &str, host: &str, path: &str, extra: &str| {
        format!(
            "{method} http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}\r\n"
        )
    };
    let second = req("GET", "b.test", "/second", "");
    // What, the bytes sent, the bytes sent after the first answer, what reaches the server,
    // the refusal recorded.
    type Case<'a> = (&'a str, String, Option<String>, Vec<String>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "pipelined",
            req("GET", "a.test", "/one", "") + &second,
            None,
            vec![format!("GET /one HTTP/1.1 | Host: a.test:{port} | ")],
            "pipelined",
        ),
        (
            "after the answer",
            req("GET", "a.test", "/one", ""),
            Some(second.clone()),
            vec![format!("GET /one HTTP/1.1 | Host: a.test:{port} | ")],
            "pipelined",
        ),
        (
            "a body by length, then another request",
            req("POST", "a.test", "/up", "Content-Length: 5\r\n") + "hello" + &second,
            None,
            vec![format!("POST /up HTTP/1.1 | Host: a.test:{port} | hello")],
            "pipelined",
        ),
        (
            "a chunked body, then another request",
            req("POST", "a.test", "/up", "Transfer-Encoding: chunked\r\n")
                + "5\r\nhello\r\n0\r\n\r\n"
                + &second,
            None,
            vec![format!(
                "POST /up HTTP/1.1 | Host: a.test:{port} | 5\r\nhello\r\n0\r\n\r\n"
            )],
            "pipelined",
        ),
        (
            "a length beside a coding",
            req(
                "POST",
                "a.test",
                "/up",
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            ) + "0\r\n\r\n"
                + &second,
            None,
            vec![],
            "bad_request",
        ),
        (
            "two lengths",
            req(
                "POST",
                "a.test",
                "/up",
                "Content-Length: 5\r\nContent-Length: 0\r\n",
            ) + "hello",
            None,
            vec![],
            "bad_request",
        ),
        (
            "a bare LF in a chunk line",
            req("POST", "a.test", "/up", "Transfer-Encoding: chunked\r\n")
                + "5\nhello\r\n0\r\n\r\n",
            None,
            vec![format!("POST /up HTTP/1.1 | Host: a.test:{port} | ")],
            "bad_request",
        ),
    ];
    for (what, first, after, expected, reason) in cases {
        let before = front.seen().len();
        // The run speaks to its proxy itself: one connection, the bytes as given, then (after
        // the first answer) `after`, then reads to the end.
        let script = format!(
            "import socket, sys, time\n\
             s = socket.create_connection(('127.0.0.1', 3128))\n\
             s.settimeout(10)\n\
             s.sendall({first:?}.encode())\n\
             after = {after:?}\n\
             got = b''\n\
             if after:\n\
             \x20   while b'ok' not in got:\n\
             \x20       got += s.recv(65536)\n\
             \x20   time.sleep(0.2)\n\
             \x20   try:\n\
             \x20       s.sendall(after.encode())\n\
             \x20   except OSError:\n\
             \x20       pass\n\
             try:\n\
             \x20   while True:\n\
             \x20       b = s.recv(65536)\n\
             \x20       if not b:\n\
             \x20           break\n\
             \x20       got += b\n\
             except OSError:\n\
             \x20   pass\n\
             sys.stdout.write(got.decode('latin-1'))\n",
            after = after.as_deref().unwrap_or("")
        );
        let (ok, out, data) = run(&t, &["python3", "-c", &script]);
        assert!(ok, "{what}: {out}");
        // The server is quiet for a second before it gives a connection up.
        std::thread::sleep(Duration::from_millis(1500));
        let seen = front.seen()[before..].to_vec();
        assert_eq!(seen, expected, "{what}: what reached the server");
        assert!(
            denied(&data).contains(&("a.test".to_owned(), reason.to_owned())),
            "{what}: {data}"
        );
        if expected.is_empty() {
            assert!(out.starts_with("HTTP/1.1 400"), "{what}: {out}");
        }
    }
    Ok(())
}

fn run(tool: &ShellTool, argv: &[&str]) -> (bool, String, Value) {
    let req = ToolRequest::new(
        SessionId::from("network"),
        "shell",
        json!({ "argv": argv })
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    match tool.execute(&req) {
        correx::ToolResult::Success { output, data, .. } => {
            (true, output, data.unwrap_or(Value::Null))
        }
        correx::ToolResult::Failure { reason, data, .. } => {
            (false, reason, data.unwrap_or(Value::Null))
        }
    }
}

/// A shell that may run `exes` in `work`, its network through `allowlist`.
fn options(exes: &[&str], allowlist: Allowlist, work: &std::path::Path) -> ShellOptions {
    ShellOptions {
        allowed_executables: exes.iter().map(|s| (*s).to_owned()).collect(),
        working_roots: vec![work.to_path_buf()],
        timeout: Duration::from_secs(20),
        isolation: correx::IsolationOptions {
            network: NetworkPolicy::Allowlist(allowlist),
            ..correx::IsolationOptions::default()
        },
        ..ShellOptions::default()
    }
}

/// Each of `names` pinned to loopback (the `resolve` map).
fn pinned(names: &[&str]) -> BTreeMap<String, IpAddr> {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    names.iter().map(|n| ((*n).to_owned(), loopback)).collect()
}

fn shell(allowlist: Allowlist, work: &std::path::Path) -> ShellTool {
    let exes = ["curl", "openssl", "getent", "python3", "sh"];
    let t = ShellTool::new(options(&exes, allowlist, work)).expect("the shell tool builds");
    assert_eq!(t.refusal(), None, "this kernel cannot confine the shell");
    t
}

fn denied(data: &Value) -> Vec<(String, String)> {
    data["network"]["denied"]
        .as_array()
        .map(|d| {
            d.iter()
                .map(|x| {
                    (
                        x["host"].as_str().unwrap_or_default().to_owned(),
                        x["reason"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn allowlist_scenario() -> TestResult {
    let work = TempDir::new("net-allow");
    let pages: BTreeMap<String, Vec<u8>> =
        [("/hello".to_owned(), b"hello from site\n".to_vec())].into();
    let site = Site::start("127.0.0.1:0", pages.clone())?;
    let metadata = Site::start("169.254.169.254:80", pages)?;
    // Something of the host's listening where the run's proxy listens in its own namespace:
    // the run must reach its proxy, never this.
    let decoy = Site::start("127.0.0.1:3128", BTreeMap::new())?;
    let port = site.port;
    let allowlist = Allowlist {
        allow: vec![
            format!("site.test:{port}"),
            format!("*.site.test:{port}"),
            format!("localhost:{port}"),
        ],
        deny: vec!["bad.site.test".into()],
        resolve: pinned(&["site.test", "www.site.test", "bad.site.test"]),
        ..Allowlist::default()
    };
    let t = shell(allowlist, work.path());
    let policy = t.applied_policy().to_json();
    assert_eq!(policy["network"]["mode"], "allowlist", "{policy}");
    assert_eq!(policy["network"]["enforced_by"], "network_namespace");
    assert_eq!(policy["namespaces"]["net"], true);

    // An allowed name, pinned to loopback: through the proxy, by curl's own proxy support.
    let url = format!("http://site.test:{port}/hello");
    let (ok, out, data) = run(&t, &["curl", "-sS", "-f", &url]);
    assert!(ok, "{out}");
    assert_eq!(out, "hello from site\n");
    assert_eq!(data["network"]["allowed"][0]["host"], "site.test", "{data}");
    assert_eq!(data["network"]["allowed"][0]["connections"], 1);
    let (ok, out, _) = run(
        &t,
        &[
            "curl",
            "-sS",
            "-f",
            &format!("http://www.site.test:{port}/hello"),
        ],
    );
    assert!(ok, "a subdomain of *.site.test: {out}");
    let before = site.hits();

    // Everything else is refused by the proxy, and said so.
    for (url, host, why) in [
        (
            format!("http://other.test:{port}/hello"),
            "other.test",
            "not_allowed",
        ),
        (
            format!("http://bad.site.test:{port}/hello"),
            "bad.site.test",
            "denied",
        ),
        (
            format!("http://site.test:{}/hello", port + 1),
            "site.test",
            "not_allowed",
        ),
        (
            format!("http://127.0.0.1:{port}/hello"),
            "127.0.0.1",
            "address_literal",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "169.254.169.254",
            "address_literal",
        ),
        // Allowed by name, but it resolves to loopback (no pin): not a public address.
        (
            format!("http://localhost:{port}/hello"),
            "localhost",
            "private_address",
        ),
    ] {
        let (ok, out, data) = run(&t, &["curl", "-sS", "-f", &url]);
        assert!(!ok, "{url} was fetched: {out}");
        assert_eq!(
            denied(&data),
            [(host.to_owned(), why.to_owned())],
            "{url}: {data}"
        );
    }
    // The Host header must name the URL's host.
    let (ok, _, data) = run(&t, &["curl", "-sS", "-f", "-H", "Host: other.test", &url]);
    assert!(!ok);
    assert_eq!(
        denied(&data),
        [("site.test".to_owned(), "host_mismatch".to_owned())]
    );

    // Around the proxy: nothing to reach. Not the host's loopback, not the metadata address
    // (both are in reach of the host: the run is in a namespace of its own), not DNS.
    let (ok, out, _) = run(
        &t,
        &[
            "curl",
            "-sS",
            "--noproxy",
            "*",
            &url.replace("site.test", "127.0.0.1"),
        ],
    );
    assert!(!ok, "a direct connect to the host's loopback: {out}");
    let (ok, out, _) = run(
        &t,
        &[
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "-m",
            "5",
            "http://169.254.169.254/hello",
        ],
    );
    assert!(!ok, "a direct connect to the metadata address: {out}");
    assert_eq!(site.hits(), before, "the site was reached around the proxy");
    assert_eq!(metadata.hits(), 0, "the metadata address was reached");
    let (ok, out, _) = run(&t, &["getent", "hosts", "example.com"]);
    assert!(!ok, "a name resolved inside the run: {out}");
    let udp = "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    print('udp')\nexcept OSError as e:\n    print('refused', e.errno)";
    let (_, out, _) = run(&t, &["python3", "-c", udp]);
    assert!(out.starts_with("refused"), "a UDP socket: {out}");
    let raw = "import socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 3129))\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)";
    let (_, out, _) = run(&t, &["python3", "-c", raw]);
    // Landlock (ABI 4) allows connecting to the proxy's port only: EACCES before the
    // namespace's refusal (ECONNREFUSED) could answer.
    let expected = if policy["network"]["landlock_tcp_connect"].is_null() {
        libc::ECONNREFUSED
    } else {
        libc::EACCES
    };
    assert_eq!(
        out.trim(),
        format!("refused {expected}"),
        "a raw TCP connect"
    );

    // connect() is open to reach the proxy, but not to a UNIX socket of the host's that the
    // filesystem rules leave in reach (a Docker or D-Bus socket): the run gets none.
    let sock_path = work.join("host.sock");
    let unix = std::os::unix::net::UnixListener::bind(&sock_path)?;
    unix.set_nonblocking(true)?;
    let to_unix = format!(
        "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({:?})\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)",
        sock_path.display().to_string()
    );
    let (_, out, _) = run(&t, &["python3", "-c", &to_unix]);
    assert_eq!(
        out.trim(),
        format!("refused {}", libc::EACCES),
        "a host UNIX socket"
    );
    assert!(unix.accept().is_err(), "the host's UNIX socket was reached");

    // TLS through CONNECT: the ClientHello must name the CONNECT's host.
    let connect = format!("site.test:{port}");
    let proxy = "127.0.0.1:3128";
    let (ok, out, data) = run(
        &t,
        &["sh", "-c", &format!("openssl s_client -proxy {proxy} -connect {connect} -servername evil.test </dev/null")],
    );
    assert!(!ok, "{out}");
    assert_eq!(
        denied(&data),
        [("site.test".to_owned(), "sni_mismatch".to_owned())],
        "{data}"
    );
    let hits = site.hits();
    let (_, _, data) = run(
        &t,
        &["sh", "-c", &format!("openssl s_client -proxy {proxy} -connect {connect} -servername site.test </dev/null")],
    );
    // The site speaks no TLS, but the tunnel was opened to it: the hello reached it.
    assert_eq!(denied(&data), []);
    assert_eq!(data["network"]["allowed"][0]["host"], "site.test", "{data}");
    assert_eq!(site.hits(), hits + 1);
    assert_eq!(decoy.hits(), 0, "a run reached the host's port 3128");

    // A real TLS site through the tunnel, two fetches: curl checks the certificate of the name
    // it asked for, end to end.
    let tls = TlsSite::start(work.path(), "secure.test")?;
    let secure = shell(
        Allowlist {
            allow: vec![format!("secure.test:{}", tls.port)],
            resolve: pinned(&["secure.test"]),
            ..Allowlist::default()
        },
        work.path(),
    );
    let url = format!("https://secure.test:{}/", tls.port);
    let cert = tls.cert.display().to_string();
    let (ok, out, data) = run(
        &secure,
        &["curl", "-sS", "-f", "--cacert", &cert, &url, &url],
    );
    assert!(ok, "{out}");
    assert_eq!(
        out.matches("Ciphers supported in s_server").count(),
        2,
        "{out}"
    );
    assert_eq!(data["network"]["allowed"][0]["connections"], 2, "{data}");
    drop(tls);

    // Through the runtime, from its JSON config: each refusal is an event, appended with the
    // run's outcome, which carries what the run did through its proxy.
    let dir = TempDir::new("net-runtime");
    let config = correx::RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {"shell": {"enabled": true, "allowed_executables": ["sh", "curl"],
                "isolation": {"network": {"allow": [format!("site.test:{port}")],
                                          "resolve": {"site.test": "127.0.0.1"}}}}},
            "approvals": {"engine": "auto"}
        })
        .to_string(),
    )?;
    let rt = correx::Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let script = format!(
        "curl -sS -f http://site.test:{port}/hello && curl -sS -f http://other.test:{port}/"
    );
    let req = ToolRequest::json("s", "shell", json!({ "argv": ["sh", "-c", script] }))?;
    let r = rt.executor().execute(&req);
    assert!(!r.is_success());
    let events = rt
        .events()
        .read_stream(&correx::session_stream("s"), 1, 100)?;
    let kinds: Vec<&str> = events.iter().map(|e| e.type_id.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "tool.approval_decided",
            "tool.execution_started",
            "tool.network_denied",
            "tool.execution_failed"
        ]
    );
    assert_eq!(
        events[1].payload["isolation"]["network"]["mode"],
        "allowlist"
    );
    let d = &events[2].payload;
    assert_eq!(
        (d["host"].as_str(), d["port"].as_u64(), d["reason"].as_str()),
        (
            Some("other.test"),
            Some(u64::from(port)),
            Some("not_allowed")
        )
    );
    let n = &events[3].payload["network"];
    assert_eq!(n["allowed"][0]["host"], "site.test", "{n}");
    assert_eq!(n["connections"], 1);
    assert!(n["bytes_down"].as_u64() > Some(16), "{n}");
    assert_eq!(n["denied_count"], 1);
    Ok(())
}

/// `pip download` from a PyPI-style simple index, and `git clone` over HTTP, each from a
/// loopback server under an allowed name; the same with the name not allowed fails and is
/// recorded.
fn clients_scenario() -> TestResult {
    let work = TempDir::new("net-clients");
    let served = work.join("served");
    std::fs::create_dir_all(served.join("files"))?;
    // A wheel, and an index page naming it.
    let wheel = "demo_pkg-1.0-py3-none-any.whl";
    let made = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
             \x20   z.writestr('demo_pkg/__init__.py', 'VALUE = 7\\n')\n\
             \x20   z.writestr('demo_pkg-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: demo-pkg\\nVersion: 1.0\\n')\n\
             \x20   z.writestr('demo_pkg-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
             \x20   z.writestr('demo_pkg-1.0.dist-info/RECORD', '')\n",
        )
        .arg(served.join("files").join(wheel))
        .status()?;
    assert!(made.success(), "making the wheel");
    let index = format!("<html><body><a href=\"/files/{wheel}\">{wheel}</a></body></html>");
    // A bare repository with one commit, served as files (git's dumb HTTP protocol).
    let src = work.join("src");
    let git = |dir: &std::path::Path, args: &[&str]| -> TestResult {
        let s = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir)
            .status()?;
        assert!(s.success(), "git {args:?}");
        Ok(())
    };
    std::fs::create_dir_all(&src)?;
    git(&src, &["init", "-q"])?;
    std::fs::write(src.join("README"), "served over http\n")?;
    git(&src, &["add", "README"])?;
    git(&src, &["commit", "-q", "-m", "one"])?;
    git(
        work.path(),
        &["clone", "-q", "--bare", "src", "served/repo.git"],
    )?;
    git(&served.join("repo.git"), &["update-server-info"])?;

    let pages: BTreeMap<String, Vec<u8>> =
        [("/simple/demo-pkg/".to_owned(), index.into_bytes())].into();
    let site = Site::serving("127.0.0.1:0", pages, Some(served.clone()))?;
    let port = site.port;
    let allowlist = Allowlist {
        allow: vec![format!("pypi.test:{port}"), format!("git.test:{port}")],
        resolve: pinned(&["pypi.test", "git.test", "other.test"]),
        ..Allowlist::default()
    };
    let o = ShellOptions {
        timeout: Duration::from_secs(60),
        ..options(&["pip", "git"], allowlist, work.path())
    };
    let t = ShellTool::new(o)?;
    let pip = |host: &str, into: &str| {
        run(
            &t,
            &[
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--index-url",
                &format!("http://{host}:{port}/simple/"),
                "--trusted-host",
                host,
                "-d",
                into,
                "demo-pkg",
            ],
        )
    };
    let (ok, out, data) = pip("pypi.test", "dl");
    assert!(ok, "pip download: {out}");
    assert!(work.join("dl").join(wheel).is_file(), "{out}");
    assert_eq!(denied(&data), [], "{data}");
    let (ok, _, data) = pip("other.test", "dl2");
    assert!(!ok);
    assert!(!work.join("dl2").join(wheel).exists());
    assert!(
        denied(&data).contains(&("other.test".to_owned(), "not_allowed".to_owned())),
        "{data}"
    );

    let (ok, out, _) = run(
        &t,
        &[
            "git",
            "clone",
            "-q",
            &format!("http://git.test:{port}/repo.git"),
            "cloned",
        ],
    );
    assert!(ok, "git clone: {out}");
    assert_eq!(
        std::fs::read_to_string(work.join("cloned").join("README"))?,
        "served over http\n"
    );
    let (ok, _, data) = run(
        &t,
        &[
            "git",
            "clone",
            "-q",
            &format!("http://other.test:{port}/repo.git"),
            "cloned2",
        ],
    );
    assert!(!ok);
    assert!(
        denied(&data).contains(&("other.test".to_owned(), "not_allowed".to_owned())),
        "{data}"
    );
    Ok(())
}

/// Where runs are contained by a subreaper instead of a PID namespace: as root the run still
/// gets its network namespace and reaches only its proxy; a user's run has no user namespace
/// then, so no network namespace: correx makes its connects (seccomp user notification), or,
/// on a kernel without that, the tool refuses to run rather than open the network.
fn subreaper_scenario() -> TestResult {
    let work = TempDir::new("net-subreaper");
    let pages: BTreeMap<String, Vec<u8>> = [("/hi".to_owned(), b"hi\n".to_vec())].into();
    let site = Site::start("127.0.0.1:0", pages)?;
    let port = site.port;
    let allowlist = Allowlist {
        allow: vec![format!("site.test:{port}")],
        resolve: pinned(&["site.test"]),
        ..Allowlist::default()
    };
    let mut o = options(&["curl"], allowlist, work.path());
    o.isolation.force_subreaper = true;
    // Where the run's proxy listens in its own namespace, something of the host's listens too.
    let decoy = Site::start("127.0.0.1:3128", BTreeMap::new())?;
    let t = ShellTool::new(o)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let policy = t.applied_policy().to_json();
        assert_eq!(policy["containment"], "subreaper");
        assert_eq!(policy["namespaces"]["net"], true, "{policy}");
        assert_eq!(policy["network"]["enforced_by"], "network_namespace");
        // Around the proxy: the host's loopback is not the run's.
        let url = format!("http://127.0.0.1:{port}/hi");
        let (ok, out, _) = run(&t, &["curl", "-sS", "--noproxy", "*", &url]);
        assert!(!ok, "a direct connect to the host's loopback: {out}");
        assert_eq!(site.hits(), 0);
        let (ok, out, _) = run(
            &t,
            &["curl", "-sS", "-f", &format!("http://site.test:{port}/hi")],
        );
        assert!(ok && out == "hi\n", "{out}");
        let (ok, _, data) = run(
            &t,
            &["curl", "-sS", "-f", &format!("http://127.0.0.1:{port}/hi")],
        );
        assert!(!ok);
        assert_eq!(
            denied(&data),
            [("127.0.0.1".to_owned(), "address_literal".to_owned())]
        );
        assert_eq!(site.hits(), 1, "only the proxied fetch reached the site");
    } else if correx::kernel_features().seccomp_user_notification {
        // No namespace for a user without user namespaces: correx makes the run's connects.
        let policy = t.applied_policy().to_json();
        assert_eq!(policy["namespaces"]["net"], false, "{policy}");
        assert_eq!(
            policy["network"]["enforced_by"],
            "seccomp_user_notification"
        );
        let url = format!("http://127.0.0.1:{port}/hi");
        let (ok, out, _) = run(&t, &["curl", "-sS", "--noproxy", "*", &url]);
        assert!(!ok, "a direct connect to the host's loopback: {out}");
        assert_eq!(site.hits(), 0);
        let (ok, out, _) = run(
            &t,
            &["curl", "-sS", "-f", &format!("http://site.test:{port}/hi")],
        );
        assert!(ok && out == "hi\n", "{out}");
        assert_eq!(site.hits(), 1);
    } else {
        let refusal = t
            .refusal()
            .ok_or("an allowlist ran without a network namespace")?;
        assert!(refusal.contains("network namespace"), "{refusal}");
        let (ok, out, _) = run(&t, &["curl", "-sS", &format!("http://site.test:{port}/hi")]);
        assert!(!ok, "{out}");
        assert_eq!(site.hits(), 0);
    }
    assert_eq!(decoy.hits(), 0, "a run reached the host's port 3128");
    Ok(())
}

/// Where no network namespace can be made (forced here by a test hook): the run shares the
/// test's network, its seccomp filter holds every `connect`, and correx makes it, to the proxy
/// alone. Attacked as a run would: straight to an allowed site's address, to the metadata
/// address, to the host's own port 3128, with a sockaddr another thread rewrites while the
/// call is held, by TCP Fast Open, by a listener of its own, over IPv6, and by DNS.
fn mediated_scenario() -> TestResult {
    let work = TempDir::new("net-mediated");
    let pages: BTreeMap<String, Vec<u8>> = [("/hi".to_owned(), b"hi\n".to_vec())].into();
    let site = Site::start("127.0.0.1:0", pages.clone())?;
    let metadata = Site::start("169.254.169.254:80", pages)?;
    // The run shares this network: its 127.0.0.1:3128 is this one, unless correx redirects.
    let decoy = Site::start("127.0.0.1:3128", BTreeMap::new())?;
    let port = site.port;
    let allowlist = Allowlist {
        allow: vec![format!("site.test:{port}")],
        resolve: pinned(&["site.test"]),
        ..Allowlist::default()
    };
    let mut o = options(&["curl", "python3", "getent"], allowlist, work.path());
    o.isolation.force_mediated_network = true;
    let t = ShellTool::new(o)?;
    assert_eq!(t.refusal(), None);
    let policy = t.applied_policy().to_json();
    assert_eq!(
        policy["network"]["enforced_by"], "seccomp_user_notification",
        "{policy}"
    );
    assert_eq!(policy["namespaces"]["net"], false);
    if policy["landlock_abi"].as_u64() >= Some(4) {
        assert_eq!(policy["network"]["landlock_tcp_connect"], json!([]));
    }

    // curl's own proxy support (a non-blocking connect): through the proxy.
    let url = format!("http://site.test:{port}/hi");
    let (ok, out, data) = run(&t, &["curl", "-sS", "-f", &url]);
    assert!(ok && out == "hi\n", "{out}");
    assert_eq!(data["network"]["allowed"][0]["host"], "site.test", "{data}");
    assert_eq!(site.hits(), 1);
    let (ok, _, data) = run(
        &t,
        &["curl", "-sS", "-f", &format!("http://other.test:{port}/hi")],
    );
    assert!(!ok);
    assert_eq!(
        denied(&data),
        [("other.test".to_owned(), "not_allowed".to_owned())]
    );

    // Around the proxy, straight to the site's address: held, refused, recorded.
    let (ok, out, data) = run(
        &t,
        &[
            "curl",
            "-sS",
            "--noproxy",
            "*",
            &format!("http://127.0.0.1:{port}/hi"),
        ],
    );
    assert!(!ok, "a direct connect: {out}");
    assert_eq!(
        denied(&data),
        [("127.0.0.1".to_owned(), "direct_connect".to_owned())]
    );
    assert_eq!(site.hits(), 1, "a direct connect reached the site");

    // Raw sockets from Python, each attack printing what the kernel said.
    let script = format!(
        r#"
import ctypes, errno, socket, struct, threading
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def connect(addr, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(addr)
    return s
attempt("metadata", lambda: connect(("169.254.169.254", 80)))
attempt("site", lambda: connect(("127.0.0.1", {port})))
attempt("ipv6", lambda: connect(("::1", {port}), socket.AF_INET6))
def proxy_get(family, host):
    s = connect((host, 3128), family)
    s.sendall(b"GET http://site.test:{port}/hi HTTP/1.1\r\nHost: site.test:{port}\r\n\r\n")
    body = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        body += b
    if not body.endswith(b"hi\n"):
        raise OSError(errno.EPROTO, body)
attempt("proxy4", lambda: proxy_get(socket.AF_INET, "127.0.0.1"))
attempt("proxy6", lambda: proxy_get(socket.AF_INET6, "::ffff:127.0.0.1"))
attempt("fastopen", lambda: socket.socket().sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", {port})))
attempt("fastopen_msg", lambda: socket.socket().sendmsg([b"GET / HTTP/1.0\r\n\r\n"], [], socket.MSG_FASTOPEN, ("127.0.0.1", {port})))
attempt("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
# The address rewritten by another thread while the connect is held: the proxy's, then the
# site's. Whatever was read, correx connects only to the proxy.
def raw(port):
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + bytes([127, 0, 0, 1]) + bytes(8)
buf = ctypes.create_string_buffer(raw(3128), 16)
proxy, site = raw(3128), raw({port})
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, site, 16)
        ctypes.memmove(buf, proxy, 16)
threading.Thread(target=flip, daemon=True).start()
ports = set()
for _ in range(300):
    s = socket.socket()
    if libc.connect(s.fileno(), buf, 16) == 0:
        ports.add(s.getpeername()[1])
    s.close()
stop = True
print("raced", "site" if {port} in ports else "never_site", len(ports))
# From another thread than the main one (a held call names the thread).
def threaded(name, f):
    t = threading.Thread(target=attempt, args=(name, f))
    t.start()
    t.join()
threaded("thread_proxy", lambda: proxy_get(socket.AF_INET, "127.0.0.1"))
threaded("thread_site", lambda: connect(("127.0.0.1", {port})))
# A filter of its own with a listener, to answer its own connects: refused.
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
allow = (Insn * 1)(Insn(0x06, 0, 0, 0x7fff0000))
prog = Prog(1, allow)
libc.prctl(38, 1, 0, 0, 0)
nr = {{"x86_64": 317, "aarch64": 277}}[__import__("os").uname().machine]
r = libc.syscall(nr, 1, 8, ctypes.byref(prog))
print("own_listener", "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno()))
"#
    );
    let (_, out, data) = run(&t, &["python3", "-c", &script]);
    let said: BTreeMap<&str, &str> = out.lines().filter_map(|l| l.split_once(' ')).collect();
    for (attack, expected) in [
        ("metadata", "EACCES"),
        ("site", "EACCES"),
        ("ipv6", "EACCES"),
        ("proxy4", "ok"),
        ("proxy6", "ok"),
        ("fastopen", "EACCES"),
        ("fastopen_msg", "EACCES"),
        ("bind", "EACCES"),
        ("udp", "EACCES"),
        ("thread_proxy", "ok"),
        ("thread_site", "EACCES"),
        ("own_listener", "EPERM"),
    ] {
        assert_eq!(said.get(attack), Some(&expected), "{attack}: {out}");
    }
    assert!(
        said.get("raced")
            .is_some_and(|r| r.starts_with("never_site")),
        "{out}"
    );
    let direct = denied(&data);
    assert!(
        direct.contains(&("169.254.169.254".to_owned(), "direct_connect".to_owned())),
        "{data}"
    );
    assert!(
        direct.contains(&("::1".to_owned(), "direct_connect".to_owned())),
        "{data}"
    );
    assert_eq!(metadata.hits(), 0, "the metadata address was reached");
    assert_eq!(
        site.hits(),
        4,
        "only the three proxied fetches reached the site"
    );
    assert_eq!(decoy.hits(), 0, "a run reached the host's port 3128");

    // No DNS of its own.
    let (ok, out, _) = run(&t, &["getent", "hosts", "site.test"]);
    assert!(!ok, "{out}");
    Ok(())
}

/// `network: "loopback"`: a run listens on its own loopback and talks to itself; the host's
/// loopback servers (a database, an agent's API) and every other address stay out of reach.
fn loopback_scenario() -> TestResult {
    let work = TempDir::new("net-loopback");
    let pages: BTreeMap<String, Vec<u8>> =
        [("/hello".to_owned(), b"hello from the host\n".to_vec())].into();
    let host_site = Site::start("127.0.0.1:0", pages.clone())?;
    let metadata = Site::start("169.254.169.254:80", pages)?;
    let tool = ShellTool::new(ShellOptions {
        allowed_executables: vec!["curl".into(), "python3".into()],
        working_roots: vec![work.path().to_path_buf()],
        timeout: Duration::from_secs(20),
        isolation: correx::IsolationOptions {
            network: NetworkPolicy::Loopback,
            ..correx::IsolationOptions::default()
        },
        ..ShellOptions::default()
    })?;
    assert_eq!(tool.refusal(), None, "this kernel cannot confine the shell");
    assert_eq!(
        tool.applied_policy().to_json()["network"]["mode"],
        "loopback"
    );
    assert_eq!(
        tool.applied_policy().to_json()["network"]["enforced_by"],
        "network_namespace"
    );
    // A server and its client in one run, on the run's loopback.
    let serve_and_ask = "import socket\n\
        s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n\
        c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n\
        a.sendall(b'answered on its own loopback'); print(c.recv(100).decode())";
    let (ok, out, _) = run(&tool, &["python3", "-c", serve_and_ask]);
    assert!(ok && out.contains("answered on its own loopback"), "{out}");
    // The host's loopback server: nothing listens there in the run's namespace.
    let url = format!("http://127.0.0.1:{}/hello", host_site.port);
    let (ok, out, _) = run(&tool, &["curl", "-sS", "--max-time", "3", &url]);
    assert!(!ok && !out.contains("hello from the host"), "{out}");
    assert_eq!(host_site.hits(), 0);
    // Any other address (here the cloud metadata one): no route.
    let (ok, out, _) = run(
        &tool,
        &[
            "curl",
            "-sS",
            "--max-time",
            "3",
            "http://169.254.169.254/hello",
        ],
    );
    assert!(!ok && !out.contains("hello from the host"), "{out}");
    assert_eq!(metadata.hits(), 0);
    // A UNIX socket of the host's in reach of the filesystem rules (here in the run's own
    // working root; for real, the user's D-Bus or SSH agent): no UNIX socket to connect with.
    let sock_path = work.path().join("host.sock");
    let host_sock = std::os::unix::net::UnixListener::bind(&sock_path)?;
    host_sock.set_nonblocking(true)?;
    let dial = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\nprint('connected')",
        sock_path.display().to_string()
    );
    let (ok, out, _) = run(&tool, &["python3", "-c", &dial]);
    assert!(!ok && !out.contains("connected"), "{out}");
    assert!(
        host_sock.accept().is_err(),
        "the run reached a host UNIX socket"
    );
    // The config spells it "loopback"; another word is named.
    let bad =
        correx::ToolConfig::from_value(&json!({"shell": {"isolation": {"network": "local"}}}))
            .expect_err("an unknown network word");
    assert!(bad.to_string().contains("loopback"), "{bad}");
    Ok(())
}

type Scenario = fn() -> TestResult;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("allowlist", allowlist_scenario),
    ("clients", clients_scenario),
    ("subreaper", subreaper_scenario),
    ("mediated", mediated_scenario),
    ("loopback", loopback_scenario),
    ("one_request", one_request_scenario),
    ("mcp_remote", crate::mcp_remote::network_policy_scenario),
];

/// Runs the scenario in a child test process inside a network namespace of its own (as root),
/// then again as nobody.
pub(crate) fn in_private_network(name: &str) -> TestResult {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: making the test's network namespace needs root");
        return Ok(());
    }
    for nobody in [false, true] {
        crate::util::assert_child_passes(
            child_test("network::private_network_child")
                .env("CORREX_CHILD_SCENARIO", name)
                .env("CORREX_CHILD_NOBODY", if nobody { "1" } else { "0" }),
            "scenario passed",
            &format!("{name} (nobody: {nobody})"),
        )?;
    }
    Ok(())
}

/// The child side: a network namespace with loopback up and 169.254.169.254 on it, no route
/// out; then (maybe) nobody; then the scenario.
#[test]
#[ignore = "helper: run by the network tests"]
fn private_network_child() {
    if !is_child() {
        return;
    }
    // SAFETY: unshare of this thread's network namespace; threads and processes started from
    // here on inherit it.
    assert_eq!(
        unsafe { libc::unshare(libc::CLONE_NEWNET) },
        0,
        "unshare(CLONE_NEWNET)"
    );
    for args in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", "169.254.169.254/32", "dev", "lo"][..],
    ] {
        let s = std::process::Command::new("ip")
            .args(args)
            .status()
            .expect("ip");
        assert!(s.success(), "ip {args:?}");
    }
    // Ports below 1024 for anyone, in this namespace only: the metadata server listens on 80.
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
        .expect("ip_unprivileged_port_start");
    let name = std::env::var("CORREX_CHILD_SCENARIO").expect("scenario name");
    if std::env::var("CORREX_CHILD_NOBODY").as_deref() == Ok("1") {
        crate::util::become_nobody();
    }
    let (_, scenario) = SCENARIOS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known scenario");
    scenario().expect("the scenario");
    println!("scenario passed");
}

#[test]
fn a_loopback_run_serves_itself_and_reaches_nothing_else() -> TestResult {
    in_private_network("loopback")
}

#[test]
fn without_a_namespace_correx_makes_every_connect_of_the_run() -> TestResult {
    in_private_network("mediated")
}

#[test]
fn an_allowlisted_run_reaches_its_hosts_through_the_proxy_and_nothing_else() -> TestResult {
    in_private_network("allowlist")
}

#[test]
fn pip_and_git_fetch_from_allowed_names_only() -> TestResult {
    in_private_network("clients")
}

#[test]
fn under_a_subreaper_an_allowlist_gets_a_namespace_or_no_run() -> TestResult {
    in_private_network("subreaper")
}

#[test]
fn a_plain_http_connection_carries_one_request_and_nothing_after_it() -> TestResult {
    in_private_network("one_request")
}
