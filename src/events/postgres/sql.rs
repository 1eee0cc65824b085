//! The SQL: the schema and its version, a connection with its statements prepared once, the
//! append's statements, the reads, and `verify`.

use super::{parse_hash, pg_error};
use crate::events::chain::{ChainHash, Link, GENESIS};
use crate::events::rows::{judge_retry, Row, StoredRow};
use crate::events::verify::{Stored, Walk, WalkRow};
use crate::events::{AppendResult, EventStoreError, LogReport, RecordedEvent, Result, Seal};
use crate::ids::EventId;
use postgres::types::ToSql;
use postgres::{Client, SimpleQueryMessage, Statement};

/// The schema version this build writes (`correx_schema.version`).
pub(super) const SCHEMA_VERSION: i64 = 1;

/// Serializes schema changes between processes opening the log at once.
const SCHEMA_LOCK: i64 = 0x636f_7272_6578;

/// Held (shared, for its session) by every connection that listens for appends: appends
/// notify only while one does. A notification costs each commit about a fifth of its time
/// here, which nobody should pay when nothing listens; asking the lock table is dearer still,
/// so a store asks now and then (see `PostgresEventStore::listened`), not at every append.
pub(super) const LISTENERS_LOCK: i64 = SCHEMA_LOCK + 1;

/// `payload` is `json`, which keeps the text as appended (the hash covers that text) and still
/// lets SQL look inside. `correx_head` is the one row every append locks: its position and hash
/// are the last event's.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS correx_events (
    position        bigint  PRIMARY KEY,
    event_id        text    NOT NULL UNIQUE,
    stream_id       text    NOT NULL,
    stream_version  bigint  NOT NULL,
    type_id         text    NOT NULL,
    schema_version  bigint  NOT NULL,
    timestamp_ms    bigint  NOT NULL,
    correlation_id  text,
    causation_id    text,
    payload         json    NOT NULL,
    hash            bytea   NOT NULL,
    UNIQUE (stream_id, stream_version)
);
CREATE TABLE IF NOT EXISTS correx_head (
    one       boolean PRIMARY KEY DEFAULT true CHECK (one),
    position  bigint  NOT NULL,
    hash      bytea   NOT NULL
);
INSERT INTO correx_head (one, position, hash)
    VALUES (true, 0, '\\x0000000000000000000000000000000000000000000000000000000000000000')
    ON CONFLICT DO NOTHING;
";

/// The insert of an append's rows, bound as arrays ($1 stream, $2 timestamp, $3..$11 columns).
const INSERT_ROWS: &str = "INSERT INTO correx_events (position, event_id, stream_id,
        stream_version, type_id, schema_version, timestamp_ms, correlation_id, causation_id,
        payload, hash)
    SELECT u.position, u.event_id, $1, u.stream_version, u.type_id, u.schema_version, $2,
           u.correlation_id, u.causation_id, u.payload::json, u.hash
    FROM unnest($3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::text[],
                $9::text[], $10::text[], $11::bytea[])
         AS u(position, event_id, stream_version, type_id, schema_version, correlation_id,
              causation_id, payload, hash)";

const COLUMNS: &str = "position, event_id, stream_id, stream_version, type_id, schema_version, \
                       timestamp_ms, correlation_id, causation_id, payload::text, hash";

