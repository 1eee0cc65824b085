//! The runtime handle and everything called on it: models, inference, tools, events.

use super::convert::{json_v1, out_arg, parse_v1, str_arg, write_json};
use super::{
    correx_error, guard, Failure, FfiResult, CORREX_APPROVE, CORREX_EXPECT_ANY,
    CORREX_EXPECT_EXACT, CORREX_EXPECT_NO_STREAM, CORREX_E_CANCELLED, CORREX_E_CONFIG,
    CORREX_E_CONFLICT, CORREX_E_EVENT_STORE, CORREX_E_INFERENCE, CORREX_E_INVALID_ARGUMENT,
    CORREX_E_MODEL, CORREX_E_NULL, CORREX_E_TOOL_SETUP, CORREX_E_UNKNOWN_MODEL, CORREX_E_UNUSABLE,
};
use crate::approvals::{ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalRequest};
use crate::events::{EventStore, EventStoreError, ExpectedVersion, NewEvent, RecordedEvent};
use crate::ids::{EventId, SessionId, ToolInvocationId};
use crate::inference::{
    InferenceError, InferenceRequest, ModelDescriptor, ModelLoadError, ModelManager,
    ProviderHealth, Tokenizer,
};
use crate::runtime::{Runtime, RuntimeConfig, RuntimeError};
use crate::tools::ToolRequest;
use crate::CancelToken;
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An approval callback: asked for every T2 and T3 tool before it runs.
///
/// `tool` is the tool's name, `tier` 0..3, `request_json` the full request
/// (`{"v":1,"invocation_id":..,"session_id":..,"tool_name":..,"parameters":{..}}`); both strings
/// live only during the call. Return `CORREX_APPROVE` to approve; any other value denies. It runs
/// on the thread that called `correx_tool_execute`, with no correx lock held, so it may block
/// (to ask a person) and may call correx (but not free the runtime).
pub type correx_approve_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        tool: *const c_char,
        tier: i32,
        request_json: *const c_char,
    ) -> i32,
>;

/// Frees the `user_data` given with a callback, when correx no longer needs it.
pub type correx_free_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

struct HostApprover {
    callback: unsafe extern "C" fn(*mut c_void, *const c_char, i32, *const c_char) -> i32,
    user_data: *mut c_void,
    free_user_data: correx_free_fn,
}

// SAFETY: by registering the approver the host promises the callback and user_data may be used
// from any thread that calls correx_tool_execute (documented on correx_runtime_set_approver).
unsafe impl Send for HostApprover {}
// SAFETY: as above; correx only passes user_data back, never touches it.
unsafe impl Sync for HostApprover {}

impl Drop for HostApprover {
    fn drop(&mut self) {
        if let Some(free) = self.free_user_data {
            // SAFETY: the host gave this destructor for this user_data, to be called once.
            unsafe { free(self.user_data) };
        }
    }
}

/// Denies unless a host approver is registered and answers exactly `CORREX_APPROVE`.
#[derive(Default)]
struct SwitchApprover(RwLock<Option<Arc<HostApprover>>>);

impl ApprovalEngine for SwitchApprover {
    fn evaluate(&self, request: &ApprovalRequest, _context: &ApprovalContext) -> ApprovalDecision {
        // Clone out of the lock: the callback runs with no correx lock held.
        let Some(host) = self.0.read().clone() else {
            return ApprovalDecision::denied("no approval callback is registered");
        };
        let (Ok(tool), Ok(req)) = (
            CString::new(request.tool_name.clone()),
            CString::new(tool_request_json(&request.request).to_string()),
        ) else {
            return ApprovalDecision::denied("the request cannot be shown to the approver");
        };
        // SAFETY: the host registered this callback with this user_data; both strings live
        // for the duration of the call.
        let answer = unsafe {
            (host.callback)(
                host.user_data,
                tool.as_ptr(),
                request.tier.as_i32(),
                req.as_ptr(),
            )
        };
        if answer == CORREX_APPROVE {
            ApprovalDecision::Approved
        } else {
            ApprovalDecision::denied(format!("denied by the host approver (answer {answer})"))
        }
    }
}

