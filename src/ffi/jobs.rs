//! Background jobs: what the host reads, waits for, signals and stops, and a session's end.

use super::cancel::{correx_cancel, token};
use super::convert::{json_v1, str_arg};
use super::runtime::{answer_json, correx_runtime, with_runtime};
use super::{correx_error, Failure, FfiResult, CORREX_E_INVALID_ARGUMENT, CORREX_E_TOOL_SETUP};
use crate::tools::ToolErrorKind;
use serde_json::Value;
use std::ffi::c_char;

/// One request on a session's background jobs (those a `shell` request with
/// `"background": true` started), as the `jobs` tool takes it but from the host: no approval,
/// nothing recorded but the jobs' own `job.started` / `job.exited`.
///
/// # Parameters
/// - `request_json`: `{"v": 1, "session_id": "s1", "operation": "list"|"read"|"wait"|"signal"|
///   "stop", "job_id": "job-…", "stdout_cursor", "stderr_cursor", "max_bytes" (read),
///   "timeout_ms" (wait, at most 60000), "signal": "TERM"|"INT"|"KILL"|"HUP"|"QUIT"|"USR1"|
///   "USR2"|"STOP"|"CONT" (signal)}`.
/// - `cancel`: NULL, or a token that ends a `wait` early (not the job).
/// - `out_json`: receives `{"v": 1, "jobs": [{"job_id", "command", "state", ...}]}` (list);
///   `{"v": 1, "stdout", "stderr", "stdout_cursor", "stderr_cursor", "stdout_dropped",
///   "stderr_dropped", "status"}` (read: output since the cursors, as lossy UTF-8, with the
///   cursors to pass next and the bytes the job's buffer no longer held); `{"v": 1, "status"}`
///   (wait, stop); `{"v": 1, "sent"}` (signal). A status is `{"state": "running",
///   "elapsed_ms"}` or `{"state": "ended", "reason": "exited"|"stopped"|"timed_out"|
///   "session_ended"|"runtime_closed", "exit_code", "signal", "duration_ms"}`.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_INVALID_ARGUMENT` for a malformed request, an unknown operation, a
/// job id this session does not have, or a signal not listed; `CORREX_E_TOOL_SETUP` when a
/// system call failed; `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// `wait` blocks up to its `timeout_ms`; `stop` up to about 2 s (SIGTERM, then every process
/// of the job killed). The rest never block. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
#[no_mangle]
pub unsafe extern "C" fn correx_jobs(
    rt: *const correx_runtime,
    request_json: *const c_char,
    cancel: *const correx_cancel,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let text = unsafe { str_arg(request_json, "request_json") }?;
        let mut params = json_v1(text, "request_json")?;
        let session = match params.remove("session_id") {
            Some(Value::String(s)) => s,
            _ => {
                return Err(Failure::new(
                    CORREX_E_INVALID_ARGUMENT,
                    "request_json.session_id must be a string",
                ))
            }
        };
        crate::tools::jobs::operate(r.runtime.jobs(), &session, &params, &token(cancel)).map_err(
            |(kind, reason)| {
                let code = match kind {
                    ToolErrorKind::InvalidRequest => CORREX_E_INVALID_ARGUMENT,
                    _ => CORREX_E_TOOL_SETUP,
                };
                Failure::new(code, format!("request_json: {reason}"))
            },
        )
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// Ends a session's background jobs: each gets SIGTERM, then after about 2 s every process of
/// it is killed, and its end is recorded (`job.exited`, reason `session_ended`). Returns once
/// they are all gone. A session with no jobs is a no-op. The runtime also lets go of what it
/// kept of the session's steps in memory (the log keeps them all: a later
/// `correx_session_infer` reads them again).
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT` (not UTF-8, or an id no session
/// call takes: empty, over 256 bytes, or holding a control character), `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Blocks up to about 2 s while jobs end. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_session_end(
    rt: *const correx_runtime,
    session_id: *const c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        // SAFETY: forwarded.
        let session = unsafe { str_arg(session_id, "session_id") }?;
        crate::sessions::check_session_id(session).map_err(super::sessions::session_failure)?;
        r.runtime.jobs().end_session(session);
        r.runtime.forget_session(session);
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}