/// Creates the tables, or checks the version of those there, in one transaction. A log at
/// this version is opened without DDL, so a role that may read and write the tables but not
/// create any opens it.
pub(super) fn prepare_schema(client: &mut Client, shown: &str) -> Result<()> {
    let current = client
        .query_one(
            "SELECT to_regclass('correx_schema') IS NOT NULL \
                AND to_regclass('correx_events') IS NOT NULL \
                AND to_regclass('correx_head') IS NOT NULL",
            &[],
        )
        .and_then(|r| r.try_get::<_, bool>(0))
        .map_err(pg_error("read the schema"))?;
    if current {
        let found: Option<i64> = client
            .query_one("SELECT max(version)::bigint FROM correx_schema", &[])
            .and_then(|r| r.try_get(0))
            .map_err(pg_error("read the schema version"))?;
        match found {
            Some(v) if v == SCHEMA_VERSION => return Ok(()),
            Some(v) if v > SCHEMA_VERSION => {
                return Err(EventStoreError::SchemaTooNew {
                    path: shown.into(),
                    found: v,
                    supported: SCHEMA_VERSION,
                })
            }
            // Older or unrecorded: the locked path below brings it up to date.
            _ => {}
        }
    }
    let mut tx = client.transaction().map_err(pg_error("begin the schema"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .map_err(pg_error("lock the schema"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS correx_schema (version bigint NOT NULL)")
        .map_err(pg_error("create the schema"))?;
    let found: Option<i64> = tx
        .query_opt("SELECT max(version)::bigint FROM correx_schema", &[])
        .map_err(pg_error("read the schema version"))?
        .map(|r| r.try_get::<_, Option<i64>>(0))
        .transpose()
        .map_err(pg_error("read the schema version"))?
        .flatten();
    if let Some(found) = found {
        if found > SCHEMA_VERSION {
            return Err(EventStoreError::SchemaTooNew {
                path: shown.into(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
    }
    tx.batch_execute(SCHEMA)
        .map_err(pg_error("create the schema"))?;
    if found != Some(SCHEMA_VERSION) {
        tx.execute("DELETE FROM correx_schema", &[])
            .and_then(|_| {
                tx.execute(
                    "INSERT INTO correx_schema (version) VALUES ($1)",
                    &[&SCHEMA_VERSION],
                )
            })
            .map_err(pg_error("write the schema version"))?;
    }
    tx.commit().map_err(pg_error("commit the schema"))
}

/// A connection's server process: its pid, and when it started (a pid is reused).
#[derive(Clone, Debug)]
pub(super) struct Backend {
    pid: i32,
    start: String,
}

/// A connection with the store's statements prepared on it.
pub(super) struct Conn {
    pub(super) client: Client,
    /// Set between `begin_and_lock` and the commit or rollback.
    pub(super) in_transaction: bool,
    /// Set once a statement that writes (the insert, the commit) was sent in the current
    /// call: a call that failed after it cannot simply be run again.
    pub(super) sent_write: bool,
    /// The server process serving it, when the server said.
    pub(super) backend: Option<Backend>,
    insert: Statement,
    insert_at_head: Statement,
    head_and_version: Statement,
    listeners: Statement,
    stream_version: Statement,
    existing: Statement,
    read_all: Statement,
    read_stream: Statement,
    read_stream_verified: Statement,
}

/// The events of one append, column by column, as the insert binds them.
#[derive(Default)]
pub(super) struct NewRows<'a> {
    positions: Vec<i64>,
    event_ids: Vec<&'a str>,
    versions: Vec<i64>,
    type_ids: Vec<&'a str>,
    schema_versions: Vec<i64>,
    correlation_ids: Vec<Option<&'a str>>,
    causation_ids: Vec<Option<&'a str>>,
    payloads: Vec<&'a str>,
    hashes: Vec<Vec<u8>>,
}

impl<'a> NewRows<'a> {
    pub(super) fn with_capacity(n: usize) -> Self {
        NewRows {
            positions: Vec::with_capacity(n),
            event_ids: Vec::with_capacity(n),
            versions: Vec::with_capacity(n),
            type_ids: Vec::with_capacity(n),
            schema_versions: Vec::with_capacity(n),
            correlation_ids: Vec::with_capacity(n),
            causation_ids: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
        }
    }

    /// The inserts' first eleven parameters: the stream, the time, then the columns.
    fn params<'s>(&'s self, stream: &'s &str, now: &'s i64) -> Vec<&'s (dyn ToSql + Sync)> {
        vec![
            stream,
            now,
            &self.positions,
            &self.event_ids,
            &self.versions,
            &self.type_ids,
            &self.schema_versions,
            &self.correlation_ids,
            &self.causation_ids,
            &self.payloads,
            &self.hashes,
        ]
    }

    pub(super) fn push(&mut self, position: u64, version: u64, e: &'a Row, hash: ChainHash) {
        self.positions.push(position as i64);
        self.event_ids.push(&e.event_id);
        self.versions.push(version as i64);
        self.type_ids.push(&e.type_id);
        self.schema_versions.push(i64::from(e.schema_version));
        self.correlation_ids.push(e.correlation_id.as_deref());
        self.causation_ids.push(e.causation_id.as_deref());
        self.payloads.push(&e.payload);
        self.hashes.push(hash.to_vec());
    }
}

/// PostgreSQL's text cannot hold U+0000: an append with one is the caller's error, said so,
/// rather than the server's encoding error. (A payload's NUL is escaped by JSON and fine.)
pub(super) fn refuse_nul(stream: &str, rows: &[Row]) -> Result<()> {
    let bad = |what: &str| EventStoreError::InvalidAppend {
        detail: format!("{what} contains a NUL character, which PostgreSQL text cannot hold"),
    };
    if stream.contains('\0') {
        return Err(bad("the stream name"));
    }
    for r in rows {
        for (what, text) in [
            ("an event id", Some(r.event_id.as_str())),
            ("a type_id", Some(r.type_id.as_str())),
            ("a correlation_id", r.correlation_id.as_deref()),
            ("a causation_id", r.causation_id.as_deref()),
        ] {
            if text.is_some_and(|t| t.contains('\0')) {
                return Err(bad(what));
            }
        }
    }
    Ok(())
}

impl Conn {
    pub(super) fn new(mut client: Client) -> Result<Conn> {
        let messages = client
            .simple_query(&format!(
                "SET lock_timeout = '{}ms'; SET idle_in_transaction_session_timeout = '{}ms'; \
                 SELECT pid, backend_start::text FROM pg_stat_activity \
                 WHERE pid = pg_backend_pid()",
                super::LOCK_TIMEOUT.as_millis(),
                super::IDLE_IN_TRANSACTION.as_millis()
            ))
            .map_err(pg_error("set timeouts"))?;
        let backend = messages.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(Backend {
                pid: r.get(0)?.parse().ok()?,
                start: r.get(1)?.to_owned(),
            }),
            _ => None,
        });
        let mut prepare = |sql: &str| client.prepare(sql).map_err(pg_error("prepare"));
        // One statement inserts the events, moves the head and notifies subscribers: one
        // round trip inside the locked transaction. A repeated id inserts nothing for that
        // row (counted, then rolled back).
        let insert = prepare(&format!(
            "WITH ins AS ({INSERT_ROWS} ON CONFLICT DO NOTHING RETURNING 1),
                  head AS (UPDATE correx_head SET position = $12, hash = $13 RETURNING 1)
             SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM head),
                    (SELECT count(*) FROM (SELECT pg_notify('correx_events', '') WHERE $14) n)"
        ))?;
        // The same on its own, outside a transaction: the head moves only if it is still at
        // $14/$15, and the events go in only if it moved. A writer that committed first holds
        // the head row until its commit; this statement then waits, sees the head moved, and
        // changes nothing. A repeated id fails the statement (nothing written).
        let insert_at_head = prepare(&format!(
            "WITH head AS (UPDATE correx_head SET position = $12, hash = $13
                           WHERE position = $14 AND hash = $15 RETURNING 1),
                  ins AS ({INSERT_ROWS} WHERE EXISTS (SELECT 1 FROM head) RETURNING 1)
             SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM head),
                    (SELECT count(*) FROM (SELECT pg_notify('correx_events', '') FROM head
                                           WHERE $16) n)"
        ))?;
        let listeners = prepare(&format!(
            "SELECT EXISTS (SELECT 1 FROM pg_locks
                 WHERE locktype = 'advisory' AND classid = {} AND objid = {} AND objsubid = 1
                   AND database = (SELECT oid FROM pg_database
                                   WHERE datname = current_database()))",
            LISTENERS_LOCK >> 32,
            LISTENERS_LOCK & 0xffff_ffff
        ))?;
        let head_and_version = prepare(
            "SELECT h.position, h.hash, \
                    (SELECT max(stream_version) FROM correx_events WHERE stream_id = $1) \
             FROM correx_head h",
        )?;
        let stream_version =
            prepare("SELECT max(stream_version) FROM correx_events WHERE stream_id = $1")?;
        let existing = prepare(
            "SELECT event_id, position, stream_id, stream_version, type_id, schema_version, \
             correlation_id, causation_id, payload::text FROM correx_events \
             WHERE event_id = ANY($1)",
        )?;
        let read_all = prepare(&format!(
            "SELECT {COLUMNS} FROM correx_events WHERE position >= $1 ORDER BY position LIMIT $2"
        ))?;
        let read_stream = prepare(&format!(
            "SELECT {COLUMNS} FROM correx_events WHERE stream_id = $1 AND stream_version >= $2 \
             ORDER BY stream_version LIMIT $3"
        ))?;
        // Each row with the previous row's hash (none for the first): checked on reading.
        let read_stream_verified = prepare(&format!(
            "SELECT {COLUMNS}, \
             (SELECT p.hash FROM correx_events p WHERE p.position < correx_events.position \
              ORDER BY p.position DESC LIMIT 1) \
             FROM correx_events WHERE stream_id = $1 AND stream_version >= $2 \
             ORDER BY stream_version LIMIT $3"
        ))?;
        Ok(Conn {
            client,
            in_transaction: false,
            sent_write: false,
            backend,
            insert,
            insert_at_head,
            head_and_version,
            listeners,
            stream_version,
            existing,
            read_all,
            read_stream,
            read_stream_verified,
        })
    }

    /// Begins a transaction and locks the head, in one round trip: the head's position and
    /// hash, as the last committed append left them.
    pub(super) fn begin_and_lock(&mut self) -> Result<(u64, ChainHash)> {
        self.in_transaction = true;
        let messages = self
            .client
            // READ COMMITTED whatever the server's default: a waiter on the head sees the
            // commit it waited for (under REPEATABLE READ it would fail with 40001).
            .simple_query(
                "BEGIN ISOLATION LEVEL READ COMMITTED; \
                 SELECT position, encode(hash, 'hex') FROM correx_head FOR UPDATE",
            )
            .map_err(pg_error("lock the head"))?;
        head_of(&messages)
    }

    pub(super) fn commit(&mut self) -> Result<()> {
        self.end_transaction("COMMIT", "commit")
    }

    pub(super) fn rollback(&mut self) -> Result<()> {
        self.end_transaction("ROLLBACK", "roll back")
    }

    /// Ends the open transaction with `statement` (`operation` names it in an error).
    fn end_transaction(&mut self, statement: &str, operation: &'static str) -> Result<()> {
        self.client
            .batch_execute(statement)
            .map_err(pg_error(operation))?;
        self.in_transaction = false;
        Ok(())
    }

    /// The head outside a transaction.
    pub(super) fn head(&mut self) -> Result<(u64, ChainHash)> {
        let messages = self
            .client
            .simple_query("SELECT position, encode(hash, 'hex') FROM correx_head")
            .map_err(pg_error("read the chain head"))?;
        head_of(&messages)
    }

    pub(super) fn stream_version(&mut self, stream: &str) -> Result<Option<u64>> {
        let row = self
            .client
            .query_one(&self.stream_version, &[&stream])
            .map_err(pg_error("read stream version"))?;
        let v: Option<i64> = row.try_get(0).map_err(pg_error("read stream version"))?;
        Ok(v.map(|v| v.max(0) as u64))
    }

    /// Inserts `rows` and moves the head to `position`/`hash`, notifying listeners if
    /// `notify`; how many rows were inserted.
    pub(super) fn insert(
        &mut self,
        stream: &str,
        now: i64,
        rows: &NewRows<'_>,
        (position, hash): (u64, &ChainHash),
        notify: bool,
    ) -> Result<u64> {
        self.sent_write = true;
        let position = position as i64;
        let hash = &hash[..];
        let mut params = rows.params(&stream, &now);
        params.extend([&position as &(dyn ToSql + Sync), &hash, &notify]);
        let row = self
            .client
            .query_one(&self.insert, &params)
            .map_err(pg_error("insert events"))?;
        Ok(row
            .try_get::<_, i64>(0)
            .map_err(pg_error("insert events"))?
            .max(0) as u64)
    }

    /// Whether any connection listens for this database's appends (holds
    /// [`LISTENERS_LOCK`]).
    pub(super) fn listeners(&mut self) -> Result<bool> {
        self.client
            .query_one(&self.listeners, &[])
            .and_then(|r| r.try_get(0))
            .map_err(pg_error("look for listeners"))
    }

    /// The head and `stream`'s version, read together (one snapshot), outside a transaction.
    pub(super) fn head_and_version(
        &mut self,
        stream: &str,
    ) -> Result<((u64, ChainHash), Option<u64>)> {
        let row = self
            .client
            .query_one(&self.head_and_version, &[&stream])
            .map_err(pg_error("read the chain head"))?;
        let read = pg_error("read the chain head");
        let position: i64 = row.try_get(0).map_err(&read)?;
        let hash: Vec<u8> = row.try_get(1).map_err(&read)?;
        let version: Option<i64> = row.try_get(2).map_err(&read)?;
        let hash = ChainHash::try_from(hash.as_slice()).map_err(|_| EventStoreError::Postgres {
            operation: "read the chain head",
            code: None,
            detail: "correx_head holds no 32-byte hash".into(),
        })?;
        Ok((
            (position.max(0) as u64, hash),
            version.map(|v| v.max(0) as u64),
        ))
    }

    /// Inserts `rows` and moves the head from `head` to `new_head` in one statement of its
    /// own transaction, if the head is still at `head`, notifying listeners if `notify`:
    /// whether it was (and so whether the events are stored). The client's error is returned
    /// as it is, for the caller to tell a refused statement (nothing written) from a lost
    /// connection (unknown).
    pub(super) fn insert_at_head(
        &mut self,
        stream: &str,
        now: i64,
        rows: &NewRows<'_>,
        head: (u64, &ChainHash),
        new_head: (u64, &ChainHash),
        notify: bool,
    ) -> std::result::Result<bool, postgres::Error> {
        self.sent_write = true;
        let (from, from_hash) = (head.0 as i64, &head.1[..]);
        let (to, to_hash) = (new_head.0 as i64, &new_head.1[..]);
        let mut params = rows.params(&stream, &now);
        params.extend([
            &to as &(dyn ToSql + Sync),
            &to_hash,
            &from,
            &from_hash,
            &notify,
        ]);
        let row = self.client.query_one(&self.insert_at_head, &params)?;
        Ok(row.try_get::<_, i64>(1)? == 1)
    }

    /// Ends `backend` (another connection's server process) if it still runs, and waits until
    /// it is gone: a process whose client vanished may still be waiting to commit. Whether it
    /// is gone (false when this role may not end it, or it outlived the wait).
    pub(super) fn end_backend(&mut self, backend: &Backend) -> Result<bool> {
        let alive =
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2";
        let ended = pg_error("end a lost connection's server process");
        let terminated = self.client.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid = $1 AND backend_start::text = $2",
            &[&backend.pid, &backend.start],
        );
        match terminated {
            Ok(_) => {}
            // Refused (another role's process, say): it cannot be told gone.
            Err(e) if e.as_db_error().is_some() => return Ok(false),
            Err(e) => return Err(ended(e)),
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let n: i64 = self
                .client
                .query_one(alive, &[&backend.pid, &backend.start])
                .and_then(|r| r.try_get(0))
                .map_err(&ended)?;
            if n == 0 {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// What was stored before under `rows`' ids, judged as a retry of this append.
    pub(super) fn find_existing(
        &mut self,
        stream: &str,
        rows: &[Row],
    ) -> Result<Option<AppendResult>> {
        let ids: Vec<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
        let stored = self
            .client
            .query(&self.existing, &[&ids])
            .map_err(pg_error("check event id"))?;
        let mut by_id = std::collections::HashMap::new();
        let read = pg_error("check event id");
        for r in stored {
            let schema_version: i64 = r.try_get(5).map_err(&read)?;
            by_id.insert(
                r.try_get::<_, String>(0).map_err(&read)?,
                StoredRow {
                    position: r.try_get::<_, i64>(1).map_err(&read)?.max(0) as u64,
                    stream_id: r.try_get(2).map_err(&read)?,
                    stream_version: r.try_get::<_, i64>(3).map_err(&read)?.max(0) as u64,
                    type_id: r.try_get(4).map_err(&read)?,
                    schema_version: u32::try_from(schema_version).unwrap_or(u32::MAX),
                    correlation_id: r.try_get(6).map_err(&read)?,
                    causation_id: r.try_get(7).map_err(&read)?,
                    payload: r.try_get(8).map_err(&read)?,
                },
            );
        }
        // `get`, not `remove`: an id twice in the batch finds its stored row both times, as
        // the SQLite store's lookups do.
        let found = rows
            .iter()
            .map(|r| by_id.get(&r.event_id).cloned())
            .collect();
        judge_retry(stream, rows, found)
    }

    pub(super) fn read_all(&mut self, from: i64, max: i64) -> Result<Vec<RecordedEvent>> {
        let rows = self
            .client
            .query(&self.read_all, &[&from, &max])
            .map_err(pg_error("read"))?;
        rows.iter().map(decode).collect()
    }

    pub(super) fn read_stream(
        &mut self,
        stream: &str,
        from: i64,
        max: i64,
    ) -> Result<Vec<RecordedEvent>> {
        let rows = self
            .client
            .query(&self.read_stream, &[&stream, &from, &max])
            .map_err(pg_error("read"))?;
        rows.iter().map(decode).collect()
    }

    /// As [`Conn::read_stream`], each row checked against the chain: its stored hash must be
    /// its row's hash following the previous row's (the genesis for the first).
    pub(super) fn read_stream_verified(
        &mut self,
        stream: &str,
        from: i64,
        max: i64,
    ) -> Result<Vec<RecordedEvent>> {
        let rows = self
            .client
            .query(&self.read_stream_verified, &[&stream, &from, &max])
            .map_err(pg_error("read"))?;
        rows.iter()
            .map(|r| {
                let event = decode(r)?;
                let corrupt = |detail: String| EventStoreError::CorruptEvent {
                    position: event.position,
                    detail,
                };
                let previous = match r.try_get::<_, Option<&[u8]>>(11) {
                    Ok(None) => Some(GENESIS),
                    Ok(Some(b)) => ChainHash::try_from(b).ok(),
                    Err(e) => return Err(corrupt(e.to_string())),
                };
                let stored = r
                    .try_get::<_, &[u8]>(10)
                    .ok()
                    .and_then(|b| ChainHash::try_from(b).ok());
                let link = link_of(r).map_err(corrupt)?;
                match (previous, stored) {
                    (Some(p), Some(h)) if link.hash(&p) == h => Ok(event),
                    _ => Err(corrupt(
                        "its stored bytes do not match its hash in the log's chain (it changed \
                         after it was appended); `correx log verify` names the damage"
                            .into(),
                    )),
                }
            })
            .collect()
    }

    pub(super) fn last_position(&mut self) -> Result<u64> {
        // The head is the last committed position (and needs no scan of the table).
        self.head().map(|(p, _)| p)
    }
}

fn head_of(messages: &[SimpleQueryMessage]) -> Result<(u64, ChainHash)> {
    let row = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => Some(r),
        _ => None,
    });
    let Some(row) = row else {
        return Err(EventStoreError::Postgres {
            operation: "read the chain head",
            code: None,
            detail: "correx_head has no row: the log's tables were changed by hand".into(),
        });
    };
    let position = row.get(0).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0);
    Ok((position, parse_hash(row.get(1))?))
}