/// A correx runtime: the event log, the model manager and the sandboxed tools. Share one
/// handle among threads freely; free it once, after every other call on it returned.
pub struct correx_runtime {
    runtime: Runtime,
    approver: Arc<SwitchApprover>,
    models: Mutex<HashMap<String, ModelDescriptor>>,
    unusable: AtomicBool,
}

/// A cancellation flag for blocking calls (`correx_model_load`, `correx_infer`). Trigger it
/// from any thread.
pub struct correx_cancel {
    token: CancelToken,
}

fn tool_request_json(r: &ToolRequest) -> Value {
    json!({
        "v": 1,
        "invocation_id": r.invocation_id,
        "session_id": r.session_id,
        "tool_name": r.tool_name,
        "parameters": r.parameters,
    })
}

fn runtime_failure(e: RuntimeError) -> Failure {
    let code = match &e {
        RuntimeError::Config(_) => CORREX_E_CONFIG,
        RuntimeError::Events(_) => CORREX_E_EVENT_STORE,
        RuntimeError::Tool { .. } | RuntimeError::Sandbox(_) => CORREX_E_TOOL_SETUP,
    };
    Failure::new(code, e.to_string())
}

fn store_failure(e: EventStoreError) -> Failure {
    let code = match &e {
        EventStoreError::WrongExpectedVersion { .. } => CORREX_E_CONFLICT,
        EventStoreError::InvalidAppend { .. } | EventStoreError::IdempotencyConflict { .. } => {
            CORREX_E_INVALID_ARGUMENT
        }
        EventStoreError::Open { .. }
        | EventStoreError::Sqlite { .. }
        | EventStoreError::Busy { .. }
        | EventStoreError::CommitFailed { .. }
        | EventStoreError::CorruptEvent { .. }
        | EventStoreError::Settings { .. } => CORREX_E_EVENT_STORE,
    };
    Failure::new(code, e.to_string())
}

fn model_failure(e: ModelLoadError) -> Failure {
    let code = match &e {
        ModelLoadError::Cancelled => CORREX_E_CANCELLED,
        ModelLoadError::BinaryNotFound { .. }
        | ModelLoadError::ModelFileMissing { .. }
        | ModelLoadError::PortInUse { .. }
        | ModelLoadError::Spawn { .. }
        | ModelLoadError::Log { .. }
        | ModelLoadError::ExitedWhileLoading { .. }
        | ModelLoadError::Timeout { .. }
        | ModelLoadError::ManagerGone
        | ModelLoadError::Events(_) => CORREX_E_MODEL,
    };
    Failure::new(code, e.to_string())
}

fn inference_failure(e: InferenceError) -> Failure {
    let code = match &e {
        InferenceError::Cancelled => CORREX_E_CANCELLED,
        InferenceError::ConnectionRefused { .. }
        | InferenceError::Timeout { .. }
        | InferenceError::Transport { .. }
        | InferenceError::Http { .. }
        | InferenceError::ContextExceeded { .. }
        | InferenceError::MalformedBody { .. }
        | InferenceError::ModelUnavailable { .. } => CORREX_E_INFERENCE,
    };
    Failure::new(code, e.to_string())
}

/// Borrows a live, usable runtime.
///
/// # Safety
/// `rt` is NULL or a live runtime from `correx_runtime_new`.
unsafe fn usable<'a>(rt: *const correx_runtime) -> FfiResult<&'a correx_runtime> {
    // SAFETY: the caller promised rt is NULL or live.
    let r = unsafe { rt.as_ref() }.ok_or_else(|| Failure::new(CORREX_E_NULL, "runtime is NULL"))?;
    if r.unusable.load(Ordering::SeqCst) {
        return Err(Failure::new(
            CORREX_E_UNUSABLE,
            "this runtime is unusable after a caught panic; free it and create a new one",
        ));
    }
    Ok(r)
}

