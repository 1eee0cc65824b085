//! The SQL: the schema, inserting one append inside a group's transaction, and decoding rows.

use super::group::Pending;
use super::{AppendResult, EventStoreError, RecordedEvent, Result, MAX_PAGE};
use crate::events::chain::{payload_digest, ChainHash, Link, GENESIS};
use crate::events::rows::{check_expected, first_duplicate, judge_retry, StoredRow};
use crate::ids::EventId;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;

/// The table. A row's `hash` is NULL only when it predates the chain (`correx_chain` holds
/// the first chained position). (Nothing in the schema
/// refuses a row without one: a CHECK costs 5% of a batch append, a trigger a third. An older
/// correx appending to a chained log is named by `verify`, and the chain covers its rows in
/// passing.)
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    position        INTEGER PRIMARY KEY,
    event_id        TEXT    NOT NULL UNIQUE,
    stream_id       TEXT    NOT NULL,
    stream_version  INTEGER NOT NULL,
    type_id         TEXT    NOT NULL,
    schema_version  INTEGER NOT NULL,
    timestamp_ms    INTEGER NOT NULL,
    correlation_id  TEXT,
    causation_id    TEXT,
    payload         TEXT    NOT NULL,
    hash            BLOB,
    UNIQUE (stream_id, stream_version)
);
";

/// The schema version this build writes (`PRAGMA user_version`): 0 is a log from before the
/// hash chain (no `hash` column), 2 the chained log, 3 the log whose chain commits to payload
/// digests from `correx_chain.digest_from` on, with `correx_erased` holding the digests of
/// erased payloads.
pub(super) const SCHEMA_VERSION: i64 = 3;

/// Erased payloads: the digest the chain commits to, who erased it, why and when.
const ERASED: &str = "
CREATE TABLE IF NOT EXISTS correx_erased (
    position      INTEGER PRIMARY KEY,
    digest        BLOB    NOT NULL,
    reason        TEXT    NOT NULL,
    erased_by     TEXT,
    erased_at_ms  INTEGER NOT NULL
);
";

