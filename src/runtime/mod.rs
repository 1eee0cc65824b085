//! [`Runtime`]: the wiring. One event store, one model manager, the tool registry built from
//! [`ToolConfig`], and a [`SandboxedToolExecutor`] over a [`DispatchingToolExecutor`].

mod config;

pub use config::{
    ApprovalsConfig, ConfigError, EngineChoice, FileToolConfig, ModelsConfig, RuntimeConfig,
    ShellConfig, ToolConfig, CONFIG_VERSION,
};

use crate::approvals::{ApprovalEngine, ApprovalPolicy, AutoApprove, DenyAll};
use crate::events::{EventStore, EventStoreError, SqliteEventStore, StoreOptions};
use crate::inference::{DefaultModelManager, ManagerOptions};
use crate::sandbox::{default_work_root, SandboxError, SandboxedToolExecutor};
use crate::tools::{
    DispatchingToolExecutor, FileEditTool, FileReadTool, FileWriteTool, Roots, ShellTool, Tool,
    ToolError, ToolRegistry,
};
use std::fmt;
use std::sync::Arc;

/// Why a runtime could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The config is malformed.
    Config(ConfigError),
    /// The event log could not be opened.
    Events(EventStoreError),
    /// A tool could not be built (a missing root or executable).
    Tool {
        /// The tool.
        tool: &'static str,
        /// Why.
        source: ToolError,
    },
    /// The sandbox could not be set up.
    Sandbox(SandboxError),
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Config(e) => e.fmt(f),
            RuntimeError::Events(e) => e.fmt(f),
            RuntimeError::Tool { tool, source } => write!(f, "tools.{tool}: {source}"),
            RuntimeError::Sandbox(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Config(e) => Some(e),
            RuntimeError::Events(e) => Some(e),
            RuntimeError::Tool { source, .. } => Some(source),
            RuntimeError::Sandbox(e) => Some(e),
        }
    }
}

/// Builds the registry a [`ToolConfig`] describes: only enabled tools, each confined as
/// configured.
///
/// # Errors
/// [`RuntimeError::Tool`] naming the tool whose root or executable is wrong.
pub fn build_registry(config: &ToolConfig) -> Result<ToolRegistry, RuntimeError> {
    let tool_err = |tool: &'static str| move |source| RuntimeError::Tool { tool, source };
    let roots = |tool: &'static str, paths: &[std::path::PathBuf]| {
        Roots::open(paths).map_err(|e| RuntimeError::Tool {
            tool,
            source: ToolError::Root(e),
        })
    };
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut protected = Vec::new();
    if config.shell.enabled {
        let shell = ShellTool::new(config.shell.options.clone()).map_err(tool_err("shell"))?;
        protected = shell.allowed_paths();
        tools.push(Arc::new(shell));
    }
    if config.file_read.enabled {
        let c = &config.file_read;
        tools.push(Arc::new(
            FileReadTool::with_roots(roots("file_read", &c.allowed_paths)?, c.max_read_bytes)
                .map_err(tool_err("file_read"))?,
        ));
    }
    if config.file_write.enabled {
        tools.push(Arc::new(
            FileWriteTool::with_roots(roots("file_write", &config.file_write.allowed_paths)?)
                .protecting(&protected),
        ));
    }
    if config.file_edit.enabled {
        tools.push(Arc::new(
            FileEditTool::with_roots(roots("file_edit", &config.file_edit.allowed_paths)?)
                .protecting(&protected),
        ));
    }
    ToolRegistry::build(tools).map_err(tool_err("registry"))
}

/// The parts of a correx runtime, wired. Shared across threads.
pub struct Runtime {
    events: Arc<SqliteEventStore>,
    models: DefaultModelManager,
    executor: SandboxedToolExecutor,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("events", &self.events)
            .field("executor", &self.executor)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Opens the event log, builds the tools and the sandbox (recovering any interrupted
    /// invocation), and a model manager that loads nothing yet.
    ///
    /// # Errors
    /// [`RuntimeError`] saying which part failed.
    pub fn new(
        config: &RuntimeConfig,
        approvals: Arc<dyn ApprovalEngine>,
    ) -> Result<Self, RuntimeError> {
        let events = Arc::new(
            SqliteEventStore::open_with(
                &config.event_log,
                StoreOptions {
                    durability: config.durability,
                    ..StoreOptions::default()
                },
            )
            .map_err(RuntimeError::Events)?,
        );
        let registry = build_registry(&config.tools)?;
        let store: Arc<dyn EventStore> = events.clone();
        // The config's engine, or the host's; the config's rules in front of it.
        let engine: Arc<dyn ApprovalEngine> = match config.approvals.engine {
            EngineChoice::Callback => approvals,
            EngineChoice::Auto => Arc::new(AutoApprove::up_to(config.approvals.max_tier)),
            EngineChoice::Deny => Arc::new(DenyAll),
        };
        let executor = SandboxedToolExecutor::with_policy(
            Arc::new(DispatchingToolExecutor::new(registry.clone())),
            registry,
            ApprovalPolicy::new(config.approvals.rules.clone(), engine),
            store.clone(),
            config
                .sandbox_root
                .clone()
                .unwrap_or_else(default_work_root),
        )
        .map_err(RuntimeError::Sandbox)?;
        let mut options = ManagerOptions::default();
        let m = &config.models;
        if let Some(b) = &m.server_bin {
            options.server_bin = b.clone();
        }
        if let Some(p) = m.port {
            options.port = p;
        }
        if let Some(t) = m.health_timeout {
            options.health_timeout = t;
        }
        if let Some(t) = m.read_timeout {
            options.http.read_timeout = t;
        }
        if let Some(t) = m.drain_timeout {
            options.drain_timeout = t;
        }
        if let Some(n) = m.port_count {
            options.port_count = n;
        }
        if let Some(n) = m.max_loaded {
            options.max_loaded = n;
        }
        if let Some(mb) = m.memory_budget_mb {
            options.memory_budget = Some(mb.saturating_mul(1 << 20));
        }
        if let Some(n) = m.max_queued {
            options.max_queued = n;
        }
        if let Some(t) = m.liveness_interval {
            options.liveness_interval = t;
        }
        if let Some(i) = m.isolation {
            options.isolation = i;
        }
        options.log_dir = m.log_dir.clone();
        let models = DefaultModelManager::new(store, options);
        Ok(Runtime {
            events,
            models,
            executor,
        })
    }

    /// The event log.
    pub fn events(&self) -> &Arc<SqliteEventStore> {
        &self.events
    }

    /// The model manager.
    pub fn models(&self) -> &DefaultModelManager {
        &self.models
    }

    /// The sandboxed tool executor.
    pub fn executor(&self) -> &SandboxedToolExecutor {
        &self.executor
    }
}
