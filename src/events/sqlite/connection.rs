//! Connections: opening one (WAL, the durability asked, a busy timeout) and retrying calls that
//! meet a locked database.

use super::{EventStoreError, Result, StoreOptions};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Writer,
    Reader,
}

pub(super) fn open_connection(
    path: &Path,
    options: &StoreOptions,
    role: Role,
) -> Result<Connection> {
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

/// Whether `e` is SQLite reporting a lock held elsewhere (worth retrying here).
pub(super) fn is_locked(e: &EventStoreError) -> bool {
    e.is_sqlite_busy()
}

/// Runs `f` until it does not fail with a lock error, sleeping with jitter between tries, up to
/// the store's retry deadline.
pub(super) fn retry_locked<T>(
    options: &StoreOptions,
    mut f: impl FnMut() -> Result<T>,
) -> Result<T> {
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
