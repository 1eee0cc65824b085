//! Group commit: appends from every thread of a process share one transaction and one flush.
//!
//! The rule, described here once: appends queue up while a group commits; the next group is
//! committed in one `BEGIN IMMEDIATE` transaction as soon as every thread inside `append` has
//! queued ([`Queue::ready`]), or [`GATHER`] after the last commit ended (or after the oldest
//! append queued, if later; [`gather_deadline`]). The append that completes a group commits
//! it at once, on its own thread (the leader); the others sleep on their own slot until their
//! answer is set, or until they are handed a group that became ready without an arrival (a
//! commit ended, an appender left). A conflicting append fails alone: nothing of it is stored
//! (an append of several events runs in a savepoint), and its neighbours commit. Every append
//! returns only after the commit holding it.

use super::{AppendResult, EventStoreError, ExpectedVersion, Result, SqliteEventStore};
use crate::events::rows::Row;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Appends waiting for the next group, and whether a group is being committed now.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) pending: Vec<Arc<Pending>>,
    /// A leader holds the writer connection for a group taken from `pending`.
    pub(super) committing: bool,
    /// Threads inside `append` that have not taken their answer yet: the appends a group may
    /// still expect.
    pub(super) appenders: usize,
    /// When the last commit ended: appends queued during a commit wait for it anyway, so the
    /// gathering for the next group starts then.
    pub(super) turn_ended: Option<Instant>,
}

/// When a group holding an append queued at `arrived` stops waiting for appenders that may
/// come back, given when the last commit ended.
pub(super) fn gather_deadline(arrived: Instant, turn_ended: Option<Instant>) -> Instant {
    turn_ended.map_or(arrived, |t| t.max(arrived)) + GATHER
}

impl Queue {
    /// Whether the queued appends should be committed now: nothing is committing, and every
    /// appender the store knows of is queued (or the oldest has waited long enough).
    pub(super) fn ready(&self, now: Instant) -> bool {
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
    pub(super) fn take_if_ready(&mut self) -> Option<Vec<Arc<Pending>>> {
        if !self.ready(Instant::now()) {
            return None;
        }
        self.committing = true;
        Some(std::mem::take(&mut self.pending))
    }

    /// Wakes the oldest queued append to commit its group, if the group is ready: one
    /// targeted wake-up, not a herd.
    /// Returns whether it woke one.
    pub(super) fn hand_over(&mut self) -> bool {
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
pub(super) struct Appender<'a> {
    pub(super) store: &'a SqliteEventStore,
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
pub(super) const GATHER: Duration = Duration::from_micros(400);

/// Ends a leader's turn, also when the commit unwinds: the next group may start, and if it is
/// ready its oldest append is woken to commit it.
pub(super) struct EndTurn<'a> {
    pub(super) store: &'a SqliteEventStore,
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

/// One append waiting for a group commit.
pub(super) struct Pending {
    pub(super) stream: String,
    pub(super) expected: ExpectedVersion,
    pub(super) events: Vec<Row>,
    pub(super) arrived: Instant,
    pub(super) slot: Mutex<Slot>,
    /// Wakes this append's thread: its result is set, or its group is ready to commit.
    pub(super) wake: Condvar,
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) result: Option<Result<AppendResult>>,
    pub(super) lead: bool,
}

impl Pending {
    pub(super) fn answer(&self, r: Result<AppendResult>) {
        self.slot.lock().result = Some(r);
        self.wake.notify_one();
    }

    pub(super) fn answered(&self) -> bool {
        self.slot.lock().result.is_some()
    }
}

/// Sets an error result on every append of a group that has none when dropped while unwinding.
pub(super) struct AnswerAll<'a>(pub(super) &'a [Arc<Pending>]);

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

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(arrived: Instant) -> Arc<Pending> {
        Arc::new(Pending {
            stream: "s".into(),
            expected: ExpectedVersion::Any,
            events: Vec::new(),
            arrived,
            slot: Mutex::new(Slot::default()),
            wake: Condvar::new(),
        })
    }

    #[test]
    fn a_group_is_ready_when_every_appender_queued_and_nothing_commits() {
        let now = Instant::now();
        let mut q = Queue {
            pending: vec![pending(now), pending(now)],
            committing: false,
            appenders: 3,
            turn_ended: Some(now),
        };
        // One appender is still coming back, and the gathering time has not passed.
        assert!(!q.ready(now));
        q.appenders = 2;
        assert!(q.ready(now));
        // Never while a group commits.
        q.committing = true;
        assert!(!q.ready(now));
        q.committing = false;
        // Nothing queued: nothing to commit.
        q.pending.clear();
        assert!(!q.ready(now));
    }

    #[test]
    fn an_incomplete_group_commits_once_its_gathering_time_passed() {
        let t0 = Instant::now();
        let q = Queue {
            pending: vec![pending(t0)],
            committing: false,
            appenders: 4,
            turn_ended: None,
        };
        assert!(!q.ready(t0));
        assert!(!q.ready(t0 + GATHER / 2));
        assert!(q.ready(t0 + GATHER));
    }

    #[test]
    fn the_gathering_time_counts_from_the_later_of_arrival_and_the_last_commit() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        assert_eq!(gather_deadline(t0, None), t0 + GATHER);
        assert_eq!(gather_deadline(t0, Some(later)), later + GATHER);
        assert_eq!(gather_deadline(later, Some(t0)), later + GATHER);
    }
}
