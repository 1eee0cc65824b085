//! The runtime handle: creating and freeing it, the host approver, and the guard every call on
//! it runs behind.

use super::convert::{out_arg, str_arg, write_json};
use super::tools::tool_request_json;
use super::{
    correx_error, guard, Failure, FfiResult, CORREX_APPROVE, CORREX_APPROVE_FOR_SESSION,
    CORREX_DEFER, CORREX_E_CONFIG, CORREX_E_EVENT_STORE, CORREX_E_NULL, CORREX_E_TOOL_SETUP,
    CORREX_E_UNUSABLE,
};
use crate::approvals::{ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalRequest};
use crate::inference::ModelDescriptor;
use crate::runtime::{Runtime, RuntimeConfig, RuntimeError};
use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An approval callback: asked for every T2 and T3 tool before it runs.
///
/// `tool` is the tool's name, `tier` 0..3, `request_json` the full request with its context
/// (`{"v":1,"invocation_id":..,"session_id":..,"tool_name":..,"parameters":{..},"context":
/// {"session_id":..,"stage_id":..|null,"mode":"interactive"|"auto"|"deny","invocation_id":..,
/// "tier":2,"paths":["/abs/path",..],"argv":[..]|null,"notice":"..."|null}}`, `paths` being
/// every file the tool may change, `argv` the shell's command line, and `notice` why a person
/// must decide it whatever the rules or earlier answers (an MCP tool whose definition changed
/// since it was pinned, under `on_tool_change: "ask"`); both strings live only during the call.
/// Return `CORREX_APPROVE` to approve, `CORREX_APPROVE_FOR_SESSION` to approve it and the same
/// tool and argv prefix for the rest of the session, `CORREX_DEFER` to record the request for
/// a durable decision from any process (`correx_approvals_decide`; a session step returns
/// `CORREX_E_PENDING`, and a run asked about again is answered from its recorded decision
/// without calling back); any other value denies. Rules in the
/// config's `approvals.rules` are checked first: a request they allow or forbid never reaches
/// the callback. It runs
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
    fn evaluate(&self, request: &ApprovalRequest, context: &ApprovalContext) -> ApprovalDecision {
        // Clone out of the lock: the callback runs with no correx lock held.
        let Some(host) = self.0.read().clone() else {
            return ApprovalDecision::denied("no approval callback is registered");
        };
        let (Ok(tool), Ok(req)) = (
            CString::new(request.tool_name.clone()),
            CString::new(approval_json(request, context).to_string()),
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
        match answer {
            CORREX_APPROVE => ApprovalDecision::Approved,
            CORREX_APPROVE_FOR_SESSION => ApprovalDecision::ApprovedForSession,
            CORREX_DEFER => ApprovalDecision::Deferred,
            other => {
                ApprovalDecision::denied(format!("denied by the host approver (answer {other})"))
            }
        }
    }

    fn name(&self) -> String {
        "host".into()
    }

    // A registered callback may answer CORREX_DEFER: a run asked about before is answered
    // from its recorded request first.
    fn defers(&self) -> bool {
        self.0.read().is_some()
    }
}

/// The request as the host's approver sees it: the tool request and its context.
fn approval_json(request: &ApprovalRequest, context: &ApprovalContext) -> serde_json::Value {
    let mut v = tool_request_json(&request.request);
    v["context"] = serde_json::json!({
        "session_id": context.session_id,
        "stage_id": context.stage_id,
        "mode": context.mode,
        "invocation_id": request.request.invocation_id,
        "tier": request.tier.as_i32(),
        "paths": request.paths,
        "argv": request.argv,
        "notice": request.notice,
    });
    v
}

/// A correx runtime: the event log, the model manager and the sandboxed tools. Share one
/// handle among threads freely; free it once, after every other call on it returned.
pub struct correx_runtime {
    pub(super) runtime: Runtime,
    approver: Arc<SwitchApprover>,
    pub(super) models: Mutex<HashMap<String, ModelDescriptor>>,
    unusable: AtomicBool,
}

