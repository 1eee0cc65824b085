//! The runtime's configuration, read from JSON with the spec's defaults: every tool disabled,
//! empty allowlists deny everything. Errors name the field.

use crate::approvals::{ApprovalRule, RuleAction};
use crate::events::Durability;
use crate::inference::ServerIsolation;
use crate::tools::{
    IsolationMode, IsolationOptions, ResourceLimits, RunAs, ShellOptions, DEFAULT_MAX_READ_BYTES,
};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The config format version this build reads.
pub const CONFIG_VERSION: u64 = 1;

/// A config field that is missing, mistyped or out of range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field's path, e.g. `tools.shell.timeout_ms`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config field {}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// The shell tool's settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShellConfig {
    /// Whether the tool is offered; default false.
    pub enabled: bool,
    /// The shell tool's own settings (JSON `working_dirs` is [`ShellOptions::working_roots`]).
    pub options: ShellOptions,
}

/// A file tool's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct FileToolConfig {
    /// Whether the tool is offered; default false.
    pub enabled: bool,
    /// Roots the tool may touch; default none (every path denied).
    pub allowed_paths: Vec<PathBuf>,
    /// Read cap in bytes; default 10 MiB.
    pub max_read_bytes: u64,
}

impl Default for FileToolConfig {
    fn default() -> Self {
        FileToolConfig {
            enabled: false,
            allowed_paths: Vec::new(),
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
        }
    }
}

/// Which tools a runtime offers and how they are confined.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolConfig {
    /// `shell`.
    pub shell: ShellConfig,
    /// `file_read`.
    pub file_read: FileToolConfig,
    /// `file_write`.
    pub file_write: FileToolConfig,
    /// `file_edit`.
    pub file_edit: FileToolConfig,
}

/// The model manager's settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelsConfig {
    /// llama-server; default: the installed one, else `llama-server` on the fixed PATH.
    pub server_bin: Option<PathBuf>,
    /// First port of the servers' range; default 10000.
    pub port: Option<u16>,
    /// Ports in the range; default 16.
    pub port_count: Option<u16>,
    /// Spawned models resident at once; default 1.
    pub max_loaded: Option<usize>,
    /// Memory budget of the resident servers, in MiB; default none.
    pub memory_budget_mb: Option<u64>,
    /// Loads that may wait for room at once; default 16.
    pub max_queued: Option<usize>,
    /// Interval of the servers' liveness checks; default 5 s.
    pub liveness_interval: Option<Duration>,
    /// Health deadline; default 30 s.
    pub health_timeout: Option<Duration>,
    /// Log directory; default `$XDG_DATA_HOME/correx/logs`.
    pub log_dir: Option<PathBuf>,
    /// Inference read timeout; default 300 s.
    pub read_timeout: Option<Duration>,
    /// How long a swap or unload waits for running inferences; default 120 s.
    pub drain_timeout: Option<Duration>,
    /// How spawned servers are confined: `required`, `best_effort`, `none`; default
    /// `required` where the kernel offers every layer, else `best_effort`.
    pub isolation: Option<ServerIsolation>,
}

/// Which engine decides approvals the rules leave open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineChoice {
    /// The host's engine (in C, the callback set with `correx_runtime_set_approver`).
    #[default]
    Callback,
    /// Approve tiers up to `max_tier`, deny the rest.
    Auto,
    /// Deny everything that needs approval.
    Deny,
}

/// How approvals are decided (config `approvals`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalsConfig {
    /// The engine; default the host's callback.
    pub engine: EngineChoice,
    /// For `auto`: the highest tier approved; default 2.
    pub max_tier: crate::tools::Tier,
    /// Rules checked before the engine.
    pub rules: Vec<ApprovalRule>,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            engine: EngineChoice::Callback,
            max_tier: crate::tools::Tier::T2,
            rules: Vec::new(),
        }
    }
}