/// Runs `body` on a runtime behind the guard; a panic marks the runtime unusable.
///
/// # Safety
/// `rt` is NULL or live; `err` is NULL or valid for a write.
unsafe fn with_runtime(
    rt: *const correx_runtime,
    err: *mut *mut correx_error,
    body: impl FnOnce(&correx_runtime) -> FfiResult,
) -> i32 {
    let poison = || {
        // SAFETY: rt is NULL or live per the caller's contract.
        if let Some(r) = unsafe { rt.as_ref() } {
            r.unusable.store(true, Ordering::SeqCst);
        }
    };
    let run = || {
        // SAFETY: forwarded from our caller.
        let r = unsafe { usable(rt) }?;
        body(r)
    };
    // SAFETY: forwarded from our caller.
    unsafe { guard(err, poison, run) }
}

/// Creates a runtime from a config JSON object.
///
/// # Parameters
/// - `config_json`: `{"v": 1, "event_log": "/path/events.db", "durability": "full"|"normal",
///   "sandbox_root": "/path", "tools": {"shell": {...}, "file_read": {...}, "file_write": {...},
///   "file_edit": {...}}, "models": {"server_bin", "port", "health_timeout_ms", "log_dir",
///   "read_timeout_ms"}}`. Every tool is disabled unless `"enabled": true`; empty allowlists deny
///   everything. See the README for every field.
/// - `out`: receives the new runtime.
/// - `err`: optional; receives an error on failure.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT` (bad UTF-8), `CORREX_E_CONFIG` (the
/// message names the field), `CORREX_E_EVENT_STORE`, `CORREX_E_TOOL_SETUP`.
///
/// # Memory and lifetimes
/// On success `*out` owns a runtime the caller frees with `correx_runtime_free`. On error
/// `*out` is left untouched.
///
/// # Blocking and threads
/// Blocks while it opens the event log and recovers interrupted tool runs. Any thread.
///
/// # Safety
/// `config_json` is NULL or NUL-terminated; `out` and `err` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn correx_runtime_new(
    config_json: *const c_char,
    out: *mut *mut correx_runtime,
    err: *mut *mut correx_error,
) -> i32 {
    let body = || -> FfiResult {
        let out = out_arg(out, "out")?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(config_json, "config_json") }?;
        let config = RuntimeConfig::from_json(text)
            .map_err(|e| Failure::new(CORREX_E_CONFIG, e.to_string()))?;
        let approver = Arc::new(SwitchApprover::default());
        let runtime = Runtime::new(&config, approver.clone()).map_err(runtime_failure)?;
        let handle = Box::new(correx_runtime {
            runtime,
            approver,
            models: Mutex::new(HashMap::new()),
            unusable: AtomicBool::new(false),
        });
        // SAFETY: out was checked non-null; the caller promised it is writable.
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    };
    // SAFETY: err is NULL or valid, per this function's contract.
    unsafe { guard(err, || {}, body) }
}

/// Frees a runtime: unloads its model (stopping llama-server) and closes the event log.
/// NULL is a no-op; freeing twice is undefined behaviour. Works on an unusable runtime too.
///
/// # Blocking and threads
/// Blocks while the server stops (at most a couple of seconds). Call it once, after every
/// other call on this runtime has returned.
///
/// # Safety
/// `rt` is NULL or a runtime from `correx_runtime_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn correx_runtime_free(rt: *mut correx_runtime) {
    if rt.is_null() {
        return;
    }
    // SAFETY: the caller passes ownership of a runtime made by Box::into_raw.
    let boxed = unsafe { Box::from_raw(rt) };
    // Dropping runs host destructors (free_user_data) and stops the server; never unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(boxed)));
}

