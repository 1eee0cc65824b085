//! MCP servers as tools: each configured server (config `mcp_servers`) is a long-lived,
//! confined run of its command spoken to over stdio, or a remote server spoken to over
//! Streamable HTTP within its network policy (JSON-RPC 2.0, the stateless protocol revision
//! [`STATELESS_PROTOCOL_VERSION`] or one of [`PROTOCOL_VERSIONS`]); its tools join the registry as `<server>.<tool>` and every call is a
//! sandboxed run like a built-in's: validated against the tool's `inputSchema` before
//! approval, gated by its tier, recorded, cancellable.

mod config;
mod connection;
mod discover;
mod host_requests;
mod input_required;
mod oauth;
mod pattern;
mod pins;
mod remote;
mod routing;
mod schema;
mod server;
mod sse;

pub use config::{McpServerConfig, McpServers, McpStart, McpToolChange, McpToolSettings};
pub use discover::STATELESS_PROTOCOL_VERSION;
pub use host_requests::{McpClientMethod, McpRefusal, McpRequestHandler, McpServerRequest};
pub use oauth::{McpAuthorizer, McpOAuthConfig};
pub use pins::{pin_held_tools, PINS_STREAM};
pub use server::{MCP_STREAM, PROTOCOL_VERSIONS};

use crate::cancel::CancelToken;
use crate::events::EventStore;
use crate::tools::Recoverable;
use crate::tools::{
    ShellOptions, ShellTool, Tier, Tool, ToolCapability, ToolDescription, ToolError, ToolErrorKind,
    ToolRequest, ToolResult, ToolSource, ValidationResult,
};
use connection::RpcError;
use serde_json::{json, Value};
use server::{McpServer, ToolDef};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The configured MCP servers of a runtime. Dropped (the runtime closes), every server is
/// stopped.
pub struct McpHub {
    servers: BTreeMap<String, Arc<McpServer>>,
    handlers: host_requests::HandlerSlot,
    authorizer: oauth::AuthorizerSlot,
    events: Arc<dyn EventStore>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.servers.keys()).finish()
    }
}

impl ToolSource for McpHub {
    fn resolve(&self, name: &str) -> Option<Arc<dyn Tool>> {
        McpHub::resolve(self, name)
    }

    fn describe(&self) -> Vec<ToolDescription> {
        McpHub::describe(self)
    }

    fn prefixes(&self) -> Vec<&str> {
        self.names()
    }
}

impl McpHub {
    /// The servers of `config`, none started yet; each is confined as its `isolation` says
    /// (built now: a kernel that cannot meet `required` fails here, naming the server).
    ///
    /// # Errors
    /// The server whose confinement or command cannot be set up, and why.
    pub fn new(
        config: &McpServers,
        events: Arc<dyn EventStore>,
    ) -> Result<McpHub, (String, ToolError)> {
        let mut servers = BTreeMap::new();
        let handlers = host_requests::HandlerSlot::default();
        let authorizer = oauth::AuthorizerSlot::default();
        let pins = Arc::new(pins::Pins::new(events.clone()));
        for (name, c) in &config.0 {
            let reach = match &c.url {
                Some(url) => server::Reach::Remote(
                    remote::RemoteSpec::new(name, c, url, events.clone(), authorizer.clone())
                        .map_err(|reason| {
                            (
                                name.clone(),
                                ToolError::InvalidSetting {
                                    field: "url",
                                    reason,
                                },
                            )
                        })?,
                ),
                None => server::Reach::Command(Box::new(Self::launcher(name, c)?)),
            };
            servers.insert(
                name.clone(),
                Arc::new(McpServer::new(
                    name.clone(),
                    c.clone(),
                    reach,
                    events.clone(),
                    handlers.clone(),
                    pins.clone(),
                )),
            );
        }
        Ok(McpHub {
            servers,
            handlers,
            authorizer,
            events,
        })
    }