fn approvals(o: Option<Obj<'_>>) -> Result<ApprovalsConfig, ConfigError> {
    let Some(o) = o else {
        return Ok(ApprovalsConfig::default());
    };
    o.only(&["engine", "max_tier", "rules"])?;
    let engine = match o.string("engine")?.as_deref() {
        None | Some("callback") => EngineChoice::Callback,
        Some("auto") => EngineChoice::Auto,
        Some("deny") => EngineChoice::Deny,
        Some(other) => {
            return Err(err(
                &o.field("engine"),
                format!("{other:?} is not \"callback\", \"auto\" or \"deny\""),
            ))
        }
    };
    let max_tier = match o.u64("max_tier")? {
        None => crate::tools::Tier::T2,
        Some(n @ 0..=3) => crate::tools::Tier::from_i32(n as i32),
        Some(n) => {
            return Err(err(
                &o.field("max_tier"),
                format!("{n} is not a tier (0-3)"),
            ))
        }
    };
    let mut rules = Vec::new();
    match o.get("rules") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let r = Obj::new(&format!("{}[{i}]", o.field("rules")), item)?;
                r.only(&["tool", "argv_prefix", "action"])?;
                let tool = r.string("tool")?.filter(|t| !t.is_empty()).ok_or_else(|| {
                    err(&r.field("tool"), "missing; name the tool the rule is about")
                })?;
                let argv_prefix = match r.get("argv_prefix") {
                    None => None,
                    Some(_) => {
                        let p = r.strings("argv_prefix")?;
                        if p.is_empty() {
                            return Err(err(
                                &r.field("argv_prefix"),
                                "must not be empty; leave it out to match every request",
                            ));
                        }
                        Some(p)
                    }
                };
                let action = match r.string("action")?.as_deref() {
                    Some("allow") => RuleAction::Allow,
                    Some("ask") => RuleAction::Ask,
                    Some("forbid") => RuleAction::Forbid,
                    Some(other) => {
                        return Err(err(
                            &r.field("action"),
                            format!("{other:?} is not \"allow\", \"ask\" or \"forbid\""),
                        ))
                    }
                    None => return Err(err(&r.field("action"), "missing: allow, ask or forbid")),
                };
                rules.push(ApprovalRule {
                    tool,
                    argv_prefix,
                    action,
                });
            }
        }
        Some(v) => {
            return Err(err(
                &o.field("rules"),
                format!("must be an array of rules, got {}", kind(v)),
            ))
        }
    }
    Ok(ApprovalsConfig {
        engine,
        max_tier,
        rules,
    })
}

/// Everything a [`crate::Runtime`] needs.
#[derive(Clone, Debug, PartialEq)]
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
    pub models: ModelsConfig,
    /// Approvals.
    pub approvals: ApprovalsConfig,
}

struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

fn kind(v: &Value) -> &'static str {
    crate::tools::json_kind(v)
}

/// A string that will become a C string (a path, an argument, an environment value) cannot hold
/// a NUL byte; refused when the config is read rather than at first use.
fn no_nul(field: &str, s: &str) -> Result<(), ConfigError> {
    match s.find('\0') {
        Some(at) => Err(err(
            field,
            format!(
                "holds a NUL byte (at byte {at}), which no path, argument or variable can carry"
            ),
        )),
        None => Ok(()),
    }
}

impl<'a> Obj<'a> {
    fn new(path: &str, v: &'a Value) -> Result<Self, ConfigError> {
        let map = v
            .as_object()
            .ok_or_else(|| err(path, format!("must be an object, got {}", kind(v))))?;
        Ok(Obj {
            path: path.to_owned(),
            map,
        })
    }

