//! `cargo bench --bench mcp`: long-lived confined processes.
//!
//! - `mcp_call_overhead_vs_floor`: a `tools/call` of server-everything's `echo` through correx
//!   (the sandboxed executor: validation against the tool's schema, the run's two durable
//!   appends, the confined server's stdio) against its floor: the same JSON-RPC round trip to
//!   the same server, started by hand and unconfined, plus the same two durable appends, in
//!   paired rounds (the median of the per-pair ratios).
//! - `mcp_http_call_overhead`: the same call to server-everything over Streamable HTTP on
//!   loopback (a remote server: its session, its SSE answer, the network policy's check)
//!   against the same JSON-RPC POST, in the same session kind, sent by a bare client (ureq,
//!   kept alive) plus the same two durable appends, in paired rounds.
//! - `job_start_ms_p50`: a background shell request (`"background": true`) for `/bin/true`,
//!   through the runtime's sandboxed executor, to the returned job id: the program has exec'd
//!   confined and contained, and `job.started` is durable. Reported beside it, in the same run,
//!   `foreground_true_ms_p50`: the same request run to its end, its usual floor.

use correx::{
    EventStore, ExpectedVersion, NewEvent, Runtime, RuntimeConfig, SqliteEventStore, ToolExecutor,
    ToolRequest, ToolResult,
};
use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 200;

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("correx-bench-mcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {"shell": {"enabled": true, "allowed_executables": ["true"],
                                "jobs": {"max_per_session": 1}}},
            "approvals": {"engine": "auto"}
        })
        .to_string(),
    )?;
    let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let run = |background: bool| -> Result<(Duration, ToolResult), String> {
        let req = ToolRequest::json(
            "b",
            "shell",
            json!({"argv": ["true"], "background": background}),
        )?;
        let t = Instant::now();
        let r = rt.executor().execute(&req);
        Ok((t.elapsed(), r))
    };
    // Warm-up: the first runs make the temp dirs and cgroups later runs reuse.
    for _ in 0..10 {
        run(false)?;
    }
    let (mut started, mut foreground) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (d, r) = run(true)?;
        let job = match &r {
            ToolResult::Success { data: Some(d), .. } => {
                d["job_id"].as_str().unwrap_or_default().to_owned()
            }
            other => return Err(format!("a background start failed: {other:?}").into()),
        };
        started.push(d);
        // The session's one job slot is free again once the job has ended and been recorded.
        rt.jobs().wait("b", &job, Duration::from_secs(10))?;
        let (d, r) = run(false)?;
        if !r.is_success() {
            return Err(format!("a foreground run failed: {r:?}").into());
        }
        foreground.push(d);
    }
    let mut ended = 0;
    let mut from = 1;
    loop {
        let page = rt
            .events()
            .read_stream(&correx::session_stream("b"), from, 1000)?;
        let Some(last) = page.last() else { break };
        from = last.stream_version + 1;
        ended += page.iter().filter(|e| e.type_id == "job.exited").count();
    }
    assert_eq!(ended, ROUNDS, "every job's end is recorded");
    println!(
        "job_start_ms_p50: {:.3}",
        p50(started).as_secs_f64() * 1000.0
    );
    println!(
        "foreground_true_ms_p50: {:.3}",
        p50(foreground).as_secs_f64() * 1000.0
    );
    drop(rt);
    mcp_call_overhead(&dir)?;
    mcp_http_call_overhead(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn installed() -> Option<HashMap<String, String>> {
    let cache = std::env::var_os("CORREX_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/correx"))
        })?;
    let text = std::fs::read_to_string(cache.join("mcp/env")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// The floor's client: the server over its stdio, newline-delimited JSON-RPC.
struct Bare {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Bare {
    fn request(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        self.next += 1;
        let id = self.next;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )?;
        line.push(b'\n');
        self.stdin.write_all(&line)?;
        self.stdin.flush()?;
        let mut buf = String::new();
        loop {
            buf.clear();
            if self.stdout.read_line(&mut buf)? == 0 {
                return Err("the server closed its stdout".into());
            }
            let v: serde_json::Value = serde_json::from_str(&buf)?;
            if v["id"] == id && v.get("method").is_none() {
                return Ok(v);
            }
            // A request of the server's (roots are not declared, so none is expected) or a
            // notification: not the answer.
        }
    }
}

fn mcp_call_overhead(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let Some(env) = installed() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err("the MCP servers are not installed; run scripts/install-mcp.sh".into());
        }
        println!("mcp_call_overhead_vs_floor: skipped (run scripts/install-mcp.sh)");
        return Ok(());
    };
    let pkg = std::path::Path::new(&env["mcp_everything"])
        .ancestors()
        .nth(4)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut isolation = json!({"read_paths": [pkg]});
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        isolation["run_as"] = json!("host"); // the install is under root's home
    }
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("mcp-events.db"),
            "sandbox_root": dir.join("mcp-sandbox"),
            "mcp_servers": {"ev": {"command": [env["node"], env["mcp_everything"], "stdio"],
                                   "isolation": isolation, "tier": 1, "start": "open"}},
            "approvals": {"engine": "auto", "max_tier": 1}
        })
        .to_string(),
    )?;
    let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let floor_log = SqliteEventStore::open(dir.join("floor-events.db"))?;
    let mut child = Command::new(&env["node"])
        .args([&env["mcp_everything"], "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut bare = Bare {
        stdin: child.stdin.take().ok_or("stdin")?,
        stdout: BufReader::new(child.stdout.take().ok_or("stdout")?),
        child,
        next: 0,
    };
    bare.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": {"name": "bare", "version": "0"}}),
    )?;
    let mut line =
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
    line.push(b'\n');
    bare.stdin.write_all(&line)?;
    compare(
        "mcp",
        "mcp_call_overhead_vs_floor",
        || through(&rt),
        || {
            floor_round(&floor_log, || {
                let v = bare.request(
                    "tools/call",
                    json!({"name": "echo", "arguments": {"message": "hello"}}),
                )?;
                if v["result"]["content"][0]["text"] != "Echo: hello" {
                    return Err(format!("echo over bare stdio: {v}").into());
                }
                Ok(())
            })
        },
    )?;
    drop(bare.stdin);
    let _ = bare.child.wait();
    Ok(())
}

