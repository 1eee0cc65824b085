//! [`SqliteEventStore`]: the event log in one SQLite file, WAL mode, with group commit.
//!
//! Here: the store, its settings and the [`EventStore`] implementation. `group` holds group
//! commit (the queue, the leader, the answers), `sql` the schema, the inserts and the row
//! decoding, `connection` opening connections and retrying a locked database, `checkpoint` WAL
//! checkpoints off the appenders' path.

mod checkpoint;
mod connection;
mod group;
mod sql;

pub(super) use sql::{has_hash_column, link_of};

use super::time::now_ms;
use super::{
    AppendResult, EventStore, EventStoreError, ExpectedVersion, NewEvent, RecordedEvent, Result,
};
use crate::events::rows::Row;
use checkpoint::Checkpointer;
pub use checkpoint::Checkpoints;
use connection::{open_connection, retry_locked, Role};
use group::{gather_deadline, AnswerAll, Appender, EndTurn, Pending, Queue, Slot};
use parking_lot::{Condvar, Mutex};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use sql::{append_one, page, prepare_schema, query_events, read_head, Head, COLUMNS};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How hard a commit works to survive power loss.
///
/// Both levels survive a crash of the process (kill -9, a panic, an abort): in WAL mode a
/// committed transaction is in the WAL file, which the operating system keeps after the process
/// dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// Where WAL checkpoints run; default [`Checkpoints::Background`].
    pub checkpoints: Checkpoints,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            lock_retry_deadline: Duration::from_secs(30),
            checkpoints: Checkpoints::default(),
        }
    }
}

/// Most rows one read returns, whatever the caller asks: short reads keep a slow reader from
/// pinning a WAL snapshot (and so blocking checkpoints) for long.
pub const MAX_PAGE: usize = 1000;

/// The one connection that writes, and what it remembers of the streams it wrote.
struct Writer {
    conn: Connection,
    /// Each stream's last version as this connection committed it, which saves a lookup per
    /// append. Valid only while no other connection commits: `data_version` is the
    /// connection's `PRAGMA data_version` when the cache was last known good.
    versions: HashMap<String, u64>,
    data_version: Option<i64>,
    /// The chain's head as this connection committed it; valid as `versions` is.
    head: Option<Head>,
    /// Whether appends are hash-chained: always, but for a bench's baseline.
    chained: bool,
}

/// Streams whose versions the writer remembers at most; past that it starts over.
const MAX_CACHED_STREAMS: usize = 10_000;

