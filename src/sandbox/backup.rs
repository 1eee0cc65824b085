//! Backups of the files a tool may touch, taken and put back through a directory fd opened
//! beneath the path's allowed root, so a directory on the path swapped for a symlink while a
//! tool runs cannot redirect them.
//!
//! A small file (at most [`INLINE_MAX`]) is saved in the run's journal itself: no second file,
//! no rename. A larger one is copied by the kernel beside itself (same filesystem, so a restore
//! is one atomic rename). [`BackupSet`] holds a run's backups and restores them when dropped
//! unless it was committed, as a database transaction rolls back.

use super::journal::{Journal, Run};
use crate::sys::fs::{fchmod, fstat, lstatat, openat, readlinkat, renameat, symlinkat, unlinkat};
use serde::{Deserialize, Serialize};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Files up to this size are saved inside the journal.
pub(crate) const INLINE_MAX: u64 = 64 * 1024;

/// What stood at a path before the tool ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Saved {
    /// Nothing: a restore deletes whatever the tool created.
    Absent,
    /// A small regular file whose bytes are in the journal (`len` bytes at `offset` of its
    /// blob area). `identity` is what the file looked like before the tool ran: when it still
    /// looks the same, the tool did not touch it and it is left alone rather than rolled back
    /// over someone else's change.
    Inline {
        offset: u64,
        len: u64,
        mode: u32,
        identity: Identity,
    },
    /// A regular file copied to `backup`, a name in the same directory.
    File { backup: PathBuf, identity: Identity },
    /// A symlink with this target (the link itself, never what it points to).
    Symlink { target: PathBuf },
}

/// Enough of a file's metadata to tell whether anything replaced or rewrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Identity {
    fn of(st: &libc::stat) -> Identity {
        Identity {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            // i64 nanoseconds reach the year 2262; serde's tagged enums cannot carry i128.
            mtime_ns: st
                .st_mtime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec),
            ctime_ns: st
                .st_ctime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_ctime_nsec),
        }
    }

    fn current(dir: RawFd, name: &OsStr) -> Option<Identity> {
        lstatat(dir, name)
            .ok()
            .filter(|st| is(st, libc::S_IFREG))
            .map(|st| Identity::of(&st))
    }
}

fn is(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// What a restore did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restored {
    /// The path was put back as it was.
    Yes,
    /// The path was as it was already; nothing to do.
    Unchanged,
    /// No complete backup exists (so the tool never ran).
    NoBackup,
}

/// One backed-up path: the root it lies under, its directory relative to that root (no
/// symlinks, no `..`), and its name there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub root: PathBuf,
    pub dir: PathBuf,
    pub name: PathBuf,
    pub saved: Saved,
}

impl Entry {
    /// The absolute path, for messages and for [`super::Recovered`].
    pub fn path(&self) -> PathBuf {
        self.root.join(&self.dir).join(&self.name)
    }

    /// Whether this entry is one this code could have written (a plain name, a relative
    /// directory without `..`, a backup name of our scheme); recovery ignores anything else.
    pub fn plausible(&self) -> bool {
        let plain = |p: &Path| p.components().all(|c| matches!(c, Component::Normal(_)));
        let name_ok = matches!(
            &self.name.components().collect::<Vec<_>>()[..],
            [Component::Normal(_)]
        );
        let backup_ok = match &self.saved {
            Saved::File { backup, .. } => {
                let mut prefix = b".".to_vec();
                prefix.extend_from_slice(self.name.as_os_str().as_bytes());
                prefix.extend_from_slice(b".correx-bak-");
                backup.components().count() == 1
                    && backup.as_os_str().as_bytes().starts_with(&prefix)
            }
            _ => true,
        };
        self.root.is_absolute() && plain(&self.dir) && name_ok && backup_ok
    }

    /// Opens this entry's directory beneath its root, refusing any symlink on the way: the
    /// directory was resolved to its real path when the backup was planned, so a symlink there
    /// now is something swapped in since.
    pub fn open_dir(&self) -> io::Result<OwnedFd> {
        self.open_dir_from(None)
    }

