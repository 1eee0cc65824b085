//! Tools: running one through the sandbox, and listing them.

use super::cancel::{correx_cancel, token};
use super::convert::request_arg;
use super::runtime::{answer_json, correx_runtime};
use super::{correx_error, FfiResult};
use crate::approvals::ApprovalContext;
use crate::ids::{SessionId, ToolInvocationId};
use crate::tools::ToolRequest;
use serde_json::{json, Value};
use std::ffi::c_char;

pub(super) fn tool_request_json(r: &ToolRequest) -> Value {
    json!({
        "v": 1,
        "invocation_id": r.invocation_id,
        "session_id": r.session_id,
        "tool_name": r.tool_name,
        "parameters": r.parameters,
    })
}

/// A tool request from the host's fields: the invocation id is generated when absent.
pub(super) fn tool_request(
    invocation_id: Option<String>,
    session_id: SessionId,
    tool_name: String,
    parameters: serde_json::Map<String, Value>,
) -> ToolRequest {
    ToolRequest {
        invocation_id: invocation_id
            .map(ToolInvocationId::from_string)
            .unwrap_or_else(ToolInvocationId::random),
        session_id,
        tool_name,
        parameters,
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolRequestIn {
    session_id: String,
    tool_name: String,
    #[serde(default)]
    invocation_id: Option<String>,
    #[serde(default)]
    parameters: serde_json::Map<String, Value>,
}

/// Runs a tool through the sandbox: T2 and T3 tools ask the approval callback first; every path
/// the tool touches is backed up and restored if it fails; started / completed / failed /
/// rejected events go to the stream `session-{session_id}`.
///
/// # Parameters
/// - `request_json`: `{"v": 1, "session_id": "s1", "tool_name": "file_write",
///   "invocation_id": "optional, generated when absent", "parameters": {...}}`.
/// - `out_json`: receives `{"v": 1, "status": "success", "invocation_id", "output", "metadata",
///   "data"}` or `{"v": 1, "status": "failure", "invocation_id", "reason", "recoverable",
///   "kind", "data"}`. `kind` is stable for programs: `invalid_request`, `not_allowed`,
///   `escape`, `not_found`, `too_large`, `symlink_loop`, `wrong_kind`, `timed_out`,
///   `cancelled`, `non_zero_exit`, `signalled`, `io`, `interrupted`, `conflict`, `other`. `data` (absent when the tool
///   gave none): the shell's `{"exit_code", "signal", "stdout", "stderr", "stdout_truncated",
///   "stderr_truncated", "stdout_dropped_bytes", "stderr_dropped_bytes", "timed_out",
///   "cancelled", "duration_ms"}` for every run, with `stdout_base64`/`stderr_base64` holding
///   the exact bytes of output that is not UTF-8; `file_read`'s `{"entries": [{"name",
///   "kind"}]}` (list), `{"exists": bool}`, `{"bytes", "utf8", "content_base64"?}` (read). The
///   shell takes an optional `timeout_ms`, at most the configured timeout. A tool that fails
///   (or is denied, or unknown) is still `CORREX_OK`: the result says so.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks while the approver decides and the tool runs (a shell command up to its timeout).
/// Any thread; tools on different files run in parallel, on one file one after another.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_tool_execute(
    rt: *const correx_runtime,
    request_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    // SAFETY: forwarded under this function's contract; no cancel.
    unsafe { correx_tool_execute_with_cancel(rt, request_json, std::ptr::null(), out_json, err) }
}

/// As `correx_tool_execute`, stoppable through `cancel` from any thread. Cancelled before the
/// tool starts (also while the approver decides), the run is rejected and nothing changes.
/// Cancelled while it runs: a shell run's every process is killed at once; a file tool
/// completes its one atomic change (the result then says success) or never starts it; a
/// failed or stopped run has its files restored, and `tool.execution_cancelled` is recorded.
///
/// # Returns
/// As `correx_tool_execute`: a cancelled run is `CORREX_OK` with a `failure` result whose
/// reason says it was cancelled.
///
/// # Blocking and threads
/// As `correx_tool_execute`; `correx_cancel_trigger` from another thread makes it return soon.
///
/// # Safety
/// Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
#[no_mangle]
pub unsafe extern "C" fn correx_tool_execute_with_cancel(
    rt: *const correx_runtime,
    request_json: *const c_char,
    cancel: *const correx_cancel,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let input: ToolRequestIn = unsafe { request_arg(request_json, "request_json") }?;
        let request = tool_request(
            input.invocation_id,
            SessionId::from_string(input.session_id),
            input.tool_name,
            input.parameters,
        );
        let result = r.runtime.executor().execute_cancellable_in(
            &request,
            &ApprovalContext::new(request.session_id.clone()),
            &token(cancel),
        );
        let v = serde_json::to_value(&result).unwrap_or(Value::Null);
        Ok(v)
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// Lists the tools: every tool the config enabled, and the built-in ones it left disabled.
///
/// # Parameters
/// - `out_json`: receives `{"v": 1, "tools": [{"name": "file_read", "tier": 1, "description":
///   "...", "operations": ["read", "list", "exists"], "parameters": {JSON schema}, "enabled":
///   true}, ...]}`, ordered by name. `parameters` can be passed as-is as a model tool's
///   `parameters` in `correx_infer`'s `config.tools`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Never blocks. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_tools_list(
    rt: *const correx_runtime,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let tools: Vec<Value> = r
            .runtime
            .executor()
            .registry()
            .describe()
            .into_iter()
            .map(|d| {
                json!({
                    "name": d.name,
                    "tier": d.tier as i32,
                    "description": d.description,
                    "operations": d.operations,
                    "parameters": d.parameters,
                    "enabled": d.enabled,
                })
            })
            .collect();
        Ok(json!({ "tools": tools }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}
