//! [`PostgresEventStore`]: the event log in a PostgreSQL database, for logs shared by several
//! hosts (cargo feature `postgres`).
//!
//! The same guarantees as the SQLite store: streams with gapless versions and expected-version
//! checks, batches in one transaction, idempotent event ids, the hash chain, and catch-up
//! subscriptions that see every event exactly once, across processes and hosts.
//!
//! **Positions in commit order.** Every append moves the one row of `correx_head` (the last
//! position and hash) and holds that row's lock to its commit, so appends are serialized: the
//! next position is the head's plus one, and a transaction commits before the next one can
//! move the head. A reader that has seen position N therefore can never later find a smaller
//! position appearing: "all events after N" is a safe question, as it is for SQLite's single
//! writer. (The cost: appends do not overlap their commits; `pg_writers_speedup` in the
//! `event_store` bench reports it.)
//!
//! **One round trip.** A handle remembers the head its last append left and the versions of
//! its streams; the next append is one statement in its own transaction that moves the head
//! only if it is still there and inserts only if it moved (an append from another handle in
//! between makes it change nothing). Otherwise, and for a conflict or a repeated id, the
//! append takes the head `FOR UPDATE` in a transaction first and decides under that lock.
//!
//! **Live events.** While some connection listens, an append notifies the channel
//! `correx_events` in its transaction, which PostgreSQL delivers at commit; a subscription's
//! store listens on one connection of its own (holding `sql::LISTENERS_LOCK`, which is how
//! writers know) and wakes its subscriptions, which then read what is new by position.
//!
//! **A lost connection.** An append whose connection fails after its write was sent ends that
//! connection's server process (which may still be waiting to commit) and looks its ids up on
//! a new one: stored, it returns where; not stored, it appends again (a pooled connection the
//! server had closed) or says so; it says `CommitUnknown` only when it cannot tell.

mod listen;
mod location;
mod sql;

pub use location::is_postgres_url;

use super::chain::{from_hex, ChainHash};
use super::latency::AppendLatency;
use super::rows::{check_expected, first_duplicate, Row};
use super::subscription::Wake;
use super::subscription::{Follow, Subscription};
use super::time::now_ms;
use super::{
    AppendResult, EventStore, EventStoreError, ExpectedVersion, LatencySnapshot, NewEvent,
    RecordedEvent, Result,
};
use listen::Listener;
use location::Target;
use parking_lot::Mutex;
use postgres::error::Severity;
use sql::Conn;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most rows one read returns, whatever the caller asks.
const MAX_PAGE: usize = 1000;
/// How long an append waits for another writer's head lock before it is
/// [`EventStoreError::Busy`], as the SQLite store's lock retry deadline.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may sit inside a transaction doing nothing before the server ends it:
/// a writer stalled while holding the head (a paused VM, a stopped process) lets the others go.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(60);

/// Idle connections kept for reuse; more are closed when given back.
const MAX_IDLE: usize = 16;
/// Streams whose versions the store remembers at most; past that it starts over.
const MAX_CACHED_STREAMS: usize = 10_000;
/// How often a subscription reads anyway when no notification woke it: what bounds the delay
/// while the listening connection reconnects (a notification is lost only then), and while
/// writers have not yet seen that a new listener listens.
const POLL: Duration = Duration::from_millis(100);
/// How long a store trusts what it last found of listeners before asking again.
const LISTENERS_RECHECK: Duration = Duration::from_millis(200);

/// What an error of the client library says, with its cause ("invalid configuration:
/// password missing"); the client's errors never hold the connection string.
pub(crate) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// An error of a call, with the server's SQLSTATE.
pub(crate) fn pg_error(operation: &'static str) -> impl Fn(postgres::Error) -> EventStoreError {
    move |e| match e.code().map(|c| c.code()) {
        // lock_timeout: another writer held the head for longer than the store waits.
        Some("55P03") => EventStoreError::Busy {
            waited_ms: LOCK_TIMEOUT.as_millis() as u64,
        },
        code => EventStoreError::Postgres {
            operation,
            code: code.map(str::to_owned),
            detail: describe(&e),
        },
    }
}

/// The versions of the streams this handle appended to, valid while the head is where this
/// handle left it (no other writer committed since).
#[derive(Default)]
struct Versions {
    /// The head (position and hash) this handle's last append left; the hash tells a head
    /// that went back and forward again (a restore, a failover) from one nobody moved.
    head: Option<(u64, ChainHash)>,
    streams: HashMap<String, u64>,
}