    fn field(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn only(&self, known: &[&str]) -> Result<(), ConfigError> {
        for k in self.map.keys() {
            if !known.contains(&k.as_str()) {
                return Err(err(
                    &self.field(k),
                    format!("unknown field; expected one of: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn bool(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(err(
                &self.field(name),
                format!("must be true or false, got {}", kind(v)),
            )),
        }
    }

    fn u64(&self, name: &str) -> Result<Option<u64>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                err(
                    &self.field(name),
                    format!("must be a non-negative integer, got {v}"),
                )
            }),
        }
    }

    fn positive(&self, name: &str) -> Result<Option<u64>, ConfigError> {
        match self.u64(name)? {
            Some(0) => Err(err(&self.field(name), "must be greater than 0")),
            other => Ok(other),
        }
    }

    fn string(&self, name: &str) -> Result<Option<String>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => no_nul(&self.field(name), s).map(|()| Some(s.clone())),
            Some(v) => Err(err(
                &self.field(name),
                format!("must be a string, got {}", kind(v)),
            )),
        }
    }

    fn path(&self, name: &str) -> Result<Option<PathBuf>, ConfigError> {
        match self.string(name)? {
            Some(s) if s.is_empty() => Err(err(&self.field(name), "must not be empty")),
            Some(s) => Ok(Some(PathBuf::from(s))),
            None => Ok(None),
        }
    }

    fn strings(&self, name: &str) -> Result<Vec<String>, ConfigError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let field = format!("{}[{i}]", self.field(name));
                    let s = v
                        .as_str()
                        .ok_or_else(|| err(&field, format!("must be a string, got {}", kind(v))))?;
                    no_nul(&field, s)?;
                    Ok(s.to_owned())
                })
                .collect(),
            Some(v) => Err(err(
                &self.field(name),
                format!("must be an array of strings, got {}", kind(v)),
            )),
        }
    }

    fn abs_paths(&self, name: &str) -> Result<Vec<PathBuf>, ConfigError> {
        let items = self.strings(name)?;
        items
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let p = PathBuf::from(&s);
                if p.is_absolute() {
                    Ok(p)
                } else {
                    Err(err(
                        &format!("{}[{i}]", self.field(name)),
                        format!("{s:?} must be an absolute path"),
                    ))
                }
            })
            .collect()
    }

    fn child(&self, name: &str) -> Result<Option<Obj<'a>>, ConfigError> {
        self.get(name)
            .map(|v| Obj::new(&self.field(name), v))
            .transpose()
    }
}

fn file_tool(o: Option<Obj<'_>>) -> Result<FileToolConfig, ConfigError> {
    let Some(o) = o else {
        return Ok(FileToolConfig::default());
    };
    o.only(&["enabled", "allowed_paths", "max_read_bytes"])?;
    Ok(FileToolConfig {
        enabled: o.bool("enabled", false)?,
        allowed_paths: o.abs_paths("allowed_paths")?,
        max_read_bytes: o
            .positive("max_read_bytes")?
            .unwrap_or(DEFAULT_MAX_READ_BYTES),
    })
}

fn shell(o: Option<Obj<'_>>) -> Result<ShellConfig, ConfigError> {
    let Some(o) = o else {
        return Ok(ShellConfig::default());
    };
    o.only(&[
        "enabled",
        "allowed_executables",
        "timeout_ms",
        "output_cap_bytes",
        "env",
        "force_secret_env",
        "working_dirs",
        "isolation",
    ])?;
    let d = ShellOptions::default();
    let mut env = BTreeMap::new();
    if let Some(e) = o.child("env")? {
        for (k, v) in e.map {
            let v = v
                .as_str()
                .ok_or_else(|| err(&e.field(k), format!("must be a string, got {}", kind(v))))?;
            no_nul(&e.field(k), k)?;
            no_nul(&e.field(k), v)?;
            env.insert(k.clone(), v.to_owned());
        }
    }
    Ok(ShellConfig {
        enabled: o.bool("enabled", false)?,
        options: ShellOptions {
            allowed_executables: o.strings("allowed_executables")?,
            timeout: match o.positive("timeout_ms")? {
                None => d.timeout,
                Some(ms) if u128::from(ms) <= crate::tools::MAX_TIMEOUT.as_millis() => {
                    Duration::from_millis(ms)
                }
                Some(ms) => {
                    return Err(err(
                        &o.field("timeout_ms"),
                        format!(
                            "must be at most {} (7 days), got {ms}",
                            crate::tools::MAX_TIMEOUT.as_millis()
                        ),
                    ))
                }
            },
            output_cap: o
                .positive("output_cap_bytes")?
                .map(|n| n.min(usize::MAX as u64) as usize)
                .unwrap_or(d.output_cap),
            env,
            force_secret_env: o.bool("force_secret_env", false)?,
            working_roots: o.abs_paths("working_dirs")?,
            isolation: isolation(o.child("isolation")?)?,
        },
    })
}

