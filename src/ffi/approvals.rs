//! Durable approval requests: listing them and deciding them, from any process on the log.

use super::convert::{request_arg, str_arg};
use super::runtime::{answer_json, correx_runtime};
use super::{
    correx_error, Failure, FfiResult, CORREX_E_CONFLICT, CORREX_E_EVENT_STORE,
    CORREX_E_INVALID_ARGUMENT, CORREX_E_NOT_FOUND,
};
use crate::approvals::{ApprovalDecision, ApprovalError};
use serde_json::Value;
use std::ffi::c_char;

fn approval_failure(e: ApprovalError) -> Failure {
    let code = match &e {
        ApprovalError::InvalidRequest(_) => CORREX_E_INVALID_ARGUMENT,
        ApprovalError::NotFound { .. } => CORREX_E_NOT_FOUND,
        ApprovalError::AlreadyDecided { .. } | ApprovalError::Expired { .. } => CORREX_E_CONFLICT,
        _ => CORREX_E_EVENT_STORE,
    };
    Failure::new(code, e.to_string())
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum DecisionName {
    Approve,
    ApproveForSession,
    Deny,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionIn {
    decision: DecisionName,
    identity: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Decides durable approval request `request_id` of session `session_id` (a run whose
/// approver deferred: the `CORREX_E_PENDING` of `correx_session_execute` names it). The first
/// decision wins; the step that asked runs once, when it is called again after an approval.
///
/// # Parameters
/// - `session_id`, `request_id`: 1 to 256 bytes of UTF-8 without control characters.
/// - `decision_json`: `{"v": 1, "decision": "approve"|"approve_for_session"|"deny",
///   "identity": "who decides, 1 to 256 bytes", "reason": "a denial's reason (optional)"}`.
/// - `out_json`: receives the recorded decision: `{"decision", "decided_by": "api",
///   "identity", "reason", "at_ms", "position"}`.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_CONFLICT` when the request was decided already (the message names
/// the first decision, which stands) or its deadline passed (it is now recorded expired);
/// `CORREX_E_NOT_FOUND` when the session has no such request; `CORREX_E_INVALID_ARGUMENT`,
/// `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Reads the session's stream and appends one event. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_approvals_decide(
    rt: *const correx_runtime,
    session_id: *const c_char,
    request_id: *const c_char,
    decision_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: the contract above says these are NULL or valid C strings.
        let session = unsafe { str_arg(session_id, "session_id") }?;
        // SAFETY: as above.
        let request = unsafe { str_arg(request_id, "request_id") }?;
        // SAFETY: as above.
        let input: DecisionIn = unsafe { request_arg(decision_json, "decision_json") }?;
        let decision = match input.decision {
            DecisionName::Approve => ApprovalDecision::Approved,
            DecisionName::ApproveForSession => ApprovalDecision::ApprovedForSession,
            DecisionName::Deny => ApprovalDecision::denied(
                input
                    .reason
                    .unwrap_or_else(|| "denied by the host".to_owned()),
            ),
        };
        let decided = r
            .runtime
            .approvals()
            .decide(session, request, &decision, &input.identity)
            .map_err(approval_failure)?;
        Ok(serde_json::to_value(&decided).unwrap_or(Value::Null))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// The durable approval requests: those of session `session_id`, decided or not, or (with a
/// NULL `session_id`) every request of the log that waits (`all` nonzero: decided ones too).
/// A request found past its deadline is recorded expired first.
///
/// # Parameters
/// - `out_json`: receives `{"v": 1, "requests": [{"session_id", "request_id", "tool_name",
///   "tier", "parameters", "argv", "paths", "asked_by", "requested_at_ms", "deadline_ms",
///   "position", "decision": null | {"decision", "decided_by", "identity", "reason", "at_ms",
///   "position"}}]}`, oldest first.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`,
/// `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// With a session: reads what its stream appended since the last call. Without: reads the
/// whole log. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_approvals_list(
    rt: *const correx_runtime,
    session_id: *const c_char,
    all: i32,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let approvals = r.runtime.approvals();
        let records = if session_id.is_null() {
            approvals.list(all != 0)
        } else {
            // SAFETY: not NULL, so a valid C string per the contract above.
            let session = unsafe { str_arg(session_id, "session_id") }?;
            approvals.of_session(session)
        }
        .map_err(approval_failure)?;
        Ok(serde_json::json!({ "requests": records }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}
