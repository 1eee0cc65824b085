//! One running MCP server, spoken to over its stdio: newline-delimited JSON-RPC 2.0.
//!
//! The server's stdout is read by the run's own pump (the supervised spawn's), through a
//! [`Sink`] that splits lines and dispatches them: responses go to the caller waiting for
//! them, requests from the server are answered (`ping`; `roots/list` with the working dirs;
//! sampling and elicitation by the host's handler, on a thread of their own, when one is
//! registered; anything else refused), notifications are kept (progress, per request) or logged. Writes
//! go to the server's stdin (non-blocking) under a lock, one whole line at a time; a server
//! that leaves its stdin full for [`WRITE_TIMEOUT`] is ended, so neither a caller nor the pump
//! blocks on it for longer. A line longer than the bound ends the server (its run is
//! cancelled) instead of growing memory.

use super::host_requests::{
    HandlerSlot, McpClientMethod, McpRefusal, McpServerRequest, MAX_IN_FLIGHT,
};
use super::input_required;
use super::remote::Remote;
use crate::cancel::CancelToken;
use crate::sys::spawn::Sink;
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a request may wait for its answer: `idle` without word from the server about it
/// (each progress notification starts this wait again), `total` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallTime {
    pub idle: Duration,
    pub total: Duration,
}

/// A fixed wait: progress does not extend it.
impl From<Duration> for CallTime {
    fn from(d: Duration) -> Self {
        CallTime { idle: d, total: d }
    }
}

/// Progress notifications kept per call (the last ones).
const KEPT_PROGRESS: usize = 64;
/// Bytes of one stderr line kept in the log.
const STDERR_LINE: usize = 2048;
/// How long a write may wait for a server to read its stdin.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RpcError {
    /// The server answered with a JSON-RPC error.
    Server { code: i64, message: String },
    /// No answer within the call's timeout.
    TimedOut,
    /// The host cancelled it (the server was told).
    Cancelled,
    /// The server ended (or was ended) before answering.
    Gone(String),
    /// A remote server refused the request at the HTTP level.
    Http { status: u16, message: String },
    /// A remote server asks for an authorization that could not be had.
    Unauthorized(String),
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Server { code, message } => {
                write!(f, "the server answered error {code}: {message}")
            }
            RpcError::TimedOut => f.write_str("the server did not answer in time"),
            RpcError::Cancelled => f.write_str("cancelled by the host"),
            RpcError::Gone(why) => write!(f, "the server ended before answering: {why}"),
            RpcError::Http { status, message } => {
                write!(f, "the server answered HTTP {status}: {message}")
            }
            RpcError::Unauthorized(why) => {
                write!(
                    f,
                    "the server asks for an authorization correx could not get: {why}"
                )
            }
        }
    }
}

/// What a call's waiter gets.
struct Waiter {
    answer: Option<Result<Value, RpcError>>,
    /// The last [`KEPT_PROGRESS`] progress notifications.
    progress: Vec<Value>,
    /// How many came in all.
    heard: u64,
}

/// How often a call passes the server's progress on while it runs, at most (the latest then).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// How many progress reports one call passes on, at most (a server reporting without end
/// cannot fill the log; the result still carries the last [`KEPT_PROGRESS`]).
const PROGRESS_PASSED_MAX: u32 = 1000;

/// What a call has passed on of its progress.
#[derive(Default)]
struct Passing {
    /// Reports heard when the last was passed.
    heard: u64,
    at: Option<Instant>,
    count: u32,
    last: Option<Value>,
}

impl Passing {
    /// Whether a report heard since the last passed may go now.
    fn due(&self, heard: u64) -> bool {
        heard > self.heard
            && self.count < PROGRESS_PASSED_MAX
            && self.at.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY)
    }

    /// Passes `latest` on unless it repeats the last passed (or, unless `last_one`, it is
    /// not due).
    fn pass(&mut self, to: &dyn Fn(&Value), latest: &Value, heard: u64, last_one: bool) {
        if heard <= self.heard
            || self.count >= PROGRESS_PASSED_MAX
            || (!last_one && !self.due(heard))
        {
            return;
        }
        self.heard = heard;
        if self.last.as_ref() == Some(latest) {
            return;
        }
        self.at = Some(Instant::now());
        self.count += 1;
        self.last = Some(latest.clone());
        to(latest);
    }
}

/// State shared by callers, the pump's sink and the writer.
pub(crate) struct Shared {
    name: String,
    waiters: Mutex<HashMap<u64, Waiter>>,
    answered: Condvar,
    /// Why and when it ended, once it has.
    ended: Mutex<Option<(String, Instant)>>,
    next_id: AtomicU64,
    /// The server said its tool list changed.
    pub tools_changed: AtomicBool,
    roots: Vec<String>,
    /// The server's stdin, until it ended (a server correx runs).
    stdin: Mutex<Option<std::os::fd::OwnedFd>>,
    /// A remote server's connection (instead of a stdin).
    remote: Option<Remote>,
    /// This, for what a remote answer hands on.
    me: Weak<Shared>,
    /// Cancelling it ends the server's run.
    pub kill: CancelToken,
    /// It wrote a line past the bound.
    pub overflowed: AtomicBool,
    max_line: usize,
    /// The host's handler of the server's sampling and elicitation requests.
    handlers: HandlerSlot,
    /// The methods declared to the server at its start (those the handler answered then).
    pub declared: Vec<McpClientMethod>,
    /// The server's requests the host's handler is answering, by request id.
    host_calls: Mutex<HashMap<String, HostCall>>,
    host_calls_done: Condvar,
    /// Calls of the server's tools under way (counted from before their request is sent, so
    /// a restart never ends one).
    pub calls: std::sync::atomic::AtomicUsize,
    /// What every request's `_meta` carries in the stateless revision (its version, this
    /// client and its capabilities); none under a handshake revision.
    meta: Mutex<Option<Map<String, Value>>>,
}

