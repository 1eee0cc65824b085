//! correx: the infrastructure layer of a local-first LLM agent runtime.
//!
//! - [`SqliteEventStore`]: an append-only event log in SQLite, durable across crashes.
//! - Contracts for inference ([`InferenceProvider`]), tools ([`Tool`], [`ToolExecutor`]) and
//!   approvals ([`ApprovalEngine`]).
//!
//! Every call is blocking; every shared type is `Send + Sync`.

#![deny(missing_docs)]

mod approvals;
mod cancel;
mod confine;
mod domain;
mod events;
pub mod ffi;
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

pub use approvals::{
    ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalMode, ApprovalPolicy,
    ApprovalRequest, ApprovalRule, ApprovalsConfig, AutoApprove, CallbackApprover, Decided,
    DenyAll, EngineChoice, RuleAction,
};
pub use cancel::CancelToken;
pub use confine::{
    Allowlist, AllowlistNetwork, Applied, AppliedPolicy, Capabilities, Devices, Filesystem,
    Identity, Ipc, IsolationMode, IsolationOptions, Limits, LoopbackNetwork, Namespaces, Network,
    NetworkPolicy, PlainNetwork, ResourceLimits, RunAs, Scopes,
};
pub use domain::{
    append_domain, check_domain_event, verify_log, verify_log_sealed, DomainEvent, EventType,
    UnloadReason,
};
pub use events::chain;
pub use events::{
    format_rfc3339_ms, verify_log_with, AppendResult, Checkpoints, Durability, EventLog,
    EventStore, EventStoreError, ExpectedVersion, LatencySnapshot, LogProblem, LogReport, NewEvent,
    RecordedEvent, Seal, SealConfig, SealError, SealKey, SealOptions, SealWriter, SqliteEventStore,
    StoreOptions, Subscription,
};
#[cfg(feature = "postgres")]
pub use events::{is_postgres_url, PostgresEventStore};
pub use ids::{EventId, ProviderId, SessionId, StageId, ToolInvocationId};
pub use inference::{
    capabilities_for, chat_body, stream_body, CapabilityScore, ChunkKind, ContextEntry,
    ContextPack, DefaultModelManager, EndpointFeatures, EndpointKind, FinishReason,
    GenerationConfig, HttpOptions, InferenceError, InferenceProvider, InferenceRequest,
    InferenceResponse, JsonSchemaFormat, LlamaCppInferenceProvider, LlamaCppTokenizer,
    ManagedInferenceProvider, ManagerOptions, ModelCapability, ModelDescriptor, ModelLoadError,
    ModelManager, ModelState, ModelStatus, ProviderHealth, ResidencyMode, ResponseFormat,
    ServerIsolation, SourceType, StreamChunk, StreamControl, TokenUsage, Tokenizer, ToolCall,
    ToolChoice, ToolSpec, MODEL_STREAM,
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
    JobStatus, JobTable, JobsOptions, SIGNALS,
};
pub use services::mcp::{
    McpClientMethod, McpHub, McpRefusal, McpRequestHandler, McpServerConfig, McpServerRequest,
    McpServers, McpStart, McpToolSettings, MCP_STREAM, PROTOCOL_VERSIONS,
};
pub use sessions::{Session, SessionError, Step, MAX_STEP_KEY};
pub use settings::{ConfigError, Section};
pub use tools::{
    looks_secret, BuildContext, BuiltinTool, ConfineError, DispatchingToolExecutor,
    FileAffectingTool, FileEditTool, FileReadTool, FileToolConfig, FileWriteTool, JobsTool,
    JobsToolOptions, Recoverable, ResolveMode, Roots, ShellOptions, ShellTool, Tier, Tool,
    ToolCapability, ToolConfig, ToolError, ToolErrorKind, ToolExecutor, ToolRegistry, ToolRequest,
    ToolResult, ToolRow, ToolSource, ValidationResult, BUILTIN_TOOLS, DEFAULT_MAX_READ_BYTES,
    DEFAULT_OUTPUT_CAP, MAX_TIMEOUT,
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