/// Registers the approval callback (replacing, and releasing, any earlier one). With a NULL
/// `callback` every T2/T3 tool is denied, which is also the state of a new runtime.
///
/// # Parameters
/// - `callback`: see `correx_approve_fn`.
/// - `user_data`: passed back to `callback`.
/// - `free_user_data`: optional; called once with `user_data` when the callback is replaced or
///   the runtime freed (after any call in progress returned). When this call fails it is not
///   called: the caller still owns `user_data`. Do not register the same `user_data` with a
///   destructor twice.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Never blocks for long. Any thread; the callback and user_data must be usable from every
/// thread that calls `correx_tool_execute`.
///
/// # Safety
/// `rt` is NULL or live; the callback is safe to call with `user_data` from any thread.
#[no_mangle]
pub unsafe extern "C" fn correx_runtime_set_approver(
    rt: *const correx_runtime,
    callback: correx_approve_fn,
    user_data: *mut c_void,
    free_user_data: correx_free_fn,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let host = callback.map(|callback| {
            Arc::new(HostApprover {
                callback,
                user_data,
                free_user_data,
            })
        });
        if host.is_none() {
            if let Some(free) = free_user_data {
                // SAFETY: no callback will use it; the host asked us to release it.
                free(user_data);
            }
        }
        let old = std::mem::replace(&mut *r.approver.0.write(), host);
        drop(old);
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Creates a cancellation flag.
///
/// # Returns
/// `CORREX_OK` or `CORREX_E_NULL`. On success `*out` owns a flag freed with
/// `correx_cancel_free`; on error it is untouched.
///
/// # Safety
/// `out` and `err` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn correx_cancel_new(
    out: *mut *mut correx_cancel,
    err: *mut *mut correx_error,
) -> i32 {
    let body = || -> FfiResult {
        let out = out_arg(out, "out")?;
        // SAFETY: checked non-null; writable per the caller.
        unsafe {
            *out = Box::into_raw(Box::new(correx_cancel {
                token: CancelToken::new(),
            }))
        };
        Ok(())
    };
    // SAFETY: err is NULL or valid, per this function's contract.
    unsafe { guard(err, || {}, body) }
}

/// Asks every call using this flag to stop; they return `CORREX_E_CANCELLED` soon after.
/// NULL is a no-op.
///
/// # Blocking and threads
/// Never blocks; safe from any thread, also while another thread is blocked using the flag.
///
/// # Safety
/// `cancel` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn correx_cancel_trigger(cancel: *const correx_cancel) {
    // SAFETY: the caller promised cancel is NULL or live.
    if let Some(c) = unsafe { cancel.as_ref() } {
        c.token.cancel();
    }
}

/// Clears the flag so it can be reused. NULL is a no-op.
///
/// # Safety
/// `cancel` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn correx_cancel_reset(cancel: *const correx_cancel) {
    // SAFETY: the caller promised cancel is NULL or live.
    if let Some(c) = unsafe { cancel.as_ref() } {
        c.token.reset();
    }
}

/// Frees a cancellation flag. NULL is a no-op; freeing twice is undefined behaviour. Free it
/// only after the calls using it returned.
///
/// # Safety
/// `cancel` is NULL or a flag from `correx_cancel_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn correx_cancel_free(cancel: *mut correx_cancel) {
    if !cancel.is_null() {
        // SAFETY: ownership of a Box-made flag passes back.
        drop(unsafe { Box::from_raw(cancel) });
    }
}

fn token(cancel: *const correx_cancel) -> CancelToken {
    // SAFETY: callers pass NULL or a live flag (documented on every export taking one).
    match unsafe { cancel.as_ref() } {
        Some(c) => c.token.clone(),
        None => CancelToken::new(),
    }
}

fn descriptor_from(map: serde_json::Map<String, Value>) -> FfiResult<ModelDescriptor> {
    let mut map = map;
    if !map.contains_key("model_path") {
        let install = crate::LlamaInstall::locate().ok_or_else(|| {
            Failure::new(
                CORREX_E_INVALID_ARGUMENT,
                "model_path is missing and no installed model was found; run scripts/install-llama.sh or give model_path",
            )
        })?;
        map.insert(
            "model_path".into(),
            Value::from(install.model.display().to_string()),
        );
    }
    serde_json::from_value(Value::Object(map))
        .map_err(|e| Failure::new(CORREX_E_INVALID_ARGUMENT, format!("model descriptor: {e}")))
}

