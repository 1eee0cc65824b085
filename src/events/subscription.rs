//! Catch-up subscriptions: history in pages, then live events (from this process and from
//! others), in position order, exactly once.

use super::sqlite::{open_reader, read_all_on, SqliteEventStore};
use super::{EventStoreError, RecordedEvent, Result};
use rusqlite::Connection;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rows fetched per read: short, so a reader never pins a WAL snapshot for long.
const PAGE: usize = 256;
/// How often a subscription looks for commits made by other processes when nothing in this
/// process woke it. Commits in this process wake it at once.
const CROSS_PROCESS_POLL: Duration = Duration::from_millis(2);

/// Delivers every event after a position, in position order, exactly once: first what is
/// stored, then what is appended later by any thread or process.
///
/// Save [`Subscription::position`] after handling an event; a new subscription from that
/// position resumes right after it.
pub struct Subscription {
    store: Arc<SqliteEventStore>,
    conn: Connection,
    position: u64,
    buffer: VecDeque<RecordedEvent>,
    data_version: i64,
    seen_commits: u64,
    /// False while the last read returned a full page: more history may follow.
    caught_up: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl SqliteEventStore {
    /// Subscribes to every event with a position greater than `after` (0: from the start).
    ///
    /// # Errors
    /// When the subscription's own read connection cannot be opened.
    pub fn subscribe(self: &Arc<Self>, after: u64) -> Result<Subscription> {
        let conn = open_reader(self)?;
        Ok(Subscription {
            store: Arc::clone(self),
            conn,
            position: after,
            buffer: VecDeque::new(),
            data_version: -1,
            seen_commits: 0,
            caught_up: false,
        })
    }
}

impl Subscription {
    /// The position of the last event delivered (or the starting position).
    pub fn position(&self) -> u64 {
        self.position
    }

    fn data_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(|source| EventStoreError::Sqlite {
                operation: "read data_version",
                source,
            })
    }

    fn fill(&mut self) -> Result<()> {
        let page = read_all_on(&self.conn, self.position.saturating_add(1), PAGE)?;
        self.caught_up = page.len() < PAGE;
        self.buffer.extend(page);
        Ok(())
    }

    /// The next event, waiting up to `timeout` for one to be appended; `Ok(None)` when none
    /// came in time.
    ///
    /// # Errors
    /// Read errors, or [`EventStoreError::CorruptEvent`] for a row that cannot be decoded (the
    /// subscription does not move past it).
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<RecordedEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.buffer.pop_front() {
                self.position = e.position;
                return Ok(Some(e));
            }
            // Note the commit counter before reading, so a commit that lands after the read
            // still wakes the wait below.
            let commits = self.store.commit_count();
            let version = self.data_version()?;
            if !self.caught_up || commits != self.seen_commits || version != self.data_version {
                self.seen_commits = commits;
                self.data_version = version;
                self.fill()?;
                if !self.buffer.is_empty() {
                    continue;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.store
                .wait_for_commit(commits, (deadline - now).min(CROSS_PROCESS_POLL));
        }
    }
}
