//! Erasing a payload while the chain keeps verifying: the event's payload is replaced by a
//! tombstone, its digest (which the chain commits to) is kept in `correx_erased` with who
//! erased it, why and when, and a `correx.payload_erased` event in the stream `correx-log`
//! records the erasure in the log itself. `verify` reports erased payloads as erased, a
//! payload put back over a tombstone as a problem, and an erasure recorded but not in effect
//! as a problem.

use super::RecordedEvent;

/// What an erased event's payload column holds.
pub const TOMBSTONE: &str = "{\"correx_erased\":true}";

/// The type of the event that records an erasure.
pub const ERASED_TYPE: &str = "correx.payload_erased";

/// The stream erasures are recorded in.
pub const ERASURE_STREAM: &str = "correx-log";

/// The position an erasure record names, when `event` is one.
pub(crate) fn erasure_of(event: &RecordedEvent) -> Option<u64> {
    if event.type_id != ERASED_TYPE || event.stream_id != ERASURE_STREAM {
        return None;
    }
    event.payload.get("position").and_then(|p| p.as_u64())
}

use super::chain::{payload_digest, to_hex, ChainHash, GENESIS};
use super::sqlite::{link_of, SqliteEventStore};
use super::verify::digest_start;
use super::{EventStore, EventStoreError, ExpectedVersion, NewEvent};
use rusqlite::{params, Connection, OptionalExtension};
use std::fmt;

/// What an erasure did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Erased {
    /// The event whose payload was erased.
    pub position: u64,
    /// The payload's SHA-256, which the chain keeps committing to.
    pub digest: ChainHash,
    /// Where the erasure is recorded (the `correx.payload_erased` event).
    pub recorded_at: u64,
    /// Whether the WAL was emptied, so the payload's bytes are gone from it too (`false`
    /// when a reader held it: the next checkpoint empties it).
    pub wal_cleared: bool,
}

/// Why a payload could not be erased.
#[derive(Debug)]
#[non_exhaustive]
pub enum EraseError {
    /// No reason was given: an erasure records why.
    NoReason,
    /// No event at that position.
    NotFound {
        /// The position asked for.
        position: u64,
    },
    /// The event was appended before the chain committed to digests: its hash covers its
    /// payload's bytes, so erasing them would break the chain.
    PredatesDigests {
        /// The position asked for.
        position: u64,
        /// The first position whose payload can be erased.
        digest_from: u64,
    },
    /// Its payload is erased already.
    AlreadyErased {
        /// The position asked for.
        position: u64,
    },
    /// It is an erasure record, which is never erased.
    ErasureRecord {
        /// The position asked for.
        position: u64,
    },
    /// The event does not match its hash: it was changed after it was appended, and erasing
    /// it would hide that. `correx log verify` says more.
    Tampered {
        /// The position asked for.
        position: u64,
    },
    /// The log could not be read or written.
    Store(EventStoreError),
}

impl fmt::Display for EraseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EraseError::NoReason => f.write_str("an erasure needs a reason (it is recorded)"),
            EraseError::NotFound { position } => write!(f, "no event at position {position}"),
            EraseError::PredatesDigests {
                position,
                digest_from,
            } => write!(
                f,
                "the event at position {position} was appended before the chain committed to \
                 payload digests, so its hash covers the payload's bytes and erasing them \
                 would break the chain; events from position {digest_from} on can be erased"
            ),
            EraseError::AlreadyErased { position } => {
                write!(f, "the payload at position {position} is erased already")
            }
            EraseError::ErasureRecord { position } => write!(
                f,
                "position {position} records an erasure; erasure records are never erased"
            ),
            EraseError::Tampered { position } => write!(
                f,
                "the event at position {position} does not match its hash (it was changed \
                 after it was appended): erasing it would hide that; `correx log verify` says \
                 more"
            ),
            EraseError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EraseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EraseError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<EventStoreError> for EraseError {
    fn from(e: EventStoreError) -> Self {
        EraseError::Store(e)
    }
}

fn sqlite(operation: &'static str) -> impl Fn(rusqlite::Error) -> EraseError {
    move |source| EraseError::Store(EventStoreError::Sqlite { operation, source })
}

/// The event at `position` as the chain sees it: its digest, type and stream, whether it
/// matches its stored hash.
struct Target {
    digest: ChainHash,
    type_id: String,
    stream_id: String,
    intact: bool,
}