/// The event log in a PostgreSQL database. Cheap to share: clone the `Arc` or use `&self` from
/// many threads; any number of processes and hosts may open the same database.
pub struct PostgresEventStore {
    target: Target,
    idle: Mutex<Vec<Conn>>,
    versions: Mutex<Versions>,
    /// When this store last asked whether anyone listens, and the answer.
    listened: Mutex<Option<(Instant, bool)>>,
    wake: Arc<Wake>,
    listener: Mutex<Option<Listener>>,
    latency: AppendLatency,
}

impl std::fmt::Debug for PostgresEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresEventStore")
            .field("location", &self.target.shown)
            .finish_non_exhaustive()
    }
}

impl PostgresEventStore {
    /// Connects to the database `url` names (`postgres://USER@HOST:PORT/DB`; a UNIX socket
    /// directory as `?host=/run/postgresql`), creates the log's tables there if it has none, or
    /// brings an older correx's up to date.
    ///
    /// The password comes from `PGPASSWORD` or a libpq password file (`PGPASSFILE`, else
    /// `~/.pgpass`, ignored when others can read it), never from the URL. The connection is
    /// not encrypted: reach the server over a UNIX socket, loopback, or a tunnel.
    ///
    /// # Errors
    /// [`EventStoreError::InvalidLocation`] for a URL that cannot be used (one holding a
    /// password among them); [`EventStoreError::Connect`] when the server cannot be reached or
    /// refuses the user; [`EventStoreError::SchemaTooNew`] for a log of a newer correx;
    /// [`EventStoreError::Postgres`] for a failed statement.
    pub fn open(url: &str) -> Result<Self> {
        let target = Target::parse(url)?;
        let mut client = target.connect()?;
        sql::prepare_schema(&mut client, &target.shown)?;
        let conn = Conn::new(client)?;
        Ok(PostgresEventStore {
            target,
            idle: Mutex::new(vec![conn]),
            versions: Mutex::new(Versions::default()),
            listened: Mutex::new(None),
            wake: Arc::new(Wake::default()),
            listener: Mutex::new(None),
            latency: AppendLatency::default(),
        })
    }

    /// The database, as `postgres://USER@HOST:PORT/DB` (never with a password).
    pub fn location(&self) -> &str {
        &self.target.shown
    }

    /// Subscribes to every event with a position greater than `after` (0: from the start),
    /// appended by any process on any host.
    ///
    /// # Errors
    /// None today: the listening connection is opened (and reopened) in the background; a
    /// subscription also reads every 100 ms when nothing woke it, which covers the time until
    /// it listens.
    pub fn subscribe(self: &Arc<Self>, after: u64) -> Result<Subscription> {
        {
            let mut listener = self.listener.lock();
            if listener.is_none() {
                *listener = Some(Listener::start(self.target.clone(), Arc::clone(&self.wake)));
            }
        }
        Ok(Subscription::new(
            Arc::clone(self) as Arc<dyn Follow>,
            after,
        ))
    }

    /// The last event's position (0 when the log is empty) and its chain hash.
    ///
    /// # Errors
    /// [`EventStoreError::Postgres`], [`EventStoreError::Connect`].
    pub fn chain_head(&self) -> Result<(u64, Option<ChainHash>)> {
        self.with_conn(|c| c.head())
            .map(|(position, hash)| (position, (position > 0).then_some(hash)))
    }

    /// How long this handle's appends took, from the call to its return, successful or not.
    pub fn append_latency(&self) -> LatencySnapshot {
        self.latency.snapshot()
    }

    /// Checks the log without changing it (as [`verify_log_with`](super::verify_log_with)
    /// does a file): positions, gapless streams, JSON payloads, the hash chain, the head row,
    /// the seals, and `check` on each event.
    ///
    /// # Errors
    /// [`EventStoreError::Postgres`], [`EventStoreError::Connect`]; what is wrong in the log is
    /// a problem in the report, not an error.
    pub fn verify(
        &self,
        check: &dyn Fn(&RecordedEvent) -> Option<String>,
        seals: &[super::Seal],
    ) -> Result<super::LogReport> {
        self.with_conn(|c| sql::verify(c, check, seals))
    }

