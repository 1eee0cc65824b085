//! Run journals: one file per sandboxed run, in a private directory its executor holds locked
//! for its whole life. A journal is complete before the run's start is recorded and removed
//! only after its outcome is, so a host killed at any point leaves it for the next executor on
//! the same root; the kernel drops the lock with the dead process, which is how recovery tells
//! a dead executor's journals from a live one's.
//!
//! A journal is `[state][json length, u32 LE][manifest JSON][small files' bytes]`, written with
//! one `pwrite` at offset 0. The state byte is `P` (pending) until the tool succeeded, then
//! overwritten in place with `C` (committed), and `I` (idle) once the run's outcome is recorded:
//! journal files are kept and reused, so a run creates, renames and unlinks no file. What lies
//! past the bytes a journal names is left from an earlier run and never read.
//!
//! Nothing here is flushed to disk: it must survive the host process dying, which the page cache
//! does. After a power loss a journal may be gone or torn, and then nothing is restored, which
//! is still safe: the file tools replace files atomically.

use super::backup::Entry;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const PENDING: u8 = b'P';
const COMMITTED: u8 = b'C';
const IDLE: u8 = b'I';
const LOCK: &str = "lock";
const DIR_PREFIX: &str = "run-";
const SUFFIX: &str = ".run";

/// What a run's journal names: the run and the paths it backed up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub session_id: String,
    pub invocation_id: String,
    pub tool_name: String,
    pub entries: Vec<Entry>,
}

/// A journal as recovery reads it.
pub(crate) struct Found {
    pub committed: bool,
    pub manifest: Manifest,
    pub blobs: Vec<u8>,
}

/// An executor's journal directory, locked while it lives, removed when dropped.
pub(crate) struct Journals {
    dir: PathBuf,
    _lock: File,
    next: AtomicU64,
    idle: parking_lot::Mutex<Vec<File>>,
    /// A run's outcome went unrecorded: its journal stays open, and so does the directory,
    /// for the next executor's recovery.
    keep: std::sync::atomic::AtomicBool,
}

/// An exclusive advisory lock on `dir/lock`; `None` when another process holds it.
pub(crate) fn lock(dir: &Path, create: bool) -> io::Result<Option<File>> {
    crate::private_dir::lock_dir(dir, LOCK, create)
}

impl Journals {
    /// A fresh private directory under `work_root`, locked. It is made and locked under a
    /// name recovery does not look at, then renamed into view: a recovery never sees it
    /// unlocked.
    pub fn create(work_root: &Path) -> io::Result<Journals> {
        use std::os::unix::fs::DirBuilderExt;
        let id = crate::ids::random_uuid();
        let fresh = work_root.join(format!(".new-{id}"));
        let dir = work_root.join(format!("{DIR_PREFIX}{id}"));
        std::fs::DirBuilder::new().mode(0o700).create(&fresh)?;
        let held = lock(&fresh, true)
            .and_then(|l| {
                l.ok_or_else(|| io::Error::other("a fresh journal directory was already locked"))
            })
            .and_then(|l| std::fs::rename(&fresh, &dir).map(|()| l));
        match held {
            Ok(l) => Ok(Journals {
                dir,
                _lock: l,
                next: AtomicU64::new(0),
                idle: parking_lot::Mutex::new(Vec::new()),
                keep: std::sync::atomic::AtomicBool::new(false),
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&fresh);
                Err(e)
            }
        }
    }

    /// The journal of one run, to begin with [`Run::begin`].
    pub fn run<'a>(&'a self, manifest: Manifest) -> Run<'a> {
        Run {
            journals: self,
            manifest,
        }
    }
}

impl Drop for Journals {
    fn drop(&mut self) {
        if !self.keep.load(Ordering::Acquire) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A run about to write its journal.
pub(crate) struct Run<'a> {
    journals: &'a Journals,
    manifest: Manifest,
}

impl<'a> Run<'a> {
    /// Writes the journal (pending) with `entries` and the small files' `blobs`.
    pub fn begin(mut self, entries: &[Entry], blobs: &[u8]) -> io::Result<Journal<'a>> {
        self.manifest.entries = entries.to_vec();
        let json = serde_json::to_vec(&self.manifest).map_err(io::Error::other)?;
        let len = u32::try_from(json.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "manifest too large"))?;
        let mut bytes = Vec::with_capacity(5 + json.len() + blobs.len());
        // One write. Cut short by a kill, it may leave "pending" over a mix of this run's and
        // an earlier run's bytes: harmless, since this run's start is recorded only after the
        // write returned, and recovery acts only on a run whose start is in the log.
        bytes.push(PENDING);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&json);
        bytes.extend_from_slice(blobs);
        let reused = self.journals.idle.lock().pop();
        let file = match reused {
            Some(f) => f,
            None => {
                let n = self.journals.next.fetch_add(1, Ordering::Relaxed);
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(self.journals.dir.join(format!("{n}{SUFFIX}")))?
            }
        };
        let journal = Journal {
            file: Some(file),
            journals: self.journals,
            blobs: blobs.to_vec(),
        };
        journal.file()?.write_all_at(&bytes, 0)?;
        Ok(journal)
    }
}

