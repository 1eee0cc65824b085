//! `correx_subscription`: every event after a position, history then live, from the host's own
//! thread with a blocking call that has a timeout (no callbacks from correx threads).

use super::convert::{out_arg, write_json};
use super::events::{event_json, store_failure};
use super::runtime::{correx_runtime, with_runtime};
use super::{correx_error, guard, Failure, FfiResult, CORREX_E_NULL, CORREX_E_UNUSABLE};
use crate::events::Subscription;
use parking_lot::Mutex;
use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A subscription to the event log: every event with a position greater than the one it was
/// created with, in position order, exactly once, appended by any thread or process. Use it
/// from one thread at a time; free it with `correx_subscription_free`.
pub struct correx_subscription {
    inner: Mutex<Subscription>,
    unusable: AtomicBool,
}

/// Subscribes to every event after position `after` (0: from the first event).
///
/// # Returns
/// `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_EVENT_STORE` (the log could not be opened for
/// reading), `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// On success `*out` owns a subscription freed with `correx_subscription_free`; on error it is
/// untouched. It keeps the log open until freed, also after `correx_runtime_free`.
///
/// # Blocking and threads
/// Opens a read connection; never waits for events. Any thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_subscribe(
    rt: *const correx_runtime,
    after: u64,
    out: *mut *mut correx_subscription,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult {
        let out = out_arg(out, "out")?;
        let sub = r.runtime.events().subscribe(after).map_err(store_failure)?;
        let handle = Box::new(correx_subscription {
            inner: Mutex::new(sub),
            unusable: AtomicBool::new(false),
        });
        // SAFETY: out checked; writable per the caller.
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    };
    // SAFETY: rt and err are NULL or valid, per this function's contract.
    unsafe { with_runtime(rt, err, body) }
}

/// Waits up to `timeout_ms` for the next event (0: only what is already stored).
///
/// # Parameters
/// - `out_json`: receives the event as `correx_events_read_all` gives each one (`{"v": 1,
///   "position", "event_id", "stream_id", "stream_version", "type_id", ..., "payload",
///   "summary"}`), or NULL when none arrived in time.
///
/// # Returns
/// `CORREX_OK` (also on a timeout: `*out_json` is then NULL), `CORREX_E_NULL`,
/// `CORREX_E_EVENT_STORE` (a read failed, or a stored row cannot be decoded: the subscription
/// does not move past it), `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`.
///
/// # Blocking and threads
/// Blocks up to `timeout_ms`; an append in this process wakes it at once, one in another
/// process within about 2 ms. One thread at a time per subscription (others wait their turn).
///
/// # Safety
/// `sub` is NULL or live; `out_json` and `err` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn correx_subscription_next(
    sub: *const correx_subscription,
    timeout_ms: u32,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    // SAFETY: the caller promised sub is NULL or live.
    let handle = unsafe { sub.as_ref() };
    let poison = || {
        if let Some(h) = handle {
            h.unusable.store(true, Ordering::SeqCst);
        }
    };
    let body = || -> FfiResult {
        let out = out_arg(out_json, "out_json")?;
        let h = handle.ok_or_else(|| Failure::new(CORREX_E_NULL, "sub is NULL"))?;
        if h.unusable.load(Ordering::SeqCst) {
            return Err(Failure::new(
                CORREX_E_UNUSABLE,
                "this subscription is unusable after a panic; free it and subscribe again from its last position",
            ));
        }
        let next = h
            .inner
            .lock()
            .next_timeout(Duration::from_millis(u64::from(timeout_ms)))
            .map_err(store_failure)?;
        match next {
            // SAFETY: out checked; writable per the caller.
            Some(e) => unsafe { write_json(out, event_json(&e)) },
            // SAFETY: as above.
            None => unsafe { *out = std::ptr::null_mut() },
        }
        Ok(())
    };
    // SAFETY: err is NULL or valid, per this function's contract.
    unsafe { guard(err, poison, body) }
}

/// The position of the last event delivered (or the one the subscription started after):
/// subscribe again after it to resume. 0 for NULL.
///
/// # Blocking and threads
/// Waits while another thread is inside `correx_subscription_next` on the same subscription.
///
/// # Safety
/// `sub` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn correx_subscription_position(sub: *const correx_subscription) -> u64 {
    // SAFETY: the caller promised sub is NULL or live.
    match unsafe { sub.as_ref() } {
        Some(h) => h.inner.lock().position(),
        None => 0,
    }
}

/// Frees a subscription. NULL is a no-op; freeing twice is undefined behaviour.
///
/// # Safety
/// `sub` is NULL or a subscription from `correx_subscribe` not yet freed, with no call on it
/// running.
#[no_mangle]
pub unsafe extern "C" fn correx_subscription_free(sub: *mut correx_subscription) {
    if !sub.is_null() {
        // SAFETY: ownership of a Box-made handle passes back.
        drop(unsafe { Box::from_raw(sub) });
    }
}
