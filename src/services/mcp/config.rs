//! [`McpServers`]: the config section `mcp_servers`, a server per name.

use super::connection::CallTime;
use super::oauth::McpOAuthConfig;
use crate::confine::{Allowlist, IsolationOptions};
use crate::settings::{self, ConfigError, Section};
use crate::tools::Tier;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// When a server starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpStart {
    /// When one of its tools is first listed or called.
    #[default]
    Lazy,
    /// When the runtime opens (a server that cannot start fails the open).
    Open,
}

/// What a call of a tool gets whose definition is not the one pinned (changed since the
/// server's tools were pinned, or added after): `on_tool_change`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpToolChange {
    /// Refused, saying why, until the host pins the new definition (default).
    #[default]
    Refuse,
    /// Asked of the approval engine whatever its tier (no rule's `allow`, no earlier
    /// answer and no auto-approving engine approves it); the first approval pins it.
    Ask,
}

/// One tool's settings (`mcp_servers.<name>.tools.<tool>`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolSettings {
    /// Its tier, instead of the server's.
    pub tier: Option<i32>,
}

/// One MCP server (`mcp_servers.<name>`): a program correx runs (`command`, spoken to over
/// its stdio) or a remote server (`url`, spoken to over Streamable HTTP).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program (an absolute path, or a name resolved through the fixed PATH) and its
    /// arguments.
    pub command: Vec<String>,
    /// A remote server's endpoint, `http://host[:port]/path` (instead of `command`).
    pub url: Option<String>,
    /// Where a remote server's requests may go: its own host must be allowed here by name
    /// (or address), and a name must resolve to public addresses unless `allow_private`.
    /// Default: the `url`'s host and port alone, public addresses only (an address literal
    /// in the `url` is allowed as written).
    pub network: Option<Allowlist>,
    /// How a remote server that asks for OAuth is authorized (defaults: a client
    /// registered dynamically, tokens in a 0600 file); see [`McpOAuthConfig`].
    pub oauth: Option<McpOAuthConfig>,
    /// Variables the server gets besides `PATH` and `TMPDIR`; nothing of the host's.
    pub env: BTreeMap<String, String>,
    /// Directories it may write in, the first its working directory; also its MCP roots.
    pub working_dirs: Vec<PathBuf>,
    /// How it is confined, as a shell run is (`tools.shell.isolation`'s fields); its
    /// program's directory is readable, add what else it reads to `read_paths`.
    pub isolation: IsolationOptions,
    /// Its tools' tier, 0..=3; default 2 (approval asked).
    pub tier: i32,
    /// Per tool: `{"tier": n}`.
    pub tools: BTreeMap<String, McpToolSettings>,
    /// `lazy` (default) or `open`.
    pub start: McpStart,
    /// A tool whose definition changed since it was pinned: `refuse` (default) or `ask`.
    pub on_tool_change: McpToolChange,
    /// From its start to the answer of `initialize` and its tool list; default 10 s.
    #[serde(rename = "startup_timeout_ms", with = "settings::millis")]
    pub startup_timeout: Duration,
    /// How long a call may go without its answer or a progress notification (each one it
    /// sends about the call starts this wait again); default 60 s.
    #[serde(rename = "call_timeout_ms", with = "settings::millis")]
    pub call_timeout: Duration,
    /// The longest a call lasts, whatever progress it reports (never less than
    /// `call_timeout_ms`); default 1 hour.
    #[serde(rename = "max_call_ms", with = "settings::millis")]
    pub max_call: Duration,
    /// The longest line it may write (a remote server: the longest body or event); a longer
    /// one ends it. Default 4 MiB.
    pub max_line_bytes: usize,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        McpServerConfig {
            command: Vec::new(),
            url: None,
            network: None,
            oauth: None,
            env: BTreeMap::new(),
            working_dirs: Vec::new(),
            isolation: IsolationOptions::default(),
            tier: 2,
            tools: BTreeMap::new(),
            start: McpStart::Lazy,
            on_tool_change: McpToolChange::Refuse,
            startup_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
            max_call: Duration::from_secs(3600),
            max_line_bytes: 4 << 20,
        }
    }
}