/// Loads a model (a no-op when it is loaded), replacing any other; appends `model.loaded`.
///
/// # Parameters
/// - `descriptor_json`: `{"v": 1, "model_id": "gemma", "model_path": "/m.gguf",
///   "residency": "persistent"|"dynamic"|"ephemeral", "idle_timeout_ms": 60000,
///   "context_size": 8192, "extra_args": ["--no-jinja", "--chat-template", "gemma"],
///   "threads": 2}`; `model_path` defaults to the model `scripts/install-llama.sh` installed.
/// - `cancel`: optional; triggering it stops the load (`CORREX_E_CANCELLED`, server killed).
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_MODEL` (the message
/// carries the server's last log lines), `CORREX_E_CANCELLED`, `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Blocks until the server is healthy (about a second for a small model; the health deadline
/// defaults to 30 s). Any thread; loads are serialized.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_model_load(
    rt: *const correx_runtime,
    descriptor_json: *const c_char,
    cancel: *const correx_cancel,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        // SAFETY: forwarded.
        let text = unsafe { str_arg(descriptor_json, "descriptor_json") }?;
        let d = descriptor_from(json_v1(text, "descriptor_json")?)?;
        r.runtime
            .models()
            .load_with_cancel(&d, &token(cancel))
            .map_err(model_failure)?;
        r.models.lock().insert(d.model_id.clone(), d);
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Unloads a model if it is loaded; appends `model.unloaded`.
///
/// # Returns
/// `CORREX_OK` (also when it was not loaded), `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`,
/// `CORREX_E_MODEL`, `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Blocks until the server has exited (at most a couple of seconds). Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_model_unload(
    rt: *const correx_runtime,
    model_id: *const c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        // SAFETY: forwarded.
        let id = unsafe { str_arg(model_id, "model_id") }?;
        r.runtime.models().unload(id).map_err(model_failure)
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// The loaded model: `{"v": 1, "model": null}` or `{"v": 1, "model": {descriptor}}`.
///
/// # Memory and lifetimes
/// `*out_json` receives a string the caller frees with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Waits while a load is in progress. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_model_current(
    rt: *const correx_runtime,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        let model = r.runtime.models().current_model();
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, json!({ "model": model })) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Whether the loaded model's server answers: `{"v": 1, "healthy": true}` or
/// `{"v": 1, "healthy": false, "reason": "..."}`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for one local HTTP call (at most the health timeout, 2 s). Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_model_health(
    rt: *const correx_runtime,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        let v = match r.runtime.models().health_check() {
            ProviderHealth::Healthy => json!({"healthy": true}),
            ProviderHealth::Unhealthy { reason } => json!({"healthy": false, "reason": reason}),
        };
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, v) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

fn known_model(r: &correx_runtime, id: &str) -> FfiResult<ModelDescriptor> {
    r.models.lock().get(id).cloned().ok_or_else(|| {
        Failure::new(
            CORREX_E_UNKNOWN_MODEL,
            format!(
                "model {id:?} was never loaded through this runtime; call correx_model_load first"
            ),
        )
    })
}

