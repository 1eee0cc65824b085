//! Backups of the files a tool may touch, kept beside each file (same filesystem, so a restore
//! is one atomic rename), listed in a manifest so a crashed host can be recovered.

use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// What stood at a path before the tool ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Saved {
    /// Nothing: a restore deletes whatever the tool created.
    Absent,
    /// A regular file, copied to `backup` (beside it). `identity` is what the file looked like
    /// before the tool ran: when it still looks the same, the tool did not touch it and it is
    /// left alone rather than rolled back over someone else's change.
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
    fn of(m: &std::fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            // i64 nanoseconds reach the year 2262; serde's tagged enums cannot carry i128.
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            ctime_ns: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
        }
    }

    fn current(path: &Path) -> Option<Identity> {
        std::fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| Identity::of(&m))
    }
}

/// What a restore did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restored {
    /// The path was put back as it was.
    Yes,
    /// The path was as it was already; nothing to do.
    Unchanged,
    /// No complete backup exists (a crash came before it was whole, so the tool never ran).
    NoBackup,
}

/// One backed-up path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub path: PathBuf,
    pub saved: Saved,
}

/// What an interrupted invocation left behind, enough to restore and to record it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub session_id: String,
    pub invocation_id: String,
    pub tool_name: String,
    pub entries: Vec<Entry>,
}

pub(crate) const MANIFEST: &str = "manifest.json";
/// What the manifest is renamed to once the tool succeeded: its change is in place.
pub(crate) const COMMITTED: &str = "committed.json";

/// Removes what a dead run may have left beside its paths: the file tools' temp files
/// (`.NAME.correx-tmp-*`) and partial backups (`.NAME.correx-bak-*.tmp`).
pub(crate) fn remove_strays(entries: &[Entry]) {
    use std::os::unix::ffi::OsStrExt;
    for e in entries {
        let (Some(parent), Some(name)) = (e.path.parent(), e.path.file_name()) else {
            continue;
        };
        let name = name.as_bytes();
        let mut tmp = b".".to_vec();
        tmp.extend_from_slice(&name[..name.len().min(200)]);
        tmp.extend_from_slice(b".correx-tmp-");
        let mut bak = b".".to_vec();
        bak.extend_from_slice(name);
        bak.extend_from_slice(b".correx-bak-");
        let Ok(siblings) = std::fs::read_dir(parent) else {
            continue;
        };
        for s in siblings.flatten() {
            let n = s.file_name();
            let n = n.as_bytes();
            if n.starts_with(&tmp) || (n.starts_with(&bak) && n.ends_with(b".tmp")) {
                let _ = std::fs::remove_file(s.path());
            }
        }
    }
}

fn backup_name(path: &Path, tag: &str) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut n = std::ffi::OsString::from(".");
    n.push(name);
    n.push(format!(".correx-bak-{tag}"));
    Ok(path.with_file_name(n))
}

/// Plans the backup of `path` (without copying yet): what is there, and where its copy goes.
pub(crate) fn plan(path: &Path, tag: &str) -> io::Result<Entry> {
    let saved = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Saved::Absent,
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() => Saved::Symlink {
            target: std::fs::read_link(path)?,
        },
        Ok(m) if m.file_type().is_file() => Saved::File {
            backup: backup_name(path, tag)?,
            identity: Identity::of(&m),
        },
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a regular file or symlink; it cannot be backed up",
                    path.display()
                ),
            ))
        }
    };
    Ok(Entry {
        path: path.to_path_buf(),
        saved,
    })
}

/// Copies the file to its backup path: the kernel copies (`copy_file_range`, a reflink where
/// the filesystem has them) into a temp name, renamed into place once complete, so a backup
/// under its final name was whole when the host last ran.
///
/// The copy is not flushed to disk (as `cp` does not): it must survive a crash of the host,
/// which the page cache does. After a power loss a backup may come back short; a restore checks
/// its size against the size recorded in the manifest and leaves the file alone when they
/// differ.
pub(crate) fn take(entry: &Entry) -> io::Result<()> {
    if let Saved::File { backup, .. } = &entry.saved {
        let mut tmp = backup.as_os_str().to_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let copied = std::fs::copy(&entry.path, &tmp).and_then(|_| std::fs::rename(&tmp, backup));
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    Ok(())
}

/// Puts back what was saved. A file comes back by renaming its backup over the path, unless
/// the file was never changed.
pub(crate) fn restore(entry: &Entry) -> io::Result<Restored> {
    match &entry.saved {
        Saved::File { backup, identity } => {
            if Identity::current(&entry.path) == Some(*identity) {
                discard(entry)?;
                return Ok(Restored::Unchanged);
            }
            match std::fs::symlink_metadata(backup) {
                Ok(m) if m.len() != identity.size => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "backup {} holds {} of {} bytes; the file was left as it is",
                            backup.display(),
                            m.len(),
                            identity.size
                        ),
                    ))
                }
                _ => {}
            }
            match std::fs::rename(backup, &entry.path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Restored::NoBackup),
                Err(e) => Err(e),
                Ok(()) => Ok(Restored::Yes),
            }
        }
        Saved::Absent => match std::fs::symlink_metadata(&entry.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Restored::Unchanged),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&entry.path).map(|()| Restored::Yes),
            Ok(_) => std::fs::remove_file(&entry.path).map(|()| Restored::Yes),
        },
        Saved::Symlink { target } => {
            if std::fs::read_link(&entry.path).ok().as_ref() == Some(target) {
                return Ok(Restored::Unchanged);
            }
            let tmp = backup_name(&entry.path, "link")?;
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp)?;
            if let Err(e) = std::fs::rename(&tmp, &entry.path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            Ok(Restored::Yes)
        }
    }
}

/// Whether a manifest entry is one this code could have written: its backup sits beside its
/// path under the backup naming scheme. Recovery ignores anything else.
pub(crate) fn plausible(entry: &Entry) -> bool {
    if !entry.path.is_absolute() {
        return false;
    }
    match &entry.saved {
        Saved::File { backup, .. } => {
            let prefix = match entry.path.file_name() {
                Some(n) => format!(".{}.correx-bak-", n.to_string_lossy()),
                None => return false,
            };
            backup.parent() == entry.path.parent()
                && backup
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        }
        Saved::Absent | Saved::Symlink { .. } => true,
    }
}

/// Drops a backup after success.
pub(crate) fn discard(entry: &Entry) -> io::Result<()> {
    match &entry.saved {
        Saved::File { backup, .. } => match std::fs::remove_file(backup) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
        Saved::Absent | Saved::Symlink { .. } => Ok(()),
    }
}

/// Writes the manifest atomically (temp file, then rename).
///
/// It is not flushed to disk: it must survive the host process dying, which the page cache
/// does. After a power loss it may be gone, and then nothing is restored, which is still safe:
/// the tools replace files atomically, and a backup is renamed into place only after it was
/// flushed, so a recovery never puts back a partial copy.
pub(crate) fn write_manifest(dir: &Path, m: &Manifest) -> io::Result<()> {
    let bytes = serde_json::to_vec(m).map_err(io::Error::other)?;
    let tmp = dir.join(".manifest.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(MANIFEST))
}
