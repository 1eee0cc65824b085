//! The tool contracts: what a tool is, what it is asked, and what it answers.

use crate::cancel::CancelToken;
use crate::ids::{SessionId, ToolInvocationId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// Risk tier of a tool, ordered by numeric value: T0 (inert) < T1 (reads) < T2 (writes, runs
/// processes) < T3 (hardest to verify, such as patches).
///
/// An unknown numeric tier counts as [`Tier::T3`], so a tier from a newer host is never treated
/// as less risky than it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(i32)]
pub enum Tier {
    /// No side effects.
    T0 = 0,
    /// Reads only.
    T1 = 1,
    /// Writes files or runs processes.
    T2 = 2,
    /// Changes that are hardest to verify.
    T3 = 3,
}

impl Tier {
    /// The tier for a number; anything outside 0..=3 is T3.
    pub fn from_i32(n: i32) -> Tier {
        match n {
            0 => Tier::T0,
            1 => Tier::T1,
            2 => Tier::T2,
            _ => Tier::T3,
        }
    }

    /// The tier's number (0..=3).
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// Whether a tool of this tier must be evaluated by the approval engine (T2 and T3).
    pub fn needs_approval(self) -> bool {
        match self {
            Tier::T0 | Tier::T1 => false,
            Tier::T2 | Tier::T3 => true,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}", self.as_i32())
    }
}

/// What a tool needs from the machine; informational, for hosts that show or filter tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCapability {
    /// Runs an executable.
    ShellExec,
    /// Spawns a child process.
    ProcessSpawn,
    /// Reads files.
    FileRead,
    /// Writes, edits or deletes files.
    FileWrite,
}

/// One request to run a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolRequest {
    /// Unique per invocation; the tool events carry it.
    pub invocation_id: ToolInvocationId,
    /// The session the invocation belongs to.
    pub session_id: SessionId,
    /// The registered tool name, e.g. `file_write`.
    pub tool_name: String,
    /// The tool's parameters, as a JSON object.
    #[serde(default)]
    pub parameters: serde_json::Map<String, serde_json::Value>,
}

impl ToolRequest {
    /// A request with a fresh invocation id.
    pub fn new(
        session_id: SessionId,
        tool_name: impl Into<String>,
        parameters: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        ToolRequest {
            invocation_id: ToolInvocationId::random(),
            session_id,
            tool_name: tool_name.into(),
            parameters,
        }
    }

    /// A request with a fresh invocation id from a JSON object of parameters, in one line:
    /// `ToolRequest::json("s1", "shell", json!({"argv": ["ls"]}))?`.
    ///
    /// # Errors
    /// A message naming the problem when `parameters` is not a JSON object.
    pub fn json(
        session_id: impl Into<SessionId>,
        tool_name: impl Into<String>,
        parameters: serde_json::Value,
    ) -> Result<Self, String> {
        match parameters {
            serde_json::Value::Object(map) => Ok(Self::new(session_id.into(), tool_name, map)),
            other => Err(format!(
                "a tool's parameters are a JSON object, not {}",
                crate::tools::json_kind(&other)
            )),
        }
    }

    /// A string parameter, if present and a string.
    pub fn str_param(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).and_then(|v| v.as_str())
    }
}

