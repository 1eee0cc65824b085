//! Remote MCP servers over Streamable HTTP, on loopback: `@modelcontextprotocol/server-everything`
//! (npm, the TypeScript SDK's Streamable HTTP transport) for calls, progress, cancellation and a
//! restart mid-session; a stub (named so: a real server cannot be made to answer 429 forever or
//! never answer) for a 429 storm and a server that never answers; and the network policy every
//! remote request goes through, which refuses a private address or a host it does not allow
//! before anything is sent.

use crate::mcp::{call, installed, kind, runtime};
use crate::util::TempDir;
use correx::{EventStore, Runtime, ToolExecutor, ToolRequest, ToolResult};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn events(rt: &Runtime, prefix: &str) -> Vec<(String, Value)> {
    rt.events()
        .read_stream(correx::MCP_STREAM, 1, 10_000)
        .expect("the stream")
        .into_iter()
        .filter(|e| e.type_id.starts_with(prefix))
        .map(|e| (e.type_id, e.payload))
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// server-everything over Streamable HTTP on `port`, killed when dropped.
struct Everything(Child);

impl Everything {
    fn start(env: &std::collections::HashMap<String, String>, port: u16) -> Everything {
        let child = Command::new(&env["node"])
            .arg(&env["mcp_everything"])
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("node starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "server-everything did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Everything(child)
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_remote_server_is_called_with_progress_cancelled_and_outlives_its_restart() -> TestResult {
    let Some(env) = installed() else {
        return Ok(());
    };
    let port = free_port();
    let mut server = Everything::start(&env, port);
    let dir = TempDir::new("mcp-remote");
    let rt = runtime(
        &dir,
        json!({"ev": {"url": format!("http://127.0.0.1:{port}/mcp"), "tier": 0}}),
    )?;
    let r = call(&rt, "ev.echo", json!({"message": "over http"}));
    let ToolResult::Success { output, .. } = &r else {
        return Err(format!("{r:?}").into());
    };
    assert_eq!(output, "Echo: over http");
    let started = events(&rt, "mcp.server_started");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].1["url"], format!("http://127.0.0.1:{port}/mcp"));
    assert_eq!(started[0].1["protocol_version"], "2025-11-25");

    // Progress over the call's SSE stream, recorded while it runs.
    let r = call(
        &rt,
        "ev.trigger-long-running-operation",
        json!({"duration": 1, "steps": 3}),
    );
    let ToolResult::Success { data: Some(d), .. } = &r else {
        return Err(format!("{r:?}").into());
    };
    assert!(
        d["progress"].as_array().is_some_and(|p| !p.is_empty()),
        "{d}"
    );
    let progress = rt
        .events()
        .read_stream(correx::MCP_STREAM, 1, 10_000)?
        .into_iter()
        .filter(|e| e.type_id == "tool.progress")
        .count();
    assert!(progress >= 1, "no tool.progress recorded");

    // A cancel ends the call at once (the server is told, its stream closed).
    let req = ToolRequest::json(
        "s",
        "ev.trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
    )?;
    let cancel = correx::CancelToken::new();
    let t0 = Instant::now();
    let r = std::thread::scope(|scope| {
        let caller = scope.spawn(|| rt.executor().execute_cancellable(&req, &cancel));
        std::thread::sleep(Duration::from_millis(500));
        cancel.cancel();
        caller.join().expect("the caller")
    });
    assert_eq!(kind(&r), "cancelled", "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());

    // The server restarts (its sessions forgotten): the next call makes a new session and
    // succeeds, without an error to the caller.
    drop(server);
    server = Everything::start(&env, port);
    let r = call(&rt, "ev.echo", json!({"message": "again"}));
    let ToolResult::Success { output, .. } = &r else {
        return Err(format!("after the restart: {r:?}").into());
    };
    assert_eq!(output, "Echo: again");
    drop(rt);
    let exited = events_of(&dir)?;
    assert_eq!(
        exited.last().map(|e| e["reason"].clone()),
        Some(json!("stopped"))
    );
    drop(server);
    Ok(())
}

/// The `mcp.server_exited` payloads in the log of `dir`'s runtime (closed).
fn events_of(dir: &TempDir) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let store = correx::SqliteEventStore::open(dir.join("events.db"))?;
    Ok(store
        .read_stream(correx::MCP_STREAM, 1, 10_000)?
        .into_iter()
        .filter(|e| e.type_id == "mcp.server_exited")
        .map(|e| e.payload)
        .collect())
}

/// What the stub does with a `tools/call`.
#[derive(Clone, Copy)]
enum OnCall {
    /// 429, `Retry-After: 0`, every time.
    Busy,
    /// Nothing, ever (the connection held open).
    Silent,
    /// An SSE stream's head, then nothing: the answer never comes, and the stub counts the
    /// stream's close by the client.
    Stream,
}

/// A stub Streamable HTTP server: answers `initialize` and `tools/list` (`t`, and `typed` with
/// an output schema) with JSON, every notification with 202, a GET with 405, a call of `typed`
/// with its arguments as structured content, and a call of `t` as `on_call` says.
/// Counts connections, `tools/call` requests and streams the client closed.
struct Stub {
    port: u16,
    connections: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Stub {
    fn start(on_call: OnCall) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let port = listener.local_addr().expect("an address").port();
        let counter = || Arc::new(AtomicUsize::new(0));
        let (connections, calls, closed) = (counter(), counter(), counter());
        let (conns, calls2, closed2) = (connections.clone(), calls.clone(), closed.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                conns.fetch_add(1, Ordering::SeqCst);
                let (calls, closed) = (calls2.clone(), closed2.clone());
                std::thread::spawn(move || serve(stream, on_call, &calls, &closed));
            }
        });
        Stub {
            port,
            connections,
            calls,
            closed,
        }
    }
}

