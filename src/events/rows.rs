//! What every store does the same way with an append's events: serializing them once, and
//! judging a retry against what was stored before under the same ids.

use super::chain::Link;
use super::{AppendResult, EventStoreError, ExpectedVersion, NewEvent, Result};

/// An event ready to insert: its payload serialized by the appending thread, so the writer
/// only binds and inserts.
pub(crate) struct Row {
    pub(crate) event_id: String,
    pub(crate) type_id: String,
    pub(crate) schema_version: u32,
    pub(crate) correlation_id: Option<String>,
    pub(crate) causation_id: Option<String>,
    pub(crate) payload: String,
}

impl Row {
    pub(crate) fn new(e: &NewEvent) -> Result<Row> {
        if e.type_id.trim().is_empty() {
            return Err(EventStoreError::InvalidAppend {
                detail: format!(
                    "event {} has an empty type_id; name what happened, e.g. \"note.added\"",
                    e.event_id
                ),
            });
        }
        Ok(Row {
            event_id: e.event_id.to_string(),
            type_id: e.type_id.clone(),
            schema_version: e.schema_version,
            correlation_id: e.correlation_id.clone(),
            causation_id: e.causation_id.clone(),
            payload: serde_json::to_string(&e.payload).map_err(|err| {
                EventStoreError::InvalidAppend {
                    detail: format!("payload of {} is not serializable: {err}", e.event_id),
                }
            })?,
        })
    }
}

/// What every store refuses before it looks at the log: no events, an empty stream name.
pub(crate) fn check_append(stream: &str, events: &[NewEvent]) -> Result<()> {
    if events.is_empty() {
        return Err(EventStoreError::InvalidAppend {
            detail: "no events to append".into(),
        });
    }
    if stream.is_empty() {
        return Err(EventStoreError::InvalidAppend {
            detail: "the stream name is empty".into(),
        });
    }
    Ok(())
}

/// Whether a stream at `current` (`None`: no stream yet) is where `expected` says; the
/// [`EventStoreError::WrongExpectedVersion`] to return if not (unless the append is a retry).
pub(crate) fn check_expected(
    stream: &str,
    expected: ExpectedVersion,
    current: Option<u64>,
) -> Result<()> {
    let holds = match expected {
        ExpectedVersion::Any => true,
        ExpectedVersion::NoStream => current.is_none(),
        ExpectedVersion::Exact(v) => current == Some(v),
    };
    if holds {
        return Ok(());
    }
    Err(EventStoreError::WrongExpectedVersion {
        stream: stream.to_owned(),
        expected: match expected {
            ExpectedVersion::Exact(v) => Some(v),
            ExpectedVersion::NoStream | ExpectedVersion::Any => None,
        },
        actual: current,
    })
}

impl Row {
    /// What the chain covers of this event stored at `position`, as version `version` of
    /// `stream`, appended at `now`.
    pub(crate) fn link<'a>(
        &'a self,
        position: u64,
        stream: &'a str,
        version: u64,
        now: i64,
    ) -> Link<'a> {
        Link {
            position,
            event_id: &self.event_id,
            stream_id: stream,
            stream_version: version,
            type_id: &self.type_id,
            schema_version: self.schema_version,
            timestamp_ms: now,
            correlation_id: self.correlation_id.as_deref(),
            causation_id: self.causation_id.as_deref(),
            payload: &self.payload,
        }
    }
}

/// A row stored before under an id an append repeats.
#[derive(Clone)]
pub(crate) struct StoredRow {
    pub(crate) position: u64,
    pub(crate) stream_id: String,
    pub(crate) stream_version: u64,
    pub(crate) type_id: String,
    pub(crate) schema_version: u32,
    pub(crate) correlation_id: Option<String>,
    pub(crate) causation_id: Option<String>,
    pub(crate) payload: String,
}

/// The first id that appears twice in `events`.
pub(crate) fn first_duplicate(events: &[Row]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .find(|e| !seen.insert(e.event_id.as_str()))
        .map(|e| e.event_id.to_string())
}

/// An idempotent retry: `found` holds, for each of `events` in order, the row stored before
/// under its id. When every id is stored, with the same content, in `stream`, the retry
/// returns where they landed; when none is, `None` (not a retry). The same id with other
/// content, part of a batch stored, or another stream is an
/// [`EventStoreError::IdempotencyConflict`]: the new content would otherwise be dropped
/// without a word.
pub(crate) fn judge_retry(
    stream: &str,
    events: &[Row],
    found: Vec<Option<StoredRow>>,
) -> Result<Option<AppendResult>> {
    for (e, row) in events.iter().zip(&found) {
        let Some(row) = row else { continue };
        let differs = if row.type_id != e.type_id {
            Some("type_id")
        } else if row.schema_version != e.schema_version {
            Some("schema_version")
        } else if row.correlation_id != e.correlation_id {
            Some("correlation_id")
        } else if row.causation_id != e.causation_id {
            Some("causation_id")
        } else if row.payload != e.payload
            && serde_json::from_str::<serde_json::Value>(&row.payload).ok()
                != serde_json::from_str::<serde_json::Value>(&e.payload).ok()
        {
            Some("payload")
        } else {
            None
        };
        if let Some(field) = differs {
            return Err(EventStoreError::IdempotencyConflict {
                event_id: e.event_id.clone(),
                detail: format!("it was stored before with another {field}"),
            });
        }
    }
    if found.iter().all(Option::is_none) {
        return Ok(None);
    }
    let conflict = |detail: String| EventStoreError::IdempotencyConflict {
        event_id: events
            .first()
            .map(|e| e.event_id.clone())
            .unwrap_or_default(),
        detail,
    };
    let stored: Vec<StoredRow> = found.into_iter().flatten().collect();
    if stored.len() != events.len() {
        return Err(conflict(
            "part of this batch was stored before, part was not".into(),
        ));
    }
    if stored.iter().any(|r| r.stream_id != stream) {
        return Err(conflict(format!(
            "it was stored in another stream, not {stream:?}"
        )));
    }
    Ok(Some(AppendResult {
        first_position: stored.iter().map(|r| r.position).min().unwrap_or(0),
        last_position: stored.iter().map(|r| r.position).max().unwrap_or(0),
        stream_version: stored.iter().map(|r| r.stream_version).max().unwrap_or(0),
    }))
}