    /// The confined launcher of a server correx runs.
    fn launcher(name: &str, c: &McpServerConfig) -> Result<ShellTool, (String, ToolError)> {
        {
            let launcher = ShellTool::new(ShellOptions {
                allowed_executables: vec![c.command[0].clone()],
                env: c.env.clone(),
                working_roots: c.working_dirs.clone(),
                isolation: c.isolation.clone(),
                timeout: crate::tools::MAX_TIMEOUT,
                ..ShellOptions::default()
            })
            .map_err(|e| (name.to_owned(), e))?;
            // A kernel that cannot confine it as required: its start fails, saying why (its
            // tools are listed as one disabled entry), as a shell's runs are refused.
            if let Some(why) = launcher.refusal() {
                log::warn!("mcp server {name}: it cannot be started: {why}");
            }
            Ok(launcher)
        }
    }

    /// Registers the host's handler of the requests servers send their client (sampling,
    /// elicitation), replacing any earlier one; `None` removes it (those requests are then
    /// refused, as in a new runtime). Servers learn what this client answers when they start
    /// (`initialize` declares it), so a running server whose declaration no longer matches is
    /// restarted before its next use, once no call of it is in progress (recorded as a stop
    /// and a start): register it before the first call, so that only servers started when
    /// the runtime opened (`start: "open"`) start twice.
    pub fn set_request_handler(&self, handler: Option<Arc<dyn McpRequestHandler>>) {
        self.handlers.set(handler);
    }

    /// Registers the host's authorizer, which shows the user an authorization server's page
    /// when a remote server asks for OAuth (replacing any earlier one; `None` removes it, and
    /// such a server's calls then fail saying so). Tokens already held are used without it.
    pub fn set_authorizer(&self, authorizer: Option<Arc<dyn McpAuthorizer>>) {
        self.authorizer.set(authorizer);
    }

    /// Starts the servers configured `start: "open"`.
    ///
    /// # Errors
    /// The first that could not start, and why.
    pub fn start_eager(&self) -> Result<(), (String, String)> {
        for (name, s) in &self.servers {
            if s.config.start == McpStart::Open {
                s.tools().map_err(|e| (name.clone(), e))?;
            }
        }
        Ok(())
    }

    /// The tool named `<server>.<tool>`, starting its server if needed.
    pub fn resolve(&self, name: &str) -> Option<Arc<dyn Tool>> {
        let (server, tool) = name.split_once('.')?;
        let s = self.servers.get(server)?;
        match s.tool(tool) {
            Ok(def) => Some(McpTool::offered(s, def?, name)),
            // Its server is not running: a request for it is refused with why.
            Err(why) => Some(Arc::new(Unavailable {
                name: name.to_owned(),
                tier: s.config.tier_of(tool),
                why,
            })),
        }
    }

    /// Every server's tools, starting the servers; a server that cannot start is listed as
    /// one disabled entry saying why.
    pub fn describe(&self) -> Vec<ToolDescription> {
        let mut out = Vec::new();
        for (name, s) in &self.servers {
            match s.tools() {
                Ok(tools) => out.extend(tools.into_iter().map(|def| {
                    let full_name = format!("{name}.{}", def.name);
                    let tier = s.config.tier_of(&def.name);
                    // A held tool's description is not shown (a changed one is what a rug
                    // pull changes): why it is held is.
                    let (description, enabled) = match still_held(s, &def) {
                        Ok(None) => (def.description.clone(), true),
                        Ok(Some(h)) => (h.reason(&full_name), h.action == McpToolChange::Ask),
                        Err(why) => (why, false),
                    };
                    ToolDescription {
                        name: full_name,
                        tier,
                        description,
                        operations: Vec::new(),
                        parameters: def.input_schema.clone(),
                        enabled,
                    }
                })),
                Err(e) => out.push(ToolDescription {
                    name: format!("{name}.*"),
                    tier: Tier::from_i32(s.config.tier),
                    description: e,
                    operations: Vec::new(),
                    parameters: json!({"type": "object"}),
                    enabled: false,
                }),
            }
        }
        out
    }