/// A request of the server's the host's handler is answering.
struct HostCall {
    cancel: CancelToken,
    /// The thread answering it, once it runs.
    thread: Option<std::thread::ThreadId>,
}

impl Shared {
    pub fn new(
        name: &str,
        roots: Vec<String>,
        max_line: usize,
        handlers: HandlerSlot,
        remote: Option<Remote>,
    ) -> Arc<Shared> {
        let declared = handlers.methods();
        Arc::new_cyclic(|me| Shared {
            name: name.to_owned(),
            waiters: Mutex::new(HashMap::new()),
            answered: Condvar::new(),
            ended: Mutex::new(None),
            next_id: AtomicU64::new(1),
            tools_changed: AtomicBool::new(false),
            roots,
            stdin: Mutex::new(None),
            remote,
            me: me.clone(),
            kill: CancelToken::new(),
            overflowed: AtomicBool::new(false),
            max_line,
            handlers,
            declared,
            host_calls: Mutex::new(HashMap::new()),
            host_calls_done: Condvar::new(),
            calls: std::sync::atomic::AtomicUsize::new(0),
            meta: Mutex::new(None),
        })
    }

    /// Speaks to the server through `stdin` from now on.
    pub fn attach_stdin(&self, stdin: std::os::fd::OwnedFd) -> std::io::Result<()> {
        crate::sys::set_nonblocking(stdin.as_raw_fd())?;
        *self.stdin.lock() = Some(stdin);
        Ok(())
    }

    /// The remote server's connection, when it is one.
    pub fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// The server's name in the config.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A request id no other request of this connection has.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Hands on what a remote server sent: one message or a batch, as a line of stdout.
    pub fn dispatch(&self, bytes: &[u8]) {
        if let Some(me) = self.me.upgrade() {
            me.line(bytes);
        }
    }

    /// Whether request `id` has its answer (or is no longer waited for).
    pub fn settled(&self, id: u64) -> bool {
        self.waiters
            .lock()
            .get(&id)
            .is_none_or(|w| w.answer.is_some())
    }

    /// Gives request `id` its answer, unless it has one.
    pub fn settle(&self, id: u64, answer: Result<Value, RpcError>) {
        if let Some(w) = self.waiters.lock().get_mut(&id) {
            if w.answer.is_none() {
                w.answer = Some(answer);
            }
        }
        self.answered.notify_all();
    }

    fn send(&self, message: &Value) -> Result<(), RpcError> {
        self.send_within(message, None, WRITE_TIMEOUT)
    }

    /// Sends `message`: a line on a stdin (`cancel` and `timeout` bound only a remote
    /// server's POST).
    fn send_within(
        &self,
        message: &Value,
        cancel: Option<&CancelToken>,
        timeout: Duration,
    ) -> Result<(), RpcError> {
        if let Some(remote) = &self.remote {
            if self.is_ended() {
                return Err(RpcError::Gone(self.why_ended()));
            }
            let Some(me) = self.me.upgrade() else {
                return Err(RpcError::Gone("the connection is closed".into()));
            };
            return remote.post(&me, message, cancel, timeout);
        }
        let mut line = serde_json::to_vec(message).unwrap_or_default();
        line.push(b'\n');
        let stdin = self.stdin.lock();
        let Some(fd) = stdin.as_ref() else {
            return Err(RpcError::Gone(self.why_ended()));
        };
        if self.is_ended() {
            return Err(RpcError::Gone(self.why_ended()));
        }
        match crate::sys::write_all_within(fd.as_raw_fd(), &line, WRITE_TIMEOUT) {
            Ok(()) => Ok(()),
            Err(e) => {
                drop(stdin);
                let why = format!("writing to its stdin failed: {e}");
                self.end(why.clone());
                self.kill.cancel();
                Err(RpcError::Gone(why))
            }
        }
    }

    pub(crate) fn why_ended(&self) -> String {
        self.ended
            .lock()
            .as_ref()
            .map(|(why, _)| why.clone())
            .unwrap_or_else(|| "its input is closed".into())
    }

    /// Why and when it ended, once it has.
    pub fn ended_at(&self) -> Option<(String, Instant)> {
        self.ended.lock().clone()
    }

    /// Marks the server ended: every waiter gets `why`, writes stop.
    pub fn end(&self, why: String) {
        {
            let mut ended = self.ended.lock();
            if ended.is_none() {
                *ended = Some((why.clone(), Instant::now()));
            }
        }
        // The server's end of input; a writer holding it now fails soon (the server is being
        // stopped) and drops it then.
        if let Some(mut stdin) = self.stdin.try_lock() {
            drop(stdin.take());
        }
        if let Some(remote) = &self.remote {
            remote.close();
        }
        let mut waiters = self.waiters.lock();
        for w in waiters.values_mut() {
            if w.answer.is_none() {
                w.answer = Some(Err(RpcError::Gone(why.clone())));
            }
        }
        drop(waiters);
        self.answered.notify_all();
        // The host's handlers in progress: no one will read their answers.
        for call in self.host_calls.lock().values() {
            call.cancel.cancel();
        }
    }