fn isolation(o: Option<Obj<'_>>) -> Result<IsolationOptions, ConfigError> {
    let Some(o) = o else {
        return Ok(IsolationOptions::default());
    };
    o.only(&["mode", "read_paths", "network", "limits", "run_as"])?;
    let mode = match o.string("mode")?.as_deref() {
        None | Some("required") => IsolationMode::Required,
        Some("best_effort") => IsolationMode::BestEffort,
        Some("none") => IsolationMode::None,
        Some(other) => {
            return Err(err(
                &o.field("mode"),
                format!("must be \"required\", \"best_effort\" or \"none\", got {other:?}"),
            ))
        }
    };
    let d = ResourceLimits::default();
    let limits = match o.child("limits")? {
        None => d,
        Some(l) => {
            l.only(&[
                "address_space_bytes",
                "file_size_bytes",
                "cpu_seconds",
                "open_files",
                "max_processes",
            ])?;
            ResourceLimits {
                address_space_bytes: l.positive("address_space_bytes")?.or(d.address_space_bytes),
                file_size_bytes: l.positive("file_size_bytes")?.or(d.file_size_bytes),
                cpu_seconds: l.positive("cpu_seconds")?.or(d.cpu_seconds),
                open_files: l.positive("open_files")?.or(d.open_files),
                max_processes: l.positive("max_processes")?.or(d.max_processes),
            }
        }
    };
    Ok(IsolationOptions {
        mode,
        read_paths: o.abs_paths("read_paths")?,
        network: o.bool("network", false)?,
        limits,
        run_as: run_as(&o)?,
        pretend_landlock_abi: None,
        force_subreaper: false,
    })
}

/// `run_as`: `"nobody"` (the default, 65534), `"host"`, or `{"uid": N, "gid": N}` (not 0).
fn run_as(o: &Obj<'_>) -> Result<RunAs, ConfigError> {
    let field = o.field("run_as");
    match o.get("run_as") {
        None | Some(Value::Null) => Ok(RunAs::default()),
        Some(Value::String(s)) if s == "nobody" => Ok(RunAs::default()),
        Some(Value::String(s)) if s == "host" => Ok(RunAs::Host),
        Some(Value::Object(_)) => {
            let ids = o
                .child("run_as")?
                .ok_or_else(|| err(&field, "must be an object"))?;
            ids.only(&["uid", "gid"])?;
            let id = |name: &str| -> Result<u32, ConfigError> {
                let v = ids
                    .positive(name)?
                    .ok_or_else(|| err(&ids.field(name), "is required"))?;
                u32::try_from(v)
                    .ok()
                    .filter(|v| *v != u32::MAX)
                    .ok_or_else(|| {
                        err(
                            &ids.field(name),
                            format!("must be below {}, got {v}", u32::MAX),
                        )
                    })
            };
            Ok(RunAs::Unprivileged {
                uid: id("uid")?,
                gid: id("gid")?,
            })
        }
        Some(v) => Err(err(
            &field,
            format!(
                "must be \"nobody\", \"host\" or {{\"uid\": N, \"gid\": N}}, got {}",
                match v {
                    Value::String(s) => format!("{s:?}"),
                    other => kind(other).to_owned(),
                }
            ),
        )),
    }
}

impl ToolConfig {
    /// Parses the `tools` object.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn from_value(v: &Value) -> Result<Self, ConfigError> {
        Self::parse(&Obj::new("tools", v)?)
    }

    fn parse(o: &Obj<'_>) -> Result<Self, ConfigError> {
        o.only(&["shell", "file_read", "file_write", "file_edit"])?;
        Ok(ToolConfig {
            shell: shell(o.child("shell")?)?,
            file_read: file_tool(o.child("file_read")?)?,
            file_write: file_tool(o.child("file_write")?)?,
            file_edit: file_tool(o.child("file_edit")?)?,
        })
    }
}