fn runtime_failure(e: RuntimeError) -> Failure {
    let code = match &e {
        RuntimeError::Config(_)
        | RuntimeError::Events(crate::events::EventStoreError::InvalidLocation { .. }) => {
            CORREX_E_CONFIG
        }
        RuntimeError::Events(_) | RuntimeError::Seal(_) | RuntimeError::Otlp(_) => {
            CORREX_E_EVENT_STORE
        }
        RuntimeError::Tool { .. }
        | RuntimeError::Sandbox(_)
        | RuntimeError::Jobs(_)
        | RuntimeError::Mcp { .. } => CORREX_E_TOOL_SETUP,
    };
    Failure::new(code, e.to_string())
}

/// Borrows a live, usable runtime.
///
/// # Safety
/// `rt` is NULL or a live runtime from `correx_runtime_new`.
pub(super) unsafe fn usable<'a>(rt: *const correx_runtime) -> FfiResult<&'a correx_runtime> {
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
pub(super) unsafe fn with_runtime(
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

/// As [`with_runtime`], for a call that answers one JSON object: `*out_json` must not be NULL
/// (checked first), and receives what `body` returns, with `"v": 1`.
///
/// # Safety
/// As [`with_runtime`]; `out_json` is NULL or valid for a write.
pub(super) unsafe fn answer_json(
    rt: *const correx_runtime,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
    body: impl FnOnce(&correx_runtime) -> FfiResult<Value>,
) -> i32 {
    let write = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        let value = body(r)?;
        // SAFETY: out checked; writable per the caller.
        unsafe { write_json(out, value) };
        Ok(())
    };
    // SAFETY: forwarded from our caller.
    unsafe { with_runtime(rt, err, write) }
}

/// Creates a runtime from a config JSON object.
///
/// # Parameters
/// - `config_json`: `{"v": 1, "event_log": "/path/events.db", "durability": "full"|"normal",
///   "sandbox_root": "/path", "tools": {"shell": {...}, "file_read": {...}, "file_write": {...},
///   "file_edit": {...}}, "models": {"server_bin", "port", "port_count", "max_loaded",
///   "memory_budget_mb", "max_queued", "liveness_interval_ms", "health_timeout_ms", "log_dir",
///   "read_timeout_ms", "drain_timeout_ms", "stop_grace_ms", "session_spill_in_flight",
///   "isolation": "required"|"best_effort"|"none"},
///   "approvals": {"engine": "callback"|"auto"|"deny",
///   "max_tier": 2, "rules": [{"tool", "argv_prefix", "action": "allow"|"ask"|"forbid"}]},
///   "mcp_servers": {"name": {"command": ["/path/server", "arg"], "env", "working_dirs",
///   "isolation", "tier", "tools": {"tool": {"tier"}}, "start": "lazy"|"open",
///   "on_tool_change": "refuse"|"ask",
///   "startup_timeout_ms", "call_timeout_ms", "max_call_ms", "max_line_bytes"}},
///   "seal": {"file": "/path/log.seals", "interval_ms": 60000, "key_file": "/path/key"},
///   "otlp": {"endpoint": "http://127.0.0.1:4318", "service_name": "correx",
///   "queue_spans": 2048, "timeout_ms": 5000}}`. Every tool is disabled
///   unless `"enabled": true`; empty allowlists deny everything; an MCP server's tools are
///   `name.tool` in `correx_tools_list` and `correx_tool_execute`. docs/reference/config.md
///   lists every field. `event_log` may instead be `"postgres://USER@HOST:PORT/DB"` in a library built
///   with the cargo feature `postgres` (the password from `PGPASSWORD` or a password file,
///   never the URL); a library without it refuses one with `CORREX_E_CONFIG`.
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

/// Test hook (feature `test-hooks`, not in a shipped library or its header): panics inside
/// correx, for the panic guard's tests. Returns `CORREX_E_PANIC` and leaves the
/// runtime unusable (every later call returns `CORREX_E_UNUSABLE`; freeing still works).
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[cfg(feature = "test-hooks")]
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