    /// Whether a call or a host-answered request is in progress.
    pub fn busy(&self) -> bool {
        self.calls.load(Ordering::Acquire) > 0
            || !self.waiters.lock().is_empty()
            || !self.host_calls.lock().is_empty()
    }

    /// Whether the host's handler is answering a request of this server.
    pub fn answering(&self) -> bool {
        !self.host_calls.lock().is_empty()
    }

    /// Waits until the host's handlers in progress have returned (told to stop by
    /// [`Shared::end`]); each is the host's code, which correx cannot interrupt. A handler
    /// that closes the runtime itself is not waited for (it would wait for itself).
    pub fn wait_host_calls(&self) {
        let me = std::thread::current().id();
        let mut calls = self.host_calls.lock();
        let mut warned = Instant::now();
        while calls.values().any(|c| c.thread != Some(me)) {
            if warned.elapsed() >= Duration::from_secs(10) {
                log::warn!(
                    "mcp server {}: waiting for {} host handler(s) to return",
                    self.name,
                    calls.len()
                );
                warned = Instant::now();
            }
            let _ = self
                .host_calls_done
                .wait_for(&mut calls, Duration::from_secs(1));
        }
    }

    /// Whether the server has ended.
    pub fn is_ended(&self) -> bool {
        self.ended.lock().is_some()
    }

    /// Sends a notification.
    pub fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// Sends a request and waits for its answer (result, and the progress notifications that
    /// came with it), within `time` (a progress notification about it starts its idle wait
    /// again); a cancel tells the server (`notifications/cancelled`) and returns at once. While it waits, `on_progress` is given the latest progress
    /// notification at most every [`PROGRESS_EVERY`] (one that repeats the last is skipped;
    /// at most [`PROGRESS_PASSED_MAX`] in all), on this thread, with no lock held; the latest
    /// is passed on before the answer is returned.
    pub fn request(
        &self,
        method: &str,
        mut params: Map<String, Value>,
        time: impl Into<CallTime>,
        cancel: Option<&CancelToken>,
        on_progress: Option<&dyn Fn(&Value)>,
    ) -> (Result<Value, RpcError>, Vec<Value>) {
        let time = time.into();
        let deadline = Instant::now().checked_add(time.total);
        let mut progress = Vec::new();
        let stateless = self.meta.lock().is_some();
        for round in 0..=input_required::MAX_ROUNDS {
            let left = deadline.map_or(time.total, |d| d.saturating_duration_since(Instant::now()));
            if round > 0 {
                // The host took the time (or the caller gave up) while giving the input.
                if cancel.is_some_and(CancelToken::is_cancelled) {
                    return (Err(RpcError::Cancelled), progress);
                }
                if left.is_zero() {
                    return (Err(RpcError::TimedOut), progress);
                }
            }
            let round_time = CallTime {
                idle: time.idle.min(left),
                total: left,
            };
            let (answer, heard) =
                self.request_once(method, params.clone(), round_time, cancel, on_progress);
            progress.extend(heard);
            // A result that asks for input first (the stateless revision's): the input is
            // had, and the request sent again with it, under a new id.
            let asked = match answer {
                Ok(result) if stateless && input_required::is_asked(&result) => result,
                other => return (other, progress),
            };
            if round == input_required::MAX_ROUNDS {
                break;
            }
            match input_required::answers(self, &asked, cancel) {
                Ok(responses) => input_required::retry_params(&mut params, &asked, responses),
                Err(e) => return (Err(e), progress),
            }
        }
        let e = RpcError::Server {
            code: -32603,
            message: format!(
                "{method}: the server asked for input more than {} times",
                input_required::MAX_ROUNDS
            ),
        };
        (Err(e), progress)
    }

    /// The stateless revision's `_meta` for every request from now on (none: a handshake
    /// revision).
    pub fn set_meta(&self, meta: Option<Map<String, Value>>) {
        *self.meta.lock() = meta;
    }

