//! Durable sessions: steps performed once and answered from the log after, and the
//! transcript a new process continues from.

use super::cancel::{correx_cancel, token};
use super::convert::{request_arg, str_arg};
use super::models::{correx_chunk_fn, forwarder, inference_failure, known_model, response_json};
use super::runtime::{answer_json, correx_runtime};
use super::tools::tool_request;
use super::{
    correx_error, Failure, FfiResult, CORREX_E_BUSY, CORREX_E_CANCELLED, CORREX_E_CONFLICT,
    CORREX_E_EVENT_STORE, CORREX_E_INVALID_ARGUMENT, CORREX_E_PENDING,
};
use crate::ids::SessionId;
use crate::inference::InferenceRequest;
use crate::sessions::{Session, SessionError, Step};
use serde_json::{json, Value};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

pub(super) fn session_failure(e: SessionError) -> Failure {
    if let SessionError::Inference(inner) = e {
        return inference_failure(inner);
    }
    let code = match &e {
        SessionError::InvalidRequest(_) => CORREX_E_INVALID_ARGUMENT,
        SessionError::Conflict { .. } | SessionError::AlreadySignaled { .. } => CORREX_E_CONFLICT,
        SessionError::InProgress { .. } | SessionError::InDoubt { .. } => CORREX_E_BUSY,
        SessionError::Cancelled => CORREX_E_CANCELLED,
        SessionError::Pending { .. } | SessionError::Waiting { .. } => CORREX_E_PENDING,
        _ => CORREX_E_EVENT_STORE,
    };
    Failure::new(code, e.to_string())
}

fn session_of(r: &correx_runtime, id: *const c_char) -> FfiResult<Arc<Session>> {
    // SAFETY: the callers' contracts say `id` is NULL or a valid C string.
    let id = unsafe { str_arg(id, "session_id") }?;
    r.runtime.session(id).map_err(session_failure)
}

/// As [`answer_json`], for a call on step `step` of session `session_id`: `body` gets the
/// session and the step key, checked in that order (after `rt` and `out_json`).
///
/// # Safety
/// As [`answer_json`]; `session_id` and `step` are NULL or valid C strings.
unsafe fn answer_step(
    rt: *const correx_runtime,
    session_id: *const c_char,
    step: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
    body: impl FnOnce(&correx_runtime, &Session, &str) -> FfiResult<Value>,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let session = session_of(r, session_id)?;
        // SAFETY: per the contract above.
        let step = unsafe { str_arg(step, "step") }?;
        body(r, &session, step)
    };
    // SAFETY: forwarded from our caller.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// A step's answer for the host: `value` made of its result, plus `"replayed"` and `"attempt"`.
fn step_json<T>(step: &Step<T>, value: impl FnOnce(&T) -> Value) -> Value {
    let mut v = value(&step.value);
    v["replayed"] = json!(step.replayed);
    v["attempt"] = json!(step.attempt);
    v["recovered"] = json!(step.recovered);
    v
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolStepIn {
    tool_name: String,
    #[serde(default)]
    invocation_id: Option<String>,
    #[serde(default)]
    parameters: serde_json::Map<String, Value>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    wait_ms: u64,
}

/// Performs inference step `step` of session `session_id` once: the first call asks the
/// model (as `correx_infer_stream`) and records the answer in the stream
/// `session-{session_id}`; a later call with the same step and request, from this process or
/// another, returns the recorded answer without asking the model. A step another caller is
/// performing is waited for.
///
/// # Parameters
/// - `session_id`, `step`: 1 to 256 bytes of UTF-8 without control characters; the host
///   chooses the step key, unique within the session.
/// - `model_id`, `request_json`, `cancel`, `on_chunk`, `user_data`: as
///   `correx_infer_stream` (a replayed answer comes to `on_chunk` whole: its reasoning, then
///   its text). `on_chunk` may be NULL.
/// - `out_json`: receives `correx_infer`'s answer plus `"replayed": bool` (true when the log
///   answered) and `"attempt"` (the try that produced it).
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_CONFLICT` when the step was recorded for another request (use a new
/// step key); `CORREX_E_INFERENCE` / `CORREX_E_CANCELLED` as `correx_infer` (nothing recorded
/// as the step's result: the next call tries again); `CORREX_E_BUSY` when a process in another
/// pid namespace holds the step; `CORREX_E_UNKNOWN_MODEL`, `CORREX_E_EVENT_STORE`,
/// `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for the generation, or while another caller performs the step (until its result,
/// or `cancel`). Any thread; steps may run concurrently. No lock is held during the model
/// call.
///
/// # Safety
/// Pointers are NULL or valid as documented; `on_chunk` is safe to call with `user_data` on
/// this thread; `cancel` is NULL or live for the whole call.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn correx_session_infer(
    rt: *const correx_runtime,
    session_id: *const c_char,
    step: *const c_char,
    model_id: *const c_char,
    request_json: *const c_char,
    cancel: *const correx_cancel,
    on_chunk: correx_chunk_fn,
    user_data: *mut c_void,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime, session: &Session, step: &str| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let id = unsafe { str_arg(model_id, "model_id") }?;
        // SAFETY: forwarded.
        let request: InferenceRequest = unsafe { request_arg(request_json, "request_json") }?;
        let d = known_model(r, id)?;
        // SAFETY: the host's promise on on_chunk and user_data is this function's contract.
        let mut forward = unsafe { forwarder(on_chunk, user_data) };
        let model = r.runtime.models().managed(&d);
        let answer = session
            .infer_stream(step, &model, &request, &token(cancel), &mut forward)
            .map_err(session_failure)?;
        Ok(step_json(&answer, response_json))
    };
    // SAFETY: rt, session_id, step, out_json and err are NULL or valid, per this function's
    // contract.
    unsafe { answer_step(rt, session_id, step, out_json, err, body) }
}

