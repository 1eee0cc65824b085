//! The runtime's configuration: a JSON object whose sections belong to the components that
//! read them (`tools`: the tool table's sections; `models`: [`ManagerOptions`]; `approvals`:
//! [`ApprovalsConfig`]). The spec's defaults hold: every tool disabled, empty allowlists deny
//! everything. Errors name the field by its whole path.

use crate::approvals::ApprovalsConfig;
use crate::events::{Durability, SealConfig};
use crate::inference::ManagerOptions;
use crate::observe::otlp::OtlpConfig;
use crate::services::mcp::McpServers;
use crate::settings::{self, ConfigError};
use crate::tools::{ToolConfig, BUILTIN_TOOLS};
use serde::Deserialize;
use serde_json::Value;
use std::path::PathBuf;

/// The config format version this build reads.
pub const CONFIG_VERSION: u64 = 1;

/// Everything a [`crate::Runtime`] needs.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The event log file.
    pub event_log: PathBuf,
    /// Durability of the log; default full.
    pub durability: Durability,
    /// Where sandbox working directories go; default [`crate::default_work_root`].
    pub sandbox_root: Option<PathBuf>,
    /// Tools.
    pub tools: ToolConfig,
    /// Models.
    pub models: ManagerOptions,
    /// Approvals.
    pub approvals: ApprovalsConfig,
    /// MCP servers whose tools join the registry (config `mcp_servers`).
    pub mcp_servers: McpServers,
    /// Seals of the log written to a file while the runtime lives (config `seal`).
    pub seal: SealConfig,
    /// The log exported live as OpenTelemetry traces (config `otlp`).
    pub otlp: OtlpConfig,
}

/// The top level as written, before the sections are checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    event_log: PathBuf,
    #[serde(default)]
    durability: Durability,
    sandbox_root: Option<PathBuf>,
    tools: Option<Value>,
    models: Option<Value>,
    approvals: Option<Value>,
    mcp_servers: Option<Value>,
    seal: Option<Value>,
    otlp: Option<Value>,
}