/// One run's journal: [`Journal::finish`] marks it idle and keeps it for the next run; dropped
/// unfinished, it stays as it is (pending or committed) for recovery.
pub(crate) struct Journal<'a> {
    file: Option<File>,
    journals: &'a Journals,
    blobs: Vec<u8>,
}

impl Journal<'_> {
    fn file(&self) -> io::Result<&File> {
        self.file
            .as_ref()
            .ok_or_else(|| io::Error::other("the journal is closed"))
    }

    /// Marks the run committed: its change is in place.
    pub fn commit(&self) -> io::Result<()> {
        self.file()?.write_all_at(&[COMMITTED], 0)
    }

    /// The small files' bytes.
    pub fn blobs(&self) -> &[u8] {
        &self.blobs
    }
}

impl Journal<'_> {
    /// The run's outcome is recorded: idle, and back in the pool.
    pub fn finish(mut self) {
        let Some(f) = self.file.take() else { return };
        match f.write_all_at(&[IDLE], 0) {
            Ok(()) => self.journals.idle.lock().push(f),
            // Still open: recovery closes it later, finding the outcome in the log.
            Err(e) => {
                log::error!("closing a sandbox journal: {e}");
                self.journals.keep.store(true, Ordering::Release);
            }
        }
    }
}

impl Drop for Journal<'_> {
    fn drop(&mut self) {
        // Not finished: the outcome is not in the log. The journal (and its directory) stay
        // for the next executor's recovery.
        if self.file.take().is_some() {
            self.journals.keep.store(true, Ordering::Release);
        }
    }
}

/// A dead executor's journal directory, locked by recovery while it works on it.
pub(crate) struct Dead {
    pub dir: PathBuf,
    pub _held: File,
    /// Its open journals (idle and torn ones are `None`).
    pub journals: Vec<Option<Found>>,
}

/// The journal directories under `work_root` whose executor is gone (their lock is free),
/// each with its lock held and its journals, read. Anything else under the root is left alone.
pub(crate) fn dead(work_root: &Path) -> io::Result<Vec<Dead>> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(work_root)? {
        let d = d?;
        let name = d.file_name();
        let name = name.to_string_lossy();
        if !d.file_type()?.is_dir() {
            continue;
        }
        // A directory an executor died making (before it was renamed into view): one making
        // it now holds it for microseconds, so only an old one is removed.
        if name.starts_with(".new-") {
            let old = d
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(60));
            if old && !matches!(lock(&d.path(), false), Ok(None)) {
                let _ = std::fs::remove_dir_all(d.path());
            }
            continue;
        }
        if !name.starts_with(DIR_PREFIX) {
            continue;
        }
        let dir = d.path();
        // A live executor (this process or another) holds its lock: not ours to touch. A
        // directory without its lock file is one a host was killed removing (the lock goes
        // first): no executor can hold it, and the lock made now keeps other recoveries out.
        let held = match lock(&dir, false) {
            Ok(Some(held)) => held,
            Ok(None) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => match lock(&dir, true) {
                Ok(Some(held)) => held,
                _ => continue,
            },
            Err(_) => continue,
        };
        let mut found = Vec::new();
        let journals = match std::fs::read_dir(&dir) {
            Ok(j) => j,
            // Another recovery removed it meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for j in journals.flatten() {
            if j.file_name().to_string_lossy().ends_with(SUFFIX) {
                found.push(std::fs::read(j.path()).ok().and_then(|b| parse(&b)));
            }
        }
        out.push(Dead {
            dir,
            _held: held,
            journals: found,
        });
    }
    Ok(out)
}

/// A journal's contents; `None` when it is torn (a power loss) or not ours.
fn parse(bytes: &[u8]) -> Option<Found> {
    let (&state, rest) = bytes.split_first()?;
    let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let json = rest.get(4..4usize.checked_add(len)?)?;
    let manifest: Manifest = serde_json::from_slice(json).ok()?;
    let committed = match state {
        PENDING => false,
        COMMITTED => true,
        _ => return None,
    };
    // Bytes past the blobs a journal names are left from an earlier run; slicing by the
    // entries' offsets never reaches them.
    Some(Found {
        committed,
        manifest,
        blobs: rest[4 + len..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_reads_back_and_a_torn_one_is_none() {
        let m = Manifest {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "t".into(),
            entries: Vec::new(),
        };
        let json = serde_json::to_vec(&m).unwrap_or_default();
        let mut b = vec![PENDING];
        b.extend_from_slice(&(json.len() as u32).to_le_bytes());
        b.extend_from_slice(&json);
        b.extend_from_slice(b"blob");
        let f = parse(&b).expect("parses");
        assert!(!f.committed);
        assert_eq!(f.manifest, m);
        assert_eq!(f.blobs, b"blob");
        b[0] = COMMITTED;
        assert!(parse(&b).is_some_and(|f| f.committed));
        for cut in [0, 1, 4, 5, 5 + json.len() - 1] {
            assert!(parse(&b[..cut]).is_none(), "cut at {cut}");
        }
        b[0] = IDLE;
        assert!(parse(&b).is_none(), "an idle journal is no run");
        b[0] = b'x';
        assert!(parse(&b).is_none());
    }
}
