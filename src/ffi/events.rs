//! The event log: append and read.

use super::convert::{out_arg, parse_v1, str_arg, write_json};
use super::runtime::{answer_json, correx_runtime, with_runtime};
use super::{
    correx_error, Failure, FfiResult, CORREX_EXPECT_ANY, CORREX_EXPECT_EXACT,
    CORREX_EXPECT_NO_STREAM, CORREX_E_CONFLICT, CORREX_E_EVENT_STORE, CORREX_E_INVALID_ARGUMENT,
};
use crate::events::{EventStore, EventStoreError, ExpectedVersion, NewEvent, RecordedEvent};
use crate::ids::EventId;
use serde_json::{json, Value};
use std::ffi::c_char;

pub(super) fn store_failure(e: EventStoreError) -> Failure {
    let code = match &e {
        EventStoreError::WrongExpectedVersion { .. } => CORREX_E_CONFLICT,
        EventStoreError::InvalidAppend { .. }
        | EventStoreError::IdempotencyConflict { .. }
        | EventStoreError::InvalidLocation { .. } => CORREX_E_INVALID_ARGUMENT,
        EventStoreError::Open { .. }
        | EventStoreError::Sqlite { .. }
        | EventStoreError::Busy { .. }
        | EventStoreError::CommitFailed { .. }
        | EventStoreError::CommitUnknown { .. }
        | EventStoreError::CorruptEvent { .. }
        | EventStoreError::NotALog { .. }
        | EventStoreError::SchemaTooNew { .. }
        | EventStoreError::Connect { .. }
        | EventStoreError::Postgres { .. }
        | EventStoreError::Settings { .. } => CORREX_E_EVENT_STORE,
    };
    Failure::new(code, e.to_string())
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

pub(super) fn event_json(e: &RecordedEvent) -> Value {
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
///   `type_id` is required and not empty; the others are optional (`schema_version` 1, `payload`
///   null, a fresh `event_id`); unknown fields are refused. An `event_id` appended before is
///   stored once (the retry returns the first positions).
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
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: forwarded.
        let stream = unsafe { str_arg(stream, "stream") }?;
        let events = r
            .runtime
            .events()
            .read_stream(stream, from_version, max as usize)
            .map_err(store_failure)?;
        let list: Vec<Value> = events.iter().map(event_json).collect();
        Ok(json!({ "events": list }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
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
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        let events = r
            .runtime
            .events()
            .read_all(from_position, max as usize)
            .map_err(store_failure)?;
        let list: Vec<Value> = events.iter().map(event_json).collect();
        Ok(json!({ "events": list }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
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