impl McpServerConfig {
    /// How long one call may take: `call_timeout_ms` without word from the server, at most
    /// `max_call_ms` in all.
    pub(crate) fn call_time(&self) -> CallTime {
        CallTime {
            idle: self.call_timeout,
            total: self.max_call.max(self.call_timeout),
        }
    }

    /// The tier of `tool`.
    pub fn tier_of(&self, tool: &str) -> Tier {
        Tier::from_i32(
            self.tools
                .get(tool)
                .and_then(|t| t.tier)
                .unwrap_or(self.tier),
        )
    }
}

impl Section for McpServerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.url {
            settings::check(
                self.command.is_empty(),
                "url",
                "a server is a command or a url, not both",
            )?;
            settings::check(
                !url.starts_with("https://"),
                "url",
                "https:// is not spoken to remote MCP servers yet (plain http:// only; \
                 put a TLS-terminating proxy you run on loopback in front of it)",
            )?;
            settings::check(
                crate::http::Endpoint::parse(url).is_some() && !url.contains(['#', ' ']),
                "url",
                "must be http://host[:port]/path",
            )?;
            if let Some(n) = &self.network {
                n.validate().map_err(|e| e.under("network"))?;
            }
            if let Some(o) = &self.oauth {
                o.validate().map_err(|e| e.under("oauth"))?;
            }
            return self.validate_common();
        }
        settings::check(
            self.oauth.is_none(),
            "oauth",
            "is a remote server's (with `url`)",
        )?;
        settings::check(
            self.network.is_none(),
            "network",
            "is a remote server's (with `url`); a command's network is `isolation.network`",
        )?;
        settings::check(
            !self.command.is_empty() && !self.command[0].is_empty(),
            "command",
            "must name the server's program: [\"/path/server\", \"arg\", ...] (or give a \
             remote server's `url`)",
        )?;
        settings::check(
            self.command.iter().all(|a| !a.contains('\0')),
            "command",
            "holds a NUL byte",
        )?;
        self.isolation
            .validate()
            .map_err(|e| e.under("isolation"))?;
        self.validate_common()
    }
}

impl McpServerConfig {
    /// What a command and a remote server have in common.
    fn validate_common(&self) -> Result<(), ConfigError> {
        settings::absolute("working_dirs", &self.working_dirs)?;
        settings::check((0..=3).contains(&self.tier), "tier", "must be 0, 1, 2 or 3")?;
        for (name, t) in &self.tools {
            if let Some(tier) = t.tier {
                settings::check(
                    (0..=3).contains(&tier),
                    &format!("tools.{name}.tier"),
                    "must be 0, 1, 2 or 3",
                )?;
            }
        }
        settings::positive_ms("startup_timeout_ms", self.startup_timeout)?;
        settings::positive_ms("call_timeout_ms", self.call_timeout)?;
        settings::check(
            self.max_call <= crate::tools::MAX_TIMEOUT,
            "max_call_ms",
            "must be at most 7 days",
        )?;
        settings::positive_ms("max_call_ms", self.max_call)?;
        settings::check(
            self.call_timeout <= crate::tools::MAX_TIMEOUT,
            "call_timeout_ms",
            "must be at most 7 days",
        )?;
        settings::positive("max_line_bytes", self.max_line_bytes as u64)
    }
}

/// The `mcp_servers` section: a server per name (letters, digits, `_` and `-`; its tools are
/// `<name>.<tool>`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct McpServers(pub BTreeMap<String, McpServerConfig>);

impl Section for McpServers {
    fn validate(&self) -> Result<(), ConfigError> {
        for (name, server) in &self.0 {
            settings::check(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                name,
                "a server's name is letters, digits, '_' and '-' (its tools are <name>.<tool>)",
            )?;
            server.validate().map_err(|e| e.under(name))?;
        }
        Ok(())
    }
}
