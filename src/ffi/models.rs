//! Models and inference: load, unload, status, infer, tokenize.

use super::cancel::{correx_cancel, token};
use super::convert::{json_v1, out_arg, request_arg, str_arg};
use super::runtime::{answer_json, correx_runtime, with_runtime};
use super::{
    correx_error, Failure, FfiResult, CORREX_CHUNK_REASONING, CORREX_CHUNK_TEXT, CORREX_CONTINUE,
    CORREX_E_BUSY, CORREX_E_CANCELLED, CORREX_E_INFERENCE, CORREX_E_INVALID_ARGUMENT,
    CORREX_E_MODEL, CORREX_E_UNKNOWN_MODEL,
};
use crate::inference::{
    ChunkKind, InferenceError, InferenceProvider, InferenceRequest, InferenceResponse,
    ModelDescriptor, ModelLoadError, ModelManager, ProviderHealth, StreamChunk, StreamControl,
    Tokenizer,
};
use serde_json::{json, Value};
use std::ffi::{c_char, c_void};

fn model_failure(e: ModelLoadError) -> Failure {
    let code = match &e {
        ModelLoadError::Cancelled => CORREX_E_CANCELLED,
        ModelLoadError::Busy { .. } => CORREX_E_BUSY,
        ModelLoadError::BinaryNotFound { .. }
        | ModelLoadError::ModelFileMissing { .. }
        | ModelLoadError::PortInUse { .. }
        | ModelLoadError::Spawn { .. }
        | ModelLoadError::Isolation { .. }
        | ModelLoadError::Log { .. }
        | ModelLoadError::ExitedWhileLoading { .. }
        | ModelLoadError::Timeout { .. }
        | ModelLoadError::ManagerGone
        | ModelLoadError::OverBudget { .. }
        | ModelLoadError::EndpointsDown { .. }
        | ModelLoadError::Events(_) => CORREX_E_MODEL,
        ModelLoadError::InvalidDescriptor { .. } => CORREX_E_INVALID_ARGUMENT,
    };
    Failure::new(code, e.to_string())
}

pub(super) fn inference_failure(e: InferenceError) -> Failure {
    let code = match &e {
        InferenceError::Cancelled => CORREX_E_CANCELLED,
        InferenceError::ConnectionRefused { .. }
        | InferenceError::Timeout { .. }
        | InferenceError::Transport { .. }
        | InferenceError::Http { .. }
        | InferenceError::ContextExceeded { .. }
        | InferenceError::MalformedBody { .. }
        | InferenceError::StreamInterrupted { .. }
        | InferenceError::MalformedEvent { .. }
        | InferenceError::StreamIncomplete { .. }
        | InferenceError::ModelUnavailable { .. } => CORREX_E_INFERENCE,
        InferenceError::Unsupported { .. }
        | InferenceError::NotServed { .. }
        | InferenceError::InvalidInput { .. } => CORREX_E_INVALID_ARGUMENT,
    };
    Failure::new(code, e.to_string())
}

