//! [`SqliteEventStore`]: the event log in one SQLite file, WAL mode, with group commit.

use super::time::now_ms;
use super::{
    AppendResult, EventStore, EventStoreError, ExpectedVersion, NewEvent, RecordedEvent, Result,
};
use crate::ids::EventId;
use parking_lot::{Condvar, Mutex};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How hard a commit works to survive power loss.
///
/// Both levels survive a crash of the process (kill -9, a panic, an abort): in WAL mode a
/// committed transaction is in the WAL file, which the operating system keeps after the process
/// dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL` (the default): the WAL is flushed to disk before each commit returns,
    /// so an append that returned `Ok` also survives power loss or a kernel crash, as far as the
    /// disk honours flushes. Group commit shares one flush among all appends waiting at once.
    #[default]
    Full,
    /// `synchronous=NORMAL`: the WAL is flushed only at checkpoints. Survives a process crash,
    /// but the last commits before a power loss or kernel crash may roll back (the file stays
    /// consistent). An explicit opt-in for throughput over power-loss durability.
    Normal,
}

impl Durability {
    fn pragma_value(self) -> i64 {
        match self {
            Durability::Full => 2,
            Durability::Normal => 1,
        }
    }
}

/// Settings for [`SqliteEventStore::open_with`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Power-loss durability; default [`Durability::Full`].
    pub durability: Durability,
    /// How long one SQLite call waits for another process's lock; default 5 s.
    pub busy_timeout: Duration,
    /// How long an append keeps retrying a locked database (with jitter) before it returns
    /// [`EventStoreError::Busy`]; default 30 s.
    pub lock_retry_deadline: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            lock_retry_deadline: Duration::from_secs(30),
        }
    }
}

/// Most rows one read returns, whatever the caller asks: short reads keep a slow reader from
/// pinning a WAL snapshot (and so blocking checkpoints) for long.
pub const MAX_PAGE: usize = 1000;

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
    UNIQUE (stream_id, stream_version)
);
";

const COLUMNS: &str = "position, event_id, stream_id, stream_version, type_id, schema_version, \
                       timestamp_ms, correlation_id, causation_id, payload";

/// The one connection that writes, and what it remembers of the streams it wrote.
struct Writer {
    conn: Connection,
    /// Each stream's last version as this connection committed it, which saves a lookup per
    /// append. Valid only while no other connection commits: `data_version` is the
    /// connection's `PRAGMA data_version` when the cache was last known good.
    versions: HashMap<String, u64>,
    data_version: Option<i64>,
}

/// Streams whose versions the writer remembers at most; past that it starts over.
const MAX_CACHED_STREAMS: usize = 10_000;

/// Appends waiting for the next group, and whether a group is being committed now.
#[derive(Default)]
struct Queue {
    pending: Vec<Arc<Pending>>,
    /// A leader holds the writer connection for a group taken from `pending`.
    committing: bool,
    /// Threads inside `append` that have not taken their answer yet: the appends a group may
    /// still expect.
    appenders: usize,
    /// When the last commit ended: appends queued during a commit wait for it anyway, so the
    /// gathering for the next group starts then.
    turn_ended: Option<Instant>,
}

/// When a group holding an append queued at `arrived` stops waiting for appenders that may
/// come back, given when the last commit ended.
fn gather_deadline(arrived: Instant, turn_ended: Option<Instant>) -> Instant {
    turn_ended.map_or(arrived, |t| t.max(arrived)) + GATHER
}

impl Queue {
    /// Whether the queued appends should be committed now: nothing is committing, and every
    /// appender the store knows of is queued (or the oldest has waited long enough).
    fn ready(&self, now: Instant) -> bool {
        !self.committing
            && match self.pending.first() {
                None => false,
                Some(oldest) => {
                    self.pending.len() >= self.appenders
                        || now >= gather_deadline(oldest.arrived, self.turn_ended)
                }
            }
    }

    /// The queued appends, for the caller to commit, if they are ready.
    fn take_if_ready(&mut self) -> Option<Vec<Arc<Pending>>> {
        if !self.ready(Instant::now()) {
            return None;
        }
        self.committing = true;
        Some(std::mem::take(&mut self.pending))
    }