    /// As [`Entry::open_dir`], from `root` (this entry's root, held open) when given.
    fn open_dir_from(&self, root: Option<&OwnedFd>) -> io::Result<OwnedFd> {
        let mut fd = match root {
            Some(r) => r.try_clone()?,
            None => openat(
                libc::AT_FDCWD,
                self.root.as_os_str(),
                libc::O_PATH | libc::O_DIRECTORY,
                0,
            )?,
        };
        for c in self.dir.components() {
            let Component::Normal(c) = c else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a backup's directory must be a plain relative path",
                ));
            };
            fd = openat(
                fd.as_raw_fd(),
                c,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )?;
        }
        Ok(fd)
    }
}

/// The roots runs back up under, each opened once and held (as the file tools hold theirs).
#[derive(Default)]
pub(crate) struct RootFds {
    open: parking_lot::Mutex<std::collections::HashMap<PathBuf, std::sync::Arc<OwnedFd>>>,
}

impl RootFds {
    fn get(&self, root: &Path) -> io::Result<std::sync::Arc<OwnedFd>> {
        if let Some(fd) = self.open.lock().get(root) {
            return Ok(fd.clone());
        }
        let fd = std::sync::Arc::new(openat(
            libc::AT_FDCWD,
            root.as_os_str(),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?);
        let mut open = self.open.lock();
        // A handful of roots in practice; a runaway set of them is not kept.
        if open.len() < 64 {
            open.insert(root.to_path_buf(), fd.clone());
        }
        Ok(fd)
    }
}

/// An entry with its directory held open for the run.
struct Live {
    entry: Entry,
    /// `None` when the directory did not exist at planning (nothing there to back up).
    dir: Option<OwnedFd>,
}

impl Live {
    fn dir_fd(&self) -> io::Result<OwnedFd> {
        match &self.dir {
            Some(d) => d.try_clone(),
            None => self.entry.open_dir(),
        }
    }
}

fn unlink_quiet(dir: RawFd, name: &OsStr) -> io::Result<()> {
    match unlinkat(dir, name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn file(fd: OwnedFd) -> std::fs::File {
    std::fs::File::from(fd)
}

/// Creates `name` in `dir` (it must not exist) for writing, with permission bits `mode`
/// exactly (not masked by the umask).
fn create_in(dir: RawFd, name: &OsStr, mode: u32) -> io::Result<std::fs::File> {
    let f = file(openat(
        dir,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )?);
    fchmod(f.as_raw_fd(), mode & 0o7777)?;
    Ok(f)
}

fn with_suffix(name: &Path, suffix: &str) -> OsString {
    let mut n = OsString::from(".");
    n.push(name.as_os_str());
    n.push(suffix);
    n
}

/// Removes what a dead run may have left beside its paths: the file tools' temp files
/// (`.NAME.correx-tmp-*`) and partial backups or restores (`.NAME.correx-bak-*.tmp`).
pub(crate) fn remove_strays(entries: &[Entry]) {
    for e in entries.iter().filter(|e| e.plausible()) {
        let Ok(dir) = e.open_dir() else { continue };
        let name = e.name.as_os_str().as_bytes();
        let mut tmp = b".".to_vec();
        tmp.extend_from_slice(&name[..name.len().min(200)]);
        tmp.extend_from_slice(b".correx-tmp-");
        let mut bak = b".".to_vec();
        bak.extend_from_slice(name);
        bak.extend_from_slice(b".correx-bak-");
        let Ok(siblings) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
            continue;
        };
        for s in siblings.flatten() {
            let n = s.file_name();
            let b = n.as_bytes();
            if b.starts_with(&tmp) || (b.starts_with(&bak) && b.ends_with(b".tmp")) {
                let _ = unlinkat(dir.as_raw_fd(), &n);
            }
        }
    }
}

/// Where `path`'s directory lies: the longest of `roots` holding it, else `/`. A tool with
/// roots names real paths (resolved beneath them); any other path is resolved here, once.
fn place(path: &Path, roots: &[PathBuf]) -> io::Result<(PathBuf, PathBuf, PathBuf)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        ));
    };
    let longest = |p: &Path| {
        roots
            .iter()
            .filter(|r| p.starts_with(r))
            .max_by_key(|r| r.as_os_str().len())
            .cloned()
    };
    let (real, root) = match longest(parent) {
        Some(root) => (parent.to_path_buf(), root),
        None => {
            let real = match std::fs::canonicalize(parent) {
                Ok(p) => p,
                Err(e) if e.kind() == io::ErrorKind::NotFound => parent.to_path_buf(),
                Err(e) => return Err(e),
            };
            let root = longest(&real).unwrap_or_else(|| PathBuf::from("/"));
            (real, root)
        }
    };
    let dir = real.strip_prefix(&root).unwrap_or(&real).to_path_buf();
    Ok((root, dir, PathBuf::from(name)))
}