/// server-everything over Streamable HTTP on `port`, killed when dropped.
struct HttpServer(std::process::Child);

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mcp_http_call_overhead(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let Some(env) = installed() else {
        println!("mcp_http_call_overhead: skipped (run scripts/install-mcp.sh)");
        return Ok(());
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let _server = HttpServer(
        Command::new(&env["node"])
            .args([&env["mcp_everything"], "streamableHttp"])
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("server-everything did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("http://127.0.0.1:{port}/mcp");
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("mcp-http-events.db"),
            "sandbox_root": dir.join("mcp-http-sandbox"),
            "mcp_servers": {"ev": {"url": url, "tier": 1, "start": "open"}},
            "approvals": {"engine": "auto", "max_tier": 1}
        })
        .to_string(),
    )?;
    let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let floor_log = SqliteEventStore::open(dir.join("floor-http-events.db"))?;
    // The bare client: a session of its own, then the same POST each round.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let post = |session: Option<&str>, body: serde_json::Value| {
        let mut req = agent
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-11-25");
        }
        req.send(body.to_string().as_bytes())
    };
    let init = post(
        None,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bare", "version": "0"}}}),
    )?;
    let session = init
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .ok_or("no session id")?
        .to_owned();
    drop(init);
    post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )?;
    let mut next = 0u64;
    compare(
        "mcp_http",
        "mcp_http_call_overhead",
        || through(&rt),
        || {
            next += 1;
            floor_round(&floor_log, || {
                let mut resp = post(
                    Some(&session),
                    json!({"jsonrpc": "2.0", "id": next, "method": "tools/call",
                           "params": {"name": "echo", "arguments": {"message": "hello"}}}),
                )?;
                let text = resp.body_mut().read_to_string()?;
                if !text.contains("Echo: hello") {
                    return Err(format!("echo over a bare POST: {text}").into());
                }
                Ok(())
            })
        },
    )?;
    Ok(())
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One `echo` through correx: approval, the two appends, the server.
fn through(rt: &Runtime) -> Res<Duration> {
    let req = ToolRequest::json("b", "ev.echo", json!({"message": "hello"}))?;
    let t = Instant::now();
    let r = rt.executor().execute(&req);
    let d = t.elapsed();
    if !r.is_success() {
        return Err(format!("echo through correx failed: {r:?}").into());
    }
    Ok(d)
}

/// One round of the floor: the two appends correx makes, around `send` (the bare round trip).
fn floor_round(log: &SqliteEventStore, send: impl FnOnce() -> Res<()>) -> Res<Duration> {
    let append = |type_id: &str| {
        log.append(
            "session-b",
            ExpectedVersion::Any,
            &[NewEvent::new(type_id, 1, json!({"tool_name": "ev.echo"}))],
        )
    };
    let t = Instant::now();
    append("tool.execution_started")?;
    send()?;
    append("tool.execution_completed")?;
    Ok(t.elapsed())
}

/// Warms both up, then times 300 rounds alternating which goes first; prints
/// `{prefix}_call_ms_p50`, `{prefix}_floor_ms_p50` and the median ratio as `ratio`.
fn compare(
    prefix: &str,
    ratio: &str,
    mut through: impl FnMut() -> Res<Duration>,
    mut floor: impl FnMut() -> Res<Duration>,
) -> Res<()> {
    for _ in 0..20 {
        through()?;
        floor()?;
    }
    let mut ratios = Vec::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..300 {
        let (x, y) = if round % 2 == 0 {
            let x = through()?;
            (x, floor()?)
        } else {
            let y = floor()?;
            (through()?, y)
        };
        ratios.push(x.as_secs_f64() / y.as_secs_f64());
        a.push(x);
        b.push(y);
    }
    ratios.sort_by(f64::total_cmp);
    println!("{prefix}_call_ms_p50: {:.3}", p50(a).as_secs_f64() * 1000.0);
    println!(
        "{prefix}_floor_ms_p50: {:.3}",
        p50(b).as_secs_f64() * 1000.0
    );
    println!("{ratio}: {:.3}", ratios[ratios.len() / 2]);
    Ok(())
}