impl RuntimeConfig {
    /// A config with the log at `event_log` and every default.
    pub fn new(event_log: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            event_log: event_log.into(),
            durability: Durability::Full,
            sandbox_root: None,
            tools: ToolConfig::default(),
            models: ManagerOptions::default(),
            approvals: ApprovalsConfig::default(),
            mcp_servers: McpServers::default(),
            seal: SealConfig::default(),
            otlp: OtlpConfig::default(),
        }
    }

    /// Parses a config JSON object: `{"v": 1, "event_log": "...", "durability": "full",
    /// "sandbox_root": "...", "tools": {...}, "models": {...}, "approvals": {...}}`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field (`json` when the text is not JSON).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new("json", e.to_string()))?;
        let Value::Object(mut top) = v else {
            return Err(ConfigError::new(
                "",
                format!("must be an object, got {}", crate::tools::json_kind(&v)),
            ));
        };
        match top.remove("v") {
            Some(Value::Number(n)) if n.as_u64() == Some(CONFIG_VERSION) => {}
            None | Some(Value::Null) => {
                return Err(ConfigError::new(
                    "v",
                    format!("missing; set \"v\": {CONFIG_VERSION}"),
                ))
            }
            Some(other) => {
                return Err(ConfigError::new(
                    "v",
                    format!("version {other} is not supported; this build reads {CONFIG_VERSION}"),
                ))
            }
        }
        let d: Document = crate::strict_json::config_from_value(Value::Object(top))?;
        settings::non_empty("event_log", &d.event_log)?;
        if let Some(root) = &d.sandbox_root {
            settings::non_empty("sandbox_root", root)?;
        }
        Ok(RuntimeConfig {
            event_log: d.event_log,
            durability: d.durability,
            sandbox_root: d.sandbox_root,
            tools: ToolConfig::read(BUILTIN_TOOLS, d.tools).map_err(|e| e.under("tools"))?,
            models: settings::read("models", d.models)?,
            approvals: settings::read("approvals", d.approvals)?,
            mcp_servers: settings::read("mcp_servers", d.mcp_servers)?,
            seal: settings::read("seal", d.seal)?,
            otlp: settings::read("otlp", d.otlp)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confine::RunAs;
    use crate::inference::ServerIsolation;
    use crate::tools::{ShellOptions, ShellTool};
    use std::time::Duration;

    fn shell(c: &RuntimeConfig) -> &ShellOptions {
        c.tools.get::<ShellTool>().expect("the shell has a row")
    }

    /// A config built in Rust gets the JSON reader's checks too, with the same message, and
    /// fails before the runtime opens or records anything; a shell built in Rust likewise.
    #[test]
    fn settings_built_in_rust_are_checked_as_a_config_is() {
        let dir = std::env::temp_dir().join(format!("correx-unit-rust-cfg-{}", std::process::id()));
        let log = dir.join("events.db");
        let mut config = RuntimeConfig::new(&log);
        config.models.max_loaded = 0;
        let e =
            crate::runtime::Runtime::new(&config, std::sync::Arc::new(crate::approvals::DenyAll))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
        assert_eq!(e, "config field models.max_loaded: must be greater than 0");
        assert!(
            !log.exists(),
            "the log was opened before the config was refused"
        );
        let shell = ShellTool::new(ShellOptions {
            timeout: Duration::ZERO,
            ..ShellOptions::default()
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert_eq!(shell, "config field timeout_ms: must be greater than 0");
    }

    #[test]
    fn the_scheduler_fields_parse_and_bad_values_are_named() {
        let c = RuntimeConfig::from_json(
            r#"{"v": 1, "event_log": "/tmp/e.db", "models": {"port": 20000, "port_count": 4,
                "max_loaded": 2, "memory_budget_mb": 4096, "max_queued": 0,
                "liveness_interval_ms": 250}}"#,
        )
        .expect("valid config");
        let m = &c.models;
        assert_eq!(
            (
                m.port,
                m.port_count,
                m.max_loaded,
                m.memory_budget,
                m.max_queued
            ),
            (20000, 4, 2, Some(4096 << 20), 0)
        );
        assert_eq!(m.liveness_interval, Duration::from_millis(250));
        for (field, bad) in [
            ("max_loaded", "0"),
            ("port_count", "70000"),
            ("memory_budget_mb", "-1"),
            ("liveness_interval_ms", "0"),
        ] {
            let text =
                format!(r#"{{"v": 1, "event_log": "/e.db", "models": {{"{field}": {bad}}}}}"#);
            let e = RuntimeConfig::from_json(&text)
                .expect_err(field)
                .to_string();
            assert!(e.contains(&format!("models.{field}")), "{e}");
        }
    }

    #[test]
    fn isolation_settings_parse_and_bad_values_are_named() {
        let c = RuntimeConfig::from_json(
            r#"{"v": 1, "event_log": "/e.db", "models": {"isolation": "best_effort"},
                "tools": {"shell": {"isolation": {"run_as": {"uid": 1000, "gid": 1001}}}}}"#,
        )
        .expect("valid config");
        assert_eq!(c.models.isolation, ServerIsolation::BestEffort);
        assert_eq!(
            shell(&c).isolation.run_as,
            RunAs::Unprivileged {
                uid: 1000,
                gid: 1001
            }
        );
        let host = RuntimeConfig::from_json(
            r#"{"v": 1, "event_log": "/e.db", "tools": {"shell": {"isolation": {"run_as": "host"}}}}"#,
        )
        .expect("valid config");
        assert_eq!(shell(&host).isolation.run_as, RunAs::Host);
        for (json, field) in [
            (r#""models": {"isolation": "strict"}"#, "models.isolation"),
            (
                r#""tools": {"shell": {"isolation": {"run_as": "root"}}}"#,
                "tools.shell.isolation.run_as",
            ),
            (
                r#""tools": {"shell": {"isolation": {"run_as": [65534, 65534]}}}"#,
                "tools.shell.isolation.run_as",
            ),
            (
                r#""tools": {"shell": {"isolation": {"run_as": {"uid": 0, "gid": 0}}}}"#,
                "tools.shell.isolation.run_as.uid",
            ),
            (
                r#""tools": {"shell": {"isolation": {"run_as": {"uid": 5}}}}"#,
                "tools.shell.isolation.run_as.gid",
            ),
            (
                r#""tools": {"shell": {"timeout_ms": 18446744073709551615}}"#,
                "tools.shell.timeout_ms",
            ),
        ] {
            let text = format!(r#"{{"v": 1, "event_log": "/e.db", {json}}}"#);
            let e = RuntimeConfig::from_json(&text).expect_err(json).to_string();
            assert!(e.contains(field), "{json}: {e}");
        }
    }
}
