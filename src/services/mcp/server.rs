//! One configured MCP server: started (lazily, or when the runtime opens) as a confined,
//! contained run of its command, initialized, its tools listed; restarted after a crash, no
//! sooner than its backoff allows; stopped when the runtime closes. Each start and exit is an
//! event in the `mcp-servers` stream.

use super::config::McpServerConfig;
use super::connection::{Lines, RpcError, Shared};
use super::discover::{discover, Found, STATELESS_PROTOCOL_VERSION};
use super::host_requests::HandlerSlot;
use super::pins::{Held, Pins};
use super::remote::{Listened, Remote, RemoteSpec};
use super::routing;
use crate::cancel::CancelToken;
use crate::domain::DomainEvent;
use crate::events::{EventStore, ExpectedVersion};
use crate::sys::spawn::{Cleanup, Started};
use crate::tools::ShellTool;
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The stream MCP servers' lifecycle events go to.
pub const MCP_STREAM: &str = "mcp-servers";

/// The handshake-era protocol revisions this client speaks (by `initialize`), newest first;
/// it asks for the first, once a server showed it does not speak
/// [`STATELESS_PROTOCOL_VERSION`](super::STATELESS_PROTOCOL_VERSION).
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Most pages of `tools/list` read (a server that pages forever is cut off).
const MAX_PAGES: usize = 100;
/// How long a server gets to exit once its stdin is closed, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A tool a server offers.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// The schema its `structuredContent` must match, when it declares one.
    pub output_schema: Option<Value>,
    /// Its definition's digest, as a pin holds it.
    pub digest: String,
    /// Its definition as listed, until its listing is checked against the pins.
    pub listed: Value,
    /// Not the definition pinned: how its calls are held (it may have been pinned since).
    pub held: Option<Held>,
}

struct Live {
    shared: Arc<Shared>,
    tools: Vec<Arc<ToolDef>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    started_at: Instant,
    /// Unexpected ends in a row before this start.
    failures_before: u32,
}

/// A server that ran this long before it ended starts its backoff afresh.
const STEADY: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Down {
    /// Unexpected exits in a row.
    failures: u32,
    /// No start before this.
    retry_at: Option<Instant>,
    /// Why the last one ended.
    last: Option<String>,
}

enum State {
    Down(Down),
    Up(Live),
}