fn decode(row: &postgres::Row) -> Result<RecordedEvent> {
    let position = row.try_get::<_, i64>(0).unwrap_or(0).max(0) as u64;
    let corrupt = |detail: String| EventStoreError::CorruptEvent { position, detail };
    let col = |e: postgres::Error| corrupt(e.to_string());
    let payload_text: String = row.try_get(9).map_err(col)?;
    let payload = serde_json::from_str(&payload_text)
        .map_err(|e| corrupt(format!("payload is not JSON: {e}")))?;
    let schema_version: i64 = row.try_get(5).map_err(col)?;
    Ok(RecordedEvent {
        position,
        event_id: EventId::from_string(row.try_get::<_, String>(1).map_err(col)?),
        stream_id: row.try_get(2).map_err(col)?,
        stream_version: row.try_get::<_, i64>(3).map_err(col)?.max(0) as u64,
        type_id: row.try_get(4).map_err(col)?,
        schema_version: u32::try_from(schema_version)
            .map_err(|_| corrupt(format!("schema_version {schema_version} is out of range")))?,
        timestamp_ms: row.try_get(6).map_err(col)?,
        correlation_id: row.try_get(7).map_err(col)?,
        causation_id: row.try_get(8).map_err(col)?,
        payload,
    })
}

/// Rows `verify` reads per query.
const VERIFY_PAGE: i64 = 5000;

