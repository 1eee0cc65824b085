//! The cancellation flag for blocking calls.

use super::convert::out_arg;
use super::{correx_error, guard, FfiResult};
use crate::cancel::CancelToken;

/// A cancellation flag for blocking calls (`correx_model_load`, `correx_infer`,
/// `correx_infer_stream`, `correx_tool_execute_with_cancel`). Trigger it from any thread.
pub struct correx_cancel {
    token: CancelToken,
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

pub(super) fn token(cancel: *const correx_cancel) -> CancelToken {
    // SAFETY: callers pass NULL or a live flag (documented on every export taking one).
    match unsafe { cancel.as_ref() } {
        Some(c) => c.token.clone(),
        None => CancelToken::new(),
    }
}