    /// Pins the definitions held of `server` (each tool whose listing changed since it was
    /// pinned, or that was added after; only `tools` of them when it names any): recorded in
    /// [`PINS_STREAM`] as pinned by the `host`, and used from the tool's next call. What was
    /// pinned (tool and digest); empty when nothing is held.
    ///
    /// # Errors
    /// The log could not be read or written.
    pub fn pin_tools(
        &self,
        server: &str,
        tools: &[&str],
    ) -> crate::events::Result<BTreeMap<String, String>> {
        pins::pin_held_tools(self.events.as_ref(), server, tools)
    }

    /// The servers' names.
    pub fn names(&self) -> Vec<&str> {
        self.servers.keys().map(String::as_str).collect()
    }

    /// Stops every server, together: each one's stdin closed, 2 s for all of them to exit,
    /// then every process left killed. None starts again.
    pub fn shutdown(&self) {
        let live: Vec<_> = self
            .servers
            .values()
            .filter_map(|s| s.begin_shutdown())
            .collect();
        server::finish_stop(live, std::time::Instant::now() + server::STOP_GRACE);
        // The host's handlers were told (their servers ended); once they returned, the
        // handler is released here, so a host may free what it uses when this returns.
        for s in self.servers.values() {
            s.wait_retired();
        }
        self.handlers.set(None);
    }
}

impl Drop for McpHub {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A tool of a server that is not running: every request for it is invalid, saying why.
struct Unavailable {
    name: String,
    tier: Tier,
    why: String,
}

impl Tool for Unavailable {
    fn name(&self) -> &str {
        &self.name
    }

    fn tier(&self) -> Tier {
        self.tier
    }

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[]
    }

    fn validate_request(&self, _: &ToolRequest) -> ValidationResult {
        ValidationResult::Invalid {
            reason: self.why.clone(),
        }
    }

    fn execute(&self, r: &ToolRequest) -> ToolResult {
        ToolResult::failure_of(
            &r.invocation_id,
            ToolErrorKind::InvalidRequest,
            self.why.clone(),
            Recoverable::Yes,
        )
    }
}

/// How `def` is held now: none once it is pinned as listed (the log read again, as the host
/// or another process may have pinned it since it was held).
fn still_held(server: &McpServer, def: &ToolDef) -> Result<Option<pins::Held>, String> {
    let Some(held) = &def.held else {
        return Ok(None);
    };
    let pinned = server.pins.pinned(&server.name, &def.name, &def.digest);
    match pinned {
        Ok(true) => Ok(None),
        Ok(false) => Ok(Some(held.clone())),
        Err(e) => Err(format!("mcp server {}: {e}", server.name)),
    }
}

/// One tool of one server, as the registry offers it.
struct McpTool {
    server: Arc<McpServer>,
    def: Arc<ToolDef>,
    full_name: String,
    tier: Tier,
    /// Not the definition pinned, and `on_tool_change: "ask"`: a person decides each call,
    /// and the first approved pins it.
    held: Option<pins::Held>,
}

impl McpTool {
    /// The tool `name` as offered: a held one under `refuse` (or one whose pins cannot be
    /// read) refuses every request, saying why.
    fn offered(server: &Arc<McpServer>, def: Arc<ToolDef>, name: &str) -> Arc<dyn Tool> {
        let tier = server.config.tier_of(&def.name);
        let held = match still_held(server, &def) {
            Ok(h) => h,
            Err(why) => {
                return Arc::new(Unavailable {
                    name: name.to_owned(),
                    tier,
                    why,
                })
            }
        };
        if let Some(h) = held.as_ref().filter(|h| h.action != McpToolChange::Ask) {
            return Arc::new(Unavailable {
                name: name.to_owned(),
                tier,
                why: h.reason(name),
            });
        }
        Arc::new(McpTool {
            full_name: name.to_owned(),
            tier,
            server: server.clone(),
            def,
            held,
        })
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.full_name
    }