    /// Wakes the oldest queued append to commit its group, if the group is ready: one
    /// targeted wake-up, not a herd.
    /// Returns whether it woke one.
    fn hand_over(&mut self) -> bool {
        if self.ready(Instant::now()) {
            if let Some(oldest) = self.pending.first() {
                oldest.slot.lock().lead = true;
                oldest.wake.notify_one();
                return true;
            }
        }
        false
    }
}

/// Counts a thread among the appenders while it is inside `append`, also when it unwinds:
/// leaving may complete the group queued behind it.
struct Appender<'a> {
    store: &'a SqliteEventStore,
}

impl Drop for Appender<'_> {
    fn drop(&mut self) {
        let mut queue = self.store.queue.lock();
        queue.appenders = queue.appenders.saturating_sub(1);
        queue.hand_over();
    }
}

/// How long a group that could commit waits for appenders it knows are coming back (about two
/// flushes here) before it commits without them.
const GATHER: Duration = Duration::from_micros(400);

/// Ends a leader's turn, also when the commit unwinds: the next group may start, and if it is
/// ready its oldest append is woken to commit it.
struct EndTurn<'a> {
    store: &'a SqliteEventStore,
}

impl Drop for EndTurn<'_> {
    fn drop(&mut self) {
        let mut queue = self.store.queue.lock();
        let now = Instant::now();
        // An append whose gathering time ran out during the commit sleeps without a timeout.
        let stopped_timing = queue
            .pending
            .first()
            .is_some_and(|p| now >= gather_deadline(p.arrived, queue.turn_ended));
        queue.committing = false;
        queue.turn_ended = Some(now);
        if !queue.hand_over() && stopped_timing {
            // Its group gathers from now on: wake it to time that.
            if let Some(oldest) = queue.pending.first() {
                oldest.wake.notify_one();
            }
        }
    }
}

/// An event ready to insert: its payload serialized by the appending thread, so the group's
/// leader only binds and inserts.
struct Row {
    event_id: String,
    type_id: String,
    schema_version: u32,
    correlation_id: Option<String>,
    causation_id: Option<String>,
    payload: String,
}

impl Row {
    fn new(e: &NewEvent) -> Result<Row> {
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

/// One append waiting for a group commit.
struct Pending {
    stream: String,
    expected: ExpectedVersion,
    events: Vec<Row>,
    arrived: Instant,
    slot: Mutex<Slot>,
    /// Wakes this append's thread: its result is set, or its group is ready to commit.
    wake: Condvar,
}

#[derive(Default)]
struct Slot {
    result: Option<Result<AppendResult>>,
    lead: bool,
}

impl Pending {
    fn answer(&self, r: Result<AppendResult>) {
        self.slot.lock().result = Some(r);
        self.wake.notify_one();
    }

    fn answered(&self) -> bool {
        self.slot.lock().result.is_some()
    }
}

/// The event log in a SQLite file. Cheap to share: clone the `Arc` or use `&self` from many
/// threads; several processes may open the same file.
///
/// Appends from all threads of a process go through one writer connection with group commit:
/// appends queue up while a group commits; the next group is committed in one
/// `BEGIN IMMEDIATE` transaction as soon as every thread inside `append` has queued, or 400 us
/// after the last commit ended (or after the oldest queued, if later). A conflicting append
/// fails alone: nothing of it is stored (an append of several events runs in a savepoint),
/// and its neighbours commit. Every append returns only after the commit holding it.
pub struct SqliteEventStore {
    path: PathBuf,
    options: StoreOptions,
    writer: Mutex<Writer>,
    queue: Mutex<Queue>,
    /// Groups committed by this handle, for subscriptions to wake on.
    commits: Mutex<u64>,
    appended: Condvar,
    readers: Mutex<Vec<Connection>>,
}

impl std::fmt::Debug for SqliteEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteEventStore")
            .field("path", &self.path)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SqliteEventStore {
    /// Opens (or creates) the log at `path` with [`StoreOptions::default`].
    ///
    /// # Errors
    /// [`EventStoreError::Open`] when the file cannot be opened or created;
    /// [`EventStoreError::Settings`] when SQLite will not use WAL or the durability asked.
    pub fn open<P: AsRef<Path>>(path: P) -> Result<Self> {
        Self::open_with(path, StoreOptions::default())
    }

    /// Opens (or creates) the log at `path` with `options`.
    ///
    /// # Errors
    /// As [`SqliteEventStore::open`].
    pub fn open_with<P: AsRef<Path>>(path: P, options: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let writer = open_connection(&path, &options, Role::Writer)?;
        retry_locked(&options, || {
            writer
                .execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))
                .map_err(|source| EventStoreError::Sqlite {
                    operation: "create schema",
                    source,
                })
        })
        .inspect_err(|_| {
            let _ = writer.execute_batch("ROLLBACK");
        })?;
        Ok(SqliteEventStore {
            path,
            options,
            writer: Mutex::new(Writer {
                conn: writer,
                versions: HashMap::new(),
                data_version: None,
            }),
            queue: Mutex::new(Queue::default()),
            commits: Mutex::new(0),
            appended: Condvar::new(),
            readers: Mutex::new(Vec::new()),
        })
    }