/// What kind of failure a [`ToolResult::Failure`] is: stable names a program can branch on
/// (the `reason` is prose for a model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolErrorKind {
    /// The request is malformed (a missing or mistyped parameter, an unknown operation or
    /// tool); it never ran.
    InvalidRequest,
    /// A policy refused it: denied by the approver or a rule, an executable not allowed, a
    /// file the tools must not write, no roots configured.
    NotAllowed,
    /// The path resolves outside the allowed roots (`..`, an escaping or absolute symlink, a
    /// magic link).
    Escape,
    /// The path, or a directory on the way, does not exist.
    NotFound,
    /// The file is larger than the read cap.
    TooLarge,
    /// A symlink loop inside a root.
    SymlinkLoop,
    /// A directory where a file was needed, or the other way round.
    WrongKind,
    /// The run passed its timeout and was killed.
    TimedOut,
    /// The host cancelled it.
    Cancelled,
    /// The command exited with a non-zero code.
    NonZeroExit,
    /// The command was killed by a signal.
    Signalled,
    /// A system error (I/O, a resource limit, the sandbox's own setup).
    Io,
    /// The host died while it ran, and recovery closed the run (a session step answers with
    /// it): its files were restored, unless the reason says it had completed.
    Interrupted,
    /// A staged run's change set was not promoted: paths it changed were changed in the real
    /// tree too while it ran (`data.workspace.conflicts` names them); nothing was applied.
    Conflict,
    /// It waits for a durable approval decision (`data.approval.request_id` names the
    /// request): nothing ran; ask for it again (same invocation id, or the same session step)
    /// after a decision.
    Pending,
    /// Anything else.
    #[default]
    Other,
}

impl ToolErrorKind {
    /// The kind's stable name, e.g. `not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorKind::InvalidRequest => "invalid_request",
            ToolErrorKind::NotAllowed => "not_allowed",
            ToolErrorKind::Escape => "escape",
            ToolErrorKind::NotFound => "not_found",
            ToolErrorKind::TooLarge => "too_large",
            ToolErrorKind::SymlinkLoop => "symlink_loop",
            ToolErrorKind::WrongKind => "wrong_kind",
            ToolErrorKind::TimedOut => "timed_out",
            ToolErrorKind::Cancelled => "cancelled",
            ToolErrorKind::NonZeroExit => "non_zero_exit",
            ToolErrorKind::Signalled => "signalled",
            ToolErrorKind::Io => "io",
            ToolErrorKind::Interrupted => "interrupted",
            ToolErrorKind::Conflict => "conflict",
            ToolErrorKind::Pending => "pending",
            ToolErrorKind::Other => "other",
        }
    }
}

/// What a tool answered.
///
/// `data` holds what a program reads without parsing prose: for the shell `{"exit_code",
/// "signal", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "stdout_dropped_bytes",
/// "stderr_dropped_bytes", "duration_ms"}` on a success, a non-zero exit, a signal, a timeout
/// and a cancel alike (output that is not UTF-8 comes as `stdout_base64`/`stderr_base64`
/// instead); for `file_read` `list` `{"entries": [{"name", "kind"}]}`, `exists` `{"exists":
/// bool}`, `read` `{"bytes", "utf8"}` (and `content_base64` when the file is not UTF-8).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolResult {
    /// The tool did its job.
    Success {
        /// The invocation this answers.
        invocation_id: ToolInvocationId,
        /// The tool's output (file contents, stdout, a listing).
        output: String,
        /// Extra facts, such as an exit code or a truncation flag.
        #[serde(default)]
        metadata: BTreeMap<String, String>,
        /// The structured result (see the type's docs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<serde_json::Value>,
    },
    /// The tool did not do its job; `reason` is written for a model to act on.
    Failure {
        /// The invocation this answers.
        invocation_id: ToolInvocationId,
        /// What went wrong and, where it helps, what to try.
        reason: String,
        /// Whether the same request may succeed after a change the model can make (a different
        /// argument); false when retrying cannot help (denied, outside the allowed roots).
        recoverable: bool,
        /// What kind of failure, for programs.
        #[serde(default)]
        kind: ToolErrorKind,
        /// The structured result (see the type's docs), when the tool got that far.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<serde_json::Value>,
    },
}

/// Whether a failed request may succeed after a change the model can make (a different
/// argument, a shorter timeout): the `recoverable` of [`ToolResult::Failure`], named at each
/// call instead of a bare `true` or `false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recoverable {
    /// A changed request may succeed.
    Yes,
    /// Retrying cannot help (denied, outside the allowed roots, the tool is broken).
    No,
}

impl From<bool> for Recoverable {
    fn from(recoverable: bool) -> Self {
        if recoverable {
            Recoverable::Yes
        } else {
            Recoverable::No
        }
    }
}

