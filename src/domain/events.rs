//! The typed events correx itself appends.

use super::TokenUsage;
use crate::events::{EventStoreError, NewEvent, RecordedEvent, Result};
use serde::{Deserialize, Serialize};

/// Why a model was unloaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnloadReason {
    /// A caller asked for it.
    Requested,
    /// The DYNAMIC idle timeout passed.
    Idle,
    /// An EPHEMERAL model finished its inference.
    Ephemeral,
    /// The server died on its own.
    Crashed,
    /// The same id was loaded with other server settings.
    Replaced,
    /// Its slot or memory was needed for another model (least recently used, nothing in
    /// flight).
    Evicted,
    /// Its server stopped answering health checks and was killed.
    Unresponsive,
}

impl UnloadReason {
    /// The recorded spelling: `requested`, `idle`, `ephemeral`, `crashed`, `replaced`,
    /// `evicted`, `unresponsive`.
    pub fn as_str(self) -> &'static str {
        match self {
            UnloadReason::Requested => "requested",
            UnloadReason::Idle => "idle",
            UnloadReason::Ephemeral => "ephemeral",
            UnloadReason::Crashed => "crashed",
            UnloadReason::Replaced => "replaced",
            UnloadReason::Evicted => "evicted",
            UnloadReason::Unresponsive => "unresponsive",
        }
    }
}

