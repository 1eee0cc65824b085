//! [`ShellOptions`]: the shell tool's config section (`tools.shell`), what it says of itself,
//! and how the runtime builds it.

use super::JobsOptions;
use super::ShellTool;
use crate::confine::{IsolationOptions, RunAs};
use crate::settings::{self, ConfigError, Section};
use crate::tools::table::{BuildContext, BuiltinTool, ToolRow};
use crate::tools::{Tier, ToolError};
use crate::workspace::{StagingOptions, WorkspaceMode};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The longest timeout a shell tool accepts: 7 days. Longer ones are refused when the tool is
/// built (a deadline past the clock's range would otherwise fail only after the child started).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default cap on captured stdout, and separately on stderr: 1 MiB, enough for any listing or
/// test log an agent reads, small enough that an output bomb cannot grow the host.
pub const DEFAULT_OUTPUT_CAP: usize = 1024 * 1024;

/// Settings of a [`ShellTool`] (config `tools.shell`, besides `enabled`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShellOptions {
    /// Executables that may run, by name (resolved through the fixed PATH) or absolute path;
    /// default empty: everything is denied.
    pub allowed_executables: Vec<String>,
    /// Wall-clock limit of one run; default 30 s, at most [`MAX_TIMEOUT`] (config
    /// `timeout_ms`).
    #[serde(rename = "timeout_ms", with = "settings::millis")]
    pub timeout: Duration,
    /// Cap on captured stdout and on stderr, each; default [`DEFAULT_OUTPUT_CAP`] (config
    /// `output_cap_bytes`).
    #[serde(rename = "output_cap_bytes")]
    pub output_cap: usize,
    /// Variables the child gets besides `PATH`; default none.
    pub env: BTreeMap<String, String>,
    /// Pass variables whose names look like secrets; default false.
    pub force_secret_env: bool,
    /// Directories the child may write in, and a request's `cwd` may lie in; the first is the
    /// default working directory. Default none: no `cwd` allowed, and a run starts in its
    /// private temp directory. Config `working_dirs`, absolute paths.
    #[serde(rename = "working_dirs")]
    pub working_roots: Vec<PathBuf>,
    /// How the child is confined by the kernel; default [`IsolationMode::Required`](crate::confine::IsolationMode::Required).
    pub isolation: IsolationOptions,
    /// Bounds on background jobs (`"background": true`): per session, timeout, buffers.
    pub jobs: JobsOptions,
    /// Whether runs change their working dirs in place (default) or in a staged layer that
    /// is promoted or discarded after the run.
    pub workspace: WorkspaceMode,
    /// A staged run's promotion policy and bounds.
    pub staging: StagingOptions,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            allowed_executables: Vec::new(),
            timeout: Duration::from_secs(30),
            output_cap: DEFAULT_OUTPUT_CAP,
            env: BTreeMap::new(),
            force_secret_env: false,
            working_roots: Vec::new(),
            isolation: IsolationOptions::default(),
            jobs: JobsOptions::default(),
            workspace: WorkspaceMode::Direct,
            staging: StagingOptions::default(),
        }
    }
}

impl Section for ShellOptions {
    fn validate(&self) -> Result<(), ConfigError> {
        settings::positive_ms("timeout_ms", self.timeout)?;
        settings::check(
            self.timeout <= MAX_TIMEOUT,
            "timeout_ms",
            format!(
                "must be at most {} (7 days), got {}",
                MAX_TIMEOUT.as_millis(),
                self.timeout.as_millis()
            ),
        )?;
        settings::positive("output_cap_bytes", self.output_cap as u64)?;
        settings::absolute("working_dirs", &self.working_roots)?;
        if self.isolation.network.allowlist().is_some() {
            for k in self.env.keys() {
                settings::check(
                    !crate::confine::net::PROXY_VARIABLES.contains(&k.as_str()),
                    &format!("env.{k}"),
                    "is set by correx for a run with a network allowlist (its proxy)",
                )?;
            }
        }
        self.jobs.validate().map_err(|e| e.under("jobs"))?;
        self.staging.validate().map_err(|e| e.under("staging"))?;
        if self.workspace == WorkspaceMode::Staged {
            settings::check(
                self.isolation.mode != crate::confine::IsolationMode::None,
                "workspace",
                "\"staged\" needs a confined run (isolation.mode \"best_effort\" or \"required\"): \
                 its working dirs are staged in its own view",
            )?;
            settings::check(
                !self.working_roots.is_empty(),
                "workspace",
                "\"staged\" needs working_dirs to stage",
            )?;
            for (i, a) in self.working_roots.iter().enumerate() {
                for b in &self.working_roots[i + 1..] {
                    settings::check(
                        !a.starts_with(b) && !b.starts_with(a),
                        "working_dirs",
                        format!(
                            "{} and {} nest, which a staged workspace cannot stage apart",
                            a.display(),
                            b.display()
                        ),
                    )?;
                }
            }
        }
        self.isolation.validate().map_err(|e| e.under("isolation"))
    }
}

