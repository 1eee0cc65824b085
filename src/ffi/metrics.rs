//! Metrics: the runtime's Prometheus text.

use super::convert::out_arg;
use super::events::store_failure;
use super::runtime::{correx_runtime, with_runtime};
use super::{correx_error, FfiResult};
use std::ffi::{c_char, CString};

/// The runtime's metrics as Prometheus text exposition (format 0.0.4, the body a `/metrics`
/// endpoint serves): what the log records (`correx_tool_runs_total{tool,outcome}`, approval
/// waits, inference latency and tokens, model loads and unloads by reason, jobs, session
/// steps) and what the runtime knows live (models resident and in flight, append latency).
/// docs/observability.md lists every family.
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_text` is the caller's, a NUL-terminated UTF-8 string freed with
/// `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Reads the log: the first call reads all of it, later ones what was appended since (calls
/// take turns). Any thread.
///
/// # Safety
/// `rt` is NULL or a live runtime; `out_text` is NULL or valid for one pointer write; `err` is
/// NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn correx_metrics(
    rt: *const correx_runtime,
    out_text: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out_text, "out_text")?;
        let text = r.runtime.metrics().map_err(store_failure)?;
        // The exposition writer drops NUL bytes, so this cannot fail.
        let text = CString::new(text).unwrap_or_default();
        // SAFETY: out checked by out_arg; writable per the caller.
        unsafe { *out = text.into_raw() };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}