fn serve(stream: TcpStream, on_call: OnCall, calls: &AtomicUsize, closed: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut out = stream.try_clone().expect("a clone");
    let mut r = BufReader::new(stream);
    loop {
        let (mut method, mut length) = (String::new(), 0usize);
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        method.push_str(line.split(' ').next().unwrap_or(""));
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let reply = |status: &str, extra: &str, body: &str| {
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        let text = if method != "POST" {
            reply("405 Method Not Allowed", "", "")
        } else {
            let m: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let id = m["id"].clone();
            match m["method"].as_str() {
                Some("initialize") => reply(
                    "200 OK",
                    "Mcp-Session-Id: stub-session\r\n",
                    &json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "stub", "version": "1"}}})
                    .to_string(),
                ),
                Some("tools/list") => reply(
                    "200 OK",
                    "",
                    &json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [
                        {"name": "t", "inputSchema": {"type": "object"}},
                        {"name": "typed", "inputSchema": {"type": "object"},
                         "outputSchema": {"type": "object", "required": ["n"],
                                          "properties": {"n": {"type": "integer"}}}}]}})
                    .to_string(),
                ),
                // Its structured content is what it was given: right or wrong for its schema.
                Some("tools/call") if m["params"]["name"] == "typed" => reply(
                    "200 OK",
                    "",
                    &json!({"jsonrpc": "2.0", "id": id, "result": {
                        "content": [{"type": "text", "text": "typed"}],
                        "structuredContent": m["params"]["arguments"]}})
                    .to_string(),
                ),
                Some("tools/call") => {
                    calls.fetch_add(1, Ordering::SeqCst);
                    match on_call {
                        OnCall::Busy => reply("429 Too Many Requests", "Retry-After: 0\r\n", ""),
                        OnCall::Silent => {
                            std::thread::sleep(Duration::from_secs(60));
                            return;
                        }
                        OnCall::Stream => {
                            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                                        Connection: close\r\n\r\n: open\n\n";
                            if out.write_all(head.as_bytes()).is_ok() {
                                // Until the client closes it (or the read timeout).
                                if matches!(r.read(&mut [0; 1]), Ok(0)) {
                                    closed.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            return;
                        }
                    }
                }
                _ => reply("202 Accepted", "", ""),
            }
        };
        if out.write_all(text.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn a_429_storm_is_retried_a_bounded_number_of_times_and_a_silent_server_times_out() -> TestResult {
    let busy = Stub::start(OnCall::Busy);
    let silent = Stub::start(OnCall::Silent);
    let dir = TempDir::new("mcp-remote-stub");
    let rt = runtime(
        &dir,
        json!({
            "busy": {"url": format!("http://127.0.0.1:{}/mcp", busy.port), "tier": 0},
            "silent": {"url": format!("http://127.0.0.1:{}/mcp", silent.port), "tier": 0,
                       "call_timeout_ms": 1000}
        }),
    )?;
    let r = call(&rt, "busy.t", json!({}));
    assert_eq!(kind(&r), "io", "{r:?}");
    let ToolResult::Failure { reason, .. } = &r else {
        unreachable!()
    };
    assert!(reason.contains("429"), "{reason}");
    // One call, then three retries: bounded, no storm.
    assert_eq!(busy.calls.load(Ordering::SeqCst), 4);
    for _ in 0..3 {
        call(&rt, "busy.t", json!({}));
    }
    assert_eq!(busy.calls.load(Ordering::SeqCst), 16);

    let t0 = Instant::now();
    let r = call(&rt, "silent.t", json!({}));
    assert_eq!(kind(&r), "timed_out", "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(silent.calls.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn closing_a_server_closes_the_stream_of_a_call_still_waiting_for_its_answer() -> TestResult {
    let stub = Stub::start(OnCall::Stream);
    let dir = TempDir::new("mcp-remote-stream");
    let rt = Arc::new(runtime(
        &dir,
        json!({"s": {"url": format!("http://127.0.0.1:{}/mcp", stub.port), "tier": 0,
                     "call_timeout_ms": 120_000}}),
    )?);
    let caller = {
        let rt = rt.clone();
        std::thread::spawn(move || call(&rt, "s.t", json!({})))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while stub.calls.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        stub.calls.load(Ordering::SeqCst),
        1,
        "the call was not sent"
    );
    rt.mcp().shutdown();
    let r = caller.join().map_err(|_| "the caller panicked")?;
    assert_ne!(kind(&r), "success", "{r:?}");
    // The stream is closed by the shutdown, not left open until the call's two minutes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stub.closed.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        stub.closed.load(Ordering::SeqCst),
        1,
        "the stream was left open"
    );
    Ok(())
}

/// The attack below in a network namespace of its own with 169.254.169.254 on its loopback
/// (as root, then as nobody), so that nothing could leave the machine were the policy broken;
/// without root, as this user in the host's network.
#[test]
fn a_remote_server_outside_its_network_policy_is_refused_and_recorded_with_nothing_sent(
) -> TestResult {
    if crate::mcp::root() {
        crate::network::in_private_network("mcp_remote")
    } else {
        network_policy_scenario()
    }
}

/// Servers at a private name and at an address their policy does not list are refused and
/// recorded, with no connection made; one pinned to loopback and allowed is reached.
pub(crate) fn network_policy_scenario() -> TestResult {
    let stub = Stub::start(OnCall::Busy);
    let port = stub.port;
    let dir = TempDir::new("mcp-remote-refused");
    let rt = runtime(
        &dir,
        json!({
            // A name resolving to loopback: private, refused by default.
            "local": {"url": format!("http://localhost:{port}/mcp")},
            // An address the policy does not list.
            "other": {"url": format!("http://127.0.0.1:{port}/mcp"),
                      "network": {"allow": ["mcp.example.com"]}},
            // A name pinned to loopback and allowed: reached.
            "pinned": {"url": format!("http://mcp.test:{port}/mcp"), "tier": 0,
                       "network": {"allow": [format!("mcp.test:{port}")],
                                   "resolve": {"mcp.test": "127.0.0.1"}}}
        }),
    )?;
    for (server, reason) in [("local", "private_address"), ("other", "address_literal")] {
        let r = call(&rt, &format!("{server}.t"), json!({}));
        let ToolResult::Failure { reason: why, .. } = &r else {
            return Err(format!("{server}: {r:?}").into());
        };
        assert!(why.contains("network policy"), "{server}: {why}");
        let refused: Vec<Value> = events(&rt, "mcp.request_refused")
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| p["server"] == server)
            .collect();
        assert!(!refused.is_empty(), "{server}: nothing recorded");
        assert_eq!(refused[0]["reason"], reason, "{server}: {refused:?}");
        assert_eq!(refused[0]["port"], port);
    }
    assert_eq!(
        stub.connections.load(Ordering::SeqCst),
        0,
        "something was sent"
    );
    let r = call(&rt, "pinned.t", json!({}));
    assert_eq!(kind(&r), "io", "{r:?}");
    assert!(stub.connections.load(Ordering::SeqCst) > 0);
    oauth_discovery_scenario()
}