/// Walks the whole log in position order (pages by position, each its own snapshot; a log
/// appended to meanwhile is checked up to where the walk ends), then checks the head row
/// against the last event.
pub(super) fn verify(
    conn: &mut Conn,
    check: &dyn Fn(&RecordedEvent) -> Option<String>,
    seals: &[Seal],
) -> Result<LogReport> {
    let mut walk = Walk::new(check, seals, Some(1));
    // One snapshot for the pages and the head, so appends committed meanwhile are not taken
    // for a head moved by hand; from the lowest position, so a row put below 1 is seen.
    conn.in_transaction = true;
    conn.client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .map_err(pg_error("verify"))?;
    let mut from = i64::MIN;
    loop {
        let rows = conn
            .client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM correx_events WHERE position > $1 \
                     ORDER BY position LIMIT $2"
                ),
                &[&from, &VERIFY_PAGE],
            )
            .map_err(pg_error("verify"))?;
        let Some(last) = rows.last() else { break };
        from = last.try_get::<_, i64>(0).unwrap_or(i64::MAX);
        for r in &rows {
            walk_row(&mut walk, r);
        }
        if (rows.len() as i64) < VERIFY_PAGE {
            break;
        }
    }
    let (head_position, head_hash) = conn.head()?;
    conn.rollback()?;
    let (last, previous) = (walk.last_position(), walk.previous());
    if head_position != last
        || (last > 0 && head_hash != previous)
        || (last == 0 && head_hash != GENESIS)
    {
        walk.report.problems.push(crate::events::LogProblem {
            position: None,
            detail: format!(
                "the head row says position {head_position}, but the last event is at \
                 {last}, or its hash differs: events or the head were changed by hand"
            ),
        });
    }
    Ok(walk.finish())
}