/// The shell's description.
pub(crate) const DESCRIPTION: &str =
    "runs an allowlisted executable with an argument vector (no shell syntax), confined by the kernel";

/// The shell's parameters.
pub(crate) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "the executable (allowlisted) and its arguments"
            },
            "cwd": {"type": "string", "description": "the start directory, inside a working root"},
            "timeout_ms": {"type": "integer", "minimum": 1,
                           "description": "the run's wall-clock limit, at most the configured one"},
            "background": {"type": "boolean",
                           "description": "start it as a background job and return its id at once; read, wait for and stop it with the jobs tool"}
        },
        "required": ["argv"],
        "additionalProperties": false
    })
}

impl BuiltinTool for ShellTool {
    const ROW: ToolRow = ToolRow::new::<Self>("shell", Tier::T2, DESCRIPTION, schema);
    type Config = ShellOptions;

    fn build(config: &ShellOptions, context: &BuildContext) -> Result<Self, ToolError> {
        let tool = ShellTool::new(config.clone())?;
        Ok(match &context.jobs {
            Some(table) => {
                tool.with_jobs(table.clone() as std::sync::Arc<dyn super::background::Background>)
            }
            None => tool,
        })
    }

    fn explain(o: &ShellOptions) -> Vec<(&'static str, String)> {
        let i = &o.isolation;
        vec![
            (
                "output_cap_bytes",
                format!("each stream is capped at {} bytes", o.output_cap),
            ),
            (
                "working_dirs",
                format!("runs start in and may write beneath {:?}", o.working_roots),
            ),
            (
                "workspace",
                match o.workspace {
                    WorkspaceMode::Direct => "runs change the working dirs in place".to_owned(),
                    WorkspaceMode::Staged => format!(
                        "runs change a staged copy of the working dirs, promoted {}",
                        match o.staging.promote {
                            crate::workspace::PromotePolicy::OnSuccess =>
                                "when the run succeeds, discarded otherwise",
                            crate::workspace::PromotePolicy::Manual => "or discarded by the host",
                        }
                    ),
                },
            ),
            (
                "env",
                format!(
                    "the child gets PATH, TMPDIR and {:?}",
                    o.env.keys().collect::<Vec<_>>()
                ),
            ),
            (
                "isolation",
                format!(
                    "also readable: {:?}; limits {:?}; on a root host runs execute as {}",
                    i.read_paths,
                    i.limits,
                    match i.run_as {
                        RunAs::Unprivileged { uid, gid } => format!("uid {uid} gid {gid}"),
                        RunAs::Host => "root without capabilities".into(),
                    }
                ),
            ),
            (
                "",
                format!(
                    "enabled: runs {:?}, {} s timeout, isolation {:?}, network {}",
                    o.allowed_executables,
                    o.timeout.as_secs(),
                    i.mode,
                    match &i.network {
                        crate::confine::NetworkPolicy::Off => "denied".to_owned(),
                        crate::confine::NetworkPolicy::Open => "allowed".to_owned(),
                        crate::confine::NetworkPolicy::Loopback =>
                            "its own loopback only".to_owned(),
                        crate::confine::NetworkPolicy::Allowlist(a) =>
                            format!("through a proxy to {:?} only", a.allow),
                    }
                ),
            ),
        ]
    }

    fn protects(&self) -> Vec<PathBuf> {
        self.allowed_paths()
    }
}