/// One server. See the module docs.
pub(crate) struct McpServer {
    pub name: String,
    pub config: McpServerConfig,
    /// How it is reached: a program correx runs, or a remote endpoint.
    reach: Reach,
    events: Arc<dyn EventStore>,
    state: Mutex<State>,
    /// The runtime closed: it never starts again.
    closed: AtomicBool,
    /// The host's handler of the server's sampling and elicitation requests.
    handlers: HandlerSlot,
    /// Connections of servers gone (or going) whose requests the host's handler may still be
    /// answering: closing waits for them.
    retired: Mutex<Vec<Arc<Shared>>>,
    /// The log's tool pins, which each listing is checked against.
    pub pins: Arc<Pins>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How a server is reached.
pub(crate) enum Reach {
    /// A program correx starts, confined as this launcher says.
    Command(Box<ShellTool>),
    /// A remote server over Streamable HTTP.
    Remote(RemoteSpec),
}

/// Appends one lifecycle event to [`MCP_STREAM`]; a refusal is logged (a server's life goes on).
pub(crate) fn record(events: &dyn EventStore, name: &str, e: DomainEvent) {
    if let Err(err) = events.append(MCP_STREAM, ExpectedVersion::Any, &[e.to_new_event()]) {
        log::error!("mcp server {name}: recording {}: {err}", e.type_id());
    }
}

/// A server's thread: reads its output until it ends, cleans up, then ends its connection and
/// records why it ended.
fn supervise(
    started: Started,
    cleanup: Cleanup,
    shared: &Arc<Shared>,
    stopping: &AtomicBool,
    events: &dyn EventStore,
    name: &str,
) {
    let mut lines = Lines::new(shared.clone());
    let ended = started.wait(&mut lines, Some(&shared.kill));
    cleanup();
    let (code, signal) = match &ended {
        Ok(e) => match e.exit {
            crate::sys::spawn::Exit::Code(c) => (Some(c), None),
            crate::sys::spawn::Exit::Signal(s) => (None, Some(s)),
        },
        Err(_) => (None, None),
    };
    let reason = if shared.overflowed.load(Ordering::Acquire) {
        "line_too_long"
    } else if stopping.load(Ordering::Acquire) {
        "stopped"
    } else if code == Some(0) {
        "exited"
    } else {
        "crashed"
    };
    shared.end(format!(
        "it {reason} (exit code {code:?}, signal {signal:?})"
    ));
    record(
        events,
        name,
        DomainEvent::McpServerExited {
            server: name.to_owned(),
            reason: reason.into(),
            exit_code: code,
            signal,
        },
    );
}

/// A remote server's thread: follows its GET stream (reopened after the server's `retry`, or
/// a backoff after a failure) until the connection ends, then ends the session and records
/// why it ended.
fn follow_remote(shared: &Arc<Shared>, stopping: &AtomicBool, events: &dyn EventStore, name: &str) {
    let Some(remote) = shared.remote() else {
        return;
    };
    let pause = |d: Duration| {
        let end = Instant::now() + d;
        while Instant::now() < end && !shared.is_ended() {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let (mut listening, mut failures) = (true, 0);
    while !shared.is_ended() {
        if !listening || !remote.ready() {
            pause(Duration::from_millis(20));
            continue;
        }
        match remote.listen(shared) {
            Ok(Listened::Unsupported) => listening = false,
            Ok(Listened::Ended(retry)) => {
                failures = 0;
                pause(retry);
            }
            Err(e) => {
                log::debug!("mcp server {name}: its GET stream: {e}");
                pause(backoff(failures));
                failures += 1;
            }
        }
    }
    let stopped = stopping.load(Ordering::Acquire);
    if stopped {
        remote.end_session();
    }
    record(
        events,
        name,
        DomainEvent::McpServerExited {
            server: name.to_owned(),
            reason: if stopped { "stopped" } else { "disconnected" }.into(),
            exit_code: None,
            signal: None,
        },
    );
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << failures.min(7))).min(Duration::from_secs(30))
}

impl McpServer {
    pub fn new(
        name: String,
        config: McpServerConfig,
        reach: Reach,
        events: Arc<dyn EventStore>,
        handlers: HandlerSlot,
        pins: Arc<Pins>,
    ) -> McpServer {
        McpServer {
            name,
            config,
            reach,
            events,
            state: Mutex::new(State::Down(Down::default())),
            closed: AtomicBool::new(false),
            handlers,
            retired: Mutex::new(Vec::new()),
            pins,
        }
    }

    fn record(&self, e: DomainEvent) {
        record(self.events.as_ref(), &self.name, e);
    }

    /// Keeps `shared` until the host's handlers answering its requests returned.
    fn retire(&self, shared: &Arc<Shared>) {
        let mut retired = self.retired.lock();
        retired.retain(|s| s.answering());
        retired.push(shared.clone());
    }

    /// Waits for the host's handlers answering requests of this server's ended connections
    /// (told to stop when each ended).
    pub fn wait_retired(&self) {
        let retired = std::mem::take(&mut *self.retired.lock());
        for shared in retired {
            shared.wait_host_calls();
        }
    }

    /// A running server told at its start of other methods than the host's handler answers
    /// now is stopped (once none of its calls or host requests is in progress), to be started
    /// again by the caller's next step; stopped without the state lock held, so a handler
    /// that uses the server meanwhile does not wait on it.
    fn restart_if_stale(&self) {
        let methods = self.handlers.methods();
        let live = {
            let mut state = self.state.lock();
            let stale = matches!(&*state, State::Up(live)
                if !live.shared.is_ended()
                    && live.shared.declared != methods
                    && !live.shared.busy());
            if !stale {
                return;
            }
            match std::mem::replace(&mut *state, State::Down(Down::default())) {
                State::Up(live) => live,
                State::Down(_) => return,
            }
        };
        log::info!(
            "mcp server {}: restarted to declare what the host's handler answers",
            self.name
        );
        self.retire(&live.shared);
        stop(live);
    }

