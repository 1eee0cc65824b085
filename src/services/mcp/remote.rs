//! A remote MCP server spoken to over Streamable HTTP (revisions 2025-03-26 to 2026-07-28):
//! every message a POST to the server's endpoint, answered with JSON, with an SSE stream (the
//! answer and what the server sends before it), or with 202 (a notification or a response of
//! ours); a GET stream the server may use for its own requests and notifications (before the
//! stateless revision). A stateless server's POSTs carry its routing headers
//! ([`routing`]) and no session.
//!
//! What a mature client does on the way, done here: the `Mcp-Session-Id` the server gave at
//! `initialize` and the negotiated `MCP-Protocol-Version` go with every request; a 404 on a
//! session (the server restarted, or forgot it; or a 400 that says so, as servers built on the
//! SDKs' examples answer) is answered by a new session and the request sent again, once,
//! without failing the call; 429 and 503 are retried a bounded number of
//! times, after the server's `Retry-After` or a backoff with jitter; an SSE stream cut off
//! before its answer is resumed with `Last-Event-ID` after the server's `retry` delay; bodies
//! and events are bounded. Every connection goes where the server's network policy lets it
//! ([`RemoteSpec`]): a name it does not allow, or one resolving to a private address, is
//! refused and recorded before anything is sent.

use super::connection::{RpcError, Shared};
use super::discover::STATELESS_PROTOCOL_VERSION;
use super::oauth::{AuthorizerSlot, Challenge, OAuth, MAX_AUTHORIZATIONS};
use super::routing::{self, ParamHeader};
use super::server::{record, PROTOCOL_VERSIONS};
use super::sse::Events;
use super::McpServerConfig;
use crate::cancel::{CancelHook, CancelToken};
use crate::confine::net::{Host, Rules};
use crate::confine::Allowlist;
use crate::domain::DomainEvent;
use crate::events::EventStore;
use crate::http::{Endpoint, HttpClient, HttpError, Request, Resolver, Response};
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Times a request answered 429 or 503 is sent again, at most.
const BUSY_RETRIES: u32 = 3;
/// The longest `Retry-After` honoured; a server asking for longer fails the call.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// Times one answer's stream is resumed, at most.
const MAX_RESUMES: u32 = 5;
/// The delay before a resumption when the server gave no `retry`.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// How long notifications, responses and the session's DELETE may take.
const SHORT: Duration = Duration::from_secs(10);

/// A remote server as configured: where it is, and where its requests may go.
pub(crate) struct RemoteSpec {
    endpoint: Endpoint,
    /// The endpoint as recorded: no query.
    pub shown: String,
    resolver: Resolver,
    /// Its OAuth state, shared by its connections (used once it answers 401).
    oauth: Arc<OAuth>,
}