impl ToolResult {
    /// A success with no metadata.
    pub fn success(invocation_id: &ToolInvocationId, output: impl Into<String>) -> Self {
        ToolResult::Success {
            invocation_id: invocation_id.clone(),
            output: output.into(),
            metadata: BTreeMap::new(),
            data: None,
        }
    }

    /// A failure of kind [`ToolErrorKind::Other`]; a reason over 4 KiB is cut (it may quote a
    /// huge argument).
    pub fn failure(
        invocation_id: &ToolInvocationId,
        reason: impl Into<String>,
        recoverable: Recoverable,
    ) -> Self {
        Self::failure_of(invocation_id, ToolErrorKind::Other, reason, recoverable)
    }

    /// A failure of `kind`; a reason over 4 KiB is cut.
    pub fn failure_of(
        invocation_id: &ToolInvocationId,
        kind: ToolErrorKind,
        reason: impl Into<String>,
        recoverable: Recoverable,
    ) -> Self {
        ToolResult::Failure {
            invocation_id: invocation_id.clone(),
            reason: crate::text::bounded(reason),
            recoverable: recoverable == Recoverable::Yes,
            kind,
            data: None,
        }
    }

    /// This result with its structured `data` set.
    pub fn with_data(mut self, value: serde_json::Value) -> Self {
        match &mut self {
            ToolResult::Success { data, .. } | ToolResult::Failure { data, .. } => {
                *data = Some(value)
            }
        }
        self
    }

    /// The structured result, if the tool gave one.
    pub fn data(&self) -> Option<&serde_json::Value> {
        match self {
            ToolResult::Success { data, .. } | ToolResult::Failure { data, .. } => data.as_ref(),
        }
    }

    /// A failure's kind; `None` for a success.
    pub fn error_kind(&self) -> Option<ToolErrorKind> {
        match self {
            ToolResult::Success { .. } => None,
            ToolResult::Failure { kind, .. } => Some(*kind),
        }
    }

    /// Whether this is a success.
    pub fn is_success(&self) -> bool {
        matches!(self, ToolResult::Success { .. })
    }

    /// The invocation this answers.
    pub fn invocation_id(&self) -> &ToolInvocationId {
        match self {
            ToolResult::Success { invocation_id, .. }
            | ToolResult::Failure { invocation_id, .. } => invocation_id,
        }
    }
}

/// Whether a request is well formed for a tool, before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValidationResult {
    /// The request may run.
    Valid,
    /// The request is malformed; `reason` says which parameter and why.
    Invalid {
        /// Which parameter is wrong and why.
        reason: String,
    },
}

impl ValidationResult {
    /// Whether the request is valid.
    pub fn is_valid(&self) -> bool {
        matches!(self, ValidationResult::Valid)
    }
}

/// A tool an agent may call. Implementations are blocking and shared across threads.
pub trait Tool: Send + Sync {
    /// The registered name, unique in a registry.
    fn name(&self) -> &str;
    /// The risk tier, which decides whether the approval engine is asked.
    fn tier(&self) -> Tier;
    /// What the tool needs from the machine.
    fn required_capabilities(&self) -> &[ToolCapability];
    /// Checks the request's shape without side effects.
    fn validate_request(&self, request: &ToolRequest) -> ValidationResult;
    /// Runs the tool. Never panics on bad input: every problem is a [`ToolResult::Failure`].
    fn execute(&self, request: &ToolRequest) -> ToolResult;
    /// Runs the tool unless `cancel` is set. The default checks once, before the tool starts
    /// (a file tool then completes its one atomic change); the shell watches the token for the
    /// whole run and kills every process of it.
    fn execute_cancellable(&self, request: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        if cancel.is_cancelled() {
            return cancelled_before_start(request);
        }
        self.execute(request)
    }
    /// What the tool does, for a person or a model; default empty.
    fn description(&self) -> &str {
        ""
    }
    /// A JSON schema of the request's parameters (usable as a model's tool definition);
    /// default: any object.
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    /// Why a person must decide this run whatever its tier and the policy's rules say (an MCP
    /// tool whose definition changed since it was pinned); none for most tools. See
    /// [`crate::ApprovalRequest::notice`].
    fn approval_notice(&self) -> Option<String> {
        None
    }
    /// The kernel confinement every run of this tool gets, as recorded in
    /// `tool.execution_started`; `None` for tools that run in the host process.
    fn isolation(&self) -> Option<&crate::confine::AppliedPolicy> {
        None
    }
    /// The tool as a [`FileAffectingTool`], when it touches files the sandbox must back up.
    fn as_file_affecting(&self) -> Option<&dyn FileAffectingTool> {
        None
    }
    /// The change sets the tool's staged runs left for the host (a shell with `workspace:
    /// "staged"`); `None` for a tool whose runs change files in place.
    fn workspace(&self) -> Option<&dyn crate::workspace::Workspace> {
        None
    }
}