    /// The server's tools, starting it if it is not running.
    pub fn tools(self: &Arc<Self>) -> Result<Vec<Arc<ToolDef>>, String> {
        self.restart_if_stale();
        let mut state = self.state.lock();
        self.ensure(&mut state)?;
        match &*state {
            State::Up(live) => Ok(live.tools.clone()),
            State::Down(_) => Err(format!("mcp server {} is not running", self.name)),
        }
    }

    /// The tool named `name`, starting the server if it is not running.
    ///
    /// # Errors
    /// Why the server is not running (it could not start, or waits out its backoff).
    pub fn tool(self: &Arc<Self>, name: &str) -> Result<Option<Arc<ToolDef>>, String> {
        self.restart_if_stale();
        let mut state = self.state.lock();
        self.ensure(&mut state)?;
        Ok(match &*state {
            State::Up(live) => live.tools.iter().find(|t| t.name == name).cloned(),
            State::Down(_) => None,
        })
    }

    /// Starts the server unless it runs; the state is locked throughout, so one start at a time.
    fn ensure(self: &Arc<Self>, state: &mut State) -> Result<(), String> {
        if self.closed.load(Ordering::Acquire) {
            return Err(format!("mcp server {}: the runtime is closed", self.name));
        }
        if let State::Up(live) = state {
            if !live.shared.is_ended() {
                if live.shared.tools_changed.swap(false, Ordering::AcqRel) {
                    let listed = list_tools(&live.shared, self.config.startup_timeout)
                        .and_then(|tools| self.reviewed(tools));
                    match listed {
                        Ok(tools) => live.tools = tools,
                        Err(e) => {
                            // Tried again on the next use.
                            live.shared.tools_changed.store(true, Ordering::Release);
                            log::warn!("mcp server {}: relisting its tools: {e}", self.name)
                        }
                    }
                }
                return Ok(());
            }
        }
        // Ended on its own (its thread recorded why): down, with a backoff from its end.
        if let State::Up(live) = state {
            if let Some(t) = live.thread.take() {
                let _ = t.join();
            }
            self.retire(&live.shared);
            let (why, at) = live
                .shared
                .ended_at()
                .unwrap_or(("unknown".into(), Instant::now()));
            let failures = if at.duration_since(live.started_at) > STEADY {
                1
            } else {
                live.failures_before + 1
            };
            *state = State::Down(Down {
                failures,
                retry_at: Some(at + backoff(failures - 1)),
                last: Some(why),
            });
        }
        if let State::Down(down) = state {
            if let Some(at) = down.retry_at {
                let now = Instant::now();
                if now < at {
                    return Err(format!(
                        "mcp server {} ended ({}); it is restarted in {} ms",
                        self.name,
                        down.last.as_deref().unwrap_or("unknown"),
                        (at - now).as_millis()
                    ));
                }
            }
        }
        let failures = match state {
            State::Down(d) => d.failures,
            State::Up(_) => 0,
        };
        match self.start(failures) {
            Ok(live) => {
                *state = State::Up(live);
                Ok(())
            }
            Err(e) => {
                *state = State::Down(Down {
                    failures: failures + 1,
                    retry_at: Some(Instant::now() + backoff(failures)),
                    last: Some(e.clone()),
                });
                Err(format!("mcp server {} could not start: {e}", self.name))
            }
        }
    }

