//! [`EventLog`]: the event log wherever its location says it is, a SQLite file or (cargo
//! feature `postgres`) a PostgreSQL database, behind one type the runtime, the CLI and the
//! hosts use, so that moving a log to PostgreSQL changes nothing but the location string.

use super::chain::ChainHash;
use super::seal::{Seal, SealError};
use super::sqlite::{SqliteEventStore, StoreOptions};
use super::subscription::Subscription;
use super::{
    AppendResult, EventStore, EventStoreError, ExpectedVersion, LatencySnapshot, LogReport,
    NewEvent, RecordedEvent, Result,
};
use std::path::Path;
use std::sync::Arc;

/// Where a log lives.
#[derive(Clone, Debug)]
enum Backend {
    Sqlite(Arc<SqliteEventStore>),
    #[cfg(feature = "postgres")]
    Postgres(Arc<super::postgres::PostgresEventStore>),
}

/// The event log at a location: a file path (SQLite), or a `postgres://` / `postgresql://` URL
/// (PostgreSQL; a build without the `postgres` feature refuses one, saying so).
#[derive(Clone, Debug)]
pub struct EventLog {
    backend: Backend,
}

impl EventLog {
    /// Opens (or creates) the log at `location`; `options` apply to a SQLite file.
    ///
    /// # Errors
    /// As [`SqliteEventStore::open_with`], or for a URL as `PostgresEventStore::open`;
    /// [`EventStoreError::InvalidLocation`] for a URL this build cannot open.
    pub fn open(location: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        Self::open_at(location.as_ref(), |path| {
            SqliteEventStore::open_with(path, options)
        })
    }

    /// Opens the log at `location` only if it is a correx log already: nothing is created.
    ///
    /// # Errors
    /// As [`EventLog::open`]; [`EventStoreError::NotALog`] for a file that is not a log. (A
    /// PostgreSQL database without the log's tables gets them: the database itself is what
    /// must exist.)
    pub fn open_existing(location: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        Self::open_at(location.as_ref(), |path| {
            SqliteEventStore::open_existing(path, options)
        })
    }

    /// A `postgres://` `location` opened as PostgreSQL; any other, a SQLite file, by `sqlite`.
    fn open_at(
        location: &Path,
        sqlite: impl FnOnce(&Path) -> Result<SqliteEventStore>,
    ) -> Result<Self> {
        if let Some(url) = postgres_url(location)? {
            return Self::open_postgres(url);
        }
        Ok(Self::from(Arc::new(sqlite(location)?)))
    }

    #[cfg(feature = "postgres")]
    fn open_postgres(url: &str) -> Result<Self> {
        Ok(EventLog {
            backend: Backend::Postgres(Arc::new(super::postgres::PostgresEventStore::open(url)?)),
        })
    }

    #[cfg(not(feature = "postgres"))]
    fn open_postgres(_url: &str) -> Result<Self> {
        Err(EventStoreError::InvalidLocation {
            location: "postgres://…".into(),
            detail: "this build of correx has no PostgreSQL support: build it with the cargo \
                     feature `postgres`, or give a file path"
                .into(),
        })
    }

    /// Where the log is: the file's path, or the database's URL without any password.
    pub fn location(&self) -> String {
        match &self.backend {
            Backend::Sqlite(s) => s.path().display().to_string(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.location().to_owned(),
        }
    }

    /// The SQLite store, when the log is a file.
    pub fn as_sqlite(&self) -> Option<&Arc<SqliteEventStore>> {
        match &self.backend {
            Backend::Sqlite(s) => Some(s),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }

    /// Subscribes to every event after position `after` (0: from the start): history, then
    /// live appends of any process, in position order, exactly once.
    ///
    /// # Errors
    /// None today; kept for stores that must connect first.
    pub fn subscribe(&self, after: u64) -> Result<Subscription> {
        match &self.backend {
            Backend::Sqlite(s) => s.subscribe(after),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.subscribe(after),
        }
    }

    /// The last event's position (0 when empty) and its chain hash (`None` when it predates
    /// the chain).
    ///
    /// # Errors
    /// The store's, reading.
    pub fn chain_head(&self) -> Result<(u64, Option<ChainHash>)> {
        match &self.backend {
            Backend::Sqlite(s) => s.chain_head(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.chain_head(),
        }
    }

    /// A seal of the log as it stands: its last event's position and hash.
    ///
    /// # Errors
    /// [`SealError::Unchained`] when the last event predates the chain; [`SealError::Store`]
    /// when the log cannot be read.
    pub fn seal(&self) -> std::result::Result<Seal, SealError> {
        Seal::of_head(self.chain_head().map_err(SealError::Store)?)
    }

    /// How long this handle's appends took.
    pub fn append_latency(&self) -> LatencySnapshot {
        match &self.backend {
            Backend::Sqlite(s) => s.append_latency(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.append_latency(),
        }
    }

    /// Checks the log without changing it (see [`verify_log_with`](super::verify_log_with)).
    ///
    /// # Errors
    /// The store's, when it cannot be read at all.
    pub fn verify(
        &self,
        check: &dyn Fn(&RecordedEvent) -> Option<String>,
        seals: &[Seal],
    ) -> Result<LogReport> {
        match &self.backend {
            Backend::Sqlite(s) => super::verify_log_with(s.path(), check, seals),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.verify(check, seals),
        }
    }

    fn store(&self) -> &dyn EventStore {
        match &self.backend {
            Backend::Sqlite(s) => s.as_ref(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.as_ref(),
        }
    }
}

impl From<Arc<SqliteEventStore>> for EventLog {
    fn from(store: Arc<SqliteEventStore>) -> Self {
        EventLog {
            backend: Backend::Sqlite(store),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<Arc<super::postgres::PostgresEventStore>> for EventLog {
    fn from(store: Arc<super::postgres::PostgresEventStore>) -> Self {
        EventLog {
            backend: Backend::Postgres(store),
        }
    }
}

/// `Some(url)` when `location` is a PostgreSQL URL.
fn postgres_url(location: &Path) -> Result<Option<&str>> {
    // A path that is not UTF-8 is a file's.
    let Some(location) = location.to_str() else {
        return Ok(None);
    };
    // Lowercase, as the client reads them; `Postgres://` is refused below, saying what is taken.
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        return Ok(Some(location));
    }
    if location.contains("://") {
        return Err(EventStoreError::InvalidLocation {
            location: location
                .split_once("://")
                .map_or_else(String::new, |(scheme, _)| format!("{scheme}://…")),
            detail: "not a file path nor a postgres:// or postgresql:// URL (lowercase)".into(),
        });
    }
    Ok(None)
}

impl EventStore for EventLog {
    fn append(
        &self,
        stream: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<AppendResult> {
        self.store().append(stream, expected, events)
    }

    fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        self.store().read_stream(stream, from_version, max)
    }

    fn read_stream_verified(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<RecordedEvent>> {
        self.store().read_stream_verified(stream, from_version, max)
    }

    fn read_all(&self, from_position: u64, max: usize) -> Result<Vec<RecordedEvent>> {
        self.store().read_all(from_position, max)
    }

    fn last_position(&self) -> Result<u64> {
        self.store().last_position()
    }
}