    /// Opens the log at `path` only if it exists and is a correx log: nothing is created in a
    /// missing file, nor a table added to another program's database.
    ///
    /// # Errors
    /// [`EventStoreError::NotALog`] naming what the file is instead; otherwise as
    /// [`SqliteEventStore::open`].
    pub fn open_existing<P: AsRef<Path>>(path: P, options: StoreOptions) -> Result<Self> {
        drop(super::verify::open_log_read_only(path.as_ref())?);
        Self::open_with(path, options)
    }

    /// The file this store writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The durability this store commits with.
    pub fn durability(&self) -> Durability {
        self.options.durability
    }

    /// How many groups this handle has committed.
    pub(super) fn commit_count(&self) -> u64 {
        *self.commits.lock()
    }

    /// Waits until this handle commits past `seen` groups, or `timeout` passes.
    pub(super) fn wait_for_commit(&self, seen: u64, timeout: Duration) {
        let mut n = self.commits.lock();
        if *n == seen {
            self.appended.wait_for(&mut n, timeout);
        }
    }

    /// Runs `f` on a pooled read-only connection.
    fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.readers.lock().pop();
        let conn = match conn {
            Some(c) => c,
            None => open_connection(&self.path, &self.options, Role::Reader)?,
        };
        let out = f(&conn);
        self.readers.lock().push(conn);
        out
    }

    fn read_query(&self, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<RecordedEvent>> {
        self.with_reader(|conn| query_events(conn, sql, args))
    }

    /// Commits `group`, taken from the queue, then lets the next group start.
    fn lead(&self, group: &[Arc<Pending>]) {
        let _end = EndTurn { store: self };
        let mut writer = self.writer.lock();
        self.commit_group(&mut writer, group);
    }

    /// Commits the group in one transaction; fills in each append's result.
    fn commit_group(&self, writer: &mut Writer, group: &[Arc<Pending>]) {
        // Followers wait for results the leader sets; if the leader unwinds, they still get one.
        let _guard = AnswerAll(group);
        let Writer {
            conn,
            versions,
            data_version,
        } = writer;
        let outcome = retry_locked(&self.options, || {
            let attempt = (|| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(|source| EventStoreError::Sqlite {
                        operation: "begin",
                        source,
                    })?;
                // Inside the write lock, the snapshot is the newest: if another connection
                // committed since our last group, the versions we remember may be stale.
                let seen: i64 = tx
                    .prepare_cached("PRAGMA data_version")
                    .and_then(|mut st| st.query_row([], |r| r.get(0)))
                    .map_err(|source| EventStoreError::Sqlite {
                        operation: "read data_version",
                        source,
                    })?;
                if *data_version != Some(seen) || versions.len() > MAX_CACHED_STREAMS {
                    versions.clear();
                }
                // Until this transaction commits, the cache holds versions it may roll back;
                // should this thread unwind, the next group starts from an empty cache.
                *data_version = None;
                let now = now_ms();
                let mut results = Vec::with_capacity(group.len());
                for p in group {
                    match append_one(&tx, p, now, versions) {
                        // A storage error (disk full, I/O) may have rolled back the whole
                        // transaction: fail the group rather than commit what is left of it.
                        Err(e) if !e.is_caller_error() => return Err(e),
                        r => results.push(r),
                    }
                }
                tx.commit().map_err(|source| EventStoreError::Sqlite {
                    operation: "commit",
                    source,
                })?;
                *data_version = Some(seen);
                Ok(results)
            })();
            if attempt.is_err() {
                // Rolled back: what this group taught us of the streams is void.
                versions.clear();
            }
            attempt
        });
        match outcome {
            Ok(results) => {
                for (p, r) in group.iter().zip(results) {
                    p.answer(r);
                }
                *self.commits.lock() += 1;
                self.appended.notify_all();
            }
            Err(e) => {
                // rusqlite errors are not Clone: every append of the group gets the same story.
                let detail = e.to_string();
                for p in group {
                    p.answer(Err(match &e {
                        EventStoreError::Busy { waited_ms } => EventStoreError::Busy {
                            waited_ms: *waited_ms,
                        },
                        _ => EventStoreError::CommitFailed {
                            detail: detail.clone(),
                        },
                    }));
                }
            }
        }
    }
}

