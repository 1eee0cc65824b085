//! Catch-up subscriptions: history in pages, then live events (from this process and from
//! others), in position order, exactly once.

use super::sqlite::SqliteEventStore;
use super::{EventStore, RecordedEvent, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rows fetched per read: short, so a reader never pins a WAL snapshot for long.
const PAGE: usize = 256;

/// A store a subscription can follow: it counts the commits it knows of (its own, and where
/// the engine tells, other processes') and waits for the next.
pub(crate) trait Follow: EventStore {
    /// Commits known so far; any change means new events may be there.
    fn commit_count(&self) -> u64;
    /// Waits until the count moves past `seen`, or `timeout` passes, or the store's own
    /// polling interval for commits it is not told of passes, whichever is first.
    fn wait_for_commit(&self, seen: u64, timeout: Duration);
}

/// The commits a store knows of, and the wait for the next.
#[derive(Default)]
pub(crate) struct Wake {
    commits: Mutex<u64>,
    moved: Condvar,
}

impl Wake {
    pub(crate) fn bump(&self) {
        *self.commits.lock() += 1;
        self.moved.notify_all();
    }

    pub(crate) fn count(&self) -> u64 {
        *self.commits.lock()
    }

    pub(crate) fn wait(&self, seen: u64, timeout: Duration) {
        let mut n = self.commits.lock();
        if *n == seen {
            self.moved.wait_for(&mut n, timeout);
        }
    }
}

/// Delivers every event after a position, in position order, exactly once: first what is
/// stored, then what is appended later by any thread or process.
///
/// Save [`Subscription::position`] after handling an event; a new subscription from that
/// position resumes right after it.
///
/// It holds no connection of its own: each read borrows one of the store's pooled readers.
/// (A connection of its own, closed when the subscription is dropped, kept its descriptor
/// open until the store closed: SQLite defers a close while another connection of the process
/// holds a lock on the same file, and the store's writer always does in WAL mode.)
pub struct Subscription {
    store: Arc<dyn Follow>,
    position: u64,
    buffer: VecDeque<RecordedEvent>,
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
    /// None today (reads open their connections as they need them); kept for stores that
    /// must connect first.
    pub fn subscribe(self: &Arc<Self>, after: u64) -> Result<Subscription> {
        Ok(Subscription::new(
            Arc::clone(self) as Arc<dyn Follow>,
            after,
        ))
    }
}

impl Subscription {
    pub(crate) fn new(store: Arc<dyn Follow>, after: u64) -> Subscription {
        Subscription {
            store,
            position: after,
            buffer: VecDeque::new(),
        }
    }

    /// The position of the last event delivered (or the starting position).
    pub fn position(&self) -> u64 {
        self.position
    }

    fn fill(&mut self) -> Result<()> {
        let page = self.store.read_all(self.position.saturating_add(1), PAGE)?;
        self.buffer.extend(page);
        Ok(())
    }

    /// The next event, waiting up to `timeout` for one to be appended; `Ok(None)` when none
    /// came in time.
    ///
    /// # Errors
    /// Read errors, or [`EventStoreError::CorruptEvent`](super::EventStoreError::CorruptEvent)
    /// for a row that cannot be decoded (the subscription does not move past it).
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<RecordedEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.buffer.pop_front() {
                self.position = e.position;
                return Ok(Some(e));
            }
            // Note the commit counter before reading, so a commit that lands after the read
            // still wakes the wait below. Each wake reads: at once after a commit the store
            // hears of, at the store's polling interval for others.
            let commits = self.store.commit_count();
            self.fill()?;
            if !self.buffer.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.store.wait_for_commit(commits, deadline - now);
        }
    }
}