    fn start(self: &Arc<Self>, failures_before: u32) -> Result<Live, String> {
        let launcher = match &self.reach {
            Reach::Command(launcher) => launcher,
            Reach::Remote(spec) => return self.connect(spec, failures_before),
        };
        let shared = Shared::new(
            &self.name,
            self.roots(),
            self.config.max_line_bytes,
            self.handlers.clone(),
            None,
        );
        let (mut started, cleanup) = launcher.start_server(&self.config.command)?;
        // Until its thread owns it, a server that fails to start is killed before what it
        // held is cleaned up.
        let attached = match started.take_stdin() {
            Some(stdin) => shared.attach_stdin(stdin).map_err(|e| e.to_string()),
            None => Err("the server's stdin pipe is missing".to_owned()),
        };
        if let Err(e) = attached {
            drop(started);
            cleanup();
            return Err(e);
        }
        let live = self.watched(
            shared,
            failures_before,
            move |shared, stopping, events, name| {
                supervise(started, cleanup, shared, stopping, events, name);
            },
        )?;
        self.initialized(live, Some(launcher.applied_policy().to_json()), None)
    }

    /// The working dirs, as MCP roots.
    fn roots(&self) -> Vec<String> {
        self.config
            .working_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect()
    }

    /// A new connection to a remote server: initialized, its GET stream followed by a
    /// thread of its own (which records the end, as a process's supervisor does).
    fn connect(self: &Arc<Self>, spec: &RemoteSpec, failures_before: u32) -> Result<Live, String> {
        let shared = Shared::new(
            &self.name,
            self.roots(),
            self.config.max_line_bytes,
            self.handlers.clone(),
            Some(spec.connect(&self.config)),
        );
        let live = self.watched(shared, failures_before, follow_remote)?;
        self.initialized(live, None, Some(spec.shown.clone()))
    }

    /// A live server whose end `watch` waits for and records, on a thread of its own: the
    /// thread records the end itself, as it may come after the server's owner is gone (the
    /// runtime dropping it).
    fn watched<W>(
        &self,
        shared: Arc<Shared>,
        failures_before: u32,
        watch: W,
    ) -> Result<Live, String>
    where
        W: FnOnce(&Arc<Shared>, &AtomicBool, &dyn EventStore, &str) + Send + 'static,
    {
        let stopping = Arc::new(AtomicBool::new(false));
        let (events, name, watched, stop) = (
            self.events.clone(),
            self.name.clone(),
            shared.clone(),
            stopping.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("correx-mcp-{}", self.name))
            .spawn(move || watch(&watched, &stop, events.as_ref(), &name))
            .map_err(|e| e.to_string())?;
        Ok(Live {
            shared,
            tools: Vec::new(),
            thread: Some(thread),
            stopping,
            started_at: Instant::now(),
            failures_before,
        })
    }

    /// Initializes a started server: recorded as started with its tools, or stopped.
    fn initialized(
        &self,
        live: Live,
        isolation: Option<Value>,
        url: Option<String>,
    ) -> Result<Live, String> {
        let found = initialize(&live.shared, self.config.startup_timeout)
            .and_then(|(protocol, tools)| Ok((protocol, self.reviewed(tools)?)));
        match found {
            Ok((protocol, tools)) => {
                self.record(DomainEvent::McpServerStarted {
                    server: self.name.clone(),
                    protocol_version: protocol,
                    tools: tools.iter().map(|t| t.name.clone()).collect(),
                    isolation,
                    url,
                });
                Ok(Live { tools, ..live })
            }
            Err(e) => {
                self.retire(&live.shared);
                stop(live);
                Err(e)
            }
        }
    }

    /// A listing checked against the server's pins: each tool not pinned as listed is held.
    fn reviewed(&self, mut tools: Vec<ToolDef>) -> Result<Vec<Arc<ToolDef>>, String> {
        let listed: Vec<(String, Value)> = tools
            .iter_mut()
            .map(|t| (t.name.clone(), std::mem::take(&mut t.listed)))
            .collect();
        let mut held = self
            .pins
            .review(&self.name, &listed, self.config.on_tool_change)?;
        Ok(tools
            .into_iter()
            .map(|mut t| {
                t.held = held.remove(&t.name);
                Arc::new(t)
            })
            .collect())
    }

