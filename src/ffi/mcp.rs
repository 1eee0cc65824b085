//! The host's handler of MCP servers' requests to their client (sampling, elicitation).

use super::convert::str_arg;
use super::runtime::{correx_free_fn, with_runtime};
use super::{
    correx_error, guard, Failure, FfiResult, CORREX_E_INVALID_ARGUMENT, CORREX_E_NULL, CORREX_OK,
};
use crate::cancel::CancelToken;
use crate::services::mcp::{McpClientMethod, McpRefusal, McpRequestHandler, McpServerRequest};
use serde_json::Value;
use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

/// `correx_runtime_set_mcp_handler`'s `methods` bit: it answers `sampling/createMessage`.
pub const CORREX_MCP_SAMPLING: i32 = 1;
/// `correx_runtime_set_mcp_handler`'s `methods` bit: it answers `elicitation/create`.
pub const CORREX_MCP_ELICITATION: i32 = 2;

/// The answer to one request of an MCP server, filled in by the host's handler during its
/// call (`correx_mcp_answer_set` or `correx_mcp_answer_refuse`). Owned by correx; valid only
/// until the handler returns.
pub struct correx_mcp_answer {
    result: Option<Value>,
    refusal: Option<String>,
    cancel: CancelToken,
}

/// A handler of MCP servers' requests to the host (see `correx_runtime_set_mcp_handler`).
///
/// `server` is the server's name in the config, `method` `"sampling/createMessage"` or
/// `"elicitation/create"`, `params_json` the request's `params` object as the server sent it;
/// all three live only during the call. Fill `answer` with `correx_mcp_answer_set` (the result
/// object: a `CreateMessageResult` for sampling, an `ElicitResult` for elicitation) and return
/// `CORREX_OK`; return anything else to decline (JSON-RPC error -1 with the message given to
/// `correx_mcp_answer_refuse`, else "declined by the host"); `CORREX_OK` without a result is
/// error -32603. It runs on a thread of correx's, with no correx lock held: it may block (to
/// ask a person, or to run a model, also through this runtime, but never free the runtime)
/// and should return soon after `correx_mcp_answer_cancelled` turns 1.
pub type correx_mcp_handler_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        server: *const c_char,
        method: *const c_char,
        params_json: *const c_char,
        answer: *mut correx_mcp_answer,
    ) -> i32,
>;

struct HostMcpHandler {
    callback: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        *const c_char,
        *const c_char,
        *mut correx_mcp_answer,
    ) -> i32,
    user_data: *mut c_void,
    free_user_data: correx_free_fn,
    methods: Vec<McpClientMethod>,
}

// SAFETY: by registering the handler the host promises the callback and user_data may be
// used from any thread (documented on correx_runtime_set_mcp_handler).
unsafe impl Send for HostMcpHandler {}
// SAFETY: as above; correx only passes user_data back, never touches it.
unsafe impl Sync for HostMcpHandler {}

impl Drop for HostMcpHandler {
    fn drop(&mut self) {
        if let Some(free) = self.free_user_data {
            // SAFETY: the host gave this destructor for this user_data, to be called once.
            unsafe { free(self.user_data) };
        }
    }
}

impl McpRequestHandler for HostMcpHandler {
    fn methods(&self) -> Vec<McpClientMethod> {
        self.methods.clone()
    }

    fn handle(
        &self,
        request: &McpServerRequest<'_>,
        cancel: &CancelToken,
    ) -> Result<Value, McpRefusal> {
        let unusable = || McpRefusal {
            code: -32603,
            message: "the request cannot be shown to the host".into(),
        };
        let server = CString::new(request.server).map_err(|_| unusable())?;
        let method = CString::new(request.method.method()).map_err(|_| unusable())?;
        // serde_json escapes control characters, so the text holds no NUL.
        let params = CString::new(request.params.to_string()).map_err(|_| unusable())?;
        let mut answer = correx_mcp_answer {
            result: None,
            refusal: None,
            cancel: cancel.clone(),
        };
        // SAFETY: the host registered this callback with this user_data; the strings and the
        // answer live for the duration of the call.
        let rc = unsafe {
            (self.callback)(
                self.user_data,
                server.as_ptr(),
                method.as_ptr(),
                params.as_ptr(),
                &mut answer,
            )
        };
        match (rc, answer.result) {
            (CORREX_OK, Some(result)) => Ok(result),
            (CORREX_OK, None) => Err(McpRefusal {
                code: -32603,
                message: "the host's handler gave no answer".into(),
            }),
            _ => Err(McpRefusal::declined(
                answer
                    .refusal
                    .unwrap_or_else(|| "declined by the host".into()),
            )),
        }
    }
}