impl RemoteSpec {
    /// The spec of server `name` at `url`, its requests kept to `config.network` (by default
    /// the url's own host and port); refusals are recorded in `events`.
    ///
    /// # Errors
    /// A url or network policy that cannot be used (the config's validation names them
    /// first).
    pub fn new(
        name: &str,
        config: &McpServerConfig,
        url: &str,
        events: Arc<dyn EventStore>,
        authorizer: AuthorizerSlot,
    ) -> Result<RemoteSpec, String> {
        let network = config.network.as_ref();
        let endpoint = Endpoint::parse(url).ok_or_else(|| format!("{url:?} is not http://"))?;
        let own = Allowlist {
            allow: vec![host_port(endpoint.host(), endpoint.port())],
            ..Allowlist::default()
        };
        let rules = Arc::new(Rules::new(network.unwrap_or(&own))?);
        let server = name;
        let name = name.to_owned();
        let resolver: Resolver = Arc::new(move |host: &str, port: u16| {
            let refused = |reason: &str| {
                record(
                    events.as_ref(),
                    &name,
                    DomainEvent::McpRequestRefused {
                        server: name.clone(),
                        host: host.to_owned(),
                        port,
                        reason: reason.to_owned(),
                    },
                );
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "{} refused by the server's network policy ({reason}): nothing was \
                         sent; allow it in mcp_servers.{name}.network",
                        host_port(host, port)
                    ),
                )
            };
            let h = Host::parse(host).ok_or_else(|| refused("not_allowed"))?;
            rules
                .check(&h, port)
                .and_then(|()| rules.addresses(&h, port))
                .map(|found| {
                    found
                        .into_iter()
                        .map(|a| SocketAddr::new(a, port))
                        .collect()
                })
                .map_err(|r| refused(r.as_str()))
        });
        let shown = url.split('?').next().unwrap_or(url).to_owned();
        let oauth = Arc::new(OAuth::new(
            server,
            url,
            config.oauth.clone().unwrap_or_default(),
            resolver.clone(),
            authorizer,
        ));
        Ok(RemoteSpec {
            endpoint,
            shown,
            resolver,
            oauth,
        })
    }

    /// A fresh connection (no session yet) with `config`'s timeouts and bounds.
    pub fn connect(&self, config: &McpServerConfig) -> Remote {
        let client = HttpClient::new(
            self.endpoint.clone(),
            config.startup_timeout.min(SHORT),
            config.call_timeout,
        )
        .with_resolver(self.resolver.clone());
        Remote {
            path: if self.endpoint_has_path() { "" } else { "/" },
            client,
            oauth: self.oauth.clone(),
            session: Mutex::new(None),
            protocol: Mutex::new(None),
            init: Mutex::new(None),
            param_headers: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            closing: CancelToken::new(),
            max_bytes: config.max_line_bytes,
            listen_last_id: Mutex::new(None),
            listening: Mutex::new(Phase::Waiting),
            listened: Condvar::new(),
        }
    }

    fn endpoint_has_path(&self) -> bool {
        self.shown
            .strip_prefix("http://")
            .is_some_and(|rest| rest.trim_end_matches('/').contains('/'))
    }
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One connection to a remote server: its session, negotiated revision and open streams.
pub(crate) struct Remote {
    client: HttpClient,
    oauth: Arc<OAuth>,
    /// The request path below the endpoint's (`/` when the url has none).
    path: &'static str,
    session: Mutex<Option<String>>,
    protocol: Mutex<Option<String>>,
    /// The `initialize` params as first sent, for a new session.
    init: Mutex<Option<Value>>,
    /// The `x-mcp-header` arguments of each tool, by tool name (stateless revision).
    param_headers: Mutex<HashMap<String, Vec<ParamHeader>>>,
    /// The streams answering requests, by request id: cancelled when a call is abandoned.
    streams: Mutex<HashMap<u64, CancelToken>>,
    /// Cancelled when the connection ends: every stream closes.
    closing: CancelToken,
    max_bytes: usize,
    /// The GET stream's last event id, for its resumption.
    listen_last_id: Mutex<Option<String>>,
    /// Where the GET stream is: not yet to be opened, to be opened, opened (or refused).
    listening: Mutex<Phase>,
    listened: Condvar,
}

/// Where a connection's GET stream is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not before the session is initialized.
    Waiting,
    /// To be opened.
    Due,
    /// Its first answer came (a stream, or a refusal).
    Answered,
}

/// What the GET stream did.
pub(crate) enum Listened {
    /// The server offers none (405, or another refusal): not asked again on this
    /// connection.
    Unsupported,
    /// It ended; reconnect after this delay.
    Ended(Duration),
}

impl Remote {
    /// The headers every request carries: the session and revision, once known.
    fn headers(&self, accept: &'static str, json_body: bool) -> Vec<(&'static str, String)> {
        let mut h = vec![("Accept", accept.to_owned())];
        if json_body {
            h.push(("Content-Type", "application/json".to_owned()));
        }
        if let Some(s) = self.session.lock().clone() {
            h.push(("Mcp-Session-Id", s));
        }
        if let Some(p) = self.protocol.lock().clone() {
            h.push(("MCP-Protocol-Version", p));
        }
        h
    }

