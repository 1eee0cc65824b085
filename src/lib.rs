//! correx: the infrastructure layer of a local-first LLM agent runtime. Every call is
//! blocking; every shared type is `Send + Sync`. The book is `docs/` in the repository.
//!
//! A host opens a [`Runtime`] from its config, runs tools through its sandboxed executor
//! (approved by tier, backed up, recorded) and reads what happened from the log:
//!
//! ```
//! use correx::{AutoApprove, EventStore, Runtime, RuntimeConfig, Tier, ToolExecutor, ToolRequest};
//! use std::sync::Arc;
//! let dir = std::env::temp_dir().join(format!("correx-doc-lib-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("notes.txt"), "hello")?;
//! let config = RuntimeConfig::from_json(&serde_json::json!({
//!     "v": 1,
//!     "event_log": dir.join("events.db"),
//!     "sandbox_root": dir.join("sandbox"),
//!     "tools": {"file_read": {"enabled": true, "allowed_paths": [&dir]}},
//! }).to_string())?;
//! let runtime = Runtime::new(&config, Arc::new(AutoApprove::up_to(Tier::T1)))?;
//! let read = serde_json::json!({"operation": "read", "path": "notes.txt"});
//! let result = runtime.executor().execute(&ToolRequest::json("s1", "file_read", read)?);
//! assert!(result.is_success());
//! // The run is in the log: its approval, its start and its outcome.
//! let types: Vec<String> = runtime.events().read_all(0, 100)?.into_iter().map(|e| e.type_id).collect();
//! assert!(types.iter().any(|t| t == "tool.execution_completed"));
//! # drop(runtime);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What a host uses, by capability:
//! - **The runtime**: [`Runtime`], [`RuntimeConfig`] (JSON, every section typed and checked),
//!   [`RuntimeError`], [`CancelToken`].
//! - **The event log**: [`EventLog`] (SQLite or PostgreSQL), [`EventStore`], [`NewEvent`],
//!   [`RecordedEvent`], [`Subscription`], [`verify_log`], seals ([`SealWriter`]) and the typed
//!   events correx appends ([`DomainEvent`]).
//! - **Models**: [`DefaultModelManager`] (resident llama-servers, remote endpoints),
//!   [`ModelDescriptor`], [`InferenceRequest`], [`InferenceResponse`], [`StreamChunk`].
//! - **Durable sessions**: [`Session`], [`Step`].
//! - **Tools**: [`Tool`], [`ToolRequest`], [`ToolResult`], [`ToolRegistry`], the built-ins
//!   ([`ShellTool`], [`FileReadTool`], [`FileWriteTool`], [`FileEditTool`], [`JobsTool`]),
//!   their confinement ([`IsolationOptions`], [`NetworkPolicy`], [`AppliedPolicy`]) and the
//!   [`SandboxedToolExecutor`].
//! - **Services**: background jobs ([`JobTable`]) and MCP servers ([`McpHub`]).
//! - **Approvals**: [`ApprovalEngine`], [`AutoApprove`], [`CallbackApprover`],
//!   [`ApprovalPolicy`]; durable requests any process decides: [`Approvals`], [`DeferAll`].
//! - **Observability**: [`LogMetrics`] (Prometheus text) and [`OtlpExporter`].
//! - **C and Java hosts**: [`ffi`], the `extern "C"` API of `include/correx.h`.

#![deny(missing_docs)]

mod approvals;
mod cancel;
mod confine;
mod domain;
mod events;
pub mod ffi;
mod http;
mod ids;
mod inference;
mod install;
mod observe;
mod platform;
mod private_dir;
mod runtime;
mod sandbox;
mod services;
mod sessions;
mod settings;
mod strict_json;
mod sys;
mod text;
mod tools;
mod workspace;