/// Creates the schema, or brings an older log's up to [`SCHEMA_VERSION`]; runs inside the
/// caller's write transaction. Rows already there keep no hash: the chain starts after them
/// (its first hash covers them, see `read_head`).
///
/// # Errors
/// [`EventStoreError::SchemaTooNew`] when a newer correx wrote the file; SQLite errors.
pub(super) fn prepare_schema(
    conn: &Connection,
    path: &std::path::Path,
    chained: bool,
) -> Result<()> {
    let sqlite = |operation| move |source| EventStoreError::Sqlite { operation, source };
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sqlite("read the schema version"))?;
    if found > SCHEMA_VERSION {
        return Err(EventStoreError::SchemaTooNew {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    conn.execute_batch(SCHEMA)
        .map_err(sqlite("create schema"))?;
    let has_hash = has_hash_column(conn).map_err(sqlite("read the schema"))?;
    if !has_hash {
        conn.execute_batch("ALTER TABLE events ADD COLUMN hash BLOB")
            .map_err(sqlite("add the hash column"))?;
    }
    // Where the chain starts, kept so that `verify` names an event after it without a hash
    // (rather than reading a log stripped of its hashes as one from before the chain).
    let has_start = conn
        .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'correx_chain'")
        .and_then(|mut st| st.exists([]))
        .map_err(sqlite("read the schema"))?;
    if chained && !has_start {
        conn.execute_batch(
            "CREATE TABLE correx_chain (chain_from INTEGER NOT NULL, digest_from INTEGER);
             INSERT INTO correx_chain SELECT coalesce(max(position), 0) + 1, \
               coalesce(max(position), 0) + 1 FROM events;",
        )
        .map_err(sqlite("record where the chain starts"))?;
    } else if chained && found < 3 {
        // A chained log from before digests: its events keep the hashes they have (so every
        // seal and checkpoint made of it still verifies); the next append is digested.
        conn.execute_batch(
            "ALTER TABLE correx_chain ADD COLUMN digest_from INTEGER;
             UPDATE correx_chain SET digest_from = \
               (SELECT coalesce(max(position), 0) + 1 FROM events);",
        )
        .map_err(sqlite("record where digests start"))?;
    }
    conn.execute_batch(ERASED)
        .map_err(sqlite("create the erasure table"))?;
    if found != SCHEMA_VERSION {
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(sqlite("write the schema version"))?;
    }
    Ok(())
}

/// What the chain covers of a row selected as [`COLUMNS`] (position first, payload tenth):
/// the one reading of a row both the writer and `verify` hash, so they cannot disagree.
pub(crate) fn link_of<'r>(r: &'r rusqlite::Row<'_>) -> rusqlite::Result<Link<'r>> {
    Ok(Link {
        position: r.get::<_, i64>(0)?.max(0) as u64,
        event_id: r.get_ref(1)?.as_str()?,
        stream_id: r.get_ref(2)?.as_str()?,
        stream_version: r.get::<_, i64>(3)?.max(0) as u64,
        type_id: r.get_ref(4)?.as_str()?,
        schema_version: r.get(5)?,
        timestamp_ms: r.get(6)?,
        correlation_id: r.get_ref(7)?.as_str_or_null()?,
        causation_id: r.get_ref(8)?.as_str_or_null()?,
        payload: r.get_ref(9)?.as_str()?,
    })
}

/// Whether the `events` table has a `hash` column (a log from before the chain has none).
pub(crate) fn has_hash_column(conn: &Connection) -> rusqlite::Result<bool> {
    conn.prepare("SELECT 1 FROM pragma_table_info('events') WHERE name = 'hash'")
        .and_then(|mut st| st.exists([]))
}

/// The last event's position and the hash the next event follows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Head {
    pub(super) position: u64,
    pub(super) hash: ChainHash,
}

/// The head the next append chains from: the last event's hash; for an empty log
/// [`GENESIS`]; for a log whose last events predate the chain, the chain computed in passing
/// over every event without a hash (once, at the first append after an upgrade), so the first
/// stored hash covers the whole log before it, as `verify` recomputes it.
pub(super) fn read_head(conn: &Connection) -> Result<Head> {
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "read the chain head",
        source,
    };
    // The newest row with a well-formed hash: found walking back from the end, so at once
    // unless rows without one follow it (a log from before the chain, an older correx's
    // appends, a damaged hash), which are chained in passing as `verify` does.
    let anchor = conn
        .prepare_cached(
            "SELECT position, hash FROM events \
             WHERE typeof(hash) = 'blob' AND length(hash) = 32 \
             ORDER BY position DESC LIMIT 1",
        )
        .and_then(|mut st| {
            st.query_row([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
                .optional()
        })
        .map_err(sqlite)?;
    let mut head = match anchor {
        None => Head {
            position: 0,
            hash: GENESIS,
        },
        // Selected for its length, so the conversion holds.
        Some((p, h)) => Head {
            position: p.max(0) as u64,
            hash: ChainHash::try_from(h.as_slice()).unwrap_or(GENESIS),
        },
    };
    let mut st = conn
        .prepare(&format!(
            "SELECT {COLUMNS} FROM events WHERE position > ?1 ORDER BY position"
        ))
        .map_err(sqlite)?;
    let mut rows = st.query([head.position as i64]).map_err(sqlite)?;
    let digest_from = crate::events::verify::digest_start(conn);
    while let Some(r) = rows.next().map_err(sqlite)? {
        let link = link_of(r).map_err(sqlite)?;
        head = Head {
            position: link.position,
            hash: link.hash_at(&head.hash, digest_from, None),
        };
    }
    Ok(head)
}

pub(super) const COLUMNS: &str =
    "position, event_id, stream_id, stream_version, type_id, schema_version, \
                       timestamp_ms, correlation_id, causation_id, payload";

pub(super) fn query_events(
    conn: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<RecordedEvent>> {
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "read",
        source,
    };
    let mut stmt = conn.prepare_cached(sql).map_err(sqlite)?;
    let mut rows = stmt.query(args).map_err(sqlite)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite)? {
        out.push(decode_row(row)?);
    }
    Ok(out)
}

/// Up to `max` events of `stream` from version `from`, each checked against the chain: its
/// stored hash must be the hash of its row following the previous row's stored hash (the
/// genesis for the first row). A row without a hash, or after one without, predates the chain
/// (or came from an older correx) and is returned unchecked, as `verify` chains it in passing.
pub(super) fn query_verified(
    conn: &Connection,
    stream: &str,
    from: i64,
    max: i64,
) -> Result<Vec<RecordedEvent>> {
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "read",
        source,
    };
    if !has_hash_column(conn).map_err(sqlite)? {
        let sql = format!(
            "SELECT {COLUMNS} FROM events WHERE stream_id = ?1 AND stream_version >= ?2 \
             ORDER BY stream_version LIMIT ?3"
        );
        return query_events(conn, &sql, &[&stream, &from, &max]);
    }
    // The previous row's hash, and whether there is a previous row at all.
    let sql = format!(
        "SELECT {COLUMNS}, hash, \
         (SELECT p.hash FROM events p WHERE p.position < events.position \
          ORDER BY p.position DESC LIMIT 1), \
         EXISTS (SELECT 1 FROM events p WHERE p.position < events.position), \
         (SELECT x.digest FROM correx_erased x WHERE x.position = events.position) \
         FROM events WHERE stream_id = ?1 AND stream_version >= ?2 \
         ORDER BY stream_version LIMIT ?3"
    );
    let digest_from = crate::events::verify::digest_start(conn);
    let mut stmt = conn.prepare_cached(&sql).map_err(sqlite)?;
    let mut rows = stmt
        .query(rusqlite::params![stream, from, max])
        .map_err(sqlite)?;
    let mut out = Vec::new();
    let hash_of = |v: rusqlite::types::ValueRef<'_>| match v {
        rusqlite::types::ValueRef::Blob(b) => ChainHash::try_from(b).ok(),
        _ => None,
    };
    while let Some(row) = rows.next().map_err(sqlite)? {
        let event = decode_row(row)?;
        let stored = hash_of(row.get_ref(10).map_err(sqlite)?);
        let has_previous: bool = row.get(12).map_err(sqlite)?;
        let previous = if has_previous {
            hash_of(row.get_ref(11).map_err(sqlite)?)
        } else {
            Some(GENESIS)
        };
        if let (Some(stored), Some(previous)) = (stored, previous) {
            let link = link_of(row).map_err(sqlite)?;
            let erased = hash_of(row.get_ref(13).map_err(sqlite)?);
            if link.hash_at(&previous, digest_from, erased.as_ref()) != stored {
                return Err(EventStoreError::CorruptEvent {
                    position: event.position,
                    detail: "its stored bytes do not match its hash in the log's chain (it \
                             changed after it was appended); `correx log verify` names the \
                             damage"
                        .into(),
                });
            }
        }
        out.push(event);
    }
    Ok(out)
}