fn target(
    conn: &Connection,
    position: u64,
    digest_from: u64,
) -> Result<Option<Target>, EraseError> {
    conn.query_row(
        "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
         timestamp_ms, correlation_id, causation_id, payload, hash, \
         (SELECT p.hash FROM events p WHERE p.position < events.position \
          ORDER BY p.position DESC LIMIT 1) \
         FROM events WHERE position = ?1",
        [position as i64],
        |r| {
            let link = link_of(r)?;
            let stored: Option<Vec<u8>> = r.get(10)?;
            let previous: Option<Vec<u8>> = r.get(11)?;
            let previous = match previous {
                None => GENESIS,
                Some(p) => ChainHash::try_from(p.as_slice()).unwrap_or([0xff; 32]),
            };
            let intact = stored.as_deref() == Some(&link.hash_at(&previous, digest_from, None)[..]);
            Ok(Target {
                digest: payload_digest(link.payload),
                type_id: link.type_id.to_owned(),
                stream_id: link.stream_id.to_owned(),
                intact,
            })
        },
    )
    .optional()
    .map_err(sqlite("read the event to erase"))
}

impl SqliteEventStore {
    /// Erases the payload at `position`: records the erasure (`correx.payload_erased`, naming
    /// `erased_by` and `reason`), then replaces the payload by [`TOMBSTONE`] and keeps its
    /// digest, so the chain, every seal and checkpoint still verify. The old bytes are
    /// overwritten in the file (`secure_delete`) and the WAL is emptied when no reader holds
    /// it. Blocks while another writer holds the log (up to 10 s).
    ///
    /// A crash after the record and before the tombstone leaves the payload in place and the
    /// record not in effect (`verify` names it); erasing again finishes it.
    ///
    /// # Errors
    /// [`EraseError`]: what cannot be erased and why, or the store's error.
    pub fn erase(
        &self,
        position: u64,
        reason: &str,
        erased_by: Option<&str>,
    ) -> Result<Erased, EraseError> {
        if reason.trim().is_empty() {
            return Err(EraseError::NoReason);
        }
        let conn = Connection::open(self.path()).map_err(sqlite("open the log to erase"))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .and_then(|()| conn.pragma_update(None, "secure_delete", true))
            .map_err(sqlite("set up the erasing connection"))?;
        let digest_from = digest_start(&conn);
        let Some(t) = target(&conn, position, digest_from)? else {
            return Err(EraseError::NotFound { position });
        };
        if t.type_id == ERASED_TYPE && t.stream_id == ERASURE_STREAM {
            return Err(EraseError::ErasureRecord { position });
        }
        if position < digest_from {
            return Err(EraseError::PredatesDigests {
                position,
                digest_from,
            });
        }
        let already: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM correx_erased WHERE position = ?1)",
                [position as i64],
                |r| r.get(0),
            )
            .map_err(sqlite("read the erasures"))?;
        if already {
            return Err(EraseError::AlreadyErased { position });
        }
        if !t.intact {
            return Err(EraseError::Tampered { position });
        }
        // An earlier erase that died before its tombstone recorded it already.
        let recorded: Option<i64> = conn
            .query_row(
                "SELECT position FROM events WHERE stream_id = ?1 AND type_id = ?2 \
                 AND json_extract(payload, '$.position') = ?3",
                params![ERASURE_STREAM, ERASED_TYPE, position as i64],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite("read the erasures"))?;
        let recorded_at = match recorded {
            Some(p) => p as u64,
            None => {
                let record = NewEvent::new(
                    ERASED_TYPE,
                    1,
                    serde_json::json!({
                        "position": position,
                        "digest": to_hex(&t.digest),
                        "reason": reason,
                        "erased_by": erased_by,
                    }),
                );
                self.append(ERASURE_STREAM, ExpectedVersion::Any, &[record])?
                    .first_position
            }
        };
        let tx = conn
            .unchecked_transaction()
            .map_err(sqlite("begin the erasure"))?;
        tx.execute(
            "INSERT INTO correx_erased (position, digest, reason, erased_by, erased_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                position as i64,
                &t.digest[..],
                reason,
                erased_by,
                super::time::now_ms()
            ],
        )
        .and_then(|_| {
            tx.execute(
                "UPDATE events SET payload = ?1 WHERE position = ?2",
                params![TOMBSTONE, position as i64],
            )
        })
        .map_err(sqlite("erase the payload"))?;
        tx.commit().map_err(sqlite("commit the erasure"))?;
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .unwrap_or(1);
        Ok(Erased {
            position,
            digest: t.digest,
            recorded_at,
            wal_cleared: busy == 0,
        })
    }
}