    /// Runs `f` on a pooled connection; one that failed is closed, not given back.
    ///
    /// A pooled connection the server closed while it sat idle (a restart, a timeout, a
    /// firewall) is found dead only when used: the call is run once more on a new connection
    /// if nothing that writes was sent on the dead one.
    fn with_conn<T>(&self, mut f: impl FnMut(&mut Conn) -> Result<T>) -> Result<T> {
        let pooled = self.idle.lock().pop();
        let (mut conn, reused) = match pooled {
            Some(c) if !c.client.is_closed() => (c, true),
            _ => (Conn::new(self.target.connect()?)?, false),
        };
        conn.sent_write = false;
        let mut out = f(&mut conn);
        if out.is_err() && reused && conn.client.is_closed() && !conn.sent_write {
            conn = Conn::new(self.target.connect()?)?;
            out = f(&mut conn);
        }
        // A caller's error (a version conflict) leaves a usable connection; one left inside
        // a transaction, or closed, is not given back.
        if !conn.in_transaction && !conn.client.is_closed() {
            let mut idle = self.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        out
    }

    fn append_rows(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        rows: &[Row],
    ) -> Result<AppendResult> {
        if let Some(r) = self.append_at_head(stream, expected, rows)? {
            return Ok(r);
        }
        self.append_locking(stream, expected, rows)
    }

    /// The append as one statement in its own transaction, from the head this handle last
    /// saw: one round trip where the locking path takes three. `None` when it wrote nothing
    /// and the locking path must decide: the head moved (another writer came between), the
    /// expected version does not hold (a conflict, or a retry of an append that committed),
    /// or the server refused the statement (an id stored before).
    fn append_at_head(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        rows: &[Row],
    ) -> Result<Option<AppendResult>> {
        let cached = {
            let v = self.versions.lock();
            v.head
                .zip(v.streams.get(stream).copied())
                .map(|(head, version)| (head, Some(version)))
        };
        self.with_conn(|conn| {
            let (head, current) = match cached {
                Some(known) => known,
                None => conn.head_and_version(stream)?,
            };
            if check_expected(stream, expected, current).is_err() {
                return Ok(None);
            }
            let now = now_ms();
            let (new, result, new_head) = chain_rows(stream, head, current, rows, now);
            let notify = self.listened(conn)?;
            match conn.insert_at_head(
                stream,
                now,
                &new,
                (head.0, &head.1),
                (new_head.0, &new_head.1),
                notify,
            ) {
                Ok(true) => {
                    self.remember(head, new_head, stream, result.stream_version);
                    self.wake.bump();
                    Ok(Some(result))
                }
                Ok(false) => Ok(None),
                Err(e) => {
                    // An ERROR ends the statement's transaction with nothing written; a
                    // FATAL or a lost connection may come after the commit. (The parsed
                    // severity: the text is in the server's language.)
                    let refused = e
                        .as_db_error()
                        .is_some_and(|db| db.parsed_severity() == Some(Severity::Error));
                    match pg_error("insert events")(e) {
                        busy @ EventStoreError::Busy { .. } => Err(busy),
                        _ if refused => Ok(None),
                        e => match self.settle(e, conn.backend.as_ref(), stream, rows) {
                            Settled::Stored(r) => {
                                self.wake.bump();
                                Ok(Some(r))
                            }
                            // A pooled connection the server had ended, most often: the
                            // locking path appends on another.
                            Settled::NotStored(_) => Ok(None),
                            Settled::Unknown(e) => Err(e),
                        },
                    }
                }
            }
        })
    }

    /// Whether appends should notify: some connection listens on this database (a
    /// subscription's, in any process). Asked on `conn` at most every [`LISTENERS_RECHECK`]:
    /// appends not notified while a new listener goes unseen reach its subscriptions by their
    /// polling ([`POLL`]).
    fn listened(&self, conn: &mut Conn) -> Result<bool> {
        if let Some((asked, answer)) = *self.listened.lock() {
            if asked.elapsed() < LISTENERS_RECHECK {
                return Ok(answer);
            }
        }
        let answer = conn.listeners()?;
        *self.listened.lock() = Some((Instant::now(), answer));
        Ok(answer)
    }

    /// Notes the head `new_head` an append left, moving from `head`, and its stream's version
    /// there. The other streams' versions are kept only if the cache was at `head`. (Two
    /// threads' appends may note theirs out of order, leaving an older head: the next append
    /// from it finds the head moved and takes the locking path, nothing worse.)
    fn remember(
        &self,
        head: (u64, ChainHash),
        new_head: (u64, ChainHash),
        stream: &str,
        version: u64,
    ) {
        let mut versions = self.versions.lock();
        if versions.head != Some(head) || versions.streams.len() >= MAX_CACHED_STREAMS {
            versions.streams.clear();
        }
        versions.head = Some(new_head);
        versions.streams.insert(stream.to_owned(), version);
    }

    /// The append in a transaction holding the head row from the start.
    fn append_locking(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        rows: &[Row],
    ) -> Result<AppendResult> {
        let outcome = self.with_conn(|conn| {
            let head = conn.begin_and_lock()?;
            match self.append_locked(conn, head, stream, expected, rows) {
                Ok(Locked::Stored {
                    result,
                    head,
                    new_head,
                }) => {
                    if let Err(e) = conn.commit() {
                        return self
                            .after_failed_commit(e, conn.backend.as_ref(), stream, rows)
                            .map(Ok);
                    }
                    self.remember(head, new_head, stream, result.stream_version);
                    self.wake.bump();
                    Ok(Ok(result))
                }
                // Nothing was written: the answer stands even if the rollback fails (the
                // connection is then closed, not given back).
                Ok(Locked::Retry(r)) => {
                    let _ = conn.rollback();
                    Ok(Ok(r))
                }
                Ok(Locked::Duplicate) => {
                    let _ = conn.rollback();
                    Ok(Err(()))
                }
                Err(e) => {
                    // The append's own error is the story; a failed rollback closes the
                    // connection (it is not given back).
                    let _ = conn.rollback();
                    Err(e)
                }
            }
        })?;
        match outcome {
            Ok(r) => Ok(r),
            // An id was stored before: nothing of this append is; what was stored says
            // whether this is a retry.
            Err(()) => match self.with_conn(|c| c.find_existing(stream, rows))? {
                Some(r) => Ok(r),
                None => match first_duplicate(rows) {
                    Some(event_id) => Err(EventStoreError::IdempotencyConflict {
                        event_id,
                        detail: "the id appears twice in this append".into(),
                    }),
                    None => Err(EventStoreError::CommitFailed {
                        detail: "a uniqueness constraint failed for no repeated id".into(),
                    }),
                },
            },
        }
    }

    /// What to say when COMMIT failed: the server's refusal is that error; after a lost
    /// connection, what [`Self::settle`] finds.
    fn after_failed_commit(
        &self,
        e: EventStoreError,
        backend: Option<&sql::Backend>,
        stream: &str,
        rows: &[Row],
    ) -> Result<AppendResult> {
        if matches!(&e, EventStoreError::Postgres { code: Some(_), .. }) {
            return Err(e);
        }
        match self.settle(e, backend, stream, rows) {
            Settled::Stored(r) => {
                self.wake.bump();
                Ok(r)
            }
            Settled::NotStored(e) => Err(EventStoreError::CommitFailed {
                detail: format!(
                    "{e}; nothing was stored (its server process ended, checked after \
                     reconnecting)"
                ),
            }),
            Settled::Unknown(e) => Err(e),
        }
    }

    /// What became of an append whose connection failed (`e`) after its write was sent. On
    /// a new connection: the old one's server process (`backend`) is ended first, since one
    /// whose client vanished may still be waiting for the head and commit after a look that
    /// found nothing; then the ids are looked up.
    fn settle(
        &self,
        e: EventStoreError,
        backend: Option<&sql::Backend>,
        stream: &str,
        rows: &[Row],
    ) -> Settled {
        let looked = self.with_conn(|c| {
            let gone = match backend {
                Some(b) => c.end_backend(b)?,
                None => false,
            };
            Ok((gone, c.find_existing(stream, rows)?))
        });
        match looked {
            Ok((_, Some(r))) => Settled::Stored(r),
            Ok((true, None)) => Settled::NotStored(e),
            Ok((false, None)) => Settled::Unknown(EventStoreError::CommitUnknown {
                detail: format!(
                    "{e}; not stored yet, but the lost connection's server process could not be \
                     ended, so it may still commit: append again with the same event ids"
                ),
            }),
            // The ids hold other events: that answer stands whatever happened.
            Err(conflict @ EventStoreError::IdempotencyConflict { .. }) => {
                Settled::Unknown(conflict)
            }
            Err(_) => Settled::Unknown(EventStoreError::CommitUnknown {
                detail: format!(
                    "{e}; whether it was stored is unknown: append again with the same event ids"
                ),
            }),
        }
    }

    /// The append inside its transaction, with the head locked.
    fn append_locked(
        &self,
        conn: &mut Conn,
        head: (u64, ChainHash),
        stream: &str,
        expected: ExpectedVersion,
        rows: &[Row],
    ) -> Result<Locked> {
        let cached = {
            let mut versions = self.versions.lock();
            if versions.head != Some(head) {
                // Another writer committed since this handle's last append.
                versions.streams.clear();
                versions.head = Some(head);
            }
            versions.streams.get(stream).copied()
        };
        let current = match cached {
            Some(v) => Some(v),
            None => conn.stream_version(stream)?,
        };
        if let Err(wrong) = check_expected(stream, expected, current) {
            // A retry of an append that did commit finds the stream moved on by itself.
            if let Some(r) = conn.find_existing(stream, rows)? {
                return Ok(Locked::Retry(r));
            }
            return Err(wrong);
        }
        let now = now_ms();
        let (new, result, new_head) = chain_rows(stream, head, current, rows, now);
        let notify = self.listened(conn)?;
        let inserted = conn.insert(stream, now, &new, (new_head.0, &new_head.1), notify)?;
        if inserted != rows.len() as u64 {
            return Ok(Locked::Duplicate);
        }
        Ok(Locked::Stored {
            result,
            head,
            new_head,
        })
    }
}

/// An append's rows after `head`, its stream at version `current`: their positions, versions
/// and chain hashes, what the append returns, and the head it leaves.
fn chain_rows<'a>(
    stream: &str,
    head: (u64, ChainHash),
    current: Option<u64>,
    rows: &'a [Row],
    now: i64,
) -> (sql::NewRows<'a>, AppendResult, (u64, ChainHash)) {
    let mut version = current.unwrap_or(0);
    let (mut position, mut hash) = head;
    let mut new = sql::NewRows::with_capacity(rows.len());
    for e in rows {
        version += 1;
        position += 1;
        hash = e.link(position, stream, version, now).hash(&hash);
        new.push(position, version, e, hash);
    }
    let result = AppendResult {
        first_position: head.0 + 1,
        last_position: position,
        stream_version: version,
    };
    (new, result, (position, hash))
}