    fn send(
        &self,
        method: &str,
        headers: &[(&'static str, String)],
        body: &[u8],
        token: &CancelToken,
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        self.send_authorized(method, headers, &[], body, token, timeout)
            .map(|(r, _)| r)
    }

    /// Sends a request with the OAuth token held, if any; the answer and the
    /// `Authorization` sent.
    fn send_authorized(
        &self,
        method: &str,
        headers: &[(&'static str, String)],
        extra: &[(String, String)],
        body: &[u8],
        token: &CancelToken,
        timeout: Duration,
    ) -> Result<(Response, Option<String>), HttpError> {
        let bearer = self.oauth.bearer(token);
        let mut refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        refs.extend(extra.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        if let Some(b) = &bearer {
            refs.push(("Authorization", b));
        }
        let response = self.client.send(
            &Request {
                method,
                path: self.path,
                headers: &refs,
                body,
            },
            token,
            Some(timeout),
        )?;
        Ok((response, bearer))
    }

    /// The revision agreed at `initialize` (or found by `server/discover`): sent with every
    /// later request.
    pub fn negotiated(&self, version: &str) {
        *self.protocol.lock() = Some(version.to_owned());
    }

    /// Whether the stateless revision was found.
    pub fn stateless(&self) -> bool {
        self.protocol.lock().as_deref() == Some(STATELESS_PROTOCOL_VERSION)
    }

    /// No revision agreed (a `server/discover` that found a handshake-era server).
    pub fn forget_revision(&self) {
        *self.protocol.lock() = None;
    }

    /// The tools' `x-mcp-header` arguments, mirrored into headers of their calls.
    pub fn set_param_headers(&self, by_tool: HashMap<String, Vec<ParamHeader>>) {
        *self.param_headers.lock() = by_tool;
    }

    /// The routing headers of `message` under the stateless revision (none before it).
    fn routing(&self, message: &Value) -> Vec<(String, String)> {
        if !self.stateless() {
            return Vec::new();
        }
        let tool = message["params"]["name"].as_str().unwrap_or_default();
        let by_tool = self.param_headers.lock();
        let params = by_tool.get(tool).map_or(&[][..], Vec::as_slice);
        routing::headers(message, params)
    }

    /// Whether the session is initialized (the GET stream may be opened).
    pub fn ready(&self) -> bool {
        *self.listening.lock() != Phase::Waiting
    }

    /// The session is initialized: the GET stream is opened, and this waits (up to `within`)
    /// for the server's first answer to it, so that what the server sends its client from
    /// now on has a stream to come on.
    pub fn open_stream(&self, within: Duration) {
        let mut phase = self.listening.lock();
        if *phase == Phase::Waiting {
            *phase = Phase::Due;
        }
        let end = Instant::now() + within;
        while *phase != Phase::Answered && Instant::now() < end {
            let _ = self.listened.wait_until(&mut phase, end);
        }
    }

    fn answered(&self) {
        *self.listening.lock() = Phase::Answered;
        self.listened.notify_all();
    }

    /// Ends the connection: every stream closes.
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// The call answered by request `id` was given up: its stream is closed.
    pub fn abandon(&self, id: u64) {
        if let Some(t) = self.streams.lock().remove(&id) {
            t.cancel();
        }
    }

    /// A token cancelled when `cancel` or the connection's closing is; the guards keep it so.
    fn linked(&self, cancel: Option<&CancelToken>) -> (CancelToken, Vec<CancelHook>) {
        let token = CancelToken::new();
        let mut hooks = Vec::new();
        for source in cancel.into_iter().chain([&self.closing]) {
            let t = token.clone();
            hooks.push(source.on_cancel(move || t.cancel()));
        }
        (token, hooks)
    }

    /// POSTs `message` and takes its answer: a JSON body is handed to `shared` now; an SSE
    /// stream is read on a thread of its own (the caller waits for the answer as for a
    /// stdio server's).
    ///
    /// # Errors
    /// The server's HTTP refusal, a timeout, a cancel, or a connection failure (which ends
    /// the connection).
    pub fn post(
        &self,
        shared: &Arc<Shared>,
        message: &Value,
        cancel: Option<&CancelToken>,
        timeout: Duration,
    ) -> Result<(), RpcError> {
        let method = message.get("method").and_then(Value::as_str);
        let request_id = message
            .get("id")
            .filter(|_| method.is_some())
            .and_then(Value::as_u64);
        let initialize = method == Some("initialize");
        if initialize {
            *self.init.lock() = message.get("params").cloned();
            *self.session.lock() = None;
            *self.protocol.lock() = None;
        }
        let body = serde_json::to_vec(message).unwrap_or_default();
        let routing = self.routing(message);
        let (token, hooks) = self.linked(cancel);
        let deadline = Instant::now() + timeout;
        let mut renewed = false;
        let mut busy = 0;
        let mut authorizations = 0;
        let response = loop {
            let headers = self.headers("application/json, text/event-stream", true);
            let left = deadline.saturating_duration_since(Instant::now());
            let (resp, sent) = self
                .send_authorized("POST", &headers, &routing, &body, &token, left)
                .map_err(|e| self.failed(shared, e))?;
            let challenge = resp.header("www-authenticate").and_then(Challenge::parse);
            match (resp.status, challenge) {
                (401, Some(c)) if authorizations < MAX_AUTHORIZATIONS => {
                    drop(resp);
                    authorizations += 1;
                    self.oauth
                        .unauthorized(&c, sent.as_deref(), &token)
                        .map_err(|why| self.unauthorized(why, &token, shared))?;
                    continue;
                }
                (403, Some(c))
                    if c.error.as_deref() == Some("insufficient_scope")
                        && authorizations < MAX_AUTHORIZATIONS =>
                {
                    drop(resp);
                    authorizations += 1;
                    self.oauth
                        .insufficient_scope(&c, sent.as_deref(), &token)
                        .map_err(|why| self.unauthorized(why, &token, shared))?;
                    continue;
                }
                (401 | 403, _) if authorizations > 0 => {
                    return Err(RpcError::Unauthorized(format!(
                        "the server still refuses after {authorizations} authorization(s) \
                         (HTTP {})",
                        resp.status
                    )));
                }
                _ => {}
            }
            match resp.status {
                404 if !renewed && !initialize && self.session.lock().is_some() => {
                    drop(resp);
                    renewed = true;
                    self.new_session(shared, &token, deadline)?;
                }
                // Many servers (those built on the SDKs' examples) say 400 and "No valid
                // session ID" where the spec says 404: the same loss of the session.
                400 if !renewed && !initialize && self.session.lock().is_some() => {
                    let mut resp = resp;
                    let said = read_bounded(&mut resp, self.max_bytes).unwrap_or_default();
                    if !String::from_utf8_lossy(&said)
                        .to_ascii_lowercase()
                        .contains("session")
                    {
                        return Err(refusal(400, &said));
                    }
                    renewed = true;
                    self.new_session(shared, &token, deadline)?;
                }
                429 | 503 if busy < BUSY_RETRIES => {
                    let wait = busy_delay(resp.header("retry-after"), busy);
                    let status = resp.status;
                    drop(resp);
                    busy += 1;
                    let Some(wait) = wait.filter(|w| Instant::now() + *w < deadline) else {
                        return Err(RpcError::Http {
                            status,
                            message: "the server is busy, and asks for a wait longer than \
                                      the call has left"
                                .into(),
                        });
                    };
                    if wait_unless(&token, wait) {
                        return Err(self.cancelled(shared));
                    }
                }
                _ => break resp,
            }
        };
        if initialize {
            if let Some(s) = response.header("mcp-session-id") {
                *self.session.lock() = Some(s.to_owned());
            }
        }
        if let Some(id) = request_id.filter(|_| is_stream(&response)) {
            self.streams.lock().insert(id, token.clone());
            return self.follow_in_background(shared, response, id, token, hooks);
        }
        drop(hooks);
        // Streamable HTTP answers a request with JSON or a stream: none is coming on this one.
        if request_id.is_some() && matches!(response.status, 202 | 204) {
            return Err(RpcError::Http {
                status: response.status,
                message: "the server accepted the request without answering it".into(),
            });
        }
        self.take_answer(shared, response)
    }

    /// An authorization that failed: a cancel, or why no token could be had.
    fn unauthorized(&self, why: String, token: &CancelToken, shared: &Shared) -> RpcError {
        if token.is_cancelled() {
            return self.cancelled(shared);
        }
        RpcError::Unauthorized(why)
    }

    /// What a request's failure to get an answer head means: a cancel, a timeout, or a
    /// connection that no longer works (ended: the next use connects again).
    fn failed(&self, shared: &Shared, e: HttpError) -> RpcError {
        match e {
            HttpError::Cancelled => self.cancelled(shared),
            HttpError::Timeout { .. } => RpcError::TimedOut,
            HttpError::ConnectionRefused { detail, .. } | HttpError::Transport { detail, .. } => {
                let why = format!("it could not be reached: {detail}");
                shared.end(why.clone());
                RpcError::Gone(why)
            }
        }
    }

    fn cancelled(&self, shared: &Shared) -> RpcError {
        if self.closing.is_cancelled() {
            RpcError::Gone(shared.why_ended())
        } else {
            RpcError::Cancelled
        }
    }

    /// A non-stream answer: 202/204 (nothing to read), a JSON body (handed on), or an HTTP
    /// refusal.
    fn take_answer(&self, shared: &Arc<Shared>, mut response: Response) -> Result<(), RpcError> {
        let status = response.status;
        if status == 202 || status == 204 {
            return Ok(());
        }
        if (200..300).contains(&status) && is_stream(&response) {
            // A stream answering a notification or a response: what it carries is handed on.
            let mut events = Events::new(BufReader::new(response), self.max_bytes);
            while let Ok(Some(e)) = events.next_event() {
                shared.dispatch(e.data.as_bytes());
            }
            return Ok(());
        }
        let body = read_bounded(&mut response, self.max_bytes);
        if !(200..300).contains(&status) {
            return Err(refusal(status, &body.unwrap_or_default()));
        }
        let body = body.map_err(|e| RpcError::Http {
            status,
            message: format!("its answer could not be read: {e}"),
        })?;
        shared.dispatch(&body);
        Ok(())
    }

    /// Reads request `id`'s answer stream on a thread of its own; `hooks` link `token` to
    /// the caller's cancel and the connection's close for as long as it reads.
    fn follow_in_background(
        &self,
        shared: &Arc<Shared>,
        response: Response,
        id: u64,
        token: CancelToken,
        hooks: Vec<CancelHook>,
    ) -> Result<(), RpcError> {
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("correx-mcp-stream".into())
            .spawn(move || {
                // Kept while the stream is read: the caller's cancel or the connection's close
                // ends the read at once, not at the call's timeout.
                let _hooks = hooks;
                if let Some(remote) = s.remote() {
                    let result = remote.follow(&s, response, id, &token);
                    remote.streams.lock().remove(&id);
                    if let Err(e) = result {
                        s.settle(id, Err(e));
                    }
                }
            });
        spawned.map(|_| ()).map_err(|e| {
            self.streams.lock().remove(&id);
            RpcError::Gone(format!("no thread to read its answer: {e}"))
        })
    }

    /// Reads request `id`'s stream until its answer came, resuming it (GET with
    /// `Last-Event-ID`, after the server's `retry`) when it ends before.
    fn follow(
        &self,
        shared: &Arc<Shared>,
        response: Response,
        id: u64,
        token: &CancelToken,
    ) -> Result<(), RpcError> {
        let mut events = Events::new(BufReader::new(response), self.max_bytes);
        let mut resumes = 0;
        loop {
            while let Ok(Some(event)) = events.next_event() {
                shared.dispatch(event.data.as_bytes());
                if shared.settled(id) {
                    return Ok(());
                }
            }
            if shared.settled(id) || token.is_cancelled() {
                return Ok(());
            }
            let Some(last) = events.last_id.clone() else {
                return Err(RpcError::Gone(
                    "the server closed the answer's stream before answering, with no event id \
                     to resume it from"
                        .into(),
                ));
            };
            if resumes == MAX_RESUMES {
                return Err(RpcError::Gone(format!(
                    "the answer's stream was cut off {MAX_RESUMES} times"
                )));
            }
            resumes += 1;
            if wait_unless(token, events.retry.unwrap_or(DEFAULT_RETRY)) {
                return Ok(());
            }
            let response = self.get(Some(&last), token)?;
            if !(200..300).contains(&response.status) || !is_stream(&response) {
                return Err(RpcError::Http {
                    status: response.status,
                    message: "resuming the answer's stream was refused".into(),
                });
            }
            let retry = events.retry;
            events = Events::new(BufReader::new(response), self.max_bytes);
            events.last_id = Some(last);
            events.retry = retry;
        }
    }

    /// A GET of the endpoint's stream, resuming after `last_id` when given.
    fn get(&self, last_id: Option<&str>, token: &CancelToken) -> Result<Response, RpcError> {
        let mut headers = self.headers("text/event-stream", false);
        if let Some(id) = last_id {
            headers.push(("Last-Event-ID", id.to_owned()));
        }
        // A stream may be quiet for long: each read waits up to a day, a close ends it.
        let quiet = Duration::from_secs(86_400);
        self.send("GET", &headers, &[], token, quiet)
            .map_err(|e| match e {
                HttpError::Cancelled => RpcError::Cancelled,
                HttpError::Timeout { .. } => RpcError::TimedOut,
                other => RpcError::Gone(other.to_string()),
            })
    }

    /// Opens the GET stream and reads what the server sends on it until it ends.
    ///
    /// # Errors
    /// It could not be opened (retried later, with a backoff).
    pub fn listen(&self, shared: &Arc<Shared>) -> Result<Listened, RpcError> {
        let (token, _hooks) = self.linked(None);
        let last = self.listen_last_id.lock().clone();
        let response = self.get(last.as_deref(), &token);
        self.answered();
        let response = response?;
        match response.status {
            200..=299 if is_stream(&response) => {}
            404 | 429 | 500..=599 => {
                return Err(RpcError::Http {
                    status: response.status,
                    message: "the GET stream was refused".into(),
                })
            }
            _ => return Ok(Listened::Unsupported),
        }
        let mut events = Events::new(BufReader::new(response), self.max_bytes);
        events.last_id = last;
        while let Ok(Some(event)) = events.next_event() {
            shared.dispatch(event.data.as_bytes());
            *self.listen_last_id.lock() = events.last_id.clone();
        }
        Ok(Listened::Ended(events.retry.unwrap_or(DEFAULT_RETRY)))
    }

    /// A new session in place of one the server no longer knows: `initialize` as first sent,
    /// its answer read here, then `notifications/initialized`.
    fn new_session(
        &self,
        shared: &Arc<Shared>,
        token: &CancelToken,
        deadline: Instant,
    ) -> Result<(), RpcError> {
        let params = self.init.lock().clone().ok_or_else(|| {
            RpcError::Gone("the server forgot the session and no initialize is known".into())
        })?;
        *self.session.lock() = None;
        *self.protocol.lock() = None;
        let id = shared.next_id();
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params});
        let body = serde_json::to_vec(&message).unwrap_or_default();
        let headers = self.headers("application/json, text/event-stream", true);
        let left = deadline.saturating_duration_since(Instant::now());
        let mut response = self
            .send("POST", &headers, &body, token, left)
            .map_err(|e| self.failed(shared, e))?;
        if !(200..300).contains(&response.status) {
            let body = read_bounded(&mut response, self.max_bytes).unwrap_or_default();
            return Err(refusal(response.status, &body));
        }
        let session = response.header("mcp-session-id").map(str::to_owned);
        let answer = self.answer_of(shared, response, id)?;
        let version = answer["protocolVersion"].as_str().unwrap_or_default();
        if !PROTOCOL_VERSIONS.contains(&version) {
            return Err(RpcError::Gone(format!(
                "its new session speaks protocol revision {version:?}"
            )));
        }
        *self.session.lock() = session;
        *self.protocol.lock() = Some(version.to_owned());
        log::info!(
            "mcp server {}: the server no longer knew its session; a new one was made",
            shared.name()
        );
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let headers = self.headers("application/json, text/event-stream", true);
        let body = serde_json::to_vec(&note).unwrap_or_default();
        let response = self
            .send("POST", &headers, &body, token, SHORT)
            .map_err(|e| self.failed(shared, e))?;
        drop(response);
        Ok(())
    }

    /// The result answering request `id` in `response` (JSON or a stream), read here; other
    /// messages on the way are handed to `shared`.
    fn answer_of(
        &self,
        shared: &Arc<Shared>,
        response: Response,
        id: u64,
    ) -> Result<Value, RpcError> {
        let mut found = None;
        let mut take = |m: Map<String, Value>| {
            if m.get("id").and_then(Value::as_u64) == Some(id)
                && (m.contains_key("result") || m.contains_key("error"))
            {
                found = Some(match m.get("result") {
                    Some(r) => Ok(r.clone()),
                    None => Err(RpcError::Server {
                        code: m["error"]["code"].as_i64().unwrap_or(0),
                        message: m["error"]["message"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    }),
                });
                true
            } else {
                shared.dispatch(Value::Object(m).to_string().as_bytes());
                false
            }
        };
        if is_stream(&response) {
            let mut events = Events::new(BufReader::new(response), self.max_bytes);
            while let Ok(Some(e)) = events.next_event() {
                if let Ok(Value::Object(m)) = serde_json::from_str(&e.data) {
                    if take(m) {
                        break;
                    }
                }
            }
        } else {
            let mut response = response;
            let body = read_bounded(&mut response, self.max_bytes).unwrap_or_default();
            let messages = match serde_json::from_slice(&body) {
                Ok(Value::Array(a)) => a,
                Ok(one) => vec![one],
                Err(_) => Vec::new(),
            };
            for m in messages {
                if let Value::Object(m) = m {
                    if take(m) {
                        break;
                    }
                }
            }
        }
        found.unwrap_or_else(|| {
            Err(RpcError::Gone(
                "the server did not answer the new session's initialize".into(),
            ))
        })
    }

    /// Tells the server the session is over (DELETE), when there is one; a server that does
    /// not allow it (405) is fine.
    pub fn end_session(&self) {
        if self.session.lock().is_none() {
            return;
        }
        let headers = self.headers("application/json, text/event-stream", false);
        let _ = self.send(
            "DELETE",
            &headers,
            &[],
            &CancelToken::new(),
            SHORT.min(STOP),
        );
    }
}

/// How long the session's DELETE may take when a server stops.
const STOP: Duration = Duration::from_secs(2);

fn is_stream(r: &Response) -> bool {
    r.content_type.starts_with("text/event-stream")
}

/// Sleeps `d` unless `token` is cancelled first; whether it was.
fn wait_unless(token: &CancelToken, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if token.is_cancelled() {
            return true;
        }
        let left = end.saturating_duration_since(Instant::now());
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
    token.is_cancelled()
}

/// The wait before the `busy`-th retry of a 429 or 503: the server's `Retry-After` in
/// seconds (`None` past [`MAX_RETRY_AFTER`]: the call fails instead), else 250 ms doubling,
/// with up to half again of jitter, so clients turned away together do not come back
/// together.
fn busy_delay(retry_after: Option<&str>, busy: u32) -> Option<Duration> {
    if let Some(secs) = retry_after.and_then(|v| v.trim().parse::<u64>().ok()) {
        let asked = Duration::from_secs(secs);
        return (asked <= MAX_RETRY_AFTER).then_some(asked);
    }
    let base = Duration::from_millis(250u64 << busy.min(6));
    let jitter = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(busy);
        h.finish() % 500
    };
    Some(base + base * jitter as u32 / 1000)
}

fn read_bounded(r: &mut Response, max: usize) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    r.take(max as u64 + 1).read_to_end(&mut body)?;
    if body.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("an answer longer than {max} bytes"),
        ));
    }
    Ok(body)
}

/// An HTTP refusal, with what the server said (cut short).
fn refusal(status: u16, body: &[u8]) -> RpcError {
    let said = crate::text::bounded(String::from_utf8_lossy(body).trim().to_owned());
    let message = match status {
        401 | 403 => format!(
            "the server refuses the request without asking for OAuth (no Bearer \
             challenge){}",
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        ),
        _ if said.is_empty() => "no reason given".to_owned(),
        _ => said,
    };
    RpcError::Http { status, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_delays_honour_retry_after_and_back_off_with_jitter() {
        assert_eq!(busy_delay(Some("2"), 0), Some(Duration::from_secs(2)));
        assert_eq!(busy_delay(Some("3600"), 0), None);
        for busy in 0..3 {
            let base = Duration::from_millis(250 << busy);
            let d = busy_delay(None, busy).expect("a delay");
            assert!(d >= base && d < base * 3 / 2, "{busy}: {d:?}");
            // An HTTP date is not read: the backoff stands.
            let d = busy_delay(Some("Wed, 21 Oct 2015 07:28:00 GMT"), busy).expect("a delay");
            assert!(d >= base && d < base * 3 / 2, "{busy}: {d:?}");
        }
    }
}