/// Runs one inference on a model loaded earlier through this runtime (reloading it first if
/// its residency unloaded it); appends `inference.completed`.
///
/// # Parameters
/// - `model_id`: a model passed to `correx_model_load` before.
/// - `request_json`: `{"v": 1, "context": {"system": "...", "task": "...", "entries":
///   [{"source": "model"|"user"|"tool", "content": "..."}]}, "config": {"temperature": 0.7,
///   "top_p": 0.95, "max_tokens": 512, "stop": [], "seed": 42}}`.
/// - `cancel`: optional; triggering it makes the call return `CORREX_E_CANCELLED` within about
///   10 ms.
/// - `out_json`: receives `{"v": 1, "text": "...", "usage": {"prompt_tokens", "completion_tokens",
///   "total_tokens"}, "finish_reason": "stop"|"length"|..., "latency_ms": 120, "model": "gemma"}`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNKNOWN_MODEL`,
/// `CORREX_E_INFERENCE`, `CORREX_E_CANCELLED`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for the whole generation (and a reload if needed). Any thread; inferences may run
/// concurrently.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_infer(
    rt: *const correx_runtime,
    model_id: *const c_char,
    request_json: *const c_char,
    cancel: *const correx_cancel,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        // SAFETY: forwarded.
        let id = unsafe { str_arg(model_id, "model_id") }?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(request_json, "request_json") }?;
        let request: InferenceRequest = parse_v1(text, "request_json")?;
        let d = known_model(r, id)?;
        let resp = r
            .runtime
            .models()
            .managed(&d)
            .infer_with_cancel(&request, &token(cancel))
            .map_err(inference_failure)?;
        let v = json!({
            "text": resp.text,
            "usage": resp.usage,
            "finish_reason": resp.finish_reason.as_str(),
            "latency_ms": resp.latency_ms,
            "model": resp.model,
        });
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, v) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Tokenizes `text` with the loaded model's tokenizer: `{"v": 1, "tokens": [1, 2, ...]}`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_INFERENCE` (no server),
/// `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for one local HTTP call. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_tokenize(
    rt: *const correx_runtime,
    text: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(text, "text") }?;
        let tokens = r
            .runtime
            .models()
            .tokenizer()
            .tokenize(text)
            .map_err(inference_failure)?;
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, json!({ "tokens": tokens })) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Counts the tokens of `text`. Never fails for want of a server: without one it approximates
/// characters / 4 (and logs a warning).
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Blocks for one local HTTP call. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_count_tokens(
    rt: *const correx_runtime,
    text: *const c_char,
    out_count: *mut u64,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_count, "out_count")?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(text, "text") }?;
        let n = r.runtime.models().tokenizer().count(text) as u64;
        // SAFETY: out checked; writable per the caller.
        unsafe { *out = n };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
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
/// - `out_json`: receives `{"v": 1, "status": "success", "invocation_id", "output", "metadata"}`
///   or `{"v": 1, "status": "failure", "invocation_id", "reason", "recoverable"}`. A tool that
///   fails (or is denied, or unknown) is still `CORREX_OK`: the result says so.
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
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(request_json, "request_json") }?;
        let input: ToolRequestIn = parse_v1(text, "request_json")?;
        let request = ToolRequest {
            invocation_id: input
                .invocation_id
                .map(ToolInvocationId::from_string)
                .unwrap_or_else(ToolInvocationId::random),
            session_id: SessionId::from_string(input.session_id),
            tool_name: input.tool_name,
            parameters: input.parameters,
        };
        let result = r
            .runtime
            .executor()
            .execute_in(&request, &ApprovalContext::new(request.session_id.clone()));
        let v = serde_json::to_value(&result).unwrap_or(Value::Null);
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, v) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewEventIn {
    #[serde(default)]
    event_id: Option<String>,
    type_id: String,
    #[serde(default = "one")]
    schema_version: u32,
    #[serde(default)]
    correlation_id: Option<String>,
    #[serde(default)]
    causation_id: Option<String>,
    #[serde(default)]
    payload: Value,
}