pub use approvals::{
    ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalError, ApprovalMode, ApprovalPolicy,
    ApprovalRecord, ApprovalRequest, ApprovalRule, Approvals, ApprovalsConfig, AutoApprove,
    CallbackApprover, Decided, DeferAll, DenyAll, EngineChoice, RecordedDecision, RuleAction,
    Settled, MAX_IDENTITY,
};
pub use cancel::CancelToken;
/// The layers of an [`AppliedPolicy`]: how a run was confined, as recorded.
pub use confine::applied;
pub use confine::{
    Allowlist, AppliedPolicy, IsolationMode, IsolationOptions, NetworkPolicy, ResourceLimits, RunAs,
};
pub use domain::{
    append_domain, check_domain_event, verify_log, verify_log_sealed, DomainEvent, EventType,
    UnloadReason,
};
pub use events::chain;
pub use events::evidence;
pub use events::merkle;
pub use events::{
    format_rfc3339_ms, verify_log_with, AppendResult, Checkpoints, Durability, EraseError, Erased,
    EventLog, EventStore, EventStoreError, ExpectedVersion, LatencySnapshot, LogProblem, LogReport,
    NewEvent, RecordedEvent, Seal, SealConfig, SealError, SealKey, SealOptions, SealWriter,
    SqliteEventStore, StoreOptions, Subscription, CHAIN_BREAK, ERASED_TYPE, ERASURE_STREAM,
    TOMBSTONE,
};
#[cfg(feature = "postgres")]
pub use events::{is_postgres_url, PostgresEventStore};
pub use ids::{EventId, ProviderId, SessionId, StageId, ToolInvocationId};
pub use inference::{
    capabilities_for, chat_body, stream_body, CapabilityScore, ChunkKind, ContextEntry,
    ContextPack, DefaultModelManager, Embeddings, EndpointFeatures, EndpointKind, FinishReason,
    GenerationConfig, HttpOptions, InferenceError, InferenceProvider, InferenceRequest,
    InferenceResponse, JsonSchemaFormat, LlamaCppInferenceProvider, LlamaCppTokenizer,
    ManagedInferenceProvider, ManagerOptions, ModelCapability, ModelDescriptor, ModelLoadError,
    ModelManager, ModelRole, ModelState, ModelStatus, PromptCacheOptions, ProviderHealth,
    ResidencyMode, ResponseFormat, ServerIsolation, SourceType, StreamChunk, StreamControl,
    TokenUsage, Tokenizer, ToolCall, ToolChoice, ToolSpec, MODEL_STREAM,
};
pub use install::LlamaInstall;
pub use observe::otlp::{
    export_log as export_log_otlp, ExportReport, ExportStats, OtlpConfig, OtlpError, OtlpExporter,
};
pub use observe::{render as render_metrics, LiveMetrics, LogMetrics};
pub use platform::{kernel_features, KernelFeatures};
pub use runtime::{build_registry, Runtime, RuntimeConfig, RuntimeError, CONFIG_VERSION};
pub use sandbox::{
    default_work_root, session_stream, Recovered, SandboxError, SandboxedToolExecutor,
};
pub use services::jobs::{
    signal_number, InterruptedJob, JobCursor, JobEndReason, JobError, JobInfo, JobOutput,
    JobStatus, JobTable, SIGNALS,
};
pub use services::mcp::{
    pin_held_tools, McpAuthorizer, McpClientMethod, McpHub, McpOAuthConfig, McpRefusal,
    McpRequestHandler, McpServerConfig, McpServerRequest, McpServers, McpStart, McpToolChange,
    McpToolSettings, MCP_STREAM, PINS_STREAM, PROTOCOL_VERSIONS, STATELESS_PROTOCOL_VERSION,
};
pub use sessions::{Session, SessionError, Step, MAX_SIGNAL_BYTES, MAX_STEP_KEY};
pub use settings::{ConfigError, Section};
pub use tools::{
    looks_secret, BuildContext, BuiltinTool, ConfineError, DispatchingToolExecutor,
    FileAffectingTool, FileEditTool, FileReadTool, FileToolConfig, FileWriteTool, JobsOptions,
    JobsTool, JobsToolOptions, Recoverable, ResolveMode, Roots, ShellOptions, ShellTool, Tier,
    Tool, ToolCapability, ToolConfig, ToolError, ToolErrorKind, ToolExecutor, ToolRegistry,
    ToolRequest, ToolResult, ToolRow, ToolSource, ValidationResult, BUILTIN_TOOLS,
    DEFAULT_MAX_READ_BYTES, DEFAULT_OUTPUT_CAP, MAX_TIMEOUT,
};
pub use workspace::{
    Change, ChangeKind, ChangeSet, Conflict, EntryType, PromoteError, PromotePolicy,
    StagedRecovery, StagingOptions, Workspace, WorkspaceError, WorkspaceMode,
};

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_handles_are_send_and_sync() {
        assert_send_sync::<crate::SqliteEventStore>();
        assert_send_sync::<crate::CallbackApprover>();
    }
}
