//! Models and inference: load, unload, status, infer, tokenize.

use super::cancel::{correx_cancel, token};
use super::convert::{json_v1, out_arg, parse_v1, str_arg, write_json};
use super::runtime::{correx_runtime, with_runtime};
use super::{
    correx_error, Failure, FfiResult, CORREX_E_CANCELLED, CORREX_E_INFERENCE,
    CORREX_E_INVALID_ARGUMENT, CORREX_E_MODEL, CORREX_E_UNKNOWN_MODEL,
};
use crate::inference::{
    InferenceError, InferenceRequest, ModelDescriptor, ModelLoadError, ModelManager,
    ProviderHealth, Tokenizer,
};
use serde_json::{json, Value};
use std::ffi::c_char;

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
