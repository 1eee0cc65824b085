//! Pointer and string conversions: bad input becomes a status, never a crash.

use super::{Failure, FfiResult, CORREX_E_INVALID_ARGUMENT, CORREX_E_NULL};
use serde_json::{Map, Value};
use std::ffi::{c_char, CStr, CString};

/// The JSON payload version this build reads and writes.
pub(crate) const PAYLOAD_VERSION: u64 = 1;

/// Borrows a NUL-terminated UTF-8 argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, name: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(Failure::new(CORREX_E_NULL, format!("{name} is NULL")));
    }
    // SAFETY: non-null, and the caller promised a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|e| {
        Failure::new(
            CORREX_E_INVALID_ARGUMENT,
            format!("{name} is not valid UTF-8 (at byte {})", e.valid_up_to()),
        )
    })
}

/// Checks an out-param is not NULL.
pub(crate) fn out_arg<T>(p: *mut T, name: &str) -> FfiResult<*mut T> {
    if p.is_null() {
        Err(Failure::new(
            CORREX_E_NULL,
            format!("{name} (an out-param) is NULL"),
        ))
    } else {
        Ok(p)
    }
}

/// Parses a `{"v": 1, ...}` object and returns it without `"v"`.
pub(crate) fn json_v1(text: &str, what: &str) -> FfiResult<Map<String, Value>> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        Failure::new(
            CORREX_E_INVALID_ARGUMENT,
            format!("{what} is not JSON: {e}"),
        )
    })?;
    let Value::Object(mut map) = v else {
        return Err(Failure::new(
            CORREX_E_INVALID_ARGUMENT,
            format!("{what} must be a JSON object"),
        ));
    };
    match map.remove("v") {
        Some(Value::Number(n)) if n.as_u64() == Some(PAYLOAD_VERSION) => Ok(map),
        Some(other) => Err(Failure::new(
            CORREX_E_INVALID_ARGUMENT,
            format!("{what} has \"v\": {other}; this library reads \"v\": {PAYLOAD_VERSION}"),
        )),
        None => Err(Failure::new(
            CORREX_E_INVALID_ARGUMENT,
            format!("{what} has no \"v\"; add \"v\": {PAYLOAD_VERSION}"),
        )),
    }
}

/// Deserializes a `{"v": 1, ...}` object into `T`.
pub(crate) fn parse_v1<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> FfiResult<T> {
    let map = json_v1(text, what)?;
    // Strictly: an array never binds to a struct by position.
    crate::strict_json::from_value(Value::Object(map))
        .map_err(|e| Failure::new(CORREX_E_INVALID_ARGUMENT, format!("{what}: {e}")))
}

/// Borrows the NUL-terminated UTF-8 argument `p` and deserializes it as a `{"v": 1, ...}`
/// object into `T`: [`str_arg`], then [`parse_v1`].
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn request_arg<T: serde::de::DeserializeOwned>(
    p: *const c_char,
    name: &str,
) -> FfiResult<T> {
    // SAFETY: per the contract above.
    let text = unsafe { str_arg(p, name) }?;
    parse_v1(text, name)
}

/// `value` with `"v": 1` added, as a caller-owned C string.
pub(crate) fn json_out(mut value: Value) -> *mut c_char {
    if let Value::Object(map) = &mut value {
        map.insert("v".into(), Value::from(PAYLOAD_VERSION));
    }
    // serde_json never emits a NUL byte (it escapes U+0000), so this cannot fail.
    CString::new(value.to_string())
        .unwrap_or_default()
        .into_raw()
}

/// Writes a JSON result to an out-param.
///
/// # Safety
/// `out` was checked by [`out_arg`] and is valid for one pointer write.
pub(crate) unsafe fn write_json(out: *mut *mut c_char, value: Value) {
    // SAFETY: per the contract above.
    unsafe { *out = json_out(value) };
}
