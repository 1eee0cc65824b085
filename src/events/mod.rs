//! The event log: every fact correx records, append-only, in SQLite on disk.
//!
//! An event belongs to a stream (a session, the model manager, ...), has a gapless per-stream
//! version (1, 2, 3, ...) and a global position that strictly increases across the whole store.
//! [`SqliteEventStore`] keeps the log in one SQLite file in WAL mode; with the default
//! [`Durability::Full`] an append that returned `Ok` survives a crash of the process and a power
//! loss (see [`Durability`] for exactly what each level promises).
//!
//! ```
//! use correx::{EventStore, ExpectedVersion, NewEvent, SqliteEventStore};
//! let dir = std::env::temp_dir().join(format!("correx-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let store = SqliteEventStore::open(dir.join("events.db"))?;
//! let event = NewEvent::new("note.added", 1, serde_json::json!({"text": "hello"}));
//! let appended = store.append("notes", ExpectedVersion::NoStream, &[event])?;
//! assert_eq!(appended.stream_version, 1);
//! let back = store.read_stream("notes", 1, 10)?;
//! assert_eq!(back[0].payload["text"], "hello");
//! # drop(store); std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod chain;
mod erase;
mod error;
pub mod evidence;
mod latency;
mod log;
pub mod merkle;
#[cfg(feature = "postgres")]
mod postgres;
mod rows;
mod seal;
mod sqlite;
mod subscription;
mod time;
pub(crate) mod verify;

pub use erase::{EraseError, Erased, ERASED_TYPE, ERASURE_STREAM, TOMBSTONE};
pub use error::EventStoreError;
pub use latency::LatencySnapshot;
pub use log::EventLog;
#[cfg(feature = "postgres")]
pub use postgres::{is_postgres_url, PostgresEventStore};
pub use seal::{Seal, SealConfig, SealError, SealKey, SealOptions, SealWriter};
pub use sqlite::{Checkpoints, Durability, SqliteEventStore, StoreOptions};
pub use subscription::Subscription;
pub use time::format_rfc3339_ms;
pub use verify::{verify_log_with, LogProblem, LogReport, CHAIN_BREAK};

use crate::ids::EventId;
use serde::{Deserialize, Serialize};

/// The result type of the event store.
pub type Result<T, E = EventStoreError> = std::result::Result<T, E>;

/// An event to append.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    /// Unique in the store: appending the same id again with the same content stores
    /// nothing and returns the positions of the first append; with other content it is an
    /// [`EventStoreError::IdempotencyConflict`].
    pub event_id: EventId,
    /// What kind of event this is, e.g. `tool.execution_started`.
    pub type_id: String,
    /// The version of the payload's schema for `type_id`.
    pub schema_version: u32,
    /// Groups events of one logical operation (for example one agent turn).
    #[serde(default)]
    pub correlation_id: Option<String>,
    /// The event that caused this one.
    #[serde(default)]
    pub causation_id: Option<String>,
    /// The event's data.
    pub payload: serde_json::Value,
}

impl NewEvent {
    /// An event with a fresh id and no correlation or causation.
    pub fn new(
        type_id: impl Into<String>,
        schema_version: u32,
        payload: serde_json::Value,
    ) -> Self {
        NewEvent {
            event_id: EventId::random(),
            type_id: type_id.into(),
            schema_version,
            correlation_id: None,
            causation_id: None,
            payload,
        }
    }

    /// Sets the correlation id.
    pub fn with_correlation(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// Sets the causation id.
    pub fn with_causation(mut self, id: impl Into<String>) -> Self {
        self.causation_id = Some(id.into());
        self
    }
}

/// An event as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    /// Global position, strictly increasing across the store, starting at 1.
    pub position: u64,
    /// The event's unique id.
    pub event_id: EventId,
    /// The stream it belongs to.
    pub stream_id: String,
    /// Its version in the stream: 1, 2, 3, ... with no gaps.
    pub stream_version: u64,
    /// What kind of event this is.
    pub type_id: String,
    /// The payload's schema version.
    pub schema_version: u32,
    /// When it was appended: milliseconds since the Unix epoch, UTC.
    pub timestamp_ms: i64,
    /// Groups events of one logical operation.
    pub correlation_id: Option<String>,
    /// The event that caused this one.
    pub causation_id: Option<String>,
    /// The event's data.
    pub payload: serde_json::Value,
}

impl RecordedEvent {
    /// The timestamp as RFC 3339 UTC with milliseconds, e.g. `2026-11-29T18:54:06.123Z`.
    pub fn timestamp_rfc3339(&self) -> String {
        format_rfc3339_ms(self.timestamp_ms)
    }
}

/// The stream version an append expects, for optimistic concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedVersion {
    /// Append whatever the stream holds.
    Any,
    /// The stream must not exist yet.
    NoStream,
    /// The stream's last version must be exactly this.
    Exact(u64),
}

/// Where an append landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendResult {
    /// Global position of the first event appended.
    pub first_position: u64,
    /// Global position of the last event appended.
    pub last_position: u64,
    /// The stream's version after the append (the last event's version).
    pub stream_version: u64,
}

/// An append-only event log. Blocking and shared across threads.
pub trait EventStore: Send + Sync {
    /// Appends `events` to `stream` atomically: all of them or none.
    ///
    /// # Errors
    /// [`EventStoreError::WrongExpectedVersion`] when `expected` does not hold; SQLite errors
    /// otherwise. An empty `events` is [`EventStoreError::InvalidAppend`].
    fn append(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<AppendResult>;

    /// Up to `max` events of `stream` with version `>= from_version`, in version order.
    ///
    /// # Errors
    /// SQLite errors, or [`EventStoreError::CorruptEvent`] naming the bad row's position.
    fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>>;

    /// As [`EventStore::read_stream`], each event checked against the log's hash chain
    /// where the store keeps one: an event whose stored bytes no longer match its hash (a
    /// changed byte anywhere in the row) is [`EventStoreError::CorruptEvent`] at its position.
    /// An event the chain does not cover (appended before it, or by a store without one) is
    /// returned unchecked. The default checks nothing.
    ///
    /// # Errors
    /// As [`EventStore::read_stream`]; [`EventStoreError::CorruptEvent`] for a damaged event.
    fn read_stream_verified(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        self.read_stream(stream, from_version, max)
    }

    /// Up to `max` events with position `>= from_position`, in position order.
    ///
    /// # Errors
    /// As [`EventStore::read_stream`].
    fn read_all(&self, from_position: u64, max: usize) -> Result<Vec<RecordedEvent>>;

    /// The last global position in the store, 0 when it is empty.
    ///
    /// # Errors
    /// SQLite errors.
    fn last_position(&self) -> Result<u64>;
}