/// What the chain covers of a row selected as [`COLUMNS`], or what keeps it from being read.
fn link_of(r: &postgres::Row) -> std::result::Result<Link<'_>, String> {
    let text = |i: usize| r.try_get::<_, &str>(i).map_err(|e| e.to_string());
    let opt = |i: usize| r.try_get::<_, Option<&str>>(i).map_err(|e| e.to_string());
    Ok(Link {
        position: r.try_get::<_, i64>(0).unwrap_or(0).max(0) as u64,
        event_id: text(1)?,
        stream_id: text(2)?,
        stream_version: r.try_get::<_, i64>(3).unwrap_or(-1).max(0) as u64,
        type_id: text(4)?,
        schema_version: r
            .try_get::<_, i64>(5)
            .ok()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or("schema_version is out of range")?,
        timestamp_ms: r.try_get::<_, i64>(6).unwrap_or(0),
        correlation_id: opt(7)?,
        causation_id: opt(8)?,
        payload: text(9)?,
    })
}

fn walk_row(walk: &mut Walk<'_>, r: &postgres::Row) {
    let text = |i: usize| r.try_get::<_, &str>(i).map_err(|e| e.to_string());
    let opt = |i: usize| r.try_get::<_, Option<&str>>(i).map_err(|e| e.to_string());
    let position = r.try_get::<_, i64>(0).unwrap_or(0);
    let version = r.try_get::<_, i64>(3).unwrap_or(-1);
    let schema_version = r
        .try_get::<_, i64>(5)
        .ok()
        .and_then(|v| u32::try_from(v).ok());
    let timestamp_ms = r.try_get::<_, i64>(6).unwrap_or(0);
    let link = link_of(r);
    let stored = match r.try_get::<_, Option<&[u8]>>(10) {
        Ok(Some(b)) => Stored::of_bytes(b),
        Ok(None) => Stored::Missing,
        Err(e) => Stored::Damaged(e.to_string()),
    };
    walk.row(WalkRow {
        position,
        link,
        stored,
        event_id: text(1).unwrap_or_default().to_owned(),
        stream: text(2).unwrap_or_default().to_owned(),
        version,
        type_id: text(4).unwrap_or_default().to_owned(),
        schema_version: schema_version.unwrap_or(0),
        timestamp_ms,
        correlation_id: opt(7).ok().flatten().map(str::to_owned),
        causation_id: opt(8).ok().flatten().map(str::to_owned),
        payload: text(9).map(str::to_owned),
    });
}