/// A tool that changes files: the sandbox backs up [`FileAffectingTool::affected_paths`] before
/// the tool runs and restores them if it fails.
pub trait FileAffectingTool: Tool {
    /// The absolute paths (inside the tool's allowed roots) that `request` may create, change or
    /// delete; empty for read-only operations.
    ///
    /// # Errors
    /// A reason a model can act on, when the request names a path that is malformed or outside
    /// every allowed root.
    fn affected_paths(&self, request: &ToolRequest) -> Result<Vec<PathBuf>, String>;

    /// As [`FileAffectingTool::affected_paths`], with the failure's kind (by default
    /// [`ToolErrorKind::InvalidRequest`]); the sandbox rejects with it.
    ///
    /// # Errors
    /// The kind and the reason.
    fn affected_paths_or_kind(
        &self,
        request: &ToolRequest,
    ) -> Result<Vec<PathBuf>, (ToolErrorKind, String)> {
        self.affected_paths(request)
            .map_err(|r| (ToolErrorKind::InvalidRequest, r))
    }

    /// The directories (canonical, absolute) the affected paths must stay under. The sandbox
    /// backs up and restores each path through its directory opened beneath the longest of
    /// these that holds it, refusing symlinks on the way, so a directory swapped for a symlink
    /// while the tool runs cannot redirect a backup or a restore. Default: none (from `/`).
    fn confining_roots(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}

/// Something that runs tool requests: a dispatcher, a sandbox, or a single tool.
pub trait ToolExecutor: Send + Sync {
    /// Runs `request` and answers; never panics on bad input.
    fn execute(&self, request: &ToolRequest) -> ToolResult;
    /// As [`ToolExecutor::execute`], stopping when `cancel` is set (see
    /// [`Tool::execute_cancellable`]); the default checks once, before starting.
    fn execute_cancellable(&self, request: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        if cancel.is_cancelled() {
            return cancelled_before_start(request);
        }
        self.execute(request)
    }

    /// Closes the runs a dead host left unfinished (restoring their files and recording their
    /// outcome), as opening the executor does; the default has none to close.
    fn recover_dead(&self) {}
}

/// The answer to a request cancelled before its tool started.
pub(crate) fn cancelled_before_start(request: &ToolRequest) -> ToolResult {
    ToolResult::failure_of(
        &request.invocation_id,
        ToolErrorKind::Cancelled,
        "cancelled by the host before the tool started; nothing was changed",
        Recoverable::No,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_order_by_number_and_unknown_is_t3() {
        assert!(Tier::T0 < Tier::T1 && Tier::T1 < Tier::T2 && Tier::T2 < Tier::T3);
        assert_eq!(Tier::from_i32(7), Tier::T3);
        assert_eq!(Tier::from_i32(-1), Tier::T3);
        assert_eq!(Tier::from_i32(1), Tier::T1);
        assert!(!Tier::T1.needs_approval() && Tier::T2.needs_approval());
    }
}
