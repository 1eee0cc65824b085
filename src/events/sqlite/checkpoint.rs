//! WAL checkpoints off the appenders' path.
//!
//! SQLite's own auto-checkpoint runs inside whichever commit pushes the WAL past 1000 pages: that
//! commit's appenders wait for the copy into the database file and its flush (about a
//! millisecond here). Instead, the writer connection reports each commit's WAL size (a WAL hook,
//! which also turns the auto-checkpoint off), and a cycle runs:
//!
//! 1. Past [`CHECKPOINT_PAGES`], the leader wakes the checkpointer thread, which copies the bulk
//!    of the WAL with a passive checkpoint on its own connection while the next groups commit.
//! 2. The first commit after it finished copies the few frames committed meanwhile, inline: a
//!    WAL is restarted from its beginning only by a write that finds it wholly copied, and under
//!    steady appends that never happens by itself.
//!
//! The WAL stays bounded: should it reach [`INLINE_PAGES`] anyway (a reader pinning old pages),
//! the commit that sees it checkpoints inline, as SQLite would have. A passive checkpoint never
//! waits for a lock and never blocks a writer.

use super::connection::{open_connection, Role};
use super::StoreOptions;
use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Arc;

/// The WAL size (pages) past which a commit wakes the checkpointer: SQLite's default.
pub(super) const CHECKPOINT_PAGES: i32 = 1000;
/// The WAL size past which the committing thread checkpoints itself.
pub(super) const INLINE_PAGES: i32 = 8 * CHECKPOINT_PAGES;

/// Where checkpoints run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Checkpoints {
    /// On a thread of the store's own (started at the first full WAL), off the appenders' path
    /// (the default).
    #[default]
    Background,
    /// Inside the commit that fills the WAL, as SQLite does by default: no thread, but that
    /// commit's appenders wait for the checkpoint.
    InCommit,
}

thread_local! {
    /// The WAL size the last commit on this thread reported (the hook runs on the committing
    /// thread, inside the commit).
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

fn record_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

/// Installs the WAL hook on the writer (replacing SQLite's auto-checkpoint).
pub(super) fn install(writer: &Connection) {
    writer.wal_hook(Some(record_pages));
}

/// The WAL size the last commit on this thread left, and forgets it.
pub(super) fn take_pages() -> i32 {
    WAL_PAGES.with(|p| p.replace(0))
}

/// A passive checkpoint on `conn`; errors (a busy database) are left for the next one.
pub(super) fn passive(conn: &Connection) {
    let r = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    });
    match r {
        Ok((_, log, done)) => log::trace!("checkpoint: {done} of {log} WAL frames copied"),
        Err(e) => log::debug!("checkpoint skipped: {e}"),
    }
}

#[derive(Default)]
struct State {
    wanted: bool,
    running: bool,
    /// The thread copied the bulk; the tail is due.
    bulk_done: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The store's checkpointer thread, started on first use and stopped when dropped.
pub(super) struct Checkpointer {
    path: PathBuf,
    options: StoreOptions,
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Checkpointer {
    pub fn new(path: PathBuf, options: StoreOptions) -> Checkpointer {
        Checkpointer {
            path,
            options,
            shared: Arc::default(),
            thread: Mutex::new(None),
        }
    }

    /// After a commit on `writer` that left `pages` in the WAL: wakes the thread for the bulk,
    /// copies the tail once the bulk is done, or (the WAL past [`INLINE_PAGES`], or no thread
    /// to be had) checkpoints inline.
    pub fn after_commit(&self, writer: &Connection, pages: i32) {
        if pages < CHECKPOINT_PAGES {
            return;
        }
        let inline = {
            let mut s = self.shared.state.lock();
            if s.running || s.wanted {
                pages >= INLINE_PAGES
            } else if std::mem::take(&mut s.bulk_done) {
                true
            } else {
                s.wanted = true;
                false
            }
        };
        if inline || !self.wake() {
            passive(writer);
        }
    }

    /// Wakes the thread (starting it the first time); `false` when there is none to be had.
    fn wake(&self) -> bool {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let started = open_connection(&self.path, &self.options, Role::Writer)
                .map_err(|e| e.to_string())
                .and_then(|conn| {
                    let shared = Arc::clone(&self.shared);
                    std::thread::Builder::new()
                        .name("correx-checkpoint".into())
                        .spawn(move || run(&conn, &shared))
                        .map_err(|e| e.to_string())
                });
            match started {
                Ok(h) => *thread = Some(h),
                Err(e) => {
                    log::warn!("no checkpoint thread, checkpointing in commits: {e}");
                    self.shared.state.lock().wanted = false;
                    return false;
                }
            }
        }
        self.shared.wake.notify_one();
        true
    }
}

fn run(conn: &Connection, shared: &Shared) {
    loop {
        {
            let mut s = shared.state.lock();
            while !s.wanted && !s.stop {
                shared.wake.wait(&mut s);
            }
            if s.stop {
                return;
            }
            s.wanted = false;
            s.running = true;
        }
        passive(conn);
        let mut s = shared.state.lock();
        s.running = false;
        s.bulk_done = true;
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(h) = self.thread.get_mut().take() {
            let _ = h.join();
        }
    }
}