/// Registers the handler of requests MCP servers send their client (replacing, and
/// releasing, any earlier one). A server is told at its start which of them this client
/// answers, so one already running is restarted before its next use when that changed (once
/// no call of it is in progress; recorded as a stop and a start): register the handler right
/// after `correx_runtime_new`. Without one (the state of a new runtime, or after a NULL
/// `callback`) servers are told none is answered and any such request is refused.
///
/// # Parameters
/// - `methods`: `CORREX_MCP_SAMPLING | CORREX_MCP_ELICITATION`, the methods it answers (0 with
///   a callback is an invalid argument).
/// - `callback`: see `correx_mcp_handler_fn`.
/// - `user_data`: passed back to `callback`.
/// - `free_user_data`: optional; called once with `user_data` when the handler is replaced or
///   the runtime freed, after every call of it returned. When this call fails it is not
///   called: the caller still owns `user_data`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Never blocks for long. Any thread; the callback and user_data must be usable from any
/// thread. `correx_runtime_free` waits for handlers in progress to return (they see
/// `correx_mcp_answer_cancelled` turn 1).
///
/// # Safety
/// `rt` is NULL or live; the callback is safe to call with `user_data` from any thread.
#[no_mangle]
pub unsafe extern "C" fn correx_runtime_set_mcp_handler(
    rt: *const super::correx_runtime,
    methods: i32,
    callback: correx_mcp_handler_fn,
    user_data: *mut c_void,
    free_user_data: correx_free_fn,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &super::correx_runtime| -> FfiResult {
        let handler: Option<Arc<dyn McpRequestHandler>> = match callback {
            Some(callback) => {
                let known = CORREX_MCP_SAMPLING | CORREX_MCP_ELICITATION;
                if methods == 0 || methods & !known != 0 {
                    return Err(Failure::new(
                        CORREX_E_INVALID_ARGUMENT,
                        format!(
                            "methods is {methods}; give CORREX_MCP_SAMPLING ({CORREX_MCP_SAMPLING}) \
                             and/or CORREX_MCP_ELICITATION ({CORREX_MCP_ELICITATION})"
                        ),
                    ));
                }
                let methods = [
                    (CORREX_MCP_SAMPLING, McpClientMethod::Sampling),
                    (CORREX_MCP_ELICITATION, McpClientMethod::Elicitation),
                ]
                .into_iter()
                .filter(|(bit, _)| methods & bit != 0)
                .map(|(_, m)| m)
                .collect();
                Some(Arc::new(HostMcpHandler {
                    callback,
                    user_data,
                    free_user_data,
                    methods,
                }))
            }
            None => {
                if let Some(free) = free_user_data {
                    // SAFETY: no callback will use it; the host asked us to release it.
                    unsafe { free(user_data) };
                }
                None
            }
        };
        r.runtime.mcp().set_request_handler(handler);
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Borrows the answer a handler was given.
///
/// # Safety
/// `answer` is NULL or the live answer of a handler call in progress.
unsafe fn answer_arg<'a>(answer: *mut correx_mcp_answer) -> FfiResult<&'a mut correx_mcp_answer> {
    // SAFETY: the caller promised NULL or live.
    unsafe { answer.as_mut() }.ok_or_else(|| Failure::new(CORREX_E_NULL, "answer is NULL"))
}

/// Sets the result a handler answers with (copied): a JSON object, sent to the server as the
/// request's `result` when the handler returns `CORREX_OK`.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_NULL`; `CORREX_E_INVALID_ARGUMENT` when `result_json` is not UTF-8
/// or not a JSON object (nothing is set then).
///
/// # Blocking and threads
/// Never blocks. Call it only from within the handler's call, on its thread.
///
/// # Safety
/// `answer` is NULL or the answer of a handler call in progress; `result_json` is NULL or
/// NUL-terminated; `err` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn correx_mcp_answer_set(
    answer: *mut correx_mcp_answer,
    result_json: *const c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = || -> FfiResult {
        // SAFETY: forwarded from this function's contract.
        let answer = unsafe { answer_arg(answer) }?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(result_json, "result_json") }?;
        let value: Value = serde_json::from_str(text).map_err(|e| {
            Failure::new(
                CORREX_E_INVALID_ARGUMENT,
                format!("result_json is not JSON: {e}"),
            )
        })?;
        if !value.is_object() {
            return Err(Failure::new(
                CORREX_E_INVALID_ARGUMENT,
                format!(
                    "result_json must be a JSON object (the request's result), not {}",
                    crate::tools::json_kind(&value)
                ),
            ));
        }
        answer.result = Some(value);
        Ok(())
    };
    // SAFETY: err is NULL or valid, per this function's contract.
    unsafe { guard(err, || {}, body) }
}

/// Refuses the request, telling the server `message` (copied; at most 4 KiB is kept). The
/// handler then returns anything but `CORREX_OK`; a result set earlier is dropped.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_NULL`; `CORREX_E_INVALID_ARGUMENT` (not UTF-8).
///
/// # Blocking and threads
/// Never blocks. Call it only from within the handler's call, on its thread.
///
/// # Safety
/// `answer` is NULL or the answer of a handler call in progress; `message` is NULL or
/// NUL-terminated; `err` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn correx_mcp_answer_refuse(
    answer: *mut correx_mcp_answer,
    message: *const c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = || -> FfiResult {
        // SAFETY: forwarded from this function's contract.
        let answer = unsafe { answer_arg(answer) }?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(message, "message") }?;
        answer.result = None;
        answer.refusal = Some(crate::text::bounded(text.to_owned()));
        Ok(())
    };
    // SAFETY: err is NULL or valid, per this function's contract.
    unsafe { guard(err, || {}, body) }
}

/// Whether the request was withdrawn: the server cancelled it or is stopping, or the runtime
/// is being freed. No answer is wanted any more; return soon.
///
/// # Returns
/// 1 when withdrawn, 0 while still wanted, 0 for NULL.
///
/// # Blocking and threads
/// Never blocks; callable from any thread during the handler's call.
///
/// # Safety
/// `answer` is NULL or the answer of a handler call in progress.
#[no_mangle]
pub unsafe extern "C" fn correx_mcp_answer_cancelled(answer: *const correx_mcp_answer) -> i32 {
    // SAFETY: the caller promised NULL or live.
    let Some(answer) = (unsafe { answer.as_ref() }) else {
        return 0;
    };
    i32::from(answer.cancel.is_cancelled())
}
