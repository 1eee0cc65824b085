//! What correx records: the typed domain events (models, inference, tools), the streams they go
//! to, and a check of a log against their schemas.
//!
//! This sits above the event log: [`crate::events`] stores and reads events by stream, type and
//! id and knows nothing of what they mean.

mod events;
mod usage;

pub use events::{DomainEvent, EventType, UnloadReason};
pub use usage::TokenUsage;

use crate::events::{AppendResult, EventStore, ExpectedVersion, LogReport, RecordedEvent, Result};
use std::path::Path;

/// The stream of the model manager's events (loads, unloads, inferences).
pub const MODEL_STREAM: &str = "model-manager";

/// The event stream of a session's tool events.
pub fn session_stream(session_id: &str) -> String {
    format!("session-{session_id}")
}

impl RecordedEvent {
    /// The typed domain event, or `None` when `type_id` is not one correx knows (the raw event
    /// is still here to read).
    ///
    /// # Errors
    /// [`crate::EventStoreError::CorruptEvent`] when the type is known but the payload does not
    /// match its schema.
    pub fn domain(&self) -> Result<Option<DomainEvent>> {
        DomainEvent::decode(self)
    }
}

/// Appends one typed domain event to `stream` with [`ExpectedVersion::Any`].
///
/// # Errors
/// As [`EventStore::append`].
pub fn append_domain(
    store: &dyn EventStore,
    stream: &str,
    event: &DomainEvent,
) -> Result<AppendResult> {
    store.append(stream, ExpectedVersion::Any, &[event.to_new_event()])
}

/// Checks the log at `path` without writing to it: that it is a correx log, SQLite's integrity
/// check, every stream's versions gapless, every payload JSON, and every event of a type correx
/// knows readable as that type (a session step's answer, result and context in their shape).
///
/// # Errors
/// [`crate::EventStoreError::NotALog`] when the file is missing or not a correx log;
/// [`crate::EventStoreError::Open`] / [`crate::EventStoreError::Sqlite`] when it cannot be read
/// at all. Problems found inside a readable log are in the report, not errors.
pub fn verify_log(path: &Path) -> Result<LogReport> {
    verify_log_sealed(path, &[])
}

/// As [`verify_log`], and the log against `seals` (see [`crate::events::Seal`]): a log
/// shorter than a seal, or holding another hash at a sealed position, is a problem naming the
/// first position concerned.
///
/// # Errors
/// As [`verify_log`].
pub fn verify_log_sealed(path: &Path, seals: &[crate::events::Seal]) -> Result<LogReport> {
    crate::events::verify_log_with(path, &check_domain_event, seals)
}

/// What is wrong with `event` as a domain event of its type, if anything (`None` for a type
/// correx does not define): the check `verify` runs on each event.
pub fn check_domain_event(event: &crate::events::RecordedEvent) -> Option<String> {
    if !DomainEvent::TYPE_IDS.contains(&event.type_id.as_str()) {
        return None;
    }
    match DomainEvent::decode(event) {
        Ok(Some(d)) => d.shape_problem(),
        Ok(None) => None,
        Err(e) => Some(e.to_string()),
    }
}