/// Opens nothing: an authorization must never get this far.
struct NeverOpened(Arc<AtomicUsize>);

impl correx::McpAuthorizer for NeverOpened {
    fn open(&self, _: &str, _: &str) -> Result<(), String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err("not expected".into())
    }
}

/// A stub server asking for OAuth: every POST is answered 401 with `challenge`, a GET of its
/// protected-resource metadata with `prm` (`PORT` in it replaced by its port). Returns its
/// port and the request lines it got.
fn protected(challenge: String, prm: Value) -> (u16, Arc<parking_lot::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = listener.local_addr().expect("an address").port();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut r = BufReader::new(stream.try_clone().expect("a clone"));
            let (mut line, mut length) = (String::new(), 0usize);
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let request = line.trim().to_owned();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let _ = r.read_exact(&mut vec![0; length]);
            let text = if request.starts_with("GET /.well-known/oauth-protected-resource") {
                let body = prm.to_string().replace("PORT", &port.to_string());
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                format!(
                    "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: {challenge}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
            };
            log.lock().push(request);
            let _ = stream.write_all(text.as_bytes());
        }
    });
    (port, seen)
}

/// OAuth discovery goes through the server's network policy: a challenge pointing its
/// metadata at the cloud metadata address, and metadata pointing the authorization server at
/// loopback, are refused and recorded, with nothing sent there and the user never asked.
fn oauth_discovery_scenario() -> TestResult {
    // In the test's own network namespace the metadata address is on loopback: a listener
    // there proves nothing was sent to it.
    let metadata = TcpListener::bind("169.254.169.254:80").ok();
    if let Some(m) = &metadata {
        m.set_nonblocking(true)?;
    }
    let (metadata_port, _) = protected(
        r#"Bearer resource_metadata="http://169.254.169.254/latest/meta-data/""#.into(),
        Value::Null,
    );
    // The authorization server loopback is not to be reached: its connections are counted.
    let auth = TcpListener::bind("127.0.0.1:0")?;
    let auth_port = auth.local_addr()?.port();
    auth.set_nonblocking(true)?;
    let (loopback_port, seen) = protected(
        "Bearer".into(),
        json!({"resource": "http://mcp.test:PORT/mcp", "authorization_servers": [format!("http://127.0.0.1:{auth_port}")]}),
    );
    let dir = TempDir::new("mcp-remote-oauth-ssrf");
    let rt = runtime(
        &dir,
        json!({
            "metadata": {"url": format!("http://mcp.test:{metadata_port}/mcp"), "tier": 0,
                         "network": {"allow": [format!("mcp.test:{metadata_port}")],
                                     "resolve": {"mcp.test": "127.0.0.1"}},
                         "oauth": {"token_file": dir.join("tokens/t1.json")}},
            "loopback": {"url": format!("http://mcp.test:{loopback_port}/mcp"), "tier": 0,
                         "network": {"allow": [format!("mcp.test:{loopback_port}")],
                                     "resolve": {"mcp.test": "127.0.0.1"}},
                         "oauth": {"token_file": dir.join("tokens/t2.json")}}
        }),
    )?;
    let opened = Arc::new(AtomicUsize::new(0));
    rt.mcp()
        .set_authorizer(Some(Arc::new(NeverOpened(opened.clone()))));
    for (server, host, reason) in [
        ("metadata", "169.254.169.254", "address_literal"),
        ("loopback", "127.0.0.1", "address_literal"),
    ] {
        let r = call(&rt, &format!("{server}.t"), json!({}));
        let ToolResult::Failure { reason: why, .. } = &r else {
            return Err(format!("{server}: {r:?}").into());
        };
        assert!(why.contains("network policy"), "{server}: {why}");
        let refused: Vec<Value> = events(&rt, "mcp.request_refused")
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| p["server"] == server)
            .collect();
        assert_eq!(refused.len(), 1, "{server}: {refused:?}");
        assert_eq!(refused[0]["host"], host, "{server}: {refused:?}");
        assert_eq!(refused[0]["reason"], reason, "{server}: {refused:?}");
    }
    assert!(
        matches!(auth.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the loopback authorization server was reached"
    );
    assert!(
        seen.lock()
            .iter()
            .any(|l| l.starts_with("GET /.well-known/oauth-protected-resource/mcp")),
        "{:?}",
        seen.lock()
    );
    assert_eq!(opened.load(Ordering::SeqCst), 0, "the user was asked");
    if let Some(m) = &metadata {
        assert!(
            matches!(m.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the metadata address was reached"
        );
    }
    Ok(())
}

#[test]
fn structured_content_that_contradicts_the_output_schema_is_not_a_success() -> TestResult {
    let stub = Stub::start(OnCall::Busy);
    let dir = TempDir::new("mcp-remote-typed");
    let rt = runtime(
        &dir,
        json!({"s": {"url": format!("http://127.0.0.1:{}/mcp", stub.port), "tier": 0}}),
    )?;
    let r = call(&rt, "s.typed", json!({"n": 3}));
    assert_eq!(kind(&r), "success", "{r:?}");
    for wrong in [json!({"n": "three"}), json!({})] {
        let r = call(&rt, "s.typed", wrong.clone());
        let ToolResult::Failure { kind, reason, .. } = &r else {
            return Err(format!("{wrong}: {r:?}").into());
        };
        assert_eq!(kind.as_str(), "other");
        assert!(reason.contains("outputSchema"), "{reason}");
    }
    Ok(())
}

/// What the stub authorization server has done.
#[derive(Default)]
struct AuthState {
    /// The access token the resource accepts now (`None`: every token has expired).
    valid: Option<String>,
    issued: u32,
    registrations: u32,
    authorizations: u32,
    refreshes: u32,
    /// The refresh token it would accept next.
    refresh: Option<String>,
    /// Refresh requests received, accepted or not.
    refresh_tries: u32,
    /// The resource's metadata names another authorization server, `{base}/other` (served by
    /// the stub too, with its own issuer).
    moved: bool,
}

/// A stub remote server that is also its own authorization server (named a stub: the
/// conformance suite runs the real flows; this one lets a test expire a token mid-session).
fn oauth_stub() -> (u16, Arc<parking_lot::Mutex<AuthState>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = listener.local_addr().expect("an address").port();
    let state = Arc::new(parking_lot::Mutex::new(AuthState::default()));
    let st = state.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut r = BufReader::new(stream.try_clone().expect("a clone"));
            let (mut line, mut length, mut auth) = (String::new(), 0usize, String::new());
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                let lower = h.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if lower.starts_with("authorization:") {
                    auth = h["authorization:".len()..].trim().to_owned();
                }
            }
            let mut body = vec![0; length];
            let _ = r.read_exact(&mut body);
            let body = String::from_utf8_lossy(&body).into_owned();
            let target = line.split(' ').nth(1).unwrap_or("").to_owned();
            let base = format!("http://mcp.test:{port}");
            let json_reply = |status: &str, v: Value| {
                let b = v.to_string();
                format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}", b.len())
            };
            let mut s = st.lock();
            let issuer = if s.moved {
                format!("{base}/other")
            } else {
                base.clone()
            };
            let text = if target == "/.well-known/oauth-protected-resource/mcp" {
                json_reply(
                    "200 OK",
                    json!({"resource": format!("{base}/mcp"), "authorization_servers": [issuer]}),
                )
            } else if target == "/.well-known/oauth-authorization-server"
                || (s.moved && target == "/.well-known/oauth-authorization-server/other")
            {
                json_reply(
                    "200 OK",
                    json!({"issuer": issuer,
                    "authorization_endpoint": format!("{base}/authorize"),
                    "token_endpoint": format!("{base}/token"),
                    "registration_endpoint": format!("{base}/register"),
                    "code_challenge_methods_supported": ["S256"],
                    "authorization_response_iss_parameter_supported": true}),
                )
            } else if target == "/register" {
                s.registrations += 1;
                json_reply("201 Created", json!({"client_id": "c1"}))
            } else if let Some(q) = target.strip_prefix("/authorize?") {
                s.authorizations += 1;
                let get = |k: &str| {
                    q.split('&')
                        .find_map(|p| p.strip_prefix(&format!("{k}=")))
                        .unwrap_or("")
                        .to_owned()
                };
                let redirect = get("redirect_uri").replace("%3A", ":").replace("%2F", "/");
                let location = format!(
                    "{redirect}?code=c0de&state={}&iss={}",
                    get("state"),
                    issuer.replace(':', "%3A").replace('/', "%2F")
                );
                format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            } else if target == "/token" {
                let refreshing = body.contains("grant_type=refresh_token");
                s.refresh_tries += u32::from(refreshing);
                let allowed = if refreshing {
                    s.refresh
                        .as_ref()
                        .is_some_and(|r| body.contains(&format!("refresh_token={r}")))
                } else {
                    body.contains("code=c0de") && body.contains("code_verifier=")
                };
                if allowed {
                    s.issued += 1;
                    if refreshing {
                        s.refreshes += 1;
                    }
                    let (a, rt) = (
                        format!("secret-access-{}", s.issued),
                        format!("secret-refresh-{}", s.issued),
                    );
                    s.valid = Some(a.clone());
                    s.refresh = Some(rt.clone());
                    json_reply(
                        "200 OK",
                        json!({"access_token": a, "token_type": "Bearer",
                                                "expires_in": 3600, "refresh_token": rt}),
                    )
                } else {
                    json_reply("400 Bad Request", json!({"error": "invalid_grant"}))
                }
            } else if s
                .valid
                .as_ref()
                .is_some_and(|v| auth == format!("Bearer {v}"))
            {
                let m: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let id = m["id"].clone();
                match m["method"].as_str() {
                    Some("initialize") => json_reply(
                        "200 OK",
                        json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "stub", "version": "1"}}}),
                    ),
                    Some("tools/list") => json_reply(
                        "200 OK",
                        json!({"jsonrpc": "2.0", "id": id,
                        "result": {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}}),
                    ),
                    Some("tools/call") => json_reply(
                        "200 OK",
                        json!({"jsonrpc": "2.0", "id": id,
                        "result": {"content": [{"type": "text", "text": "authorized"}]}}),
                    ),
                    _ => "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_owned(),
                }
            } else {
                format!("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            };
            drop(s);
            let _ = stream.write_all(text.as_bytes());
        }
    });
    (port, state)
}