    /// Calls `tool` with `arguments` for invocation `run` (its session and invocation ids);
    /// the result, and the progress notifications it sent. While it runs, its progress is
    /// recorded as `tool.progress` events (the latest at most every 100 ms), so a host
    /// following the log sees it live.
    pub fn call(
        self: &Arc<Self>,
        tool: &str,
        arguments: Map<String, Value>,
        run: (&str, &str),
        cancel: &CancelToken,
    ) -> Result<(Value, Vec<Value>), RpcError> {
        self.restart_if_stale();
        let shared = {
            let mut state = self.state.lock();
            self.ensure(&mut state).map_err(RpcError::Gone)?;
            match &*state {
                State::Up(live) => {
                    // Counted before the lock goes: a restart for the host's handler waits.
                    live.shared.calls.fetch_add(1, Ordering::AcqRel);
                    live.shared.clone()
                }
                State::Down(_) => return Err(RpcError::Gone("not running".into())),
            }
        };
        struct Counted<'a>(&'a Shared);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.calls.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _counted = Counted(&shared);
        let mut params = Map::new();
        params.insert("name".into(), json!(tool));
        params.insert("arguments".into(), Value::Object(arguments));
        let tool_name = format!("{}.{tool}", self.name);
        let record_progress = |p: &Value| {
            self.record(DomainEvent::ToolProgress {
                session_id: run.0.to_owned(),
                invocation_id: run.1.to_owned(),
                tool_name: tool_name.clone(),
                progress: p["progress"].as_f64().unwrap_or(0.0),
                total: p["total"].as_f64(),
                message: p["message"].as_str().map(str::to_owned),
            })
        };
        let (answer, progress) = shared.request(
            "tools/call",
            params,
            self.config.call_time(),
            Some(cancel),
            Some(&record_progress),
        );
        answer.map(|a| (a, progress))
    }

    /// Stops the server if it runs: its stdin closed, [`EXIT_GRACE`] to exit, then every
    /// process of it killed. Returns once it is gone and its end recorded.
    pub fn shutdown(&self) {
        if let Some(live) = self.begin_shutdown() {
            finish_stop(vec![live], Instant::now() + EXIT_GRACE);
        }
        self.wait_retired();
    }

    /// Closes the server for good and tells a running one to end (its stdin closed); the
    /// live server, to [`finish_stop`] (several servers stop together).
    pub fn begin_shutdown(&self) -> Option<LiveServer> {
        self.closed.store(true, Ordering::Release);
        let old = std::mem::replace(&mut *self.state.lock(), State::Down(Down::default()));
        match old {
            State::Up(live) => {
                live.stopping.store(true, Ordering::Release);
                live.shared.end("stopped by correx".into());
                self.retire(&live.shared);
                Some(LiveServer(live))
            }
            State::Down(_) => None,
        }
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A server told to end, not yet gone.
pub(crate) struct LiveServer(Live);

/// Waits (until `deadline`) for servers told to end, kills what is left, and waits for each
/// end to be recorded.
pub(crate) fn finish_stop(servers: Vec<LiveServer>, deadline: Instant) {
    let mut threads = Vec::new();
    for LiveServer(mut live) in servers {
        if let Some(t) = live.thread.take() {
            threads.push((live.shared.clone(), t));
        }
    }
    for (shared, t) in threads {
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        shared.kill.cancel();
        let _ = t.join();
    }
}

/// Ends a live server and waits for its thread (which records the end).
fn stop(live: Live) {
    live.stopping.store(true, Ordering::Release);
    live.shared.end("stopped by correx".into());
    finish_stop(vec![LiveServer(live)], Instant::now() + EXIT_GRACE);
}

/// How long servers get to exit once their stdin is closed, before they are killed.
pub(crate) const STOP_GRACE: Duration = EXIT_GRACE;

/// How long a start waits for a remote server's first answer to its GET stream.
const OPEN_STREAM: Duration = Duration::from_secs(2);

/// The revision found ([`discover`] first, `initialize` for a handshake-era server, then
/// `notifications/initialized` and a remote server's GET stream opened), then the tool list.
fn initialize(shared: &Shared, timeout: Duration) -> Result<(String, Vec<ToolDef>), String> {
    let deadline = Instant::now().checked_add(timeout);
    let left = |deadline: Option<Instant>| {
        deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()))
    };
    let mut capabilities = json!({"roots": {"listChanged": false}});
    for m in &shared.declared {
        capabilities[m.capability()] = json!({});
    }
    if let Found::Stateless(found) = discover(shared, timeout, &capabilities)? {
        if found["capabilities"].get("tools").is_none() {
            log::warn!("an mcp server offers no tools capability; listing anyway");
        }
        let tools = list_tools(shared, left(deadline))?;
        return Ok((STATELESS_PROTOCOL_VERSION.to_owned(), tools));
    }
    let timeout = left(deadline);
    let mut params = Map::new();
    params.insert("protocolVersion".into(), json!(PROTOCOL_VERSIONS[0]));
    params.insert("capabilities".into(), capabilities);
    params.insert(
        "clientInfo".into(),
        json!({"name": "correx", "version": env!("CARGO_PKG_VERSION")}),
    );
    let (answer, _) = shared.request("initialize", params, timeout, None, None);
    let answer = answer.map_err(|e| format!("initialize: {e}"))?;
    let version = answer["protocolVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if !PROTOCOL_VERSIONS.contains(&version.as_str()) {
        return Err(format!(
            "it speaks protocol revision {version:?}; this client speaks {}",
            PROTOCOL_VERSIONS.join(", ")
        ));
    }
    if let Some(remote) = shared.remote() {
        remote.negotiated(&version);
    }
    if answer["capabilities"].get("tools").is_none() {
        log::warn!("an mcp server offers no tools capability; listing anyway");
    }
    shared
        .notify("notifications/initialized", json!({}))
        .map_err(|e| e.to_string())?;
    let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
    if let Some(remote) = shared.remote() {
        remote.open_stream(left.min(OPEN_STREAM));
    }
    let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
    let tools = list_tools(shared, left)?;
    Ok((version, tools))
}