/// Performs tool step `step` of session `session_id` once, through the sandbox as
/// `correx_tool_execute_with_cancel` runs a tool (approval, backup, events): the first call
/// runs it and records its result; a later call with the same step and request returns the
/// recorded result without running it. When the host died while the run was under way, the
/// step answers with the run's recorded outcome (kind `interrupted`, with `data.state`:
/// `restored`, `unchanged`, `unknown` or `completed`) and never runs it again: the host decides whether
/// to try again under a new step key.
///
/// # Parameters
/// - `session_id`, `step`: as `correx_session_infer`.
/// - `request_json`: `{"v": 1, "tool_name": "file_write", "parameters": {...},
///   "call_id": "the model's tool call this answers (optional; the result joins the
///   transcript under it)", "invocation_id": "optional, generated when absent",
///   "wait_ms": 0}`. The step's digest covers the tool name, the parameters and the call
///   id. `wait_ms`: how long to wait for a durable approval decision the run needs (0: do
///   not wait).
/// - `cancel`: NULL, or a token that stops the run (as `correx_tool_execute_with_cancel`) or
///   ends a wait for another caller's run.
/// - `out_json`: receives `correx_tool_execute`'s result plus `"replayed"`, `"attempt"` and
///   `"recovered"` (true when the result is a dead run's recorded outcome: kind `interrupted`,
///   `data.state` saying where its files are).
///
/// # Returns
/// `CORREX_OK` (a tool that failed is still OK: the result says so); `CORREX_E_PENDING` when
/// the run waits for a durable approval decision (the message names the request; nothing
/// ran: decide it with `correx_approvals_decide` from any process, then call the step again);
/// `CORREX_E_CONFLICT` when the step was recorded for another request; `CORREX_E_BUSY` when
/// its owner died
/// mid-run and no recovery has closed the run yet (open a runtime on the sandbox root again),
/// or a process in another pid namespace holds it; `CORREX_E_CANCELLED` (a wait cancelled),
/// `CORREX_E_EVENT_STORE`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// As `correx_tool_execute`, or while another caller performs the step, or up to `wait_ms`
/// for an approval decision. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
#[no_mangle]
pub unsafe extern "C" fn correx_session_execute(
    rt: *const correx_runtime,
    session_id: *const c_char,
    step: *const c_char,
    request_json: *const c_char,
    cancel: *const correx_cancel,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime, session: &Session, step: &str| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let input: ToolStepIn = unsafe { request_arg(request_json, "request_json") }?;
        let request = tool_request(
            input.invocation_id,
            SessionId::from_string(session.id()),
            input.tool_name,
            input.parameters,
        );
        let done = session
            .execute_waiting(
                step,
                r.runtime.executor(),
                &request,
                input.call_id.as_deref(),
                std::time::Duration::from_millis(input.wait_ms),
                &token(cancel),
            )
            .map_err(session_failure)?;
        Ok(step_json(&done, |result| {
            serde_json::to_value(result).unwrap_or(Value::Null)
        }))
    };
    // SAFETY: rt, session_id, step, out_json and err are NULL or valid, per this function's
    // contract.
    unsafe { answer_step(rt, session_id, step, out_json, err, body) }
}