/// The user's browser: loads the authorization page, following its redirect to correx's
/// loopback listener (through the name the test pins, as correx's own requests do).
struct Browser;

impl correx::McpAuthorizer for Browser {
    fn open(&self, _: &str, url: &str) -> Result<(), String> {
        let url = url.replace("mcp.test", "127.0.0.1");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let r = agent.get(&url).call().map_err(|e| e.to_string())?;
        (r.status() == 200)
            .then_some(())
            .ok_or_else(|| format!("HTTP {}", r.status()))
    }
}

#[test]
fn a_token_that_expires_mid_session_is_refreshed_once_stored_0600_and_never_logged() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let (port, state) = oauth_stub();
    let dir = TempDir::new("mcp-remote-oauth");
    // In a directory of its own: correx makes it 0700 (a token file in a directory others can
    // enter is refused).
    let tokens = dir.join("tokens/tokens.json");
    let rt = Arc::new(runtime(
        &dir,
        json!({"s": {"url": format!("http://mcp.test:{port}/mcp"), "tier": 0,
                     "network": {"allow": [format!("mcp.test:{port}")],
                                 "resolve": {"mcp.test": "127.0.0.1"}},
                     "oauth": {"token_file": tokens}}}),
    )?);
    // Without an authorizer the call fails saying what the host must do.
    let r = call(&rt, "s.t", json!({}));
    let ToolResult::Failure { reason, .. } = &r else {
        return Err(format!("{r:?}").into());
    };
    assert!(reason.contains("set_authorizer"), "{reason}");
    rt.mcp().set_authorizer(Some(Arc::new(Browser)));
    // The failed start is retried after its backoff.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut r = call(&rt, "s.t", json!({}));
    while !r.is_success() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        r = call(&rt, "s.t", json!({}));
    }
    let ToolResult::Success { output, .. } = &r else {
        return Err(format!("{r:?}").into());
    };
    assert_eq!(output, "authorized");
    {
        let s = state.lock();
        assert_eq!((s.registrations, s.authorizations, s.refreshes), (1, 1, 0));
    }
    // The server forgets the token mid-session: four callers at once get one refresh between
    // them, and no second authorization.
    state.lock().valid = None;
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let rt = rt.clone();
            std::thread::spawn(move || call(&rt, "s.t", json!({})))
        })
        .collect();
    for c in callers {
        let r = c.join().map_err(|_| "a caller panicked")?;
        assert!(r.is_success(), "{r:?}");
    }
    {
        let s = state.lock();
        assert_eq!(
            (s.authorizations, s.refreshes),
            (1, 1),
            "one refresh, no new login"
        );
    }
    // The rotated refresh token was stored, 0600; no token reached the log.
    let saved = std::fs::read_to_string(&tokens)?;
    assert!(saved.contains("secret-refresh-2"), "{saved}");
    assert_eq!(
        std::fs::metadata(&tokens)?.permissions().mode() & 0o777,
        0o600
    );
    drop(rt);
    // A host restarted after the token expired: the stored refresh token brings it back, no
    // login.
    state.lock().valid = None;
    let rt = runtime(
        &dir,
        json!({"s": {"url": format!("http://mcp.test:{port}/mcp"), "tier": 0,
                     "network": {"allow": [format!("mcp.test:{port}")],
                                 "resolve": {"mcp.test": "127.0.0.1"}},
                     "oauth": {"token_file": tokens}}}),
    )?;
    let r = call(&rt, "s.t", json!({}));
    assert!(r.is_success(), "{r:?}");
    {
        let s = state.lock();
        assert_eq!(
            (s.authorizations, s.refreshes),
            (1, 2),
            "refreshed after the restart"
        );
    }
    drop(rt);
    let log = std::fs::read(dir.join("events.db"))?;
    let wal = std::fs::read(dir.join("events.db-wal")).unwrap_or_default();
    for bytes in [&log, &wal] {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains("secret-"), "a token reached the event log");
    }
    Ok(())
}

