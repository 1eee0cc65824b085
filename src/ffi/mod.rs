//! The C ABI, one module per C type or concern: `runtime` (the handle, the approver, the guard
//! around every call on it), `cancel`, `models` (models and inference), `tools`, `events`,
//! `subscription`.
//! Every export has one shape: a panic guard around the body, pointer and string conversions
//! that turn bad input into a status, then a call into safe Rust.
//!
//! Conventions (see `include/correx.h`):
//! - Every call returns an `int32_t` status, `CORREX_OK` (0) on success, and takes an optional
//!   `correx_error **err` that receives a heap error (code and message) on failure, to be freed
//!   with `correx_error_free`. There is no thread-local "last error".
//! - Handles are opaque. Constructors write the handle to an out-param only on success.
//!   Every `*_free(NULL)` is a no-op; freeing twice is undefined behaviour.
//! - Strings in are NUL-terminated UTF-8; strings out belong to the caller, who frees them with
//!   `correx_string_free`.
//! - Complex payloads are JSON objects carrying `"v": 1`.
//! - A panic inside correx is caught, returns `CORREX_E_PANIC`, and marks the handle unusable:
//!   later calls on it return `CORREX_E_UNUSABLE` (freeing it is still allowed).

#![allow(non_camel_case_types)]

mod approvals;
mod cancel;
mod convert;
mod events;
mod jobs;
mod log_bridge;
mod mcp;
mod mcp_pins;
mod metrics;
mod models;
mod runtime;
mod sessions;
mod subscription;
mod tools;

pub use approvals::*;
pub use cancel::*;
pub use events::*;
pub use jobs::*;
pub use log_bridge::{correx_log_callback, correx_set_log_callback};
pub use mcp::*;
pub use mcp_pins::*;
pub use metrics::*;
pub use models::*;
pub use runtime::*;
pub use sessions::*;
pub use subscription::*;
pub use tools::*;

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const CORREX_OK: i32 = 0;
/// A required pointer argument was NULL.
pub const CORREX_E_NULL: i32 = 1;
/// An argument is malformed: invalid UTF-8, JSON that does not parse or has the wrong shape,
/// a `"v"` other than 1, an out-of-range integer.
pub const CORREX_E_INVALID_ARGUMENT: i32 = 2;
/// The runtime config is invalid (the message names the field).
pub const CORREX_E_CONFIG: i32 = 3;
/// The event log failed (I/O, corruption, locked too long).
pub const CORREX_E_EVENT_STORE: i32 = 4;
/// An append's expected version did not hold (re-read the stream and retry), or a session
/// step key was recorded for another request (use a new key).
pub const CORREX_E_CONFLICT: i32 = 5;
/// A model could not be loaded or unloaded.
pub const CORREX_E_MODEL: i32 = 6;
/// An inference failed (connection, timeout, HTTP, context size, malformed body).
pub const CORREX_E_INFERENCE: i32 = 7;
/// The call was cancelled through its `correx_cancel`.
pub const CORREX_E_CANCELLED: i32 = 8;
/// A panic inside correx was caught; the handle is now unusable.
pub const CORREX_E_PANIC: i32 = 9;
/// The handle was marked unusable by an earlier caught panic; free it and make a new one.
pub const CORREX_E_UNUSABLE: i32 = 10;
/// The named model was never loaded through this runtime.
pub const CORREX_E_UNKNOWN_MODEL: i32 = 11;
/// A file or tool could not be set up (a missing allowed path or executable).
pub const CORREX_E_TOOL_SETUP: i32 = 12;
/// A model could not be replaced or unloaded because inferences were still running on it
/// after the drain timeout; nothing was changed.
pub const CORREX_E_BUSY: i32 = 13;
/// A session step's run waits for a durable approval decision: nothing ran. Decide the
/// request (`correx_approvals_decide`, from any process), then call the step again.
pub const CORREX_E_PENDING: i32 = 14;
/// The named record does not exist (an approval request the session never made).
pub const CORREX_E_NOT_FOUND: i32 = 15;

/// An approval callback's answer that approves. Any value but this,
/// `CORREX_APPROVE_FOR_SESSION` and `CORREX_DEFER` denies.
pub const CORREX_APPROVE: i32 = 1;
/// An approval callback's answer that approves this request and, for the rest of its session,
/// every request of the same tool whose argv starts with this one's (every request of a tool
/// without an argv): they are not asked about again.
pub const CORREX_APPROVE_FOR_SESSION: i32 = 2;
/// An approval callback's answer that denies.
pub const CORREX_DENY: i32 = 0;
/// An approval callback's answer that defers the request to a durable decision: it is
/// recorded (`tool.approval_requested`) and waits for `correx_approvals_decide` from any
/// process; the run does not start now (a session step returns `CORREX_E_PENDING`). Asked
/// again for the same run, the recorded decision answers before the callback is called.
pub const CORREX_DEFER: i32 = 3;

/// `correx_infer_stream`'s chunk callback: the piece is answer text.
pub const CORREX_CHUNK_TEXT: i32 = 0;
/// `correx_infer_stream`'s chunk callback: the piece is the model's reasoning.
pub const CORREX_CHUNK_REASONING: i32 = 1;
/// A chunk callback's answer that lets the generation go on. Any other value stops it.
pub const CORREX_CONTINUE: i32 = 0;