fn one() -> u32 {
    1
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendIn {
    events: Vec<NewEventIn>,
}

fn event_json(e: &RecordedEvent) -> Value {
    let summary = match e.domain() {
        Ok(Some(d)) => d.summary(),
        Ok(None) => e.type_id.clone(),
        Err(err) => err.to_string(),
    };
    json!({
        "summary": summary,
        "position": e.position,
        "event_id": e.event_id,
        "stream_id": e.stream_id,
        "stream_version": e.stream_version,
        "type_id": e.type_id,
        "schema_version": e.schema_version,
        "timestamp_ms": e.timestamp_ms,
        "timestamp": e.timestamp_rfc3339(),
        "correlation_id": e.correlation_id,
        "causation_id": e.causation_id,
        "payload": e.payload,
    })
}

/// Appends events to a stream atomically.
///
/// # Parameters
/// - `stream`: the stream's name (not empty).
/// - `expected_kind`: `CORREX_EXPECT_ANY`, `CORREX_EXPECT_NO_STREAM` or `CORREX_EXPECT_EXACT`.
/// - `expected_version`: the version `CORREX_EXPECT_EXACT` expects; ignored otherwise.
/// - `events_json`: `{"v": 1, "events": [{"type_id": "note.added", "schema_version": 1,
///   "payload": {...}, "event_id": "optional", "correlation_id": null, "causation_id": null}]}`.
///   An `event_id` appended before is stored once (the retry returns the first positions).
/// - `out_json`: optional; receives `{"v": 1, "first_position", "last_position",
///   "stream_version"}`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_CONFLICT` (expected
/// version), `CORREX_E_EVENT_STORE`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` (when given) is the caller's, freed with `correx_string_free`.
///
/// # Blocking and threads
/// Blocks until the events are on disk (one flush, shared with concurrent appends). Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_events_append(
    rt: *const correx_runtime,
    stream: *const c_char,
    expected_kind: i32,
    expected_version: u64,
    events_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        // SAFETY: forwarded.
        let stream = unsafe { str_arg(stream, "stream") }?;
        // SAFETY: forwarded.
        let text = unsafe { str_arg(events_json, "events_json") }?;
        let expected = match expected_kind {
            CORREX_EXPECT_ANY => ExpectedVersion::Any,
            CORREX_EXPECT_NO_STREAM => ExpectedVersion::NoStream,
            CORREX_EXPECT_EXACT => ExpectedVersion::Exact(expected_version),
            other => {
                return Err(Failure::new(
                    CORREX_E_INVALID_ARGUMENT,
                    format!("expected_kind {other} is not CORREX_EXPECT_ANY, _NO_STREAM or _EXACT"),
                ))
            }
        };
        let input: AppendIn = parse_v1(text, "events_json")?;
        let events: Vec<NewEvent> = input
            .events
            .into_iter()
            .map(|e| NewEvent {
                event_id: e
                    .event_id
                    .map(EventId::from_string)
                    .unwrap_or_else(EventId::random),
                type_id: e.type_id,
                schema_version: e.schema_version,
                correlation_id: e.correlation_id,
                causation_id: e.causation_id,
                payload: e.payload,
            })
            .collect();
        let result = r
            .runtime
            .events()
            .append(stream, expected, &events)
            .map_err(store_failure)?;
        if !out_json.is_null() {
            // SAFETY: non-null and writable per the caller.
            unsafe {
                write_json(
                    out_json,
                    serde_json::to_value(result).unwrap_or(Value::Null),
                )
            };
        }
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Reads up to `max` events of `stream` from version `from_version` (inclusive; versions start
/// at 1): `{"v": 1, "events": [{"position", "event_id", "stream_id", "stream_version",
/// "type_id", "schema_version", "timestamp_ms", "timestamp", "correlation_id", "causation_id",
/// "payload", "summary"}]}`, where `timestamp` is RFC 3339 UTC and `summary` one line for people. At most 1000 events per call; page by asking again from the last version + 1.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for one short read. Any thread, concurrently with appends.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_events_read_stream(
    rt: *const correx_runtime,
    stream: *const c_char,
    from_version: u64,
    max: u32,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        // SAFETY: forwarded.
        let stream = unsafe { str_arg(stream, "stream") }?;
        let events = r
            .runtime
            .events()
            .read_stream(stream, from_version, max as usize)
            .map_err(store_failure)?;
        let list: Vec<Value> = events.iter().map(event_json).collect();
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, json!({ "events": list })) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Reads up to `max` events of the whole log from global position `from_position` (inclusive;
/// positions start at 1), in position order, in the shape of `correx_events_read_stream`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for one short read. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_events_read_all(
    rt: *const correx_runtime,
    from_position: u64,
    max: u32,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        let events = r
            .runtime
            .events()
            .read_all(from_position, max as usize)
            .map_err(store_failure)?;
        let list: Vec<Value> = events.iter().map(event_json).collect();
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, json!({ "events": list })) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// The last global position in the log (0 when empty).
///
/// # Blocking and threads
/// Blocks for one short read. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_events_last_position(
    rt: *const correx_runtime,
    out_position: *mut u64,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_position, "out_position")?;
        let p = r.runtime.events().last_position().map_err(store_failure)?;
        // SAFETY: out checked; writable per the caller.
        unsafe { *out = p };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// For testing the panic guard: panics inside correx. Returns `CORREX_E_PANIC` and leaves the
/// runtime unusable (every later call returns `CORREX_E_UNUSABLE`; freeing still works).
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_debug_panic(
    rt: *const correx_runtime,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |_: &correx_runtime| -> FfiResult {
        panic!("correx_debug_panic was called");
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}