/// A run's backups, with their journal. Dropped without [`BackupSet::commit`], it restores
/// every path; committed, it drops the backups. The journal goes with it.
pub(crate) struct BackupSet<'a> {
    live: Vec<Live>,
    journal: Option<Journal<'a>>,
    settled: bool,
}

impl<'a> BackupSet<'a> {
    /// Backs up `paths` (each resolved beneath the longest of `roots` holding it, else `/`):
    /// plans each, writes the journal (small files inside it), then copies the large ones.
    /// On error nothing is left behind and the tool must not run.
    pub fn take(
        run: Run<'a>,
        paths: &[PathBuf],
        roots: &[PathBuf],
        root_fds: &RootFds,
        tag: &str,
    ) -> Result<BackupSet<'a>, String> {
        let mut live = Vec::with_capacity(paths.len());
        let mut blobs: Vec<u8> = Vec::new();
        for p in paths {
            let planned = place(p, roots).and_then(|(root, dir, name)| {
                let root_fd = root_fds.get(&root)?;
                plan(
                    Entry {
                        root,
                        dir,
                        name,
                        saved: Saved::Absent,
                    },
                    &root_fd,
                    tag,
                    &mut blobs,
                )
            });
            match planned {
                Ok(l) => live.push(l),
                Err(e) => {
                    return Err(format!(
                        "backup of {} failed, the tool did not run: {e}",
                        p.display()
                    ))
                }
            }
        }
        let entries: Vec<Entry> = live.iter().map(|l| l.entry.clone()).collect();
        let journal = run
            .begin(&entries, &blobs)
            .map_err(|e| format!("writing the sandbox journal: {e}"))?;
        super::seam("journal");
        let mut set = BackupSet {
            live,
            journal: Some(journal),
            settled: true,
        };
        let failed = set
            .live
            .iter()
            .find_map(|l| copy(l).err().map(|e| (l.entry.path(), e)));
        if let Some((path, e)) = failed {
            set.discard();
            // Never started: nothing for a recovery to close.
            set.finish();
            return Err(format!(
                "backup of {} failed, the tool did not run: {e}",
                path.display()
            ));
        }
        set.settled = false;
        Ok(set)
    }

    /// The tool succeeded: the journal is marked committed first (from here a crash cannot
    /// turn the success into a rollback), then the backups go. When the mark cannot be
    /// written nothing is dropped: the caller restores.
    pub fn commit(&mut self) -> std::io::Result<()> {
        if let Some(j) = &self.journal {
            j.commit()?;
        }
        super::seam("committed");
        self.discard();
        super::seam("discarded");
        Ok(())
    }

    /// The run's outcome is recorded: its journal is done with (and reused).
    pub fn finish(&mut self) {
        if let Some(j) = self.journal.take() {
            j.finish();
        }
    }

    /// The tool never ran: drops the backups without restoring.
    pub fn abandon(&mut self) {
        self.discard();
    }

    /// Drops the backups without restoring (the tool never ran, or it succeeded).
    fn discard(&mut self) {
        for l in &self.live {
            let Saved::File { backup, .. } = &l.entry.saved else {
                continue;
            };
            let removed = l
                .dir_fd()
                .and_then(|d| unlink_quiet(d.as_raw_fd(), backup.as_os_str()));
            if let Err(e) = removed {
                log::warn!("dropping the backup of {}: {e}", l.entry.path().display());
            }
        }
        self.settled = true;
    }

    /// Puts every path back as it was, last first; the errors, one message each.
    pub fn restore(&mut self) -> Vec<String> {
        if self.settled {
            return Vec::new();
        }
        self.settled = true;
        let blobs = self.journal.as_ref().map(Journal::blobs).unwrap_or(&[]);
        let mut errors = Vec::new();
        for l in self.live.iter().rev() {
            let done = l
                .dir_fd()
                .and_then(|d| restore(&l.entry, d.as_raw_fd(), blobs));
            if let Err(e) = done {
                errors.push(format!(
                    "restoring {} failed: {e}",
                    l.entry.path().display()
                ));
            }
        }
        errors
    }
}