/// The config of the OAuth stub on `port` as server `s`, its tokens in `tokens`.
fn oauth_server(port: u16, tokens: &std::path::Path) -> Value {
    json!({"s": {"url": format!("http://mcp.test:{port}/mcp"), "tier": 0,
                 "network": {"allow": [format!("mcp.test:{port}")],
                             "resolve": {"mcp.test": "127.0.0.1"}},
                 "oauth": {"token_file": tokens}}})
}

/// Two hosts share one token file and the server rotates refresh tokens (each is good once):
/// the second to find its token expired takes the one the first refreshed, instead of
/// spending the used refresh token and losing the login.
#[test]
fn two_hosts_sharing_a_token_file_refresh_once_between_them() -> TestResult {
    let (port, state) = oauth_stub();
    let shared = TempDir::new("mcp-remote-oauth-shared");
    let tokens = shared.join("tokens/tokens.json");
    let (dir_a, dir_b) = (TempDir::new("mcp-oauth-a"), TempDir::new("mcp-oauth-b"));
    let a = runtime(&dir_a, oauth_server(port, &tokens))?;
    a.mcp().set_authorizer(Some(Arc::new(Browser)));
    let r = call(&a, "s.t", json!({}));
    assert!(r.is_success(), "{r:?}");
    // The second host has no authorizer: it runs on the login the first made.
    let b = runtime(&dir_b, oauth_server(port, &tokens))?;
    let r = call(&b, "s.t", json!({}));
    assert!(r.is_success(), "{r:?}");
    state.lock().valid = None;
    for host in [&a, &b] {
        let r = call(host, "s.t", json!({}));
        assert!(r.is_success(), "{r:?}");
    }
    let s = state.lock();
    assert_eq!(
        (s.authorizations, s.refreshes, s.refresh_tries),
        (1, 1, 1),
        "one refresh between the two hosts"
    );
    Ok(())
}

/// The resource's metadata moves it to another authorization server (where its network
/// allows): the refresh token is not sent there; a new registration and login are.
#[test]
fn a_refresh_token_is_never_sent_to_another_authorization_server() -> TestResult {
    let (port, state) = oauth_stub();
    let dir = TempDir::new("mcp-remote-oauth-moved");
    let tokens = dir.join("tokens/tokens.json");
    {
        let rt = runtime(&dir, oauth_server(port, &tokens))?;
        rt.mcp().set_authorizer(Some(Arc::new(Browser)));
        let r = call(&rt, "s.t", json!({}));
        assert!(r.is_success(), "{r:?}");
    }
    {
        let mut s = state.lock();
        s.valid = None;
        s.moved = true;
    }
    let rt = runtime(&dir, oauth_server(port, &tokens))?;
    rt.mcp().set_authorizer(Some(Arc::new(Browser)));
    let r = call(&rt, "s.t", json!({}));
    assert!(r.is_success(), "{r:?}");
    let s = state.lock();
    assert_eq!(
        s.refresh_tries, 0,
        "the refresh token went to another server"
    );
    assert_eq!((s.registrations, s.authorizations), (2, 2));
    Ok(())
}
