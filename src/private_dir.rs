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

    /// Creates `parent/name` (which must not exist yet) with mode 0700.
    pub fn new_exact(parent: &Path, name: &str) -> io::Result<PrivateDir> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
        let path = parent.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(PrivateDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