impl RuntimeConfig {
    /// A config with the log at `event_log` and every default.
    pub fn new(event_log: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            event_log: event_log.into(),
            durability: Durability::Full,
            sandbox_root: None,
            tools: ToolConfig::default(),
            models: ModelsConfig::default(),
            approvals: ApprovalsConfig::default(),
        }
    }

    /// Parses a config JSON object: `{"v": 1, "event_log": "...", "durability": "full",
    /// "sandbox_root": "...", "tools": {...}, "models": {...}, "approvals": {...}}`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field (`json` when the text is not JSON).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|e| err("json", e.to_string()))?;
        let o = Obj::new("", &v)?;
        o.only(&[
            "v",
            "event_log",
            "durability",
            "sandbox_root",
            "tools",
            "models",
            "approvals",
        ])?;
        match o.u64("v")? {
            Some(CONFIG_VERSION) => {}
            Some(other) => {
                return Err(err(
                    "v",
                    format!("version {other} is not supported; this build reads {CONFIG_VERSION}"),
                ))
            }
            None => return Err(err("v", format!("missing; set \"v\": {CONFIG_VERSION}"))),
        }
        let event_log = o
            .path("event_log")?
            .ok_or_else(|| err("event_log", "missing; give the event log's file path"))?;
        let durability = match o.string("durability")?.as_deref() {
            None | Some("full") => Durability::Full,
            Some("normal") => Durability::Normal,
            Some(other) => {
                return Err(err(
                    "durability",
                    format!("{other:?} is not \"full\" or \"normal\""),
                ))
            }
        };
        let tools = match o.child("tools")? {
            Some(t) => ToolConfig::parse(&t)?,
            None => ToolConfig::default(),
        };
        let models = match o.child("models")? {
            None => ModelsConfig::default(),
            Some(m) => {
                m.only(&[
                    "server_bin",
                    "port",
                    "health_timeout_ms",
                    "log_dir",
                    "read_timeout_ms",
                    "drain_timeout_ms",
                    "port_count",
                    "max_loaded",
                    "memory_budget_mb",
                    "max_queued",
                    "liveness_interval_ms",
                    "isolation",
                ])?;
                let isolation = match m.string("isolation")?.as_deref() {
                    None => None,
                    Some("required") => Some(ServerIsolation::Required),
                    Some("best_effort") => Some(ServerIsolation::BestEffort),
                    Some("none") => Some(ServerIsolation::None),
                    Some(other) => {
                        return Err(err(
                            "models.isolation",
                            format!(
                                "must be \"required\", \"best_effort\" or \"none\", got {other:?}"
                            ),
                        ))
                    }
                };
                let port_count = match m.positive("port_count")? {
                    None => None,
                    Some(n) if n <= 65535 => Some(n as u16),
                    Some(n) => {
                        return Err(err(
                            "models.port_count",
                            format!("{n} is more ports than exist (at most 65535)"),
                        ))
                    }
                };
                let port = match m.u64("port")? {
                    None => None,
                    Some(p) if (1..=65535).contains(&p) => Some(p as u16),
                    Some(p) => {
                        return Err(err("models.port", format!("{p} is not a port (1-65535)")))
                    }
                };
                ModelsConfig {
                    server_bin: m.path("server_bin")?,
                    port,
                    health_timeout: m.positive("health_timeout_ms")?.map(Duration::from_millis),
                    log_dir: m.path("log_dir")?,
                    read_timeout: m.positive("read_timeout_ms")?.map(Duration::from_millis),
                    drain_timeout: m.positive("drain_timeout_ms")?.map(Duration::from_millis),
                    port_count,
                    max_loaded: m.positive("max_loaded")?.map(|n| n as usize),
                    memory_budget_mb: m.positive("memory_budget_mb")?,
                    max_queued: m.u64("max_queued")?.map(|n| n as usize),
                    liveness_interval: m
                        .positive("liveness_interval_ms")?
                        .map(Duration::from_millis),
                    isolation,
                }
            }
        };
        Ok(RuntimeConfig {
            event_log,
            durability,
            sandbox_root: o.path("sandbox_root")?,
            tools,
            models,
            approvals: approvals(o.child("approvals")?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                m.memory_budget_mb,
                m.max_queued
            ),
            (Some(20000), Some(4), Some(2), Some(4096), Some(0))
        );
        assert_eq!(m.liveness_interval, Some(Duration::from_millis(250)));
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
        assert_eq!(c.models.isolation, Some(ServerIsolation::BestEffort));
        assert_eq!(
            c.tools.shell.options.isolation.run_as,
            RunAs::Unprivileged {
                uid: 1000,
                gid: 1001
            }
        );
        let host = RuntimeConfig::from_json(
            r#"{"v": 1, "event_log": "/e.db", "tools": {"shell": {"isolation": {"run_as": "host"}}}}"#,
        )
        .expect("valid config");
        assert_eq!(host.tools.shell.options.isolation.run_as, RunAs::Host);
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
