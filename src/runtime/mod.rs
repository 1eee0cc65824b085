//! [`Runtime`]: the wiring. One event store, one model manager, the tool registry built from
//! [`ToolConfig`], and a [`SandboxedToolExecutor`] over a [`DispatchingToolExecutor`].

mod config;

pub use config::{RuntimeConfig, CONFIG_VERSION};

use crate::approvals::{
    ApprovalEngine, ApprovalPolicy, Approvals, AutoApprove, DeferAll, DenyAll, EngineChoice,
};
use crate::domain::DomainEvent;
use crate::events::ExpectedVersion;
use crate::events::{EventLog, EventStore, EventStoreError, SealError, SealWriter, StoreOptions};
use crate::inference::DefaultModelManager;
use crate::observe::otlp::{OtlpError, OtlpExporter};
use crate::observe::{LiveMetrics, LogMetrics};
use crate::sandbox::{default_work_root, SandboxError, SandboxedToolExecutor};
use crate::services::jobs::{InterruptedJob, JobError, JobTable};
use crate::services::mcp::McpHub;
use crate::sessions::{Session, SessionError};
use crate::settings::ConfigError;
use crate::tools::{BuildContext, DispatchingToolExecutor, ToolConfig, ToolError, ToolRegistry};
use crate::workspace::{ChangeSet, WorkspaceError};
use parking_lot::Mutex;
use std::collections::HashMap;
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
    /// The config's seal file or key could not be read or written (config `seal`).
    Seal(SealError),
    /// The OTLP exporter could not start (config `otlp`).
    Otlp(OtlpError),
    /// A tool could not be built (a missing root or executable).
    Tool {
        /// The tool.
        tool: &'static str,
        /// Why.
        source: ToolError,
    },
    /// The sandbox could not be set up.
    Sandbox(SandboxError),
    /// The background jobs' table could not be set up (its records under the sandbox root),
    /// or a job a dead host left could not be recorded interrupted.
    Jobs(JobError),
    /// An MCP server could not be set up, or (`start: "open"`) started.
    Mcp {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Config(e) => e.fmt(f),
            RuntimeError::Events(e) => e.fmt(f),
            RuntimeError::Seal(e) => write!(f, "seal: {e}"),
            RuntimeError::Otlp(e) => write!(f, "otlp: {e}"),
            RuntimeError::Tool { tool, source } => write!(f, "tools.{tool}: {source}"),
            RuntimeError::Sandbox(e) => e.fmt(f),
            RuntimeError::Jobs(e) => write!(f, "background jobs: {e}"),
            RuntimeError::Mcp { server, reason } => write!(f, "mcp_servers.{server}: {reason}"),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Config(e) => Some(e),
            RuntimeError::Events(e) => Some(e),
            RuntimeError::Seal(e) => Some(e),
            RuntimeError::Otlp(e) => Some(e),
            RuntimeError::Tool { source, .. } => Some(source),
            RuntimeError::Sandbox(e) => Some(e),
            RuntimeError::Jobs(e) => Some(e),
            RuntimeError::Mcp { .. } => None,
        }
    }
}

/// Builds the registry a [`ToolConfig`] describes: only enabled tools, each confined as
/// configured, in the order of its table.
///
/// # Errors
/// [`RuntimeError::Tool`] naming the tool whose root or executable is wrong.
pub fn build_registry(config: &ToolConfig) -> Result<ToolRegistry, RuntimeError> {
    config
        .build()
        .map_err(|(tool, source)| RuntimeError::Tool { tool, source })
}

/// The parts of a correx runtime, wired. Shared across threads.
pub struct Runtime {
    events: Arc<EventLog>,
    models: DefaultModelManager,
    executor: SandboxedToolExecutor,
    jobs: Arc<JobTable>,
    interrupted_jobs: Vec<InterruptedJob>,
    mcp: Arc<McpHub>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// The log's metrics folded so far; each [`Runtime::metrics`] folds in what came since.
    metrics: Mutex<LogMetrics>,
    /// The live OTLP exporter (config `otlp`); dropped after the parts that append on their
    /// way out, so it exports their last events.
    otlp: Option<OtlpExporter>,
    /// Last, so its final seal, written as it drops, covers what every part above appended
    /// on its way out.
    _sealer: Option<SealWriter>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("events", &self.events)
            .field("executor", &self.executor)
            .finish_non_exhaustive()
    }
}