    fn tier(&self) -> Tier {
        self.tier
    }

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[]
    }

    fn description(&self) -> &str {
        &self.def.description
    }

    fn approval_notice(&self) -> Option<String> {
        self.held.as_ref().map(|h| h.reason(&self.full_name))
    }

    fn parameters(&self) -> Value {
        self.def.input_schema.clone()
    }

    fn validate_request(&self, r: &ToolRequest) -> ValidationResult {
        match schema::check(&self.def.input_schema, &Value::Object(r.parameters.clone())) {
            Ok(()) => ValidationResult::Valid,
            Err(reason) => ValidationResult::Invalid { reason },
        }
    }

    fn execute(&self, r: &ToolRequest) -> ToolResult {
        self.execute_cancellable(r, &CancelToken::new())
    }

    fn execute_cancellable(&self, r: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        let id = &r.invocation_id;
        // Held, and a person approved this call: its definition is pinned before it is sent.
        if let Some(h) = &self.held {
            let tools = BTreeMap::from([(self.def.name.clone(), h.listed.clone())]);
            let pinned =
                self.server
                    .pins
                    .pin(&self.server.name, tools, "approval", Some(id.to_string()));
            if let Err(e) = pinned {
                return ToolResult::failure_of(
                    id,
                    ToolErrorKind::Io,
                    format!(
                        "{}: its new definition cannot be pinned: {e}",
                        self.full_name
                    ),
                    Recoverable::Yes,
                );
            }
        }
        let (answer, progress) = match self.server.call(
            &self.def.name,
            r.parameters.clone(),
            (r.session_id.as_str(), id.as_str()),
            cancel,
        ) {
            Ok(a) => a,
            Err(e) => {
                let (kind, recoverable) = match e {
                    RpcError::Cancelled => (ToolErrorKind::Cancelled, false),
                    RpcError::TimedOut => (ToolErrorKind::TimedOut, true),
                    RpcError::Server { .. } => (ToolErrorKind::InvalidRequest, false),
                    RpcError::Gone(_) => (ToolErrorKind::Io, true),
                    RpcError::Http { status, .. } if status >= 500 || status == 429 => {
                        (ToolErrorKind::Io, true)
                    }
                    RpcError::Http { .. } => (ToolErrorKind::InvalidRequest, false),
                    RpcError::Unauthorized(_) => (ToolErrorKind::NotAllowed, false),
                };
                return ToolResult::failure_of(
                    id,
                    kind,
                    format!("{}: {e}", self.full_name),
                    Recoverable::from(recoverable),
                );
            }
        };
        let content = answer.get("content").cloned().unwrap_or_else(|| json!([]));
        let text: Vec<&str> = content
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["type"] == "text")
            .filter_map(|c| c["text"].as_str())
            .collect();
        let mut data = json!({"server": self.server.name, "tool": self.def.name, "content": content,
                              "backup": "none"});
        if let Some(s) = answer.get("structuredContent") {
            data["structuredContent"] = s.clone();
        }
        if !progress.is_empty() {
            data["progress"] = Value::Array(progress);
        }
        let output = text.join("\n");
        // A tool that declares an output schema must give structured content matching it
        // (unless it reports an error): a result that contradicts it is not passed on as one.
        if let (Some(schema), false) = (&self.def.output_schema, answer["isError"] == true) {
            let checked = match answer.get("structuredContent") {
                Some(content) => schema::check(schema, content),
                None => Err("it gave no structuredContent".to_owned()),
            };
            if let Err(why) = checked {
                return ToolResult::failure_of(
                    id,
                    ToolErrorKind::Other,
                    format!(
                        "{}: its result does not match the tool's outputSchema: {why}",
                        self.full_name
                    ),
                    Recoverable::No,
                )
                .with_data(data);
            }
        }
        if answer["isError"] == true {
            let reason = if output.is_empty() {
                format!("{} reported an error", self.full_name)
            } else {
                output
            };
            return ToolResult::failure_of(id, ToolErrorKind::Other, reason, Recoverable::No)
                .with_data(data);
        }
        ToolResult::Success {
            invocation_id: id.clone(),
            output,
            metadata: BTreeMap::from([("server".to_owned(), self.server.name.clone())]),
            data: Some(data),
        }
    }
}