/// A new read-only connection on the store's file, set up like the pooled ones.
pub(super) fn open_reader(store: &SqliteEventStore) -> Result<Connection> {
    open_connection(&store.path, &store.options, Role::Reader)
}

/// Up to `max` events from `from` on `conn`, in position order.
pub(super) fn read_all_on(conn: &Connection, from: u64, max: usize) -> Result<Vec<RecordedEvent>> {
    let sql =
        format!("SELECT {COLUMNS} FROM events WHERE position >= ?1 ORDER BY position LIMIT ?2");
    let from = from.min(i64::MAX as u64) as i64;
    query_events(conn, &sql, &[&from, &page(max)])
}

fn query_events(
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

fn page(max: usize) -> i64 {
    max.min(MAX_PAGE) as i64
}

/// Sets an error result on every append of a group that has none when dropped while unwinding.
struct AnswerAll<'a>(&'a [Arc<Pending>]);

impl Drop for AnswerAll<'_> {
    fn drop(&mut self) {
        // Only for unwinding: otherwise every append was answered, and some have taken their
        // answer already, which would look like none.
        if !std::thread::panicking() {
            return;
        }
        for p in self.0 {
            if !p.answered() {
                p.answer(Err(EventStoreError::CommitFailed {
                    detail: "the thread committing this group panicked; nothing was stored".into(),
                }));
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Writer,
    Reader,
}

fn open_connection(path: &Path, options: &StoreOptions, role: Role) -> Result<Connection> {
    let open_err = |source| EventStoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags).map_err(open_err)?;
    conn.busy_timeout(options.busy_timeout).map_err(open_err)?;
    // Switching to WAL needs a moment of exclusive access; another process may be mid-write.
    let mode: String = retry_locked(options, || {
        conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|source| EventStoreError::Sqlite {
                operation: "set journal_mode",
                source,
            })
    })?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(EventStoreError::Settings {
            pragma: "journal_mode",
            wanted: "wal".into(),
            got: mode,
        });
    }
    let sync = options.durability.pragma_value();
    conn.pragma_update(None, "synchronous", sync)
        .map_err(open_err)?;
    let got: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .map_err(open_err)?;
    if got != sync {
        return Err(EventStoreError::Settings {
            pragma: "synchronous",
            wanted: sync.to_string(),
            got: got.to_string(),
        });
    }
    if role == Role::Reader {
        conn.pragma_update(None, "query_only", true)
            .map_err(open_err)?;
    } else {
        // An append of several events runs in a savepoint, whose journal spills to a temp file
        // past 64 KiB unless temp storage is in memory; on disk it costs a third of a batch
        // append.
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(open_err)?;
    }
    Ok(conn)
}