impl Drop for Runtime {
    /// Ends every background job (recorded `runtime_closed`) before the tools that started
    /// them go: nothing a runtime started outlives it.
    fn drop(&mut self) {
        self.jobs.close();
        self.mcp.shutdown();
    }
}

/// The built-in tools that stage their runs (MCP servers' tools never do: listing those
/// would start their servers).
fn staged_tools(executor: &SandboxedToolExecutor) -> Vec<Arc<dyn crate::tools::Tool>> {
    let mut tools = executor.registry().all();
    tools.retain(|t| t.workspace().is_some());
    tools
}

/// Records what the staged tools' recovery made of the runs a dead host left
/// (`workspace.settled` by `recovery`), each in its session's stream.
fn record_staged_recovery(
    executor: &SandboxedToolExecutor,
    store: &Arc<dyn EventStore>,
) -> Result<(), crate::events::EventStoreError> {
    for tool in staged_tools(executor) {
        let Some(w) = tool.workspace() else { continue };
        for r in w.recovered() {
            let event = DomainEvent::WorkspaceSettled {
                session_id: r.session_id.clone(),
                invocation_id: r.invocation_id,
                state: r.state.into(),
                by: "recovery".into(),
                summary: serde_json::json!({}),
            };
            store.append(
                &crate::domain::session_stream(&r.session_id),
                ExpectedVersion::Any,
                &[event.to_new_event()],
            )?;
        }
    }
    Ok(())
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
        // Before anything is opened or recorded: a config built in Rust has not been through
        // the JSON reader's checks.
        config
            .models
            .check_values()
            .map_err(|e| RuntimeError::Config(e.under("models")))?;
        let events = Arc::new(
            EventLog::open(
                &config.event_log,
                StoreOptions {
                    durability: config.durability,
                    ..StoreOptions::default()
                },
            )
            .map_err(RuntimeError::Events)?,
        );
        let sealer = match config.seal.options().map_err(RuntimeError::Seal)? {
            Some(options) => {
                Some(SealWriter::start(events.clone(), options).map_err(RuntimeError::Seal)?)
            }
            None => None,
        };
        let otlp = OtlpExporter::start(&events, &config.otlp).map_err(RuntimeError::Otlp)?;
        let store: Arc<dyn EventStore> = events.clone();
        let work_root = config
            .sandbox_root
            .clone()
            .unwrap_or_else(default_work_root);
        let (jobs, interrupted_jobs) =
            JobTable::open(store.clone(), &work_root).map_err(RuntimeError::Jobs)?;
        let jobs = Arc::new(jobs);
        let registry = config
            .tools
            .build_with(BuildContext {
                jobs: Some(jobs.clone()),
                ..BuildContext::default()
            })
            .map_err(|(tool, source)| RuntimeError::Tool { tool, source })?;
        let mcp = Arc::new(McpHub::new(&config.mcp_servers, store.clone()).map_err(
            |(server, e)| RuntimeError::Mcp {
                server,
                reason: e.to_string(),
            },
        )?);
        mcp.start_eager()
            .map_err(|(server, reason)| RuntimeError::Mcp { server, reason })?;
        let registry = registry.with_mcp(mcp.clone());
        // The config's engine, or the host's; the config's rules in front of it.
        let engine: Arc<dyn ApprovalEngine> = match config.approvals.engine {
            EngineChoice::Callback => approvals,
            EngineChoice::Auto => Arc::new(AutoApprove::up_to(config.approvals.max_tier)),
            EngineChoice::Deny => Arc::new(DenyAll),
            EngineChoice::Durable => Arc::new(DeferAll),
        };
        let executor = SandboxedToolExecutor::with_policy(
            Arc::new(DispatchingToolExecutor::new(registry.clone())),
            registry,
            ApprovalPolicy::new(config.approvals.rules.clone(), engine).with_deadline(
                config
                    .approvals
                    .deadline_secs
                    .map(std::time::Duration::from_secs),
            ),
            store.clone(),
            work_root,
        )
        .map_err(RuntimeError::Sandbox)?;
        record_staged_recovery(&executor, &store).map_err(RuntimeError::Events)?;
        let models = DefaultModelManager::new(store, config.models.clone())
            .map_err(|e| RuntimeError::Config(e.under("models")))?;
        Ok(Runtime {
            events,
            models,
            executor,
            jobs,
            interrupted_jobs,
            mcp,
            sessions: Mutex::new(HashMap::new()),
            metrics: Mutex::new(LogMetrics::default()),
            otlp,
            _sealer: sealer,
        })
    }

    /// The event log.
    pub fn events(&self) -> &Arc<EventLog> {
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

    /// The background jobs the shell started (`"background": true`); they end when the
    /// runtime is dropped, at the latest.
    pub fn jobs(&self) -> &Arc<JobTable> {
        &self.jobs
    }

    /// The durable approval requests of the log: list them, decide them (any process may;
    /// the first decision wins). A step whose run waits for one returns
    /// [`SessionError::Pending`] until then.
    pub fn approvals(&self) -> &Approvals {
        self.executor.approvals()
    }

    /// The MCP servers of the config (`mcp_servers`).
    pub fn mcp(&self) -> &Arc<McpHub> {
        &self.mcp
    }

    /// Durable session `id` (see [`Session`]): its steps are performed once and answered
    /// from the log after. The first call reads the session's stream; the session is kept,
    /// so later calls read only what was appended since, until [`Runtime::forget_session`].
    ///
    /// # Errors
    /// As [`Session::open`].
    pub fn session(&self, id: &str) -> Result<Arc<Session>, SessionError> {
        if let Some(s) = self.sessions.lock().get(id) {
            return Ok(s.clone());
        }
        let store: Arc<dyn EventStore> = self.events.clone();
        let opened = Arc::new(Session::open(store, id)?);
        Ok(self
            .sessions
            .lock()
            .entry(id.to_owned())
            .or_insert(opened)
            .clone())
    }

    /// Drops this runtime's copy of session `id` (its memory, its approval requests' too;
    /// nothing in the log). A later
    /// [`Runtime::session`] reads it again.
    pub fn forget_session(&self, id: &str) {
        self.sessions.lock().remove(id);
        self.executor.approvals().forget(id);
    }

    /// The Prometheus text exposition (format 0.0.4) of what the log records (tool runs by
    /// tool and outcome, approvals and their waits, inferences, tokens, loads, unloads by
    /// reason, jobs, session steps) and what the runtime knows live (models resident and in
    /// flight, append latency). The first call reads the whole log; later ones only what was
    /// appended since.
    ///
    /// # Errors
    /// The event store's, reading the log.
    pub fn metrics(&self) -> Result<String, EventStoreError> {
        let mut log = self.metrics.lock();
        log.update(self.events.as_ref())?;
        let status = self.models.status();
        let live = LiveMetrics {
            resident_models: status
                .iter()
                .filter(|s| s.state == crate::inference::ModelState::Loaded)
                .count(),
            in_flight: status
                .iter()
                .map(|s| (s.model_id.clone(), s.in_flight))
                .collect(),
            append_latency: self.events.append_latency(),
            otlp: self.otlp.as_ref().map(OtlpExporter::stats),
        };
        Ok(crate::observe::render(&log, Some(&live)))
    }

    /// The live OTLP exporter's counts, when the config names an endpoint.
    pub fn otlp_stats(&self) -> Option<crate::observe::otlp::ExportStats> {
        self.otlp.as_ref().map(OtlpExporter::stats)
    }

    /// Jobs a dead host left running under this sandbox root, recorded `job.exited` with
    /// reason `interrupted` when this runtime opened.
    pub fn interrupted_jobs(&self) -> &[InterruptedJob] {
        &self.interrupted_jobs
    }

    /// The change sets staged runs left for the host (`staging.promote: "manual"`), oldest
    /// first within each tool: (tool, session, invocation).
    pub fn staged(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for tool in staged_tools(&self.executor) {
            if let Some(w) = tool.workspace() {
                let name = tool.name().to_owned();
                out.extend(w.held().into_iter().map(|(s, i)| (name.clone(), s, i)));
            }
        }
        out
    }

    /// Promotes the change set invocation `invocation_id` staged and left for the host:
    /// applied to the real tree through the tool's journal, then recorded
    /// (`workspace.settled`, state `promoted`, by `host`). Refused (a conflict), it stays held
    /// and nothing was applied.
    ///
    /// # Errors
    /// [`WorkspaceError`]; [`WorkspaceError::Unrecorded`] when it was applied but the log
    /// could not take its record.
    pub fn promote_staged(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError> {
        self.settle_staged(invocation_id, true)
    }

    /// Discards the change set invocation `invocation_id` staged and left for the host, and
    /// records it (`workspace.settled`, state `discarded`, by `host`).
    ///
    /// # Errors
    /// As [`Runtime::promote_staged`].
    pub fn discard_staged(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError> {
        self.settle_staged(invocation_id, false)
    }

    /// Puts the working dirs back to what they were before invocation `invocation_id` of
    /// session `session_id` changed them: every promoted change set of the session from the
    /// newest back to that one is taken back from its backups, newest first, and each is
    /// recorded (`workspace.settled`, state `rewound`, by `host`). Returns the invocations
    /// taken back, newest first.
    ///
    /// # Errors
    /// [`WorkspaceError::NotRewindable`]; [`WorkspaceError::ChangedSince`] when someone else
    /// changed a path it would take back (nothing changed); [`WorkspaceError::Io`];
    /// [`WorkspaceError::Unrecorded`] when it was done but the log could not take its record.
    pub fn rewind_staged(
        &self,
        session_id: &str,
        invocation_id: &str,
    ) -> Result<Vec<String>, WorkspaceError> {
        let tool = staged_tools(&self.executor).into_iter().find(|t| {
            t.workspace()
                .is_some_and(|w| w.rewindable(session_id).iter().any(|i| i == invocation_id))
        });
        let Some(w) = tool.as_deref().and_then(|t| t.workspace()) else {
            return Err(WorkspaceError::NotRewindable {
                invocation_id: invocation_id.to_owned(),
            });
        };
        let rewound = w.rewind(session_id, invocation_id)?;
        let events: Vec<_> = rewound
            .iter()
            .map(|(inv, summary)| {
                DomainEvent::WorkspaceSettled {
                    session_id: session_id.to_owned(),
                    invocation_id: inv.clone(),
                    state: "rewound".into(),
                    by: "host".into(),
                    summary: summary.clone(),
                }
                .to_new_event()
            })
            .collect();
        self.events
            .append(
                &crate::domain::session_stream(session_id),
                ExpectedVersion::Any,
                &events,
            )
            .map_err(WorkspaceError::Unrecorded)?;
        Ok(rewound.into_iter().map(|(i, _)| i).collect())
    }

    fn settle_staged(
        &self,
        invocation_id: &str,
        promote: bool,
    ) -> Result<ChangeSet, WorkspaceError> {
        for tool in staged_tools(&self.executor) {
            let Some(w) = tool.workspace() else {
                continue;
            };
            let Some((session, _)) = w.held().into_iter().find(|(_, i)| i == invocation_id) else {
                continue;
            };
            let set = if promote {
                w.promote(invocation_id)?
            } else {
                w.discard(invocation_id)?
            };
            let event = DomainEvent::WorkspaceSettled {
                session_id: session.clone(),
                invocation_id: invocation_id.to_owned(),
                state: if promote { "promoted" } else { "discarded" }.into(),
                by: "host".into(),
                summary: set.summary(),
            };
            self.events
                .append(
                    &crate::domain::session_stream(&session),
                    ExpectedVersion::Any,
                    &[event.to_new_event()],
                )
                .map_err(WorkspaceError::Unrecorded)?;
            return Ok(set);
        }
        Err(WorkspaceError::NotHeld {
            invocation_id: invocation_id.to_owned(),
        })
    }
}
