use std::fmt;
use std::path::PathBuf;

/// What went wrong in the event store.
#[derive(Debug)]
#[non_exhaustive]
pub enum EventStoreError {
    /// The database file could not be opened or prepared.
    Open {
        /// The file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A SQLite call failed.
    Sqlite {
        /// What the store was doing.
        operation: &'static str,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// Another process held the write lock for longer than the store waits.
    Busy {
        /// How long the store retried, in milliseconds.
        waited_ms: u64,
    },
    /// Optimistic concurrency failed: the stream is not at the expected version.
    WrongExpectedVersion {
        /// The stream.
        stream: String,
        /// What the caller expected (`None`: no stream yet).
        expected: Option<u64>,
        /// What the stream holds (`None`: no stream yet).
        actual: Option<u64>,
    },
    /// The transaction holding a group of appends failed to commit; none of them is stored.
    CommitFailed {
        /// SQLite's account of the failure.
        detail: String,
    },
    /// The connection was lost while the transaction holding an append committed: it may be
    /// stored or not. Append again with the same event ids: a stored append returns its
    /// positions, one that was not is stored then.
    CommitUnknown {
        /// What was lost, and what is known.
        detail: String,
    },
    /// An append was malformed (no events, an empty stream name).
    InvalidAppend {
        /// What is wrong.
        detail: String,
    },
    /// An event id was appended again with different content or to a different stream.
    IdempotencyConflict {
        /// The repeated id.
        event_id: String,
        /// How the retry differs from the first append.
        detail: String,
    },
    /// A stored row cannot be read back.
    CorruptEvent {
        /// The row's global position.
        position: u64,
        /// What is wrong with it.
        detail: String,
    },
    /// The file is not a correx event log (not SQLite, or no `events` table); nothing was
    /// written to it.
    NotALog {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        detail: String,
    },
    /// The log was written by a newer correx, with a schema this build does not know; nothing
    /// was written to it. Use that correx, or a newer one.
    SchemaTooNew {
        /// The file.
        path: PathBuf,
        /// Its schema version (`PRAGMA user_version`).
        found: i64,
        /// The newest this build reads and writes.
        supported: i64,
    },
    /// The PostgreSQL server could not be reached, or refused the connection (authentication,
    /// no such database).
    Connect {
        /// The server and database, without any password.
        target: String,
        /// What the client library or the server said.
        detail: String,
        /// The server's SQLSTATE, when it refused (28P01: wrong password, 3D000: no such
        /// database); `None` when it was not reached or the client stopped first.
        code: Option<String>,
        /// Whether trying again later may succeed: the server was unreachable or full, not a
        /// refused password, a missing database or a password the client lacks.
        transient: bool,
    },
    /// A PostgreSQL call failed.
    Postgres {
        /// What the store was doing.
        operation: &'static str,
        /// The server's SQLSTATE code, when the server answered with one.
        code: Option<String>,
        /// The server's (or the client library's) message.
        detail: String,
    },
    /// The log's location is neither a file path nor a `postgres://` URL this build can use.
    InvalidLocation {
        /// The location as given (any password left out).
        location: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// SQLite did not accept the durability or journal settings the store needs.
    Settings {
        /// The pragma.
        pragma: &'static str,
        /// What was asked.
        wanted: String,
        /// What SQLite reported back.
        got: String,
    },
}

impl EventStoreError {
    /// Whether the caller's own request was at fault (a version conflict, a repeated id, a
    /// malformed append), as opposed to the storage failing.
    pub fn is_caller_error(&self) -> bool {
        match self {
            EventStoreError::WrongExpectedVersion { .. }
            | EventStoreError::IdempotencyConflict { .. }
            | EventStoreError::InvalidAppend { .. } => true,
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
            | EventStoreError::InvalidLocation { .. }
            | EventStoreError::Settings { .. } => false,
        }
    }

    /// Whether SQLite reported a lock held by another connection (`SQLITE_BUSY` or
    /// `SQLITE_LOCKED`), while opening or in a call: the one classification of "busy" the store
    /// retries on and reports as transient.
    pub(crate) fn is_sqlite_busy(&self) -> bool {
        match self {
            EventStoreError::Sqlite { source, .. } | EventStoreError::Open { source, .. } => {
                matches!(
                    source.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                )
            }
            _ => false,
        }
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            EventStoreError::Busy { .. } => true,
            EventStoreError::Sqlite { .. } | EventStoreError::Open { .. } => self.is_sqlite_busy(),
            EventStoreError::CommitUnknown { .. } => true,
            EventStoreError::Connect { transient, .. } => *transient,
            // Connection lost (class 08), serialization failure, deadlock, shutdown, too
            // many connections.
            EventStoreError::Postgres { code, .. } => code.as_deref().is_some_and(|c| {
                c.starts_with("08") || matches!(c, "40001" | "40P01" | "57P01" | "53300")
            }),
            EventStoreError::WrongExpectedVersion { .. }
            | EventStoreError::CommitFailed { .. }
            | EventStoreError::InvalidAppend { .. }
            | EventStoreError::IdempotencyConflict { .. }
            | EventStoreError::CorruptEvent { .. }
            | EventStoreError::NotALog { .. }
            | EventStoreError::SchemaTooNew { .. }
            | EventStoreError::InvalidLocation { .. }
            | EventStoreError::Settings { .. } => false,
        }
    }
}

fn version(v: &Option<u64>) -> String {
    match v {
        Some(v) => format!("version {v}"),
        None => "no stream".to_owned(),
    }
}

impl fmt::Display for EventStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventStoreError::Open { path, source } => write!(
                f,
                "cannot open event log {}: {source}; check that the directory exists and is writable",
                path.display()
            ),
            EventStoreError::Sqlite { operation, source } => {
                write!(f, "event log {operation} failed: {source}")
            }
            EventStoreError::Busy { waited_ms } => write!(
                f,
                "event log is locked by another process; gave up after {waited_ms} ms, retry later"
            ),
            EventStoreError::WrongExpectedVersion {
                stream,
                expected,
                actual,
            } => write!(
                f,
                "stream {stream:?} expected {} but holds {}; re-read the stream and retry",
                version(expected),
                version(actual)
            ),
            EventStoreError::CommitUnknown { detail } => {
                write!(f, "event log commit outcome unknown: {detail}")
            }
            EventStoreError::CommitFailed { detail } => {
                write!(f, "event log commit failed, nothing was stored: {detail}")
            }
            EventStoreError::InvalidAppend { detail } => write!(f, "invalid append: {detail}"),
            EventStoreError::IdempotencyConflict { event_id, detail } => write!(
                f,
                "event id {event_id} was already appended differently: {detail}; use a fresh id"
            ),
            EventStoreError::CorruptEvent { position, detail } => {
                write!(f, "event at position {position} is corrupt: {detail}")
            }
            EventStoreError::NotALog { path, detail } => write!(
                f,
                "{} is not a correx event log ({detail}); check the path",
                path.display()
            ),
            EventStoreError::SchemaTooNew {
                path,
                found,
                supported,
            } => write!(
                f,
                "{}: the log's schema is version {found}, written by a newer correx; this one \
                 knows up to {supported}: open it with that correx or a newer one",
                path.display()
            ),
            EventStoreError::Connect { target, detail, .. } => write!(
                f,
                "cannot connect to the event log at {target}: {detail}; check that the server \
                 runs, the database exists, and the password is in PGPASSWORD or a password \
                 file (PGPASSFILE, ~/.pgpass)"
            ),
            EventStoreError::Postgres {
                operation,
                code,
                detail,
            } => match code {
                Some(code) => write!(f, "event log {operation} failed: {detail} (SQLSTATE {code})"),
                None => write!(f, "event log {operation} failed: {detail}"),
            },
            EventStoreError::InvalidLocation { location, detail } => {
                write!(f, "event log location {location:?}: {detail}")
            }
            EventStoreError::Settings {
                pragma,
                wanted,
                got,
            } => write!(
                f,
                "sqlite refused {pragma}={wanted} (it reports {got}); the file system may not support it"
            ),
        }
    }
}

impl std::error::Error for EventStoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EventStoreError::Open { source, .. } | EventStoreError::Sqlite { source, .. } => {
                Some(source)
            }
            EventStoreError::Busy { .. }
            | EventStoreError::WrongExpectedVersion { .. }
            | EventStoreError::CommitFailed { .. }
            | EventStoreError::CommitUnknown { .. }
            | EventStoreError::InvalidAppend { .. }
            | EventStoreError::IdempotencyConflict { .. }
            | EventStoreError::CorruptEvent { .. }
            | EventStoreError::NotALog { .. }
            | EventStoreError::SchemaTooNew { .. }
            | EventStoreError::Connect { .. }
            | EventStoreError::Postgres { .. }
            | EventStoreError::InvalidLocation { .. }
            | EventStoreError::Settings { .. } => None,
        }
    }
}