fn descriptor_from(map: serde_json::Map<String, Value>) -> FfiResult<ModelDescriptor> {
    let mut map = map;
    if !map.contains_key("model_path") && !map.contains_key("endpoints") {
        let install = crate::install::LlamaInstall::locate().ok_or_else(|| {
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
    crate::strict_json::from_value(Value::Object(map))
        .map_err(|e| Failure::new(CORREX_E_INVALID_ARGUMENT, format!("model descriptor: {e}")))
}

/// Loads a model (a no-op when it is loaded with the same server settings) on its own server
/// and port, evicting the least recently used idle model when `models.max_loaded` or
/// `models.memory_budget_mb` requires it; appends `model.loaded`.
///
/// # Parameters
/// - `descriptor_json`: `{"v": 1, "model_id": "gemma", "model_path": "/m.gguf",
///   "residency": "persistent"|"dynamic"|"ephemeral", "idle_timeout_ms": 60000,
///   "context_size": 8192, "extra_args": ["--no-jinja", "--chat-template", "gemma"],
///   "threads": 2, "serves": "chat"|"embeddings"}`, or for servers already running elsewhere `{"v": 1, "model_id": "far",
///   "residency": "persistent", "endpoints": ["http://10.0.0.5:8080", ...],
///   "endpoint_kind": "llama-server"|"openai", "api_key_env": "VAR", "served_model": "name"}`
///   (nothing is spawned or killed; requests fail over between them; an `openai` endpoint is
///   any engine with OpenAI's chat completions and model list, and a request needing what only
///   llama-server has is `CORREX_E_INVALID_ARGUMENT`; the key is read from the environment
///   variable `api_key_env` names and never recorded). `model_id` and `residency` are
///   required; `model_path` defaults to the model `scripts/install-llama.sh` installed;
///   unknown fields are refused.
/// - `cancel`: optional; triggering it stops the load (`CORREX_E_CANCELLED`, server killed).
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_MODEL` (the message
/// carries the server's last log lines; also a model alone over the memory budget, or remote
/// endpoints none of which answers), `CORREX_E_BUSY` (no model could be evicted: every one
/// still had inferences running after `models.drain_timeout_ms`, or servers still loading or
/// stopping held the room, or `models.max_queued` loads already waited; the message names the
/// model asked for and what it waited for; nothing changed), `CORREX_E_CANCELLED`, `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// When the bounds are full, first waits for a model to have nothing in flight (running
/// inferences are never killed; at most the drain timeout, default 120 s). Then blocks until
/// the server is healthy (about a second for a small model; the health deadline defaults to
/// 30 s). Any thread; loads of different models run at once, a load of a model being loaded
/// waits for that load.
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
/// `CORREX_E_MODEL`, `CORREX_E_BUSY` (inferences still running after the drain timeout;
/// nothing changed), `CORREX_E_UNUSABLE`.
///
/// # Blocking and threads
/// Waits for the model's running inferences to finish (never kills them; at most
/// `models.drain_timeout_ms`, default 120 s), then until the server has exited (at most
/// `models.stop_grace_ms` after SIGTERM, default 1.5 s, then SIGKILL). Any thread.
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

/// The most recently used loaded model: `{"v": 1, "model": null}` or `{"v": 1, "model":
/// {descriptor}}`; `correx_models_status` lists them all.
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
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let model = r.runtime.models().current_model();
        Ok(json!({ "model": model }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// Whether every loaded model's server answers: `{"v": 1, "healthy": true}` or
/// `{"v": 1, "healthy": false, "reason": "model_id: ..."}` naming the first that does not.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for one HTTP call per loaded model (each at most the health timeout, 2 s); an
/// `openai` endpoint answering for the first time (or whose failed probe is due again) is also
/// probed: up to four short requests of at most 30 s each. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_model_health(
    rt: *const correx_runtime,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let v = match r.runtime.models().health_check() {
            ProviderHealth::Healthy => json!({"healthy": true}),
            ProviderHealth::Unhealthy { reason } => json!({"healthy": false, "reason": reason}),
        };
        Ok(v)
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

pub(super) fn known_model(r: &correx_runtime, id: &str) -> FfiResult<ModelDescriptor> {
    r.models.lock().get(id).cloned().ok_or_else(|| {
        Failure::new(
            CORREX_E_UNKNOWN_MODEL,
            format!(
                "model {id:?} was never loaded through this runtime; call correx_model_load first"
            ),
        )
    })
}

/// The stream callback that hands each chunk to the host's `on_chunk` (none: every chunk is
/// taken). Also used by `correx_session_infer`.
///
/// # Safety
/// `on_chunk` must be callable with `user_data` on the calling thread for as long as the
/// returned closure lives.
pub(super) unsafe fn forwarder(
    on_chunk: correx_chunk_fn,
    user_data: *mut c_void,
) -> impl FnMut(StreamChunk<'_>) -> StreamControl {
    let mut piece = Vec::new();
    move |chunk: StreamChunk<'_>| -> StreamControl {
        let Some(callback) = on_chunk else {
            return StreamControl::Continue;
        };
        piece.clear();
        piece.extend_from_slice(chunk.text.as_bytes());
        piece.push(0);
        let kind = match chunk.kind {
            ChunkKind::Text => CORREX_CHUNK_TEXT,
            ChunkKind::Reasoning => CORREX_CHUNK_REASONING,
        };
        // SAFETY: the host promised on_chunk is callable with user_data on this thread; the
        // text is NUL-terminated and outlives the call.
        let answer = unsafe {
            callback(
                user_data,
                kind,
                piece.as_ptr().cast::<c_char>(),
                chunk.text.len(),
            )
        };
        if answer == CORREX_CONTINUE {
            StreamControl::Continue
        } else {
            StreamControl::Stop
        }
    }
}

/// The response JSON of `correx_infer` and `correx_infer_stream`.
pub(super) fn response_json(resp: &InferenceResponse) -> Value {
    let mut v = json!({
        "text": resp.text,
        "usage": resp.usage,
        "finish_reason": resp.finish_reason.as_str(),
        "latency_ms": resp.latency_ms,
        "model": resp.model,
        "tool_calls": resp.tool_calls,
        "timings": resp.timings,
    });
    if let Some(o) = v.as_object_mut() {
        if let Some(r) = &resp.reasoning {
            o.insert("reasoning".into(), json!(r));
        }
        if let Some(e) = &resp.endpoint {
            o.insert("endpoint".into(), json!(e));
        }
    }
    v
}

/// Receives each piece of a streamed answer.
///
/// `kind` is `CORREX_CHUNK_TEXT` or `CORREX_CHUNK_REASONING`; `text` is `len` bytes of UTF-8
/// (a token or a few), NUL-terminated, living only during the call. Return `CORREX_CONTINUE`
/// to go on; any other value stops the generation (the call then returns
/// `CORREX_E_CANCELLED`). It runs on the thread that called `correx_infer_stream`, before that
/// call returns, with no correx lock held: it may call correx (`correx_cancel_trigger`, events,
/// other models) but must not free the runtime, and must not unwind (throw or `longjmp`) out.
pub type correx_chunk_fn = Option<
    unsafe extern "C" fn(user_data: *mut c_void, kind: i32, text: *const c_char, len: usize) -> i32,
>;

/// Runs one inference on a model loaded earlier through this runtime (reloading it first if
/// its residency unloaded it); appends `inference.completed`.
///
/// # Parameters
/// - `model_id`: a model passed to `correx_model_load` before.
/// - `request_json`: `{"v": 1, "context": {"system": "...", "task": "...", "entries":
///   [{"source": "model"|"user"|"tool", "content": "...", "tool_calls": [...], "tool_call_id":
///   "..."}]}, "config": {...}, "session": "..."}`. `context` is required (`{}` is an empty
///   pack: one empty user message); `session` (optional) keeps a conversation's requests to a
///   remote model on one endpoint, where its prompt is cached; in `context`, an entry needs `source` and `content`. Unknown fields are refused, at
///   every level. Every `config` field is optional: `temperature` (0.7), `top_p`
///   (0.95), `max_tokens` (512), `stop` ([]), `seed`, `top_k`, `min_p`, `typical_p`,
///   `repeat_penalty`, `repeat_last_n`, `presence_penalty`, `frequency_penalty`, `mirostat`,
///   `mirostat_tau`, `mirostat_eta` (unset: the server's default), `response_format`
///   (`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": {...}}}`),
///   `grammar` (GBNF), `tools` (`[{"name", "description", "parameters": {JSON schema}}]`, for a
///   server started with `--jinja`), `tool_choice` (`"auto"`, `"none"`, `"required"` or
///   `{"function": "name"}`).
/// - `cancel`: optional; triggering it closes the connection: the call returns
///   `CORREX_E_CANCELLED` at once and the server stops generating.
/// - `out_json`: receives `{"v": 1, "text": "...", "usage": {"prompt_tokens",
///   "completion_tokens", "total_tokens"}, "finish_reason": "stop"|"length"|"tool_calls"|...,
///   "latency_ms": 120, "model": "gemma", "tool_calls": [{"id", "name", "arguments": {...}}],
///   "timings": {llama-server's timings} or null, "reasoning": "..." (only when the model
///   reasoned), "endpoint": "http://..." (only for a remote model)}`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNKNOWN_MODEL`,
/// `CORREX_E_INFERENCE` (the message says which: unreachable, timed out, an HTTP error, a stream
/// that broke off or ended without its final event, a malformed event), `CORREX_E_CANCELLED`,
/// `CORREX_E_UNUSABLE`.
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
    // SAFETY: forwarded under this function's contract; no callback.
    unsafe {
        correx_infer_stream(
            rt,
            model_id,
            request_json,
            cancel,
            None,
            std::ptr::null_mut(),
            out_json,
            err,
        )
    }
}

/// As `correx_infer`, handing each piece of the answer to `on_chunk` as it arrives.
///
/// # Parameters
/// As `correx_infer`, plus:
/// - `on_chunk`: called for each piece (see `correx_chunk_fn`); NULL streams without a
///   callback (as `correx_infer`).
/// - `user_data`: passed to `on_chunk` untouched; correx never frees it.
///
/// # Returns
/// As `correx_infer`; `CORREX_E_CANCELLED` also when `on_chunk` asked to stop.
///
/// # Memory and lifetimes
/// `*out_json` (the whole answer, as `correx_infer`'s) is the caller's, freed with
/// `correx_string_free`; untouched on error. A chunk's text lives only during its callback.
///
/// # Blocking and threads
/// Blocks for the whole generation; `on_chunk` runs on the calling thread. Any thread;
/// inferences may run concurrently.
///
/// # Safety
/// Pointers are NULL or valid as documented; `on_chunk` is safe to call with `user_data` on
/// this thread.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn correx_infer_stream(
    rt: *const correx_runtime,
    model_id: *const c_char,
    request_json: *const c_char,
    cancel: *const correx_cancel,
    on_chunk: correx_chunk_fn,
    user_data: *mut c_void,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let id = unsafe { str_arg(model_id, "model_id") }?;
        // SAFETY: forwarded.
        let request: InferenceRequest = unsafe { request_arg(request_json, "request_json") }?;
        let d = known_model(r, id)?;
        // SAFETY: the host's promise on on_chunk and user_data is this function's contract.
        let mut forward = unsafe { forwarder(on_chunk, user_data) };
        let resp = r
            .runtime
            .models()
            .managed(&d)
            .infer_stream(&request, &token(cancel), &mut forward)
            .map_err(inference_failure)?;
        Ok(response_json(&resp))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// What `correx_embed` is asked.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbedRequest {
    inputs: Vec<String>,
}

/// Embeds texts on a model whose descriptor says `"serves": "embeddings"` (its server runs
/// with `--embeddings`), loading it first if needed like any resident (it counts against
/// `models.max_loaded` and the memory budget); appends `embedding.completed`.
///
/// # Parameters
/// - `model_id`: a model loaded through `correx_model_load` before (its descriptor is used).
/// - `inputs_json`: `{"v": 1, "inputs": ["text", ...]}`: 1 to 1,024 texts, none empty.
/// - `cancel`: optional; triggering it stops the load or the call (`CORREX_E_CANCELLED`).
/// - `out_json`: receives `{"v": 1, "model": "id", "vectors": [[0.1, ...], ...] (one per
///   input, in input order), "prompt_tokens": 12, "latency_ms": 40}`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT` (bad JSON, no inputs, an empty
/// one, more than 1,024, or a model that does not serve embeddings: nothing is sent),
/// `CORREX_E_UNKNOWN_MODEL`, `CORREX_E_INFERENCE`, `CORREX_E_CANCELLED`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for the call (and a load if needed). Any thread; calls may run concurrently.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_embed(
    rt: *const correx_runtime,
    model_id: *const c_char,
    inputs_json: *const c_char,
    cancel: *const correx_cancel,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let id = unsafe { str_arg(model_id, "model_id") }?;
        // SAFETY: forwarded.
        let request: EmbedRequest = unsafe { request_arg(inputs_json, "inputs_json") }?;
        let d = known_model(r, id)?;
        let e = r
            .runtime
            .models()
            .embed(&d, &request.inputs, &token(cancel))
            .map_err(inference_failure)?;
        Ok(json!({
            "model": e.model,
            "vectors": e.vectors,
            "prompt_tokens": e.prompt_tokens,
            "latency_ms": e.latency_ms,
        }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// Tokenizes `text` with the loaded model's tokenizer: `{"v": 1, "tokens": [1, 2, ...]}`.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_MODEL` (no model is
/// loaded: nothing is sent), `CORREX_E_INFERENCE` (the server failed or did not answer within
/// 10 s), `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Blocks for one local HTTP call, at most 10 s. Any thread.
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
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let text = unsafe { str_arg(text, "text") }?;
        let tokenizer = r.runtime.models().loaded_tokenizer().ok_or_else(|| {
            Failure::new(
                CORREX_E_MODEL,
                "no model is loaded; load one with correx_model_load before tokenizing",
            )
        })?;
        let tokens = tokenizer.tokenize(text).map_err(inference_failure)?;
        Ok(json!({ "tokens": tokens }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}

/// Counts the tokens of `text` with the loaded model's tokenizer. Never fails for want of a
/// server: with no model loaded (nothing is sent), or a server that fails or does not answer
/// within 10 s, it approximates characters / 4.
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
        let n = match r.runtime.models().loaded_tokenizer() {
            Some(t) => t.count(text) as u64,
            None => (text.chars().count() / 4) as u64,
        };
        // SAFETY: out checked; writable per the caller.
        unsafe { *out = n };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// What is loaded, loading or unloading, like Ollama's `/api/ps`, sorted by model id:
/// `{"v": 1, "models": [{"model_id", "state": "loaded"|"loading"|"unloading", "pid", "port",
/// "residency", "loaded_at_ms", "idle_expires_in_ms", "in_flight", "rss_bytes",
/// "estimated_bytes"}]}` (`pid`, `port`, `loaded_at_ms`, `idle_expires_in_ms`, `rss_bytes` and
/// `estimated_bytes` may be null); a remote model also has `"endpoints": [{"url", "healthy",
/// "in_flight"}]` and no pid or port.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Never waits for a load or an inference. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_models_status(
    rt: *const correx_runtime,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let models = serde_json::to_value(r.runtime.models().status()).unwrap_or(Value::Null);
        Ok(json!({ "models": models }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}