pub(super) fn page(max: usize) -> i64 {
    max.min(MAX_PAGE) as i64
}

/// Appends `p` inside the group's transaction. A failing append leaves nothing behind: an
/// append of several events runs in a savepoint; a single event needs none, as a failed
/// INSERT undoes itself and nothing is written before it.
pub(super) fn append_one(
    tx: &rusqlite::Transaction<'_>,
    p: &Pending,
    now: i64,
    versions: &mut HashMap<String, u64>,
    head: &mut Head,
    chained: bool,
) -> Result<AppendResult> {
    let sqlite = |operation| move |source| EventStoreError::Sqlite { operation, source };
    let savepoint = p.events.len() > 1;
    // Cached statements: parsing these tiny statements anew for every append of every
    // group would be a visible share of the leader's time.
    let run = |sql: &str| {
        if !savepoint {
            return Ok(());
        }
        tx.prepare_cached(sql)
            .and_then(|mut st| st.execute([]))
            .map(|_| ())
    };
    run("SAVEPOINT append").map_err(sqlite("savepoint"))?;
    // Whatever an append rolled back, the chain goes on from where it stood before it.
    let before = *head;
    let result = match append_events(tx, p, now, versions, head, chained) {
        Ok(Attempt::Stored(r)) => Ok(r),
        // Checking ids up front would cost a lookup per event on every append; the UNIQUE index
        // finds repeats for free, and only then do we look at what was stored before.
        Ok(Attempt::DuplicateId) => {
            *head = before;
            run("ROLLBACK TO append").map_err(sqlite("rollback savepoint"))?;
            match find_existing(tx, p) {
                Ok(Some(r)) => Ok(r),
                Ok(None) => match first_duplicate(&p.events) {
                    Some(event_id) => Err(EventStoreError::IdempotencyConflict {
                        event_id,
                        detail: "the id appears twice in this append".into(),
                    }),
                    None => Err(EventStoreError::CommitFailed {
                        detail: "a uniqueness constraint failed for no repeated id".into(),
                    }),
                },
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    if result.is_err() {
        *head = before;
        run("ROLLBACK TO append").map_err(sqlite("rollback savepoint"))?;
    }
    run("RELEASE append").map_err(sqlite("release savepoint"))?;
    result
}

/// What one append inside the group transaction came to.
pub(super) enum Attempt {
    Stored(AppendResult),
    /// An event id is already in the table (or twice in this batch).
    DuplicateId,
}

pub(super) fn append_events(
    conn: &Connection,
    p: &Pending,
    now: i64,
    versions: &mut HashMap<String, u64>,
    head: &mut Head,
    chained: bool,
) -> Result<Attempt> {
    let sqlite = |operation| move |source| EventStoreError::Sqlite { operation, source };
    let current: Option<u64> = match versions.get(&p.stream) {
        Some(v) => Some(*v),
        None => conn
            .prepare_cached("SELECT max(stream_version) FROM events WHERE stream_id = ?1")
            .map_err(sqlite("read stream version"))?
            .query_row([&p.stream], |r| r.get::<_, Option<i64>>(0))
            .map_err(sqlite("read stream version"))?
            .map(|v| v as u64),
    };
    if let Err(wrong) = check_expected(&p.stream, p.expected, current) {
        // A retry of an append that did commit finds the stream moved on by itself.
        if let Some(r) = find_existing(conn, p)? {
            return Ok(Attempt::Stored(r));
        }
        return Err(wrong);
    }
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO events (position, event_id, stream_id, stream_version, type_id, \
             schema_version, timestamp_ms, correlation_id, causation_id, payload, hash) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )
        .map_err(sqlite("prepare insert"))?;
    let mut version = current.unwrap_or(0);
    let mut first = 0;
    let mut last = 0;
    for (i, e) in p.events.iter().enumerate() {
        version += 1;
        // The position is chosen here, not by SQLite, because the hash covers it.
        let position = head.position + 1;
        // Every append since digests exist is past `digest_from`: digested.
        let hash = chained.then(|| {
            let link = e.link(position, &p.stream, version, now);
            link.hash_digested(&head.hash, &payload_digest(link.payload))
        });
        let inserted = insert.execute(params![
            position as i64,
            e.event_id.as_str(),
            p.stream,
            version as i64,
            e.type_id,
            e.schema_version,
            now,
            e.correlation_id,
            e.causation_id,
            e.payload,
            hash.as_ref().map(|h| &h[..]),
        ]);
        match inserted {
            Ok(_) => {
                *head = Head {
                    position,
                    hash: hash.unwrap_or(GENESIS),
                };
            }
            Err(source)
                if source.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) =>
            {
                return Ok(Attempt::DuplicateId);
            }
            Err(source) => {
                return Err(EventStoreError::Sqlite {
                    operation: "insert event",
                    source,
                })
            }
        }
        last = position;
        if i == 0 {
            first = last;
        }
    }
    versions.insert(p.stream.clone(), version);
    Ok(Attempt::Stored(AppendResult {
        first_position: first,
        last_position: last,
        stream_version: version,
    }))
}

/// An idempotent retry: what the rows already stored under `p`'s ids say of it (see
/// [`judge_retry`]).
pub(super) fn find_existing(conn: &Connection, p: &Pending) -> Result<Option<AppendResult>> {
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "check event id",
        source,
    };
    let mut stmt = conn
        .prepare_cached(
            "SELECT position, stream_id, stream_version, type_id, schema_version, \
             correlation_id, causation_id, payload FROM events WHERE event_id = ?1",
        )
        .map_err(sqlite)?;
    let mut found = Vec::with_capacity(p.events.len());
    for e in &p.events {
        let row = stmt
            .query_row([e.event_id.as_str()], |r| {
                Ok(StoredRow {
                    position: r.get::<_, i64>(0)?.max(0) as u64,
                    stream_id: r.get(1)?,
                    stream_version: r.get::<_, i64>(2)?.max(0) as u64,
                    type_id: r.get(3)?,
                    schema_version: r.get(4)?,
                    correlation_id: r.get(5)?,
                    causation_id: r.get(6)?,
                    payload: r.get(7)?,
                })
            })
            .optional()
            .map_err(sqlite)?;
        found.push(row);
    }
    judge_retry(&p.stream, &p.events, found)
}

pub(super) fn decode_row(row: &rusqlite::Row<'_>) -> Result<RecordedEvent> {
    let position = row
        .get::<_, i64>(0)
        .map_err(|source| EventStoreError::Sqlite {
            operation: "read position",
            source,
        })? as u64;
    let corrupt = |detail: String| EventStoreError::CorruptEvent { position, detail };
    let col = |e: rusqlite::Error| corrupt(e.to_string());
    let payload_text: String = row.get(9).map_err(col)?;
    let payload = serde_json::from_str(&payload_text)
        .map_err(|e| corrupt(format!("payload is not JSON: {e}")))?;
    Ok(RecordedEvent {
        position,
        event_id: EventId::from_string(row.get::<_, String>(1).map_err(col)?),
        stream_id: row.get(2).map_err(col)?,
        stream_version: row.get::<_, i64>(3).map_err(col)? as u64,
        type_id: row.get(4).map_err(col)?,
        schema_version: row.get(5).map_err(col)?,
        timestamp_ms: row.get(6).map_err(col)?,
        correlation_id: row.get(7).map_err(col)?,
        causation_id: row.get(8).map_err(col)?,
        payload,
    })
}
