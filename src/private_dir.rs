//! A private temporary directory (mode 0700), removed with everything in it on drop.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A directory only this user can enter, removed on drop.
#[derive(Debug)]
pub(crate) struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Creates `parent/{prefix}{random}` with mode 0700 (the parent is created if missing).
    pub fn new_in(parent: &Path, prefix: &str) -> io::Result<PrivateDir> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
        let path = parent.join(format!("{prefix}{}", crate::ids::random_uuid()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(PrivateDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes over `path` (a directory this process made private): removed on drop.
    pub fn adopt(path: PathBuf) -> PrivateDir {
        PrivateDir { path }
    }

    /// Gives the directory up without removing it.
    pub fn keep(mut self) -> PathBuf {
        // An empty path is what drop leaves alone.
        std::mem::take(&mut self.path)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return; // kept
        }
        remove_tree(&self.path);
    }
}

/// Removes `path` with everything in it, even subdirectories a child left without write or
/// search permission for us (it owned them): those are made 0700 first.
pub(crate) fn remove_tree(path: &Path) {
    if std::fs::remove_dir_all(path).is_ok() {
        return;
    }
    fn open_up(dir: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(path);
    if let Err(e) = std::fs::remove_dir_all(path) {
        log::warn!("could not remove {}: {e}", path.display());
    }
}

/// Refuses a directory that is a symlink, not ours, or open to others: whoever could write
/// into it could swap what correx later reads, restores or removes there.
pub(crate) fn check_private(root: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(root)?;
    let uid = crate::sys::uid();
    let why = if !m.is_dir() {
        "is not a directory (or is a symlink)"
    } else if m.uid() != uid {
        "belongs to another user"
    } else if m.mode() & 0o077 != 0 {
        "is readable or writable by others (it must be mode 0700)"
    } else {
        return Ok(());
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!("{} {why}", root.display()),
    ))
}

/// Writes `bytes` to `path` whole or not at all (mode 0600): into a new file beside it,
/// synced, then renamed over it.
///
/// # Errors
/// Creating, writing or renaming failed; `path` is then as it was.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        crate::ids::random_uuid()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// An exclusive advisory lock on `dir/name`, held while the file lives; `None` when another
/// process holds it. The lock file is created (mode 0600) when `create`.
pub(crate) fn lock_dir(dir: &Path, name: &str, create: bool) -> io::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(name))?;
    Ok(crate::sys::fs::try_lock_exclusive(f.as_raw_fd())?.then_some(f))
}