impl Drop for BackupSet<'_> {
    /// Restores unless committed; a journal not [`BackupSet::finish`]ed stays open for the
    /// next executor's recovery (its outcome was never recorded).
    fn drop(&mut self) {
        for e in self.restore() {
            log::error!("{e}");
        }
        drop(self.journal.take());
    }
}

/// What is at `entry`'s path now, read through its directory; small files into `blobs`.
fn plan(mut entry: Entry, root: &OwnedFd, tag: &str, blobs: &mut Vec<u8>) -> io::Result<Live> {
    let dir = match entry.open_dir_from(Some(root)) {
        Ok(d) => d,
        // The tool may create the directory; a restore then removes what it put at the path.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Live { entry, dir: None }),
        Err(e) => return Err(e),
    };
    let name = entry.name.as_os_str();
    entry.saved = match lstatat(dir.as_raw_fd(), name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Saved::Absent,
        Err(e) => return Err(e),
        Ok(st) if is(&st, libc::S_IFLNK) => Saved::Symlink {
            target: readlinkat(dir.as_raw_fd(), name)?,
        },
        Ok(st) if is(&st, libc::S_IFREG) => {
            if st.st_size as u64 > INLINE_MAX {
                Saved::File {
                    backup: PathBuf::from(with_suffix(&entry.name, &format!(".correx-bak-{tag}"))),
                    identity: Identity::of(&st),
                }
            } else {
                let mut f = file(openat(
                    dir.as_raw_fd(),
                    name,
                    libc::O_RDONLY | libc::O_NOFOLLOW,
                    0,
                )?);
                // The identity of what was read, not of what the lstat saw a moment earlier.
                let st = fstat(f.as_raw_fd())?;
                let offset = blobs.len() as u64;
                // One read of one byte more than the size: a short read is the end.
                let want = st.st_size as usize + 1;
                let start = blobs.len();
                blobs.resize(start + want, 0);
                let mut got = 0;
                while got < want {
                    match f.read(&mut blobs[start + got..]) {
                        Ok(0) => break,
                        Ok(n) if n < want - got => {
                            got += n;
                            break;
                        }
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                blobs.truncate(start + got);
                let len = got as u64;
                if len != st.st_size as u64 {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "the file changed while it was backed up",
                    ));
                }
                Saved::Inline {
                    offset,
                    len,
                    mode: st.st_mode & 0o7777,
                    identity: Identity::of(&st),
                }
            }
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "it is not a regular file or symlink; it cannot be backed up",
            ))
        }
    };
    Ok(Live {
        entry,
        dir: Some(dir),
    })
}

/// Copies a large file to its backup name: the kernel copies (`copy_file_range`, a reflink
/// where the filesystem has them) into a temp name, renamed into place once complete, so a
/// backup under its final name was whole when the host last ran.
///
/// The copy is not flushed to disk (as `cp` does not): it must survive a crash of the host,
/// which the page cache does. After a power loss a backup may come back short; a restore checks
/// its size against the recorded one and leaves the file alone when they differ.
fn copy(l: &Live) -> io::Result<()> {
    let (Saved::File { backup, .. }, Some(dir)) = (&l.entry.saved, &l.dir) else {
        return Ok(());
    };
    let dir = dir.as_raw_fd();
    let tmp = {
        let mut t = backup.as_os_str().to_os_string();
        t.push(".tmp");
        t
    };
    let copied = (|| {
        let mut src = file(openat(
            dir,
            l.entry.name.as_os_str(),
            libc::O_RDONLY | libc::O_NOFOLLOW,
            0,
        )?);
        let mode = fstat(src.as_raw_fd())?.st_mode;
        let mut dst = create_in(dir, &tmp, mode)?;
        io::copy(&mut src, &mut dst)?;
        renameat(dir, &tmp, backup.as_os_str())
    })();
    if copied.is_err() {
        let _ = unlinkat(dir, &tmp);
    }
    copied
}