/// `correx_events_append`: append whatever the stream holds.
pub const CORREX_EXPECT_ANY: i32 = 0;
/// `correx_events_append`: the stream must not exist yet.
pub const CORREX_EXPECT_NO_STREAM: i32 = 1;
/// `correx_events_append`: the stream's last version must equal `expected_version`.
pub const CORREX_EXPECT_EXACT: i32 = 2;

/// The ABI's major version: bumped on incompatible changes.
pub const CORREX_ABI_VERSION_MAJOR: i32 = 0;
/// The ABI's minor version: bumped when calls are added.
pub const CORREX_ABI_VERSION_MINOR: i32 = 4;
/// The ABI's patch version: bumped for fixes that change no signature.
pub const CORREX_ABI_VERSION_PATCH: i32 = 0;
/// The ABI version as one number: `MAJOR << 16 | MINOR << 8 | PATCH`; compare it with
/// `correx_abi_version()` at run time.
pub const CORREX_ABI_VERSION: i32 =
    (CORREX_ABI_VERSION_MAJOR << 16) | (CORREX_ABI_VERSION_MINOR << 8) | CORREX_ABI_VERSION_PATCH;

/// An error: a `CORREX_E_*` code and a message saying what failed and what to try.
pub struct correx_error {
    code: i32,
    message: CString,
}

/// What an export's body fails with: a status code and a message.
pub(crate) struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: crate::text::bounded(message),
        }
    }
}

pub(crate) type FfiResult<T = ()> = Result<T, Failure>;

/// Writes `f` to `err` (when the caller asked for errors) and returns its code.
///
/// # Safety
/// `err` is NULL or valid for one pointer write.
unsafe fn report(err: *mut *mut correx_error, f: Failure) -> i32 {
    if !err.is_null() {
        let message = CString::new(f.message.replace('\0', "\\0")).unwrap_or_default();
        let boxed = Box::new(correx_error {
            code: f.code,
            message,
        });
        // SAFETY: the caller promised err is valid for a write.
        unsafe { *err = Box::into_raw(boxed) };
    }
    f.code
}

/// Runs `body` behind the panic guard. `poison` is called when the body panicked, to mark
/// the handle it was using unusable.
///
/// # Safety
/// `err` is NULL or valid for one pointer write.
pub(crate) unsafe fn guard(
    err: *mut *mut correx_error,
    poison: impl FnOnce(),
    body: impl FnOnce() -> FfiResult,
) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let failure = match outcome {
        Ok(Ok(())) => return CORREX_OK,
        Ok(Err(f)) => f,
        Err(panic) => {
            poison();
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Failure::new(
                CORREX_E_PANIC,
                format!("correx panicked ({what}); this handle is now unusable, free it"),
            )
        }
    };
    // SAFETY: forwarded from our caller's contract.
    unsafe { report(err, failure) }
}

/// The ABI version of the loaded library, `MAJOR << 16 | MINOR << 8 | PATCH`.
///
/// # Returns
/// The version; compare it with the header's `CORREX_ABI_VERSION`.
///
/// # Blocking and threads
/// Never blocks; callable from any thread.
#[no_mangle]
pub extern "C" fn correx_abi_version() -> i32 {
    CORREX_ABI_VERSION
}

/// The error's `CORREX_E_*` code.
///
/// # Parameters
/// - `error`: an error from any correx call, or NULL (then `CORREX_E_NULL` is returned).
///
/// # Safety
/// `error` is NULL or a live error from correx.
#[no_mangle]
pub unsafe extern "C" fn correx_error_code(error: *const correx_error) -> i32 {
    // SAFETY: the caller promised error is NULL or live.
    match unsafe { error.as_ref() } {
        Some(e) => e.code,
        None => CORREX_E_NULL,
    }
}

/// The error's message: what failed and what to try.
///
/// # Parameters
/// - `error`: an error from any correx call, or NULL (then an empty string is returned).
///
/// # Memory and lifetimes
/// The string belongs to the error and lives until `correx_error_free(error)`; do not free it.
///
/// # Safety
/// `error` is NULL or a live error from correx.
#[no_mangle]
pub unsafe extern "C" fn correx_error_message(error: *const correx_error) -> *const c_char {
    // SAFETY: the caller promised error is NULL or live.
    match unsafe { error.as_ref() } {
        Some(e) => e.message.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// Frees an error. NULL is a no-op; freeing the same error twice is undefined behaviour.
///
/// # Safety
/// `error` is NULL or an error from correx not yet freed.
#[no_mangle]
pub unsafe extern "C" fn correx_error_free(error: *mut correx_error) {
    if !error.is_null() {
        // SAFETY: the caller passes ownership of an error correx allocated with Box.
        drop(unsafe { Box::from_raw(error) });
    }
}

/// Frees a string correx returned. NULL is a no-op; freeing twice is undefined behaviour.
///
/// # Safety
/// `s` is NULL or a string returned by correx not yet freed.
#[no_mangle]
pub unsafe extern "C" fn correx_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: the caller passes ownership of a string correx made with CString::into_raw.
        drop(unsafe { CString::from_raw(s) });
    }
}