/// The events correx appends, each with a fixed type id and schema version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum DomainEvent {
    /// A llama-server passed its health check with this model.
    #[serde(rename = "model.loaded")]
    ModelLoaded {
        /// The model's id.
        model_id: String,
        /// The GGUF file (empty for a remote model).
        model_path: String,
        /// The server's port (absent for a remote model).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
        /// The server's process id (absent for a remote model).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        /// Spawn (or, for a remote model, the first check) to healthy, in milliseconds.
        load_ms: u64,
        /// A remote model's endpoints.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        endpoints: Vec<String>,
        /// What each remote endpoint offers, as probed at the load (`{"url", "tokenize",
        /// "json_schema", "llama_extras"}`; `{"url", "probed": false, "reason"}` for one that
        /// did not answer then or failed its probe, probed again when it answers).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        endpoint_features: Vec<serde_json::Value>,
        /// How the spawned server was confined (`models.isolation`), as applied; absent for a
        /// remote model and in events written before servers were confined.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        isolation: Option<serde_json::Value>,
    },
    /// A request to a remote model's endpoint failed before any answer arrived, and went to
    /// another endpoint.
    #[serde(rename = "model.endpoint_failover")]
    ModelEndpointFailover {
        /// The model.
        model_id: String,
        /// The endpoint that failed.
        from: String,
        /// The endpoint tried next.
        to: String,
        /// What failed.
        error: String,
    },
    /// A model's server was stopped and reaped.
    #[serde(rename = "model.unloaded")]
    ModelUnloaded {
        /// The model's id.
        model_id: String,
        /// Why.
        reason: UnloadReason,
        /// The server's pid (absent in events written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        /// The port it listened on (absent in events written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
    },
    /// A tool run needs a decision that no rule, earlier session answer or engine gave at
    /// once: it waits, as this record, for a decision from any process (a
    /// `tool.approval_decided` with `answers_request`). The run starts when it is asked for
    /// again after an approving decision; it never starts on its own.
    #[serde(rename = "tool.approval_requested")]
    ToolApprovalRequested {
        /// The session.
        session_id: String,
        /// The invocation: the request's id (what a decision names).
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// The tool's tier, 0..=3.
        tier: i32,
        /// The request's parameters, as the approver would see them.
        parameters: serde_json::Value,
        /// The command line, for a tool that takes one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        argv: Option<Vec<String>>,
        /// Every path the tool may change.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        paths: Vec<String>,
        /// Why it needs a decision: `tier T2`, or the rule that asks (`rule: shell ["git"] ask`).
        asked_by: String,
        /// Who deferred it to a durable decision: the engine's name.
        engine: String,
        /// After this instant (milliseconds since the Unix epoch) the request is `expired`
        /// (denied), decided by whoever reads it next; none: it waits until decided.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<i64>,
    },
    /// A policy rule, an earlier session answer or the approval engine decided whether a tool
    /// invocation may run; appended in one transaction with the start or the rejection it led
    /// to — or, for a decision on a `tool.approval_requested` (`answers_request`), alone, by
    /// the process that decided.
    #[serde(rename = "tool.approval_decided")]
    ToolApprovalDecided {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// The tool's tier, 0..=3.
        tier: i32,
        /// `approved`, `approved_for_session` or `denied`.
        decision: String,
        /// Who decided: `rule: shell ["rm"] forbid`, `session`, `host`, `auto up to T2`,
        /// `deny_all`.
        decided_by: String,
        /// How long the decision took (a person's answer, through the host), in milliseconds.
        wait_ms: u64,
        /// A denial's reason.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// It decides the invocation's `tool.approval_requested` (`decision` may then be
        /// `expired`, by `deadline`): the run has not started.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        answers_request: bool,
        /// Who decided, as the host named them (a person, a service).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        identity: Option<String>,
    },
    /// A tool invocation passed approval and is about to run.
    #[serde(rename = "tool.execution_started")]
    ToolExecutionStarted {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// The tool's tier, 0..=3.
        tier: i32,
        /// The kernel confinement the run gets (the shell's applied isolation policy); absent
        /// for tools that run in the host process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        isolation: Option<serde_json::Value>,
    },
    /// A tool invocation succeeded.
    #[serde(rename = "tool.execution_completed")]
    ToolExecutionCompleted {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// How long the tool ran, in milliseconds.
        duration_ms: u64,
        /// What a run with a network allowlist did through its proxy: `connections`,
        /// `bytes_up`, `bytes_down`, `allowed` (those per host) and `denied_count` (each
        /// refusal is a `tool.network_denied` event before this one); absent for others.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<serde_json::Value>,
    },
    /// A tool invocation failed; its files were restored.
    #[serde(rename = "tool.execution_failed")]
    ToolExecutionFailed {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// Why it failed (`interrupted` after a crash).
        reason: String,
        /// Whether a changed request may succeed.
        recoverable: bool,
        /// The failure's stable kind (`not_found`, `timed_out`, ...; see `ToolErrorKind`);
        /// absent in events written before it was recorded, and after a crash.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        /// As in `tool.execution_completed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<serde_json::Value>,
    },
    /// Recovery found a run a dead host started and left without an outcome, and closed it
    /// with what is known. (A run whose files recovery restored is recorded
    /// `tool.execution_failed` with reason `interrupted`.)
    #[serde(rename = "tool.execution_interrupted")]
    ToolExecutionInterrupted {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// `completed`: the tool finished and its change is in place, but its completion was
        /// never recorded; `unchanged`: it was stopped before it changed anything.
        state: String,
    },
    /// A running tool reported how far it is (an MCP server's `notifications/progress`): the
    /// latest report at most every 100 ms of a call, in the `mcp-servers` stream.
    #[serde(rename = "tool.progress")]
    ToolProgress {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool (`<server>.<tool>`).
        tool_name: String,
        /// How far, in the server's units.
        progress: f64,
        /// Of how much, when the server knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
        /// What the server said it is doing (at most 1024 characters).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The host cancelled a running tool invocation; its files were restored.
    #[serde(rename = "tool.execution_cancelled")]
    ToolExecutionCancelled {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// How long it ran before it stopped, in milliseconds.
        duration_ms: u64,
        /// As in `tool.execution_completed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<serde_json::Value>,
    },
    /// A run's proxy refused a connection (a host not allowed, an address, a TLS hello naming
    /// another host, a bound reached); appended with the run's outcome, before it.
    #[serde(rename = "tool.network_denied")]
    ToolNetworkDenied {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// The host asked for (a name, or an address as written).
        host: String,
        /// The port asked for.
        port: u16,
        /// Why: `not_allowed`, `denied`, `address_literal`, `private_address`, `unresolved`,
        /// `sni_mismatch`, `no_sni`, `encrypted_client_hello`, `host_mismatch`, `pipelined`
        /// (bytes after a plain request's end on its connection: never passed on),
        /// `too_many_connections`, `byte_limit`, `bad_request`, `unreachable`,
        /// `direct_connect`.
        reason: String,
    },
    /// A staged run's change set, as it ended: every path it changed, its text files' diff,
    /// and what became of it (`promoted`, `kept` for the host, `discarded`, or `conflict`).
    /// Appended with the run's outcome, before it.
    #[serde(rename = "workspace.staged")]
    WorkspaceStaged {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// The promotion policy: `on_success` or `manual`.
        promote: String,
        /// `promoted`, `kept`, `discarded`, `conflict` or `refused`.
        state: String,
        /// Counts by kind (`added`, `modified`, `deleted`, `mode_changed`, `touched`,
        /// `special`), `paths` and `bytes`.
        summary: serde_json::Value,
        /// Every changed path: `{"path", "kind", "type", "size"?, "before_size"?, "mode"?,
        /// "before_mode"?, "target"?}`.
        changes: serde_json::Value,
        /// A unified diff of the text files (binary and large ones named only), at most
        /// 256 KiB.
        diff: String,
        /// Files were left out of `diff` to bound it.
        diff_truncated: bool,
        /// Why it was discarded or refused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A change set held for the host was promoted or discarded (by the host, or by recovery
    /// after a crash), or a promoted one was taken back by a rewind.
    #[serde(rename = "workspace.settled")]
    WorkspaceSettled {
        /// The session.
        session_id: String,
        /// The invocation that staged it.
        invocation_id: String,
        /// `promoted`, `discarded` or `rewound`.
        state: String,
        /// Who decided: `host` or `recovery`.
        by: String,
        /// Counts by kind, as in `workspace.staged`.
        summary: serde_json::Value,
    },
    /// A tool invocation was denied by the approval engine and never ran.
    #[serde(rename = "tool.execution_rejected")]
    ToolExecutionRejected {
        /// The session.
        session_id: String,
        /// The invocation.
        invocation_id: String,
        /// The tool.
        tool_name: String,
        /// The tool's tier, 0..=3.
        tier: i32,
        /// The engine's reason.
        reason: String,
        /// Why, as a stable kind: `invalid_request`, `not_allowed`, `escape`, `cancelled`, ...
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
    },
    /// A background job's program started (a shell request with `background: true`); its
    /// outcome is a later `job.exited` of the same job id.
    #[serde(rename = "job.started")]
    JobStarted {
        /// The session.
        session_id: String,
        /// The job.
        job_id: String,
        /// The shell invocation that started it.
        invocation_id: String,
        /// The command, argv as given.
        command: Vec<String>,
        /// When it is stopped unless it ends first, in milliseconds from its start.
        timeout_ms: u64,
    },
    /// A background job ended and every process of it is gone.
    #[serde(rename = "job.exited")]
    JobExited {
        /// The session.
        session_id: String,
        /// The job.
        job_id: String,
        /// Why it ended: `exited` (on its own), `stopped` (asked to), `timed_out`,
        /// `session_ended`, `runtime_closed`, or `interrupted` (its host died, recorded by the
        /// next runtime opened on the same sandbox root).
        reason: String,
        /// Its exit code, when it exited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// The signal that ended it, when one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// From its start to its end, in milliseconds (absent when interrupted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
        /// Bytes it wrote to stdout and to stderr, kept or not.
        #[serde(default)]
        stdout_bytes: u64,
        /// As `stdout_bytes`.
        #[serde(default)]
        stderr_bytes: u64,
    },
    /// An MCP server started: initialized, its tools listed (stream `mcp-servers`).
    #[serde(rename = "mcp.server_started")]
    McpServerStarted {
        /// The server's name in the config.
        server: String,
        /// The protocol revision it answered.
        protocol_version: String,
        /// Its tools' names (without the server's prefix).
        tools: Vec<String>,
        /// How it is confined, as applied (a server correx runs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        isolation: Option<serde_json::Value>,
        /// A remote server's endpoint: its scheme, host, port and path (never a query, which
        /// may carry a key).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
    },
    /// A request to a remote MCP server was refused by its network policy before anything was
    /// sent (`mcp_servers.<name>.network`).
    #[serde(rename = "mcp.request_refused")]
    McpRequestRefused {
        /// The server's name in the config.
        server: String,
        /// The host asked for (a name, or an address as written).
        host: String,
        /// The port asked for.
        port: u16,
        /// Why: `not_allowed`, `denied`, `address_literal`, `private_address` or
        /// `unresolved`.
        reason: String,
    },
    /// An MCP server's tool definitions were pinned (in the `mcp-pins` stream): a later
    /// listing of one of them is used only while its digest is the one pinned here.
    #[serde(rename = "mcp.tools_pinned")]
    McpToolsPinned {
        /// The server's name in the config.
        server: String,
        /// Each tool pinned (its name, without the server's prefix) and its definition's
        /// digest, `sha256:<hex>`.
        tools: std::collections::BTreeMap<String, String>,
        /// Who pinned them: `first_use` (the server's first listing), `approval` (a call of
        /// a changed tool approved) or `host` (the host, or `correx mcp pin`).
        by: String,
        /// The approved call, for `approval`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
    },
    /// An MCP server listed a tool whose definition is not the one pinned (changed since, or
    /// added after the first listing): it is not used until pinned again.
    #[serde(rename = "mcp.tool_held")]
    McpToolHeld {
        /// The server's name in the config.
        server: String,
        /// The tool, without the server's prefix.
        tool: String,
        /// The digest pinned for it; none for a tool added after the pin.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned: Option<String>,
        /// The digest of the definition listed now.
        listed: String,
        /// What its calls get: `refused` (until the host pins it) or `asked` (a person
        /// approves each call until one approval pins it).
        action: String,
        /// The definition listed (omitted past 64 KiB), for whoever decides.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        definition: Option<serde_json::Value>,
    },
    /// An MCP server ended and every process of it is gone.
    #[serde(rename = "mcp.server_exited")]
    McpServerExited {
        /// The server's name in the config.
        server: String,
        /// `stopped` (by correx: the runtime closed, or it failed to start), `exited` (code
        /// 0, on its own), `crashed`, `line_too_long` (it wrote a line past its bound), or,
        /// for a remote server, `disconnected` (a request could not reach it; it is
        /// connected again on a later use).
        reason: String,
        /// Its exit code, when it exited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// The signal that ended it, when one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// A session step was claimed: its owner performs it now. Appended at the stream version
    /// its owner read, so two claimers of one step cannot both win.
    #[serde(rename = "session.step_started")]
    SessionStepStarted {
        /// The session.
        session_id: String,
        /// The host's key of the step, unique within the session.
        step: String,
        /// `infer` or `tool`.
        kind: String,
        /// The request's SHA-256, hex (an inference's whole request; a tool's name,
        /// parameters and call id).
        digest: String,
        /// 1 for the first try; one more for each try after the last owner died or failed
        /// before a result.
        attempt: u32,
        /// Who performs it: `{"pid", "start", "boot", "ns", "claim"}` (its process, that
        /// process's start time and boot, its pid namespace, and a claim id).
        owner: serde_json::Value,
        /// A tool step's invocation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
        /// The model's call id a tool step answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
    },
    /// A session step's result, recorded once; a later call with the same key is answered
    /// from it.
    #[serde(rename = "session.step_completed")]
    SessionStepCompleted {
        /// The session.
        session_id: String,
        /// The step's key.
        step: String,
        /// `infer`, `tool` or `wait`.
        kind: String,
        /// As in `session.step_started`.
        digest: String,
        /// The try that produced it.
        attempt: u32,
        /// An inference's answer: `text`, `usage`, `finish_reason`, `latency_ms`, `model`,
        /// `tool_calls`, `reasoning`, `timings`, `endpoint`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<serde_json::Value>,
        /// What an inference's request changed of the previous inference's context: `{"keep":
        /// N, "entries": [...]}` (the first N entries stay, these follow), with `"header":
        /// {"system", "task"}` when those changed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<serde_json::Value>,
        /// A tool step's result, as the tool answered it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<serde_json::Value>,
        /// The model's call id a tool step answers (its transcript entry carries it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// Set when the owner died before recording the result and it was rebuilt from the
        /// run's recorded outcome: that outcome's type (the tool's output itself was lost).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recovered: Option<String>,
        /// A wait step's answer: the payload of the signal that ended it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<serde_json::Value>,
    },
    /// A session step waits for a signal by name (`Session::wait`); a signal from any
    /// process answers it.
    #[serde(rename = "session.waiting")]
    SessionWaiting {
        /// The session.
        session_id: String,
        /// The step's key.
        step: String,
        /// The signal it waits for.
        name: String,
    },
    /// A signal for a session's waits (`Session::signal`): the first of a name answers every
    /// wait for it; another of the same name is refused.
    #[serde(rename = "session.signaled")]
    SessionSignaled {
        /// The session.
        session_id: String,
        /// The signal's name.
        name: String,
        /// What it carries, as the sender gave it.
        payload: serde_json::Value,
        /// Who sent it, as the sender said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// A session step's try ended without a result (an inference error or a cancel): no side
    /// effect happened, and the next call with the key tries again.
    #[serde(rename = "session.step_failed")]
    SessionStepFailed {
        /// The session.
        session_id: String,
        /// The step's key.
        step: String,
        /// `infer` or `tool`.
        kind: String,
        /// The try that failed.
        attempt: u32,
        /// Why.
        error: String,
    },
    /// An inference finished.
    #[serde(rename = "inference.completed")]
    InferenceCompleted {
        /// The model that answered.
        model_id: String,
        /// Token counts.
        usage: TokenUsage,
        /// Wall time of the call, in milliseconds.
        latency_ms: u64,
        /// Why generation stopped.
        finish_reason: String,
        /// The endpoint that answered (a remote model's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
    },
    /// An embedding call finished.
    #[serde(rename = "embedding.completed")]
    EmbeddingCompleted {
        /// The model that answered.
        model_id: String,
        /// How many texts were embedded.
        inputs: u32,
        /// Tokens the server read for them.
        prompt_tokens: u32,
        /// The length of each vector.
        dimensions: u32,
        /// Wall time of the call, in milliseconds.
        latency_ms: u64,
    },
    /// A session's saved prompt cache went into a server, and its answer reused it.
    #[serde(rename = "model.cache_restored")]
    ModelCacheRestored {
        /// The model it was restored into.
        model_id: String,
        /// The session whose conversation it holds.
        session_id: String,
        /// Tokens the file held.
        tokens_restored: u64,
        /// Tokens of the request the server took from it (`timings.cache_n`).
        tokens_reused: u64,
        /// Tokens the server computed (`timings.prompt_n`): the new suffix.
        tokens_computed: u64,
        /// Wall time of the restore, in milliseconds.
        restore_ms: u64,
    },
    /// A session had a saved prompt cache and it was not used.
    #[serde(rename = "model.cache_missed")]
    ModelCacheMissed {
        /// The model the session's request went to.
        model_id: String,
        /// The session.
        session_id: String,
        /// Why: `model` (saved for another model file), `build` (another server build),
        /// `settings` (another context size or server arguments), `prefix` (the request
        /// does not continue the saved messages), `restore_failed` (the server refused the
        /// file), `not_reused` (restored, but the answer shows the server computed the
        /// prompt again; the file is dropped).
        reason: String,
        /// What the server said or did, when there is more to say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// A session's slot was saved after an answer.
    #[serde(rename = "model.cache_saved")]
    ModelCacheSaved {
        /// The model whose server saved it.
        model_id: String,
        /// The session.
        session_id: String,
        /// Tokens saved (the prompt and the answer).
        tokens: u64,
        /// Bytes written.
        bytes: u64,
        /// Wall time of the save, in milliseconds.
        save_ms: u64,
        /// Least recently used files removed after it to keep the caps.
        files_removed: u32,
        /// Their bytes.
        bytes_removed: u64,
    },
}

macro_rules! type_ids {
    ($($variant:ident => $id:literal),* $(,)?) => {
        /// A domain event's type without its payload. Readers that take a payload field by
        /// field (so an event a newer build wrote still shows what it can) match on it: every
        /// variant by name, so a new event type is a compile error wherever it must be handled.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EventType {
            $(#[doc = concat!("`", $id, "`")] $variant,)*
        }

        impl EventType {
            /// The type of a recorded `type_id`; `None` for one correx does not know.
            pub fn of(type_id: &str) -> Option<EventType> {
                match type_id {
                    $($id => Some(EventType::$variant),)*
                    _ => None,
                }
            }

            /// The type id.
            pub fn as_str(self) -> &'static str {
                match self { $(EventType::$variant => $id,)* }
            }
        }

        impl DomainEvent {
            /// The event's type id.
            pub fn type_id(&self) -> &'static str {
                match self { $(DomainEvent::$variant { .. } => $id,)* }
            }

            /// Every type id correx knows.
            pub const TYPE_IDS: &'static [&'static str] = &[$($id),*];
        }
    };
}

type_ids! {
    ModelLoaded => "model.loaded",
    ModelUnloaded => "model.unloaded",
    ModelEndpointFailover => "model.endpoint_failover",
    ToolApprovalRequested => "tool.approval_requested",
    ToolApprovalDecided => "tool.approval_decided",
    ToolExecutionStarted => "tool.execution_started",
    ToolExecutionCompleted => "tool.execution_completed",
    ToolExecutionFailed => "tool.execution_failed",
    ToolExecutionRejected => "tool.execution_rejected",
    ToolExecutionCancelled => "tool.execution_cancelled",
    ToolExecutionInterrupted => "tool.execution_interrupted",
    ToolProgress => "tool.progress",
    ToolNetworkDenied => "tool.network_denied",
    WorkspaceStaged => "workspace.staged",
    WorkspaceSettled => "workspace.settled",
    InferenceCompleted => "inference.completed",
    EmbeddingCompleted => "embedding.completed",
    ModelCacheRestored => "model.cache_restored",
    ModelCacheMissed => "model.cache_missed",
    ModelCacheSaved => "model.cache_saved",
    JobStarted => "job.started",
    JobExited => "job.exited",
    McpServerStarted => "mcp.server_started",
    McpServerExited => "mcp.server_exited",
    McpRequestRefused => "mcp.request_refused",
    McpToolsPinned => "mcp.tools_pinned",
    McpToolHeld => "mcp.tool_held",
    SessionStepStarted => "session.step_started",
    SessionStepCompleted => "session.step_completed",
    SessionStepFailed => "session.step_failed",
    SessionWaiting => "session.waiting",
    SessionSignaled => "session.signaled",
}

/// Every domain event is at schema version 1.
const SCHEMA_VERSION: u32 = 1;

impl DomainEvent {
    /// One line for people: what happened, e.g. `file_write (T2) started in session s1`.
    pub fn summary(&self) -> String {
        // Every type is named here, so a new one is a compile error until it has a line; each
        // group's function matches only the types routed to it.
        match self {
            DomainEvent::ModelLoaded { .. }
            | DomainEvent::ModelEndpointFailover { .. }
            | DomainEvent::ModelUnloaded { .. }
            | DomainEvent::InferenceCompleted { .. }
            | DomainEvent::EmbeddingCompleted { .. }
            | DomainEvent::ModelCacheRestored { .. }
            | DomainEvent::ModelCacheMissed { .. }
            | DomainEvent::ModelCacheSaved { .. } => self.model_summary(),
            DomainEvent::ToolApprovalRequested { .. }
            | DomainEvent::ToolApprovalDecided { .. }
            | DomainEvent::ToolExecutionStarted { .. }
            | DomainEvent::ToolExecutionRejected { .. } => self.tool_start_summary(),
            DomainEvent::ToolExecutionCompleted { .. }
            | DomainEvent::ToolExecutionFailed { .. }
            | DomainEvent::ToolExecutionInterrupted { .. }
            | DomainEvent::ToolProgress { .. }
            | DomainEvent::ToolExecutionCancelled { .. }
            | DomainEvent::ToolNetworkDenied { .. }
            | DomainEvent::WorkspaceStaged { .. }
            | DomainEvent::WorkspaceSettled { .. } => self.tool_run_summary(),
            DomainEvent::JobStarted { .. }
            | DomainEvent::JobExited { .. }
            | DomainEvent::McpServerStarted { .. }
            | DomainEvent::McpServerExited { .. }
            | DomainEvent::McpRequestRefused { .. }
            | DomainEvent::McpToolsPinned { .. }
            | DomainEvent::McpToolHeld { .. } => self.process_summary(),
            DomainEvent::SessionStepStarted { .. }
            | DomainEvent::SessionStepCompleted { .. }
            | DomainEvent::SessionStepFailed { .. }
            | DomainEvent::SessionWaiting { .. }
            | DomainEvent::SessionSignaled { .. } => self.step_summary(),
        }
    }

    /// [`DomainEvent::summary`] of a model's load, failover, unload or inference.
    fn model_summary(&self) -> String {
        match self {
            DomainEvent::ModelLoaded { model_id, pid, port, load_ms, endpoints, .. } => match (pid, port) {
                (Some(pid), Some(port)) => format!("model {model_id} loaded (pid {pid}, port {port}, {load_ms} ms)"),
                _ => format!("model {model_id} reachable at {} ({load_ms} ms)", endpoints.join(", ")),
            },
            DomainEvent::ModelEndpointFailover { model_id, from, to, error } => {
                let short: String = error.chars().take(120).collect();
                format!("model {model_id}: {from} failed ({short}); trying {to}")
            }
            DomainEvent::ModelUnloaded { model_id, reason, pid, .. } => {
                let reason = reason.as_str();
                match pid {
                    Some(pid) => format!("model {model_id} unloaded ({reason}, pid {pid})"),
                    None => format!("model {model_id} unloaded ({reason})"),
                }
            }
            DomainEvent::InferenceCompleted { model_id, usage, latency_ms, finish_reason, endpoint } => format!(
                "inference on {model_id}{}: {} prompt + {} completion tokens in {latency_ms} ms ({finish_reason})",
                endpoint.as_ref().map(|e| format!(" at {e}")).unwrap_or_default(),
                usage.prompt_tokens, usage.completion_tokens
            ),
            DomainEvent::EmbeddingCompleted { model_id, inputs, prompt_tokens, dimensions, latency_ms } => format!(
                "embeddings on {model_id}: {inputs} texts ({prompt_tokens} tokens) to {dimensions} dimensions in {latency_ms} ms"
            ),
            DomainEvent::ModelCacheRestored { model_id, session_id, tokens_reused, tokens_computed, restore_ms, .. } => format!(
                "prompt cache of {session_id} restored into {model_id} in {restore_ms} ms: {tokens_reused} tokens reused, {tokens_computed} computed"
            ),
            DomainEvent::ModelCacheMissed { model_id, session_id, reason, .. } => format!(
                "prompt cache of {session_id} not used on {model_id} ({reason})"
            ),
            DomainEvent::ModelCacheSaved { model_id, session_id, tokens, bytes, .. } => format!(
                "prompt cache of {session_id} saved by {model_id}: {tokens} tokens, {bytes} bytes"
            ),
            // `summary` routes no other type here; were one, its type id is what it shows.
            _ => self.type_id().to_owned(),
        }
    }

    /// [`DomainEvent::summary`] of a tool run's approval, start or rejection.
    fn tool_start_summary(&self) -> String {
        match self {
            DomainEvent::ToolApprovalRequested {
                tool_name,
                tier,
                invocation_id,
                asked_by,
                ..
            } => {
                format!("{tool_name} (T{tier}) waits for a decision ({asked_by}), request {invocation_id}")
            }
            DomainEvent::ToolApprovalDecided {
                tool_name,
                tier,
                decision,
                decided_by,
                wait_ms,
                invocation_id,
                answers_request: true,
                identity,
                ..
            } => {
                let who = identity
                    .as_deref()
                    .map(|i| format!(" ({i})"))
                    .unwrap_or_default();
                format!("{tool_name} (T{tier}) request {invocation_id} {decision} by {decided_by}{who} after {wait_ms} ms")
            }
            DomainEvent::ToolApprovalDecided {
                tool_name,
                tier,
                decision,
                decided_by,
                wait_ms,
                invocation_id,
                ..
            } => {
                format!("{tool_name} (T{tier}) {decision} by {decided_by} after {wait_ms} ms, invocation {invocation_id}")
            }
            DomainEvent::ToolExecutionStarted {
                tool_name,
                tier,
                invocation_id,
                ..
            } => {
                format!("{tool_name} (T{tier}) started, invocation {invocation_id}")
            }
            DomainEvent::ToolExecutionRejected {
                tool_name,
                tier,
                reason,
                invocation_id,
                ..
            } => {
                format!("{tool_name} (T{tier}) rejected: {reason}, invocation {invocation_id}")
            }
            // `summary` routes no other type here; were one, its type id is what it shows.
            _ => self.type_id().to_owned(),
        }
    }

    /// [`DomainEvent::summary`] of a tool run's progress, network denial or outcome.
    fn tool_run_summary(&self) -> String {
        match self {
            DomainEvent::ToolExecutionCompleted {
                tool_name,
                duration_ms,
                invocation_id,
                ..
            } => {
                format!("{tool_name} completed in {duration_ms} ms, invocation {invocation_id}")
            }
            DomainEvent::ToolExecutionFailed {
                tool_name,
                reason,
                invocation_id,
                ..
            } => {
                let short: String = reason.chars().take(120).collect();
                format!("{tool_name} failed: {short}, invocation {invocation_id}")
            }
            DomainEvent::ToolExecutionInterrupted {
                tool_name,
                state,
                invocation_id,
                ..
            } => {
                format!("{tool_name} interrupted by a crash ({state}), invocation {invocation_id}")
            }
            DomainEvent::ToolProgress {
                tool_name,
                progress,
                total,
                message,
                invocation_id,
                ..
            } => {
                let of = total.map(|t| format!(" of {t}")).unwrap_or_default();
                let what = message
                    .as_ref()
                    .map(|m| format!(": {}", m.chars().take(120).collect::<String>()))
                    .unwrap_or_default();
                format!("{tool_name} at {progress}{of}{what}, invocation {invocation_id}")
            }
            DomainEvent::ToolExecutionCancelled {
                tool_name,
                duration_ms,
                invocation_id,
                ..
            } => {
                format!("{tool_name} cancelled after {duration_ms} ms (files restored), invocation {invocation_id}")
            }
            DomainEvent::ToolNetworkDenied {
                tool_name,
                host,
                port,
                reason,
                invocation_id,
                ..
            } => {
                format!("{tool_name} refused a connection to {host}:{port} ({reason}), invocation {invocation_id}")
            }
            DomainEvent::WorkspaceStaged {
                tool_name,
                state,
                summary,
                invocation_id,
                ..
            } => {
                let paths = summary["paths"].as_u64().unwrap_or(0);
                format!("{tool_name} staged {paths} changed paths ({state}), invocation {invocation_id}")
            }
            DomainEvent::WorkspaceSettled {
                state,
                by,
                summary,
                invocation_id,
                ..
            } => {
                let paths = summary["paths"].as_u64().unwrap_or(0);
                format!("staged change set of invocation {invocation_id} ({paths} paths) {state} by the {by}")
            }
            // `summary` routes no other type here; were one, its type id is what it shows.
            _ => self.type_id().to_owned(),
        }
    }

    /// [`DomainEvent::summary`] of a background job's or an MCP server's start or end.
    fn process_summary(&self) -> String {
        match self {
            DomainEvent::JobStarted {
                job_id,
                command,
                invocation_id,
                ..
            } => {
                format!(
                    "job {job_id} started: {}, invocation {invocation_id}",
                    command.join(" ")
                )
            }
            DomainEvent::JobExited {
                job_id,
                reason,
                exit_code,
                signal,
                duration_ms,
                ..
            } => {
                let how = match (exit_code, signal) {
                    (Some(c), _) => format!(", exit code {c}"),
                    (None, Some(s)) => format!(", signal {s}"),
                    (None, None) => String::new(),
                };
                let after = duration_ms
                    .map(|d| format!(" after {d} ms"))
                    .unwrap_or_default();
                format!("job {job_id} ended ({reason}{how}){after}")
            }
            DomainEvent::McpServerStarted {
                server,
                protocol_version,
                tools,
                ..
            } => {
                format!(
                    "mcp server {server} started (protocol {protocol_version}, {} tools)",
                    tools.len()
                )
            }
            DomainEvent::McpServerExited {
                server,
                reason,
                exit_code,
                signal,
            } => {
                let how = match (exit_code, signal) {
                    (Some(c), _) => format!(", exit code {c}"),
                    (None, Some(s)) => format!(", signal {s}"),
                    (None, None) => String::new(),
                };
                format!("mcp server {server} ended ({reason}{how})")
            }
            DomainEvent::McpRequestRefused {
                server,
                host,
                port,
                reason,
            } => format!("mcp server {server}: a request to {host}:{port} refused ({reason})"),
            DomainEvent::McpToolsPinned {
                server, tools, by, ..
            } => {
                format!(
                    "mcp server {server}: {} tool definitions pinned ({by})",
                    tools.len()
                )
            }
            DomainEvent::McpToolHeld {
                server,
                tool,
                pinned,
                action,
                ..
            } => {
                let what = if pinned.is_some() {
                    "changed since it was pinned"
                } else {
                    "added after the pin"
                };
                format!("mcp server {server}: tool {tool} {what}; held ({action})")
            }
            // `summary` routes no other type here; were one, its type id is what it shows.
            _ => self.type_id().to_owned(),
        }
    }

    /// [`DomainEvent::summary`] of a durable session step's start, result or failed try.
    fn step_summary(&self) -> String {
        match self {
            DomainEvent::SessionWaiting {
                session_id,
                step,
                name,
            } => format!("session {session_id}: step {step:?} waits for signal {name:?}"),
            DomainEvent::SessionSignaled {
                session_id,
                name,
                by,
                ..
            } => match by {
                Some(by) => format!("session {session_id}: signal {name:?} sent by {by}"),
                None => format!("session {session_id}: signal {name:?} sent"),
            },
            DomainEvent::SessionStepStarted {
                session_id,
                step,
                kind,
                attempt,
                ..
            } => {
                format!("session {session_id}: step {step:?} ({kind}) started, try {attempt}")
            }
            DomainEvent::SessionStepCompleted {
                session_id,
                step,
                kind,
                recovered,
                ..
            } => match recovered {
                Some(from) => {
                    format!("session {session_id}: step {step:?} ({kind}) closed from {from}")
                }
                None => format!("session {session_id}: step {step:?} ({kind}) recorded"),
            },
            DomainEvent::SessionStepFailed {
                session_id,
                step,
                kind,
                attempt,
                error,
            } => {
                let short: String = error.chars().take(120).collect();
                format!(
                    "session {session_id}: step {step:?} ({kind}) try {attempt} failed: {short}"
                )
            }
            // `summary` routes no other type here; were one, its type id is what it shows.
            _ => self.type_id().to_owned(),
        }
    }

    /// What a payload's free-form fields fail to hold, beyond their types: a step's answer,
    /// result and context are JSON the session reads back, so `verify` and the session's own
    /// reading check their shape alike.
    pub(crate) fn shape_problem(&self) -> Option<String> {
        let DomainEvent::SessionStepCompleted {
            answer,
            result,
            context,
            signal,
            ..
        } = self
        else {
            return None;
        };
        if let Some(a) = answer {
            let ok = a["text"].is_string()
                && a["usage"].is_object()
                && a["finish_reason"].is_string()
                && a["model"].is_string();
            if !ok {
                return Some(
                    "a step's answer lacks its text, usage, finish_reason or model".into(),
                );
            }
        }
        if let Some(r) = result {
            let ok = matches!(r["status"].as_str(), Some("success" | "failure"))
                && r["invocation_id"].is_string();
            if !ok {
                return Some("a step's result lacks its status or invocation id".into());
            }
        }
        if let Some(c) = context {
            if !(c["keep"].is_u64() && c["entries"].is_array()) {
                return Some("a step's context lacks keep or entries".into());
            }
        }
        if answer.is_none() && result.is_none() && signal.is_none() {
            return Some("a step's record holds neither an answer, a result nor a signal".into());
        }
        None
    }

    /// The event ready to append, with a fresh event id.
    pub fn to_new_event(&self) -> NewEvent {
        // Serializing a plain struct of strings and numbers cannot fail.
        let payload = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(mut tagged)) => {
                tagged.remove("data").unwrap_or(serde_json::Value::Null)
            }
            _ => serde_json::Value::Null,
        };
        NewEvent::new(self.type_id(), SCHEMA_VERSION, payload)
    }

    /// Decodes a recorded event; `Ok(None)` for a type id correx does not know.
    pub(super) fn decode(event: &RecordedEvent) -> Result<Option<DomainEvent>> {
        if !Self::TYPE_IDS.contains(&event.type_id.as_str()) {
            return Ok(None);
        }
        let corrupt = |detail: String| EventStoreError::CorruptEvent {
            position: event.position,
            detail,
        };
        if event.schema_version != SCHEMA_VERSION {
            return Err(corrupt(format!(
                "{} has schema version {}, this build reads {SCHEMA_VERSION}",
                event.type_id, event.schema_version
            )));
        }
        let tagged = serde_json::json!({"type": event.type_id, "data": event.payload});
        let parsed = serde_json::from_value::<DomainEvent>(tagged);
        match parsed {
            Ok(d) if d.type_id() == event.type_id => Ok(Some(d)),
            Ok(d) => Err(corrupt(format!(
                "payload of {} decodes as {}",
                event.type_id,
                d.type_id()
            ))),
            Err(e) => Err(corrupt(format!("payload of {}: {e}", event.type_id))),
        }
    }
}