    /// One request and its answer; see [`Shared::request`].
    fn request_once(
        &self,
        method: &str,
        mut params: Map<String, Value>,
        time: CallTime,
        cancel: Option<&CancelToken>,
        on_progress: Option<&dyn Fn(&Value)>,
    ) -> (Result<Value, RpcError>, Vec<Value>) {
        let id = self.next_id();
        let meta = params.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        if let Some(m) = meta.as_object_mut() {
            // The id doubles as the progress token: notifications name the call they belong to.
            m.insert("progressToken".into(), json!(id));
            if let Some(common) = &*self.meta.lock() {
                for (k, v) in common {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
        // No word can come before the answer's head: the idle wait bounds the send.
        match self.send_request(id, method, params, cancel, time.idle) {
            Ok(()) => {}
            // A remote server's POST was given up: as a wait for an answer would have been.
            Err(RpcError::Cancelled) => return self.abandon(id, method, true, Vec::new()),
            Err(RpcError::TimedOut) => return self.abandon(id, method, false, Vec::new()),
            Err(e) => return (Err(e), Vec::new()),
        }
        self.await_answer(id, method, time, cancel, on_progress)
    }

    /// Registers the waiter of request `id`, then sends it; on a failure the waiter is removed
    /// again.
    fn send_request(
        &self,
        id: u64,
        method: &str,
        params: Map<String, Value>,
        cancel: Option<&CancelToken>,
        timeout: Duration,
    ) -> Result<(), RpcError> {
        self.waiters.lock().insert(
            id,
            Waiter {
                answer: None,
                progress: Vec::new(),
                heard: 0,
            },
        );
        if self.is_ended() {
            self.waiters.lock().remove(&id);
            return Err(RpcError::Gone(self.why_ended()));
        }
        let sent = self.send_within(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
            cancel,
            timeout,
        );
        if let Err(e) = sent {
            self.waiters.lock().remove(&id);
            return Err(e);
        }
        Ok(())
    }

    /// Waits for the answer to request `id` (sent), passing its progress on meanwhile; see
    /// [`Shared::request`].
    fn await_answer(
        &self,
        id: u64,
        method: &str,
        time: impl Into<CallTime>,
        cancel: Option<&CancelToken>,
        on_progress: Option<&dyn Fn(&Value)>,
    ) -> (Result<Value, RpcError>, Vec<Value>) {
        let time = time.into();
        let started = Instant::now();
        let total = started.checked_add(time.total);
        let mut idle = started.checked_add(time.idle);
        let mut heard_at_idle = 0;
        let mut passing = Passing::default();
        let mut waiters = self.waiters.lock();
        loop {
            if let Some(w) = waiters.get_mut(&id) {
                // Word about the call: its idle wait starts again.
                if w.heard != heard_at_idle {
                    heard_at_idle = w.heard;
                    idle = Instant::now().checked_add(time.idle);
                }
                if w.answer.is_some() {
                    let w = waiters.remove(&id);
                    drop(waiters);
                    return self.answered_call(w, &mut passing, on_progress);
                }
                if let (Some(pass), Some(latest)) = (on_progress, w.progress.last()) {
                    if passing.due(w.heard) {
                        let (latest, heard) = (latest.clone(), w.heard);
                        drop(waiters);
                        passing.pass(pass, &latest, heard, false);
                        waiters = self.waiters.lock();
                        continue;
                    }
                }
            }
            let cancelled = cancel.is_some_and(CancelToken::is_cancelled);
            let deadline = match (idle, total) {
                (Some(i), Some(t)) => Some(i.min(t)),
                (i, t) => i.or(t),
            };
            let late = deadline.is_some_and(|d| Instant::now() >= d);
            if cancelled || late {
                let progress = waiters.remove(&id).map(|w| w.progress).unwrap_or_default();
                drop(waiters);
                return self.abandon(id, method, cancelled, progress);
            }
            // Woken by an answer or the end; a cancel is seen within the slice.
            let slice = Instant::now() + Duration::from_millis(20);
            let until = deadline.map_or(slice, |d| d.min(slice));
            let _ = self.answered.wait_until(&mut waiters, until);
        }
    }

    /// What a call returns once its waiter `w` (removed, no lock held) has its answer.
    fn answered_call(
        &self,
        w: Option<Waiter>,
        passing: &mut Passing,
        on_progress: Option<&dyn Fn(&Value)>,
    ) -> (Result<Value, RpcError>, Vec<Value>) {
        match w {
            Some(Waiter {
                answer: Some(a),
                progress,
                heard,
            }) => {
                // The last report often comes just before the answer.
                if let (Some(pass), Some(latest)) = (on_progress, progress.last()) {
                    passing.pass(pass, latest, heard, true);
                }
                (a, progress)
            }
            _ => (Err(RpcError::Gone(self.why_ended())), Vec::new()),
        }
    }

    /// Gives up on request `id` (its waiter removed, no lock held), cancelled or late: the
    /// server is told (but for `initialize`).
    fn abandon(
        &self,
        id: u64,
        method: &str,
        cancelled: bool,
        progress: Vec<Value>,
    ) -> (Result<Value, RpcError>, Vec<Value>) {
        let reason = if cancelled {
            "cancelled by the host"
        } else {
            "timed out"
        };
        if let Some(remote) = &self.remote {
            remote.abandon(id);
        }
        // Nothing to cancel before a revision is agreed.
        if method != "initialize" && method != "server/discover" {
            let _ = self.notify(
                "notifications/cancelled",
                json!({"requestId": id, "reason": reason}),
            );
        }
        let e = if cancelled {
            RpcError::Cancelled
        } else {
            RpcError::TimedOut
        };
        (Err(e), progress)
    }

    /// Handles one line the server wrote on stdout.
    fn line(self: &Arc<Self>, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let parsed = serde_json::from_str::<Value>(text);
        // A batch (the 2025-03-26 revision allows them): each message in turn.
        if let Ok(Value::Array(batch)) = parsed {
            for m in batch {
                if let Value::Object(m) = m {
                    self.message(&m);
                }
            }
            return;
        }
        let Ok(Value::Object(m)) = parsed else {
            let short: String = text.chars().take(200).collect();
            log::warn!(
                "mcp server {}: a line that is not a JSON object: {short}",
                self.name
            );
            return;
        };
        self.message(&m);
    }

    /// Handles one JSON-RPC message: a response (it has `result` or `error`), a request from
    /// the server (`method` and `id`), or a notification (`method` alone).
    fn message(self: &Arc<Self>, m: &Map<String, Value>) {
        let response = m.contains_key("result") || m.contains_key("error");
        match (m.get("id"), m.get("method").and_then(Value::as_str)) {
            // A response to one of ours.
            (Some(id), _) if response => self.response(id, m),
            // A request from the server.
            (Some(id), Some(method)) => self.server_request(id, method, m),
            // A notification.
            (None, Some(method)) => self.notification(method, m),
            (_, None) => {}
        }
    }

    /// A response to one of ours: its waiter gets the answer.
    fn response(&self, id: &Value, m: &Map<String, Value>) {
        let Some(id) = id.as_u64() else {
            // `id: null`: an error about a message it could not read.
            log::warn!(
                "mcp server {}: an error not tied to a request: {}",
                self.name,
                crate::text::bounded(m.get("error").map(Value::to_string).unwrap_or_default())
            );
            return;
        };
        let answer = match (m.get("result"), m.get("error")) {
            (Some(r), _) => Ok(r.clone()),
            (None, Some(e)) => Err(RpcError::Server {
                code: e["code"].as_i64().unwrap_or(0),
                message: e["message"].as_str().unwrap_or_default().to_owned(),
            }),
            (None, None) => Err(RpcError::Server {
                code: -32603,
                message: "a response with neither result nor error".into(),
            }),
        };
        if let Some(w) = self.waiters.lock().get_mut(&id) {
            // The first answer wins; a second one for the same id is the server's error.
            if w.answer.is_some() {
                log::warn!(
                    "mcp server {}: a second answer to request {id}; the first stands",
                    self.name
                );
                return;
            }
            w.answer = Some(answer);
        }
        self.answered.notify_all();
    }

    /// A request from the server: answered here (`ping`, `roots/list`), by the host's handler
    /// on a thread of its own (a declared method), or refused.
    fn server_request(self: &Arc<Self>, id: &Value, method: &str, m: &Map<String, Value>) {
        let reply = match method {
            "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            "roots/list" => json!({"jsonrpc": "2.0", "id": id, "result": self.roots_result()}),
            other => match McpClientMethod::from_method(other) {
                Some(asked) if self.declared.contains(&asked) => {
                    self.answer_on_thread(id.clone(), asked, m.get("params"));
                    return;
                }
                _ => json!({"jsonrpc": "2.0", "id": id, "error": {
                    "code": -32601,
                    "message": format!(
                        "{other} is not supported by this client (correx answers ping, \
                         roots/list{})",
                        self.declared
                            .iter()
                            .map(|m| format!(", {}", m.method()))
                            .collect::<String>()
                    )
                }}),
            },
        };
        let _ = self.send(&reply);
    }

    /// The answer to `roots/list`: the roots the server was given.
    pub(super) fn roots_result(&self) -> Value {
        let roots: Vec<Value> = self
            .roots
            .iter()
            .map(|r| json!({"uri": file_uri(r), "name": r}))
            .collect();
        json!({ "roots": roots })
    }

    /// A notification from the server.
    fn notification(&self, method: &str, m: &Map<String, Value>) {
        match method {
            "notifications/progress" => self.progress(m),
            "notifications/cancelled" => {
                // The server withdrew a request the host is answering.
                let id = &m.get("params").unwrap_or(&Value::Null)["requestId"];
                if let Some(call) = self.host_calls.lock().get(&id.to_string()) {
                    call.cancel.cancel();
                }
            }
            "notifications/tools/list_changed" => self.tools_changed.store(true, Ordering::Release),
            "notifications/message" => {
                let p = &m["params"];
                log::info!(
                    "mcp server {}: {}",
                    self.name,
                    crate::text::bounded(p["data"].to_string())
                );
            }
            _ => {}
        }
    }

    /// A progress notification: kept with the call it names, whose caller is woken.
    fn progress(&self, m: &Map<String, Value>) {
        let mut params = m.get("params").cloned().unwrap_or(Value::Null);
        // Kept small: the counts, and the message cut to 1 KiB.
        if let Some(msg) = params.get("message").and_then(Value::as_str) {
            let cut: String = msg.chars().take(1024).collect();
            params["message"] = json!(cut);
        }
        if let Value::Object(p) = &mut params {
            p.retain(|k, _| {
                matches!(
                    k.as_str(),
                    "progressToken" | "progress" | "total" | "message"
                )
            });
        }
        if let Some(token) = params["progressToken"].as_u64() {
            if let Some(w) = self.waiters.lock().get_mut(&token) {
                if w.progress.len() == KEPT_PROGRESS {
                    w.progress.remove(0);
                }
                w.progress.push(params);
                w.heard += 1;
            }
            // The caller passes it on while it waits.
            self.answered.notify_all();
        }
    }
}

impl Shared {
    /// Has the host's handler answer request `id` on a thread of its own; at most
    /// [`MAX_IN_FLIGHT`] at a time, a request past them (or one that repeats an id in
    /// progress) is refused at once.
    fn answer_on_thread(
        self: &Arc<Self>,
        id: Value,
        method: McpClientMethod,
        params: Option<&Value>,
    ) {
        let key = id.to_string();
        let cancel = CancelToken::new();
        let refused = {
            let mut calls = self.host_calls.lock();
            if calls.len() >= MAX_IN_FLIGHT {
                Some(format!(
                    "{} requests are already waiting for the host; try again later",
                    calls.len()
                ))
            } else if calls.contains_key(&key) {
                Some(format!("request id {key} is already in progress"))
            } else if self.is_ended() {
                Some("the client is stopping this server".to_owned())
            } else {
                let call = HostCall {
                    cancel: cancel.clone(),
                    thread: None,
                };
                calls.insert(key.clone(), call);
                None
            }
        };
        if let Some(why) = refused {
            let _ = self.send(&error_reply(&id, -32603, &why));
            return;
        }
        let params = params.cloned().unwrap_or(Value::Null);
        let (shared, reply_id) = (self.clone(), id.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("correx-mcp-{}-host", self.name))
            .spawn(move || {
                let key = reply_id.to_string();
                if let Some(call) = shared.host_calls.lock().get_mut(&key) {
                    call.thread = Some(std::thread::current().id());
                }
                let reply = shared.host_answer(&reply_id, method, &params, &cancel);
                // Done before the reply goes: a server may reuse the id at once.
                shared.host_calls.lock().remove(&key);
                shared.host_calls_done.notify_all();
                // Withdrawn by the server (or it is ending): no answer is wanted.
                if !cancel.is_cancelled() {
                    let _ = shared.send(&reply);
                }
            });
        if let Err(e) = spawned {
            self.host_calls.lock().remove(&key);
            self.host_calls_done.notify_all();
            let _ = self.send(&error_reply(&id, -32603, &format!("no thread for it: {e}")));
        }
    }

    /// The host's answer to input a stateless server asked for, given on this thread: held
    /// among the host's calls meanwhile, so that the server's end cancels it and a close
    /// waits for it, as for a request of the server's own.
    pub(super) fn answer_inline(
        &self,
        method: McpClientMethod,
        params: &Value,
        cancel: &CancelToken,
    ) -> Value {
        let token = CancelToken::new();
        let _linked = {
            let t = token.clone();
            cancel.on_cancel(move || t.cancel())
        };
        let key = format!("input-{}", self.next_id());
        {
            let mut calls = self.host_calls.lock();
            if self.is_ended() {
                return error_reply(&Value::Null, -32603, "the client is stopping this server");
            }
            calls.insert(
                key.clone(),
                HostCall {
                    cancel: token.clone(),
                    thread: Some(std::thread::current().id()),
                },
            );
        }
        let reply = self.host_answer(&Value::Null, method, params, &token);
        self.host_calls.lock().remove(&key);
        self.host_calls_done.notify_all();
        reply
    }

    /// The host's answer to one request, as the JSON-RPC message to send.
    fn host_answer(
        &self,
        id: &Value,
        method: McpClientMethod,
        params: &Value,
        cancel: &CancelToken,
    ) -> Value {
        // Withdrawn before its turn: the handler is not asked (the reply is not sent).
        if cancel.is_cancelled() {
            return error_reply(id, -32603, "withdrawn");
        }
        let Some(handler) = self.handlers.answering(method) else {
            return error_reply(
                id,
                -32601,
                &format!("{} is no longer answered by this client", method.method()),
            );
        };
        let request = McpServerRequest {
            server: &self.name,
            method,
            params,
        };
        let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handler.handle(&request, cancel)
        }));
        match answered {
            Ok(Ok(result @ Value::Object(_))) => {
                let result = match method {
                    McpClientMethod::Elicitation => {
                        super::host_requests::with_defaults(params, result)
                    }
                    McpClientMethod::Sampling => result,
                };
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Ok(Ok(other)) => {
                log::warn!(
                    "mcp server {}: the host's {} handler answered with {}, not an object",
                    self.name,
                    method.method(),
                    crate::tools::json_kind(&other)
                );
                error_reply(id, -32603, "the host's handler gave no usable answer")
            }
            Ok(Err(McpRefusal { code, message })) => error_reply(id, code, &message),
            Err(_) => {
                log::error!(
                    "mcp server {}: the host's {} handler panicked",
                    self.name,
                    method.method()
                );
                error_reply(id, -32603, "the host's handler failed")
            }
        }
    }
}

fn error_reply(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// How long a server that closed its stdout has to exit before it is ended and killed.
const CLOSED_STDOUT_GRACE: Duration = Duration::from_secs(1);

/// Splits the server's output into lines: stdout to [`Shared::line`], stderr to the log.
pub(crate) struct Lines {
    pub shared: Arc<Shared>,
    partial: [Vec<u8>; 2],
    /// Set when a line passed the bound: the rest is not read.
    overflowed: bool,
}

impl Lines {
    pub fn new(shared: Arc<Shared>) -> Lines {
        Lines {
            shared,
            partial: [Vec::new(), Vec::new()],
            overflowed: false,
        }
    }
}

impl Sink for Lines {
    /// A server that closes its stdout can answer nothing more. One that does not exit
    /// within [`CLOSED_STDOUT_GRACE`] (an exit names its own reason) is ended and killed
    /// then, so its calls fail at once rather than at their timeouts, and its next use
    /// starts it again.
    fn closed(&mut self, stream: usize) {
        if stream != 0 {
            return;
        }
        let shared = self.shared.clone();
        let watch = move || {
            std::thread::sleep(CLOSED_STDOUT_GRACE);
            if !shared.is_ended() {
                shared.end("it closed its stdout but kept running".into());
                shared.kill.cancel();
            }
        };
        let name = format!("correx-mcp-{}-stdout", self.shared.name);
        if std::thread::Builder::new().name(name).spawn(watch).is_err() {
            self.shared.end("it closed its stdout".into());
            self.shared.kill.cancel();
        }
    }

    fn take(&mut self, stream: usize, bytes: &[u8]) {
        if self.overflowed {
            return;
        }
        let stream = stream.min(1);
        let mut rest = bytes;
        loop {
            let end = rest.iter().position(|&b| b == b'\n');
            let mut piece = &rest[..end.unwrap_or(rest.len())];
            if stream == 1 {
                // Stderr is only logged: a long line is cut, not fatal.
                let room = STDERR_LINE.saturating_sub(self.partial[1].len());
                piece = &piece[..piece.len().min(room)];
            } else if self.partial[stream].len() + piece.len() > self.shared.max_line {
                self.overflow(stream);
                return;
            }
            match end {
                Some(n) => {
                    let mut line = std::mem::take(&mut self.partial[stream]);
                    line.extend_from_slice(piece);
                    rest = &rest[n + 1..];
                    self.emit(stream, &line);
                }
                None => {
                    self.partial[stream].extend_from_slice(piece);
                    return;
                }
            }
        }
    }
}

impl Lines {
    /// A line passed the bound: the server is ended and nothing more of it is read.
    fn overflow(&mut self, stream: usize) {
        self.overflowed = true;
        self.partial = [Vec::new(), Vec::new()];
        let why = format!(
            "it wrote a line longer than {} bytes on {}; it was stopped",
            self.shared.max_line,
            if stream == 0 { "stdout" } else { "stderr" }
        );
        log::error!("mcp server {}: {why}", self.shared.name);
        self.shared.overflowed.store(true, Ordering::Release);
        self.shared.end(why);
        self.shared.kill.cancel();
    }

    fn emit(&self, stream: usize, line: &[u8]) {
        if stream == 0 {
            self.shared.line(line);
        } else {
            let text = String::from_utf8_lossy(&line[..line.len().min(STDERR_LINE)]);
            log::info!("mcp server {}: {}", self.shared.name, text.trim_end());
        }
    }
}

/// A `file://` URI of an absolute path, percent-encoding what a URI cannot carry as is.
fn file_uri(path: &str) -> String {
    let mut out = String::from("file://");
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::mcp::McpRequestHandler;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;

    /// Answers sampling as `answer` says: an object, another JSON kind, a panic, or (with
    /// `wait`) nothing until cancelled.
    struct Host {
        answer: Value,
        wait: bool,
        entered: AtomicU64,
        cancelled: AtomicU64,
    }

    impl McpRequestHandler for Host {
        fn methods(&self) -> Vec<McpClientMethod> {
            vec![McpClientMethod::Sampling]
        }

        fn handle(
            &self,
            _: &McpServerRequest<'_>,
            cancel: &CancelToken,
        ) -> Result<Value, McpRefusal> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            if self.wait {
                while !cancel.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.cancelled.fetch_add(1, Ordering::SeqCst);
            }
            if self.answer == "panic" {
                panic!("a host handler that panics");
            }
            Ok(self.answer.clone())
        }
    }

    /// A connection whose server is this test: it writes lines as the server, and reads what
    /// the client sent.
    fn connection(host: Host) -> (Arc<Shared>, Arc<Host>, BufReader<UnixStream>) {
        let slot = HandlerSlot::default();
        let host = Arc::new(host);
        slot.set(Some(host.clone()));
        let shared = Shared::new("t", vec!["/w".into()], 1 << 20, slot, None);
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        shared
            .attach_stdin(std::os::fd::OwnedFd::from(ours))
            .expect("attached");
        theirs
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("a timeout");
        (shared, host, BufReader::new(theirs))
    }

    fn read(r: &mut BufReader<UnixStream>) -> Value {
        let mut line = String::new();
        r.read_line(&mut line).expect("a line");
        serde_json::from_str(&line).expect("JSON")
    }

    fn sampling(id: u64) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"sampling/createMessage","params":{{}}}}"#)
            .into_bytes()
    }

    fn host(answer: Value) -> Host {
        Host {
            answer,
            wait: false,
            entered: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    #[test]
    fn input_asked_for_is_given_by_the_host_and_the_request_sent_again_under_a_new_id() {
        let (shared, h, mut r) = connection(host(json!({"role": "assistant", "n": 1})));
        shared.set_meta(Some(crate::services::mcp::discover::meta(
            &json!({"sampling": {}}),
        )));
        let caller = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut params = Map::new();
                params.insert("name".into(), json!("t"));
                shared.request("tools/call", params, Duration::from_secs(20), None, None)
            })
        };
        let first = read(&mut r);
        let meta = &first["params"]["_meta"];
        assert_eq!(
            meta["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );
        assert_eq!(
            meta["io.modelcontextprotocol/clientCapabilities"]["sampling"],
            json!({})
        );
        let asked = json!({"jsonrpc": "2.0", "id": first["id"], "result": {
            "resultType": "input_required", "requestState": "s1",
            "inputRequests": {
                "pick": {"method": "sampling/createMessage", "params": {}},
                "where": {"method": "roots/list"}}}});
        shared.line(asked.to_string().as_bytes());
        let retry = read(&mut r);
        assert_ne!(retry["id"], first["id"]);
        assert_eq!(retry["params"]["name"], "t");
        assert_eq!(retry["params"]["requestState"], "s1");
        let given = &retry["params"]["inputResponses"];
        assert_eq!(given["pick"], json!({"role": "assistant", "n": 1}));
        assert_eq!(given["where"]["roots"][0]["name"], "/w");
        assert_eq!(h.entered.load(Ordering::SeqCst), 1);
        // A second round without state: none is sent; then the result completes the call.
        let again = json!({"jsonrpc": "2.0", "id": retry["id"], "result": {
            "resultType": "input_required",
            "inputRequests": {"pick": {"method": "sampling/createMessage"}}}});
        shared.line(again.to_string().as_bytes());
        let third = read(&mut r);
        assert!(third["params"].get("requestState").is_none(), "{third}");
        let done = json!({"jsonrpc": "2.0", "id": third["id"], "result": {"content": []}});
        shared.line(done.to_string().as_bytes());
        let (answer, _) = caller.join().expect("the caller");
        assert_eq!(answer, Ok(json!({"content": []})));
    }

    #[test]
    fn input_no_handler_answers_fails_the_call_without_asking_the_host() {
        let (shared, h, mut r) = connection(host(json!({})));
        shared.set_meta(Some(crate::services::mcp::discover::meta(&json!({}))));
        let caller = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                shared.request(
                    "tools/call",
                    Map::new(),
                    Duration::from_secs(20),
                    None,
                    None,
                )
            })
        };
        let first = read(&mut r);
        let asked = json!({"jsonrpc": "2.0", "id": first["id"], "result": {
            "resultType": "input_required",
            "inputRequests": {"form": {"method": "elicitation/create", "params": {}}}}});
        shared.line(asked.to_string().as_bytes());
        let (answer, _) = caller.join().expect("the caller");
        let Err(RpcError::Server { code, message }) = answer else {
            panic!("not refused: {answer:?}");
        };
        assert_eq!(code, -32602);
        assert!(message.contains("elicitation/create"), "{message}");
        assert_eq!(h.entered.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_first_of_two_answers_to_one_request_wins() {
        let (shared, _, mut r) = connection(host(json!({})));
        let id = shared.next_id();
        let wait = Duration::from_secs(20);
        shared
            .send_request(id, "tools/call", Map::new(), None, wait)
            .expect("sent");
        assert_eq!(read(&mut r)["id"], id);
        // Both arrive before the caller looks.
        shared.line(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"n":1}}}}"#).as_bytes());
        shared.line(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"n":2}}}}"#).as_bytes());
        let (answer, _) = shared.await_answer(id, "tools/call", wait, None, None);
        assert_eq!(answer, Ok(json!({"n": 1})));
    }

    #[test]
    fn a_host_answer_that_is_not_an_object_or_a_panic_is_an_error_to_the_server() {
        for (answer, code) in [
            (json!({"role": "assistant"}), None),
            (json!([1]), Some(-32603)),
            (json!("panic"), Some(-32603)),
        ] {
            let (shared, _, mut r) = connection(host(answer.clone()));
            shared.line(&sampling(7));
            let reply = read(&mut r);
            assert_eq!(reply["id"], 7, "{reply}");
            assert_eq!(reply["error"]["code"].as_i64(), code, "{answer}: {reply}");
            if code.is_none() {
                assert_eq!(reply["result"], answer);
            }
        }
    }

    #[test]
    fn undeclared_methods_are_refused_and_requests_past_the_bound_are_turned_away() {
        let (shared, h, mut r) = connection(Host {
            wait: true,
            ..host(json!({}))
        });
        assert_eq!(shared.declared, [McpClientMethod::Sampling]);
        shared.line(br#"{"jsonrpc":"2.0","id":"e","method":"elicitation/create","params":{}}"#);
        let reply = read(&mut r);
        assert_eq!(
            (reply["id"].as_str(), reply["error"]["code"].as_i64()),
            (Some("e"), Some(-32601))
        );
        for id in 0..MAX_IN_FLIGHT as u64 {
            shared.line(&sampling(id));
        }
        shared.line(&sampling(99));
        let reply = read(&mut r);
        assert_eq!(
            (reply["id"].as_u64(), reply["error"]["code"].as_i64()),
            (Some(99), Some(-32603))
        );
        assert!(shared.busy());
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.entered.load(Ordering::SeqCst) < MAX_IN_FLIGHT as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Withdrawn by the server: its handler is told and nothing is sent for it.
        shared.line(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":0}}"#,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.cancelled.load(Ordering::SeqCst) < 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(h.cancelled.load(Ordering::SeqCst), 1);
        // The end tells the rest, and waiting returns once they did.
        shared.end("stopped by the test".into());
        shared.wait_host_calls();
        assert_eq!(h.cancelled.load(Ordering::SeqCst), MAX_IN_FLIGHT as u64);
        assert!(!shared.busy());
        drop(shared);
        // Nothing was answered for the withdrawn request (sent before the end, had it been).
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut r, &mut rest).expect("the rest");
        assert_eq!(rest, "", "an answer to a withdrawn request");
    }
}