/// The conversation of session `session_id` as the log tells it, for a new process to
/// continue: `{"v": 1, "system", "task", "entries": [{"source": "user"|"model"|"tool",
/// "content", "tool_calls"?, "tool_call_id"?}]}`, the shape of `correx_infer`'s
/// `request_json.context` (each inference's context, each answer as a `model` entry with its
/// tool calls, each tool step with a call id as a `tool` entry).
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_EVENT_STORE`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_NULL`,
/// `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Reads the log: the first call on a session reads its whole stream, later ones what was
/// appended since. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_session_transcript(
    rt: *const correx_runtime,
    session_id: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let session = session_of(r, session_id)?;
        let pack = session.transcript().map_err(session_failure)?;
        Ok(serde_json::to_value(&pack).unwrap_or(Value::Null))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitIn {
    name: String,
    #[serde(default)]
    wait_ms: u64,
}

/// Waits for a signal as step `step` of session `session_id`, once: the first call records
/// that the step waits (`session.waiting`); a signal sent from any process
/// (`correx_session_signal`) answers it, the step records its payload, and a later call with
/// the key returns that payload without waiting.
///
/// # Parameters
/// - `session_id`, `step`: as `correx_session_infer`.
/// - `wait_json`: `{"v": 1, "name": "the signal", "wait_ms": 0}`: the name (1 to 256 bytes,
///   no control characters) and how long to wait for it now (0: look once).
/// - `cancel`: NULL, or a token that ends the wait (`CORREX_E_CANCELLED`).
/// - `out_json`: receives `{"v": 1, "payload": <the signal's JSON>, "replayed": bool,
///   "attempt": 1, "recovered": false}`.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_PENDING` when no signal came within `wait_ms` (the wait is
/// recorded: call the step again, from any process, after the signal);
/// `CORREX_E_CONFLICT` when the key belongs to another step or another signal's wait;
/// `CORREX_E_CANCELLED`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`,
/// `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks up to `wait_ms` (reading the log every few milliseconds). Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
#[no_mangle]
pub unsafe extern "C" fn correx_session_wait(
    rt: *const correx_runtime,
    session_id: *const c_char,
    step: *const c_char,
    wait_json: *const c_char,
    cancel: *const correx_cancel,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |_: &correx_runtime, session: &Session, step: &str| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let asked: WaitIn = unsafe { request_arg(wait_json, "wait_json") }?;
        let got = session
            .wait(
                step,
                &asked.name,
                std::time::Duration::from_millis(asked.wait_ms),
                &token(cancel),
            )
            .map_err(session_failure)?;
        Ok(step_json(&got, |payload| json!({ "payload": payload })))
    };
    // SAFETY: rt, session_id, step, out_json and err are NULL or valid, per this function's
    // contract.
    unsafe { answer_step(rt, session_id, step, out_json, err, body) }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalIn {
    name: String,
    #[serde(default)]
    payload: Value,
    #[serde(default)]
    by: Option<String>,
}

/// Sends a signal to session `session_id`'s waits (recorded as `session.signaled`): every
/// wait step for its name, in any process, now or later, gets its payload. The first signal
/// of a name is the one.
///
/// # Parameters
/// - `signal_json`: `{"v": 1, "name": "the signal", "payload": <any JSON, at most 1 MiB>,
///   "by": "who sends it (optional, recorded)"}`.
/// - `out_json`: receives `{"v": 1, "position": N}`: where the signal is in the log.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_CONFLICT` when a signal of the name was sent already (the message
/// says where); `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`,
/// `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// One append to the log. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_session_signal(
    rt: *const correx_runtime,
    session_id: *const c_char,
    signal_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let session = session_of(r, session_id)?;
        // SAFETY: forwarded.
        let sent: SignalIn = unsafe { request_arg(signal_json, "signal_json") }?;
        let position = session
            .signal(&sent.name, sent.payload, sent.by.as_deref())
            .map_err(session_failure)?;
        Ok(json!({ "position": position }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}