fn is_locked(e: &EventStoreError) -> bool {
    let source = match e {
        EventStoreError::Sqlite { source, .. } | EventStoreError::Open { source, .. } => source,
        _ => return false,
    };
    matches!(
        source.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Runs `f` until it does not fail with a lock error, sleeping with jitter between tries, up to
/// the store's retry deadline.
fn retry_locked<T>(options: &StoreOptions, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    let mut attempt: u32 = 0;
    loop {
        match f() {
            Err(e) if is_locked(&e) => {
                if start.elapsed() >= options.lock_retry_deadline {
                    return Err(EventStoreError::Busy {
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
                attempt = attempt.saturating_add(1);
                let cap_ms = 2u64.saturating_pow(attempt.min(7)).min(100);
                let jitter = u64::from(crate::ids::random_bytes::<2>()[0]) % (cap_ms + 1);
                std::thread::sleep(Duration::from_millis(1 + jitter));
            }
            other => return other,
        }
    }
}

/// Appends `p` inside the group's transaction. A failing append leaves nothing behind: an
/// append of several events runs in a savepoint; a single event needs none, as a failed
/// INSERT undoes itself and nothing is written before it.
fn append_one(
    tx: &rusqlite::Transaction<'_>,
    p: &Pending,
    now: i64,
    versions: &mut HashMap<String, u64>,
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
    let result = match append_events(tx, p, now, versions) {
        Ok(Attempt::Stored(r)) => Ok(r),
        // Checking ids up front would cost a lookup per event on every append; the UNIQUE index
        // finds repeats for free, and only then do we look at what was stored before.
        Ok(Attempt::DuplicateId) => {
            run("ROLLBACK TO append").map_err(sqlite("rollback savepoint"))?;
            match find_existing(tx, p) {
                Ok(Some(r)) => Ok(r),
                Ok(None) => match first_duplicate(p) {
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
        run("ROLLBACK TO append").map_err(sqlite("rollback savepoint"))?;
    }
    run("RELEASE append").map_err(sqlite("release savepoint"))?;
    result
}

fn first_duplicate(p: &Pending) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    p.events
        .iter()
        .find(|e| !seen.insert(e.event_id.as_str()))
        .map(|e| e.event_id.to_string())
}

/// What one append inside the group transaction came to.
enum Attempt {
    Stored(AppendResult),
    /// An event id is already in the table (or twice in this batch).
    DuplicateId,
}

fn append_events(
    conn: &Connection,
    p: &Pending,
    now: i64,
    versions: &mut HashMap<String, u64>,
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
    let ok = match p.expected {
        ExpectedVersion::Any => true,
        ExpectedVersion::NoStream => current.is_none(),
        ExpectedVersion::Exact(v) => current == Some(v),
    };
    if !ok {
        // A retry of an append that did commit finds the stream moved on by itself.
        if let Some(r) = find_existing(conn, p)? {
            return Ok(Attempt::Stored(r));
        }
        return Err(EventStoreError::WrongExpectedVersion {
            stream: p.stream.clone(),
            expected: match p.expected {
                ExpectedVersion::Exact(v) => Some(v),
                ExpectedVersion::NoStream | ExpectedVersion::Any => None,
            },
            actual: current,
        });
    }
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO events (event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .map_err(sqlite("prepare insert"))?;
    let mut version = current.unwrap_or(0);
    let mut first = 0;
    let mut last = 0;
    for (i, e) in p.events.iter().enumerate() {
        version += 1;
        let inserted = insert.execute(params![
            e.event_id.as_str(),
            p.stream,
            version as i64,
            e.type_id,
            e.schema_version,
            now,
            e.correlation_id,
            e.causation_id,
            e.payload
        ]);
        match inserted {
            Ok(_) => {}
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
        last = conn.last_insert_rowid() as u64;
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

/// An idempotent retry: when every event id is already stored, in this stream, returns where
/// they landed. When only some are stored, or in another stream, the retry is not the same
/// append and is refused.
fn find_existing(conn: &Connection, p: &Pending) -> Result<Option<AppendResult>> {
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "check event id",
        source,
    };
    let mut stmt = conn
        .prepare_cached(
            "SELECT position, stream_id, stream_version FROM events WHERE event_id = ?1",
        )
        .map_err(sqlite)?;
    let mut found = Vec::with_capacity(p.events.len());
    for e in &p.events {
        let row = stmt
            .query_row([e.event_id.as_str()], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)? as u64,
                ))
            })
            .optional()
            .map_err(sqlite)?;
        found.push(row);
    }
    if found.iter().all(Option::is_none) {
        return Ok(None);
    }
    let conflict = |detail: String| EventStoreError::IdempotencyConflict {
        event_id: p
            .events
            .first()
            .map(|e| e.event_id.to_string())
            .unwrap_or_default(),
        detail,
    };
    let stored: Vec<(u64, String, u64)> = found.into_iter().flatten().collect();
    if stored.len() != p.events.len() {
        return Err(conflict(
            "part of this batch was stored before, part was not".into(),
        ));
    }
    if stored.iter().any(|(_, s, _)| *s != p.stream) {
        return Err(conflict(format!(
            "it was stored in another stream, not {:?}",
            p.stream
        )));
    }
    let first = stored.iter().map(|r| r.0).min().unwrap_or(0);
    let last = stored.iter().map(|r| r.0).max().unwrap_or(0);
    let version = stored.iter().map(|r| r.2).max().unwrap_or(0);
    Ok(Some(AppendResult {
        first_position: first,
        last_position: last,
        stream_version: version,
    }))
}

fn decode_row(row: &rusqlite::Row<'_>) -> Result<RecordedEvent> {
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

impl EventStore for SqliteEventStore {
    fn append(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<AppendResult> {
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
        let rows = events.iter().map(Row::new).collect::<Result<_>>()?;
        // Group commit with no wake-up on the way to the disk when appenders keep coming: the
        // append that completes a group (every appender the store knows of is queued, and no
        // commit runs) commits it at once. The others sleep on their own slot until their
        // answer is set, or until they are handed a group that became ready without an
        // arrival (a commit ended, an appender left); a group left incomplete is committed by
        // its oldest append when GATHER has passed.
        let (me, group) = {
            let mut queue = self.queue.lock();
            // Stamped under the lock, so the queue is in arrival order.
            let me = Arc::new(Pending {
                stream: stream.to_owned(),
                expected,
                events: rows,
                arrived: Instant::now(),
                slot: Mutex::new(Slot::default()),
                wake: Condvar::new(),
            });
            queue.pending.push(Arc::clone(&me));
            queue.appenders += 1;
            (me, queue.take_if_ready())
        };
        let _appender = Appender { store: self };
        if let Some(group) = group {
            self.lead(&group);
        }
        loop {
            // Queue before slot, the order `hand_over` takes them in.
            let deadline = gather_deadline(me.arrived, self.queue.lock().turn_ended);
            let mut slot = me.slot.lock();
            if let Some(r) = slot.result.take() {
                return r;
            }
            let try_lead = if std::mem::take(&mut slot.lead) {
                true
            } else if Instant::now() < deadline {
                me.wake.wait_until(&mut slot, deadline).timed_out()
            } else {
                me.wake.wait(&mut slot);
                false
            };
            drop(slot);
            if try_lead {
                let group = {
                    let mut queue = self.queue.lock();
                    // Answered meanwhile: return now rather than commit someone else's group.
                    if me.answered() {
                        None
                    } else {
                        queue.take_if_ready()
                    }
                };
                if let Some(group) = group {
                    self.lead(&group);
                }
            }
        }
    }

    fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM events WHERE stream_id = ?1 AND stream_version >= ?2 \
             ORDER BY stream_version LIMIT ?3"
        );
        let from = from_version.min(i64::MAX as u64) as i64;
        self.read_query(&sql, &[&stream, &from, &page(max)])
    }

    fn read_all(&self, from_position: u64, max: usize) -> Result<Vec<RecordedEvent>> {
        let sql =
            format!("SELECT {COLUMNS} FROM events WHERE position >= ?1 ORDER BY position LIMIT ?2");
        let from = from_position.min(i64::MAX as u64) as i64;
        self.read_query(&sql, &[&from, &page(max)])
    }

    fn last_position(&self) -> Result<u64> {
        self.with_reader(|conn| {
            conn.query_row("SELECT coalesce(max(position), 0) FROM events", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|v| v as u64)
            .map_err(|source| EventStoreError::Sqlite {
                operation: "read last position",
                source,
            })
        })
    }
}