/// Every page of `tools/list`.
fn list_tools(shared: &Shared, timeout: Duration) -> Result<Vec<ToolDef>, String> {
    let deadline = Instant::now().checked_add(timeout);
    let mut tools = Vec::new();
    let mut param_headers = HashMap::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut params = Map::new();
        if let Some(c) = &cursor {
            params.insert("cursor".into(), json!(c));
        }
        let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return Err("tools/list: its pages took longer than the startup timeout".into());
        }
        let (answer, _) = shared.request("tools/list", params, left, None, None);
        let page = answer.map_err(|e| format!("tools/list: {e}"))?;
        for t in page["tools"].as_array().into_iter().flatten() {
            let Some(name) = t["name"].as_str() else {
                continue;
            };
            // A name a registry key cannot carry plainly is skipped, with a warning.
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                log::warn!("an mcp server listed a tool with an unusable name: {name:?}");
                continue;
            }
            let input_schema = t
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            // A tool whose routing headers cannot be sent is left out; the others stay. They
            // are sent to a stateless remote server only.
            let routed = shared.remote().is_some_and(Remote::stateless);
            let annotations = if routed {
                routing::param_headers(&input_schema)
            } else {
                Ok(Vec::new())
            };
            match annotations {
                Ok(h) if !h.is_empty() => {
                    param_headers.insert(name.to_owned(), h);
                }
                Ok(_) => {}
                Err(why) => {
                    log::warn!("an mcp server's tool {name:?} is left out: {why}");
                    continue;
                }
            }
            tools.push(ToolDef {
                name: name.to_owned(),
                description: t["description"].as_str().unwrap_or_default().to_owned(),
                input_schema,
                output_schema: t.get("outputSchema").filter(|s| s.is_object()).cloned(),
                digest: super::pins::digest(t),
                held: None,
                listed: t.clone(),
            });
        }
        match page["nextCursor"].as_str() {
            Some(c) if !c.is_empty() => cursor = Some(c.to_owned()),
            _ => {
                if let Some(remote) = shared.remote() {
                    remote.set_param_headers(param_headers);
                }
                return Ok(tools);
            }
        }
    }
    Err(format!("tools/list: more than {MAX_PAGES} pages"))
}