/// Puts back what was saved, through `dir` (the entry's directory). A file comes back by
/// renaming its backup (or a copy of its inline bytes) over the path, unless it was never
/// changed.
pub(crate) fn restore(entry: &Entry, dir: RawFd, blobs: &[u8]) -> io::Result<Restored> {
    let name = entry.name.as_os_str();
    match &entry.saved {
        Saved::Inline {
            offset,
            len,
            mode,
            identity,
        } => {
            if Identity::current(dir, name) == Some(*identity) {
                return Ok(Restored::Unchanged);
            }
            let bytes = usize::try_from(*offset)
                .ok()
                .zip(usize::try_from(offset.saturating_add(*len)).ok())
                .and_then(|(a, b)| blobs.get(a..b))
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "journal cut short"))?;
            let tmp = with_suffix(
                &entry.name,
                &format!(".correx-bak-restore-{}.tmp", crate::ids::random_uuid()),
            );
            let _ = unlinkat(dir, &tmp);
            let written = create_in(dir, &tmp, *mode)
                .and_then(|mut f| f.write_all(bytes))
                .and_then(|()| renameat(dir, &tmp, name));
            if written.is_err() {
                let _ = unlinkat(dir, &tmp);
            }
            written.map(|()| Restored::Yes)
        }
        Saved::File { backup, identity } => {
            if Identity::current(dir, name) == Some(*identity) {
                unlink_quiet(dir, backup.as_os_str())?;
                return Ok(Restored::Unchanged);
            }
            match lstatat(dir, backup.as_os_str()) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Restored::NoBackup),
                Err(e) => return Err(e),
                Ok(st) if st.st_size as u64 != identity.size => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "its backup holds {} of {} bytes; the file was left as it is",
                            st.st_size, identity.size
                        ),
                    ))
                }
                Ok(_) => {}
            }
            renameat(dir, backup.as_os_str(), name).map(|()| Restored::Yes)
        }
        Saved::Absent => match lstatat(dir, name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Restored::Unchanged),
            Err(e) => Err(e),
            Ok(st) if is(&st, libc::S_IFDIR) => {
                // Through the held directory (std's removal never follows a symlink inside).
                std::fs::remove_dir_all(Path::new(&format!("/proc/self/fd/{dir}")).join(name))
                    .map(|()| Restored::Yes)
            }
            Ok(_) => unlinkat(dir, name).map(|()| Restored::Yes),
        },
        Saved::Symlink { target } => {
            if readlinkat(dir, name).ok().as_ref() == Some(target) {
                return Ok(Restored::Unchanged);
            }
            let tmp = with_suffix(&entry.name, ".correx-bak-link.tmp");
            let _ = unlinkat(dir, &tmp);
            symlinkat(target, dir, &tmp)?;
            if let Err(e) = renameat(dir, &tmp, name) {
                let _ = unlinkat(dir, &tmp);
                return Err(e);
            }
            Ok(Restored::Yes)
        }
    }
}

/// Drops a large file's backup (recovery, after a commit or for a run that never started).
pub(crate) fn discard(entry: &Entry) -> io::Result<()> {
    let Saved::File { backup, .. } = &entry.saved else {
        return Ok(());
    };
    match entry.open_dir() {
        Ok(d) => unlink_quiet(d.as_raw_fd(), backup.as_os_str()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_on_an_entrys_directory_is_refused() {
        let tmp = std::env::temp_dir().join(format!("correx-backup-{}", crate::ids::random_uuid()));
        let real = tmp.join("real");
        std::fs::create_dir_all(&real).unwrap_or_default();
        let entry = |dir: &str| Entry {
            root: tmp.clone(),
            dir: PathBuf::from(dir),
            name: PathBuf::from("f"),
            saved: Saved::Absent,
        };
        assert!(entry("real").open_dir().is_ok());
        let _ = std::os::unix::fs::symlink(&real, tmp.join("link"));
        assert!(entry("link").open_dir().is_err(), "followed a symlink");
        assert!(!entry("../x").plausible());
        assert!(!entry("/abs").plausible());
        assert!(entry("a/b").plausible());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