/// The event log in a SQLite file. Cheap to share: clone the `Arc` or use `&self` from many
/// threads; several processes may open the same file.
///
/// Appends from all threads of a process go through one writer connection with group commit
/// (the rule is in the `group` module's docs): concurrent appends share one flush, a
/// conflicting append fails alone, and every append returns only after the commit holding it.
pub struct SqliteEventStore {
    path: PathBuf,
    options: StoreOptions,
    writer: Mutex<Writer>,
    queue: Mutex<Queue>,
    /// Groups committed by this handle, for subscriptions to wake on.
    commits: crate::events::subscription::Wake,
    readers: Mutex<Vec<Connection>>,
    checkpointer: Checkpointer,
    latency: crate::events::latency::AppendLatency,
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
        Self::open_chained(path.as_ref(), options, true)
    }

    /// The store without the hash chain (no hash written, none required): the baseline the
    /// `event_store` bench measures the chain's cost against. Test builds only.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn open_unchained_for_bench<P: AsRef<Path>>(path: P) -> Result<Self> {
        Self::open_chained(path.as_ref(), StoreOptions::default(), false)
    }

    fn open_chained(path: &Path, options: StoreOptions, chained: bool) -> Result<Self> {
        let path = path.to_path_buf();
        let writer = open_connection(&path, &options, Role::Writer)?;
        retry_locked(&options, || {
            let begin = |sql: &str, operation| {
                writer
                    .execute_batch(sql)
                    .map_err(|source| EventStoreError::Sqlite { operation, source })
            };
            begin("BEGIN IMMEDIATE", "begin")?;
            prepare_schema(&writer, &path, chained)?;
            begin("COMMIT", "commit the schema")
        })
        .inspect_err(|_| {
            let _ = writer.execute_batch("ROLLBACK");
        })?;
        if options.checkpoints == Checkpoints::Background {
            checkpoint::install(&writer);
        }
        Ok(SqliteEventStore {
            checkpointer: Checkpointer::new(path.clone(), options.clone()),
            path,
            options,
            writer: Mutex::new(Writer {
                conn: writer,
                versions: HashMap::new(),
                data_version: None,
                head: None,
                chained,
            }),
            queue: Mutex::new(Queue::default()),
            commits: Default::default(),
            readers: Mutex::new(Vec::new()),
            latency: Default::default(),
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

    /// The last event's position (0 when the log is empty) and its chain hash (`None` when it
    /// predates the chain or its hash is damaged).
    ///
    /// # Errors
    /// SQLite errors.
    pub fn chain_head(&self) -> Result<(u64, Option<crate::events::chain::ChainHash>)> {
        self.with_reader(read_chain_head)
    }

    /// How long this handle's appends took, from the call to its return, successful or not.
    pub fn append_latency(&self) -> crate::events::LatencySnapshot {
        self.latency.snapshot()
    }

    /// The durability this store commits with.
    pub fn durability(&self) -> Durability {
        self.options.durability
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
            head,
            chained,
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
                    *head = None;
                }
                let mut chain = match *head {
                    Some(h) => h,
                    None => read_head(&tx)?,
                };
                // Until this transaction commits, the cache holds versions it may roll back;
                // should this thread unwind, the next group starts from an empty cache.
                *data_version = None;
                let now = now_ms();
                let mut results = Vec::with_capacity(group.len());
                for p in group {
                    match append_one(&tx, p, now, versions, &mut chain, *chained) {
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
                *head = Some(chain);
                Ok(results)
            })();
            if attempt.is_err() {
                // Rolled back: what this group taught us of the streams is void.
                versions.clear();
                *head = None;
            }
            attempt
        });
        match outcome {
            Ok(results) => {
                let pages = checkpoint::take_pages();
                for (p, r) in group.iter().zip(results) {
                    p.answer(r);
                }
                self.commits.bump();
                if self.options.checkpoints == Checkpoints::Background {
                    self.checkpointer.after_commit(conn, pages);
                }
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

/// The last event's position and stored hash, on `conn` (a log without a hash column reads as
/// unchained).
pub(super) fn read_chain_head(
    conn: &Connection,
) -> Result<(u64, Option<crate::events::chain::ChainHash>)> {
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "read the chain head",
        source,
    };
    let has_hash = sql::has_hash_column(conn).map_err(sqlite)?;
    let sql = if has_hash {
        "SELECT position, hash FROM events ORDER BY position DESC LIMIT 1"
    } else {
        "SELECT position, NULL FROM events ORDER BY position DESC LIMIT 1"
    };
    conn.query_row(sql, [], |r| {
        let hash = match r.get_ref(1)? {
            rusqlite::types::ValueRef::Blob(b) => crate::events::chain::ChainHash::try_from(b).ok(),
            _ => None,
        };
        Ok((r.get::<_, i64>(0)?, hash))
    })
    .optional()
    .map(|row| match row {
        None => (0, None),
        Some((p, h)) => (p.max(0) as u64, h),
    })
    .map_err(sqlite)
}

impl SqliteEventStore {
    /// The append itself, after the arguments were checked.
    fn append_rows(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<AppendResult> {
        let rows = events.iter().map(Row::new).collect::<Result<_>>()?;
        // Group commit (see `group`): no wake-up on the way to the disk while appenders keep
        // coming.
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
}

/// How often a subscription looks for commits made by other processes when nothing in this
/// process woke it (SQLite tells no one of another process's commit). Commits in this process
/// wake it at once.
const CROSS_PROCESS_POLL: Duration = Duration::from_millis(2);

impl crate::events::subscription::Follow for SqliteEventStore {
    /// Groups this handle has committed.
    fn commit_count(&self) -> u64 {
        self.commits.count()
    }

    fn wait_for_commit(&self, seen: u64, timeout: Duration) {
        self.commits.wait(seen, timeout.min(CROSS_PROCESS_POLL));
    }
}

impl EventStore for SqliteEventStore {
    fn append(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<AppendResult> {
        crate::events::rows::check_append(stream, events)?;
        let started = Instant::now();
        let out = self.append_rows(stream, expected, events);
        self.latency.record(started.elapsed());
        out
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

    fn read_stream_verified(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let from = from_version.min(i64::MAX as u64) as i64;
        self.with_reader(|conn| sql::query_verified(conn, stream, from, page(max)))
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