/// What became of an append whose connection failed after its write was sent.
enum Settled {
    /// Stored (its ids hold these very events): where.
    Stored(AppendResult),
    /// Not stored, and its server process is gone, so it never will be; the failure.
    NotStored(EventStoreError),
    /// Not known, or known to conflict: the error to return.
    Unknown(EventStoreError),
}

/// What an append came to inside its transaction.
enum Locked {
    /// Inserted; commit. `head` is where it started, `new_head` where it ends.
    Stored {
        result: AppendResult,
        head: (u64, ChainHash),
        new_head: (u64, ChainHash),
    },
    /// Every id was stored before by this same append: roll back, return where they are.
    Retry(AppendResult),
    /// An id is stored already (or twice in the batch): roll back and judge.
    Duplicate,
}

impl Drop for PostgresEventStore {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.get_mut().take() {
            listener.stop();
        }
    }
}

impl Follow for PostgresEventStore {
    fn commit_count(&self) -> u64 {
        self.wake.count()
    }

    fn wait_for_commit(&self, seen: u64, timeout: Duration) {
        self.wake.wait(seen, timeout.min(POLL));
    }
}

impl EventStore for PostgresEventStore {
    fn append(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<AppendResult> {
        crate::events::rows::check_append(stream, events)?;
        let rows = events.iter().map(Row::new).collect::<Result<Vec<_>>>()?;
        sql::refuse_nul(stream, &rows)?;
        let started = Instant::now();
        let out = self.append_rows(stream, expected, &rows);
        self.latency.record(started.elapsed());
        out
    }

    fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        if stream.contains('\0') {
            return Ok(Vec::new());
        }
        let from = from_version.min(i64::MAX as u64) as i64;
        let max = max.min(MAX_PAGE) as i64;
        self.with_conn(|c| c.read_stream(stream, from, max))
    }

    fn read_stream_verified(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        if stream.contains('\0') {
            return Ok(Vec::new());
        }
        let from = from_version.min(i64::MAX as u64) as i64;
        let max = max.min(MAX_PAGE) as i64;
        self.with_conn(|c| c.read_stream_verified(stream, from, max))
    }

    fn read_all(&self, from_position: u64, max: usize) -> Result<Vec<RecordedEvent>> {
        let from = from_position.min(i64::MAX as u64) as i64;
        let max = max.min(MAX_PAGE) as i64;
        self.with_conn(|c| c.read_all(from, max))
    }

    fn last_position(&self) -> Result<u64> {
        self.with_conn(|c| c.last_position())
    }
}

/// The chain hash stored as hex text by a simple query, checked.
fn parse_hash(text: Option<&str>) -> Result<ChainHash> {
    text.and_then(from_hex)
        .ok_or_else(|| EventStoreError::Postgres {
            operation: "read the chain head",
            code: None,
            detail: "correx_head holds no 32-byte hash".into(),
        })
}
