//! [`RunLayer`]: one staged run's directory: for each working dir an overlay's upper and work
//! directories, where promotion leaves what it removed, and the files that say where the run
//! is (`run.json`; `kept` once it is held for the host; `promote.json` while its change set
//! is applied, `promoted` once it was).

use super::changes::{self, ChangeSet};
use crate::sys::view::Overlay;
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What `run.json` says of a staged run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    pub invocation_id: String,
    pub session_id: String,
    /// The working dirs, in the tool's order (the layers' numbers).
    pub roots: Vec<PathBuf>,
    /// When the run started (seconds, nanoseconds since the epoch): a real path changed
    /// after it conflicts with the run's change of it.
    pub started: (i64, i64),
}

/// One staged run's directory.
#[derive(Debug)]
pub(crate) struct RunLayer {
    pub dir: PathBuf,
    pub record: RunRecord,
}

/// Marks: the run finished and is held for the host; its promotion is being applied; it
/// was applied.
pub(crate) const KEPT: &str = "kept";
pub(crate) const JOURNAL: &str = "promote.json";
pub(crate) const PROMOTED: &str = "promoted";
pub(crate) const RECORD: &str = "run.json";

impl RunLayer {
    /// Makes the layer of a run in `dir` (which must not exist) for `roots`, each upper
    /// directory with its working dir's permission bits (the run sees them as the root's).
    /// `run_ids`: a root host's run executes as these ids, so each upper directory is theirs
    /// (the overlay shows it as the working dir itself).
    pub fn create(
        dir: PathBuf,
        (session_id, invocation_id): (&str, &str),
        roots: &[PathBuf],
        run_ids: Option<(u32, u32)>,
    ) -> io::Result<RunLayer> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        // The filesystem's clock, not the wall clock: a real path's change time is compared
        // with it, and a filesystem's times may lag the wall clock by a tick.
        let started = {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&dir)?;
            (m.mtime(), m.mtime_nsec())
        };
        let layer = RunLayer {
            dir,
            record: RunRecord {
                invocation_id: invocation_id.to_owned(),
                session_id: session_id.to_owned(),
                roots: roots.to_vec(),
                started,
            },
        };
        let made = (|| {
            for (k, root) in roots.iter().enumerate() {
                let mode = std::fs::metadata(root)?.permissions().mode() & 0o7777;
                let b = layer.dir.join(k.to_string());
                std::fs::DirBuilder::new().mode(0o700).create(&b)?;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(b.join("work"))?;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(b.join("removed"))?;
                let upper = b.join("upper");
                std::fs::DirBuilder::new().mode(0o700).create(&upper)?;
                std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(mode))?;
                if let Some((uid, gid)) = run_ids {
                    crate::sys::fs::lchown(&upper, uid, gid)?;
                }
            }
            // Not synced yet: a layer without its record is one of a run that never finished,
            // discarded either way. It is made durable before anything depends on it.
            let bytes = serde_json::to_vec(&layer.record).map_err(io::Error::other)?;
            write_whole(&layer.dir.join(RECORD), &bytes, false)
        })();
        if let Err(e) = made {
            layer.remove();
            return Err(e);
        }
        Ok(layer)
    }

    /// The layer in `dir`, from its record; `None` where it has none (made no further than
    /// its directory).
    pub fn open(dir: PathBuf) -> Option<RunLayer> {
        let bytes = std::fs::read(dir.join(RECORD)).ok()?;
        let record = serde_json::from_slice(&bytes).ok()?;
        Some(RunLayer { dir, record })
    }

    pub fn upper(&self, k: usize) -> PathBuf {
        self.dir.join(k.to_string()).join("upper")
    }

    pub fn removed(&self, k: usize, op: usize) -> PathBuf {
        self.dir
            .join(k.to_string())
            .join("removed")
            .join(op.to_string())
    }

    /// The overlays that stage each working dir (`userxattr`: mounted in a user namespace,
    /// where the overlay keeps its marks in `user.*` attributes), each with the Landlock
    /// `rights` of a working dir.
    ///
    /// # Errors
    /// A path the overlay's options cannot carry (a comma, colon, backslash or NUL byte).
    pub fn overlays(&self, userxattr: bool, rights: u64) -> Result<Vec<Overlay>, String> {
        let mut out = Vec::with_capacity(self.record.roots.len());
        for (k, root) in self.record.roots.iter().enumerate() {
            let b = self.dir.join(k.to_string());
            let (lower, upper, work) = (
                option_path(root)?,
                option_path(&b.join("upper"))?,
                option_path(&b.join("work"))?,
            );
            // Renamed directories are copied (no redirects), every file copied up whole (no
            // metacopy), no index: the upper layer is plain files a change set is read from.
            let mut data = format!(
                "lowerdir={lower},upperdir={upper},workdir={work},redirect_dir=nofollow,index=off,metacopy=off"
            );
            if userxattr {
                data.push_str(",userxattr");
            }
            out.push(Overlay {
                target: CString::new(root.as_os_str().as_bytes()).map_err(|e| e.to_string())?,
                data: CString::new(data).map_err(|e| e.to_string())?,
                rights,
            });
        }
        Ok(out)
    }

    /// Reads what the run changed, working dir by working dir.
    pub fn changes(&self) -> io::Result<ChangeSet> {
        let mut set = ChangeSet::default();
        for (k, root) in self.record.roots.iter().enumerate() {
            changes::read(k, root, &self.upper(k), &mut set)?;
        }
        Ok(set)
    }

    pub fn has(&self, mark: &str) -> bool {
        self.dir.join(mark).exists()
    }

    /// Makes the layer's record and its place in the tool's directory durable: before a
    /// journal or a mark that recovery reads with it.
    pub fn make_durable(&self) -> io::Result<()> {
        std::fs::File::open(self.dir.join(RECORD))?.sync_all()?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        match self.dir.parent() {
            Some(tool) => std::fs::File::open(tool)?.sync_all(),
            None => Ok(()),
        }
    }

    /// Sets `mark`, durably.
    pub fn mark(&self, mark: &str) -> io::Result<()> {
        write_synced(&self.dir.join(mark), b"")
    }

    /// Removes the layer and everything in it.
    pub fn remove(&self) {
        crate::private_dir::remove_tree(&self.dir);
    }

    /// Bytes its files hold (what keeping it costs).
    pub fn bytes(&self) -> u64 {
        du(&self.dir)
    }
}

/// A path as the overlay's mount options carry it, or why it cannot be.
fn option_path(p: &Path) -> Result<String, String> {
    let s = p
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))?;
    if s.contains([',', ':', '\\', '\0']) {
        return Err(format!(
            "{s} holds a comma, colon or backslash, which an overlay's options cannot carry"
        ));
    }
    Ok(s.to_owned())
}

/// Writes `path` whole and durably: a temp file, synced, renamed, the directory synced.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_whole(path, bytes, true)
}

/// Writes `path` whole (a temp file renamed over it, so no reader sees part of it); with
/// `sync`, durably too.
fn write_whole(path: &Path, bytes: &[u8], sync: bool) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
    }
    std::fs::rename(&tmp, path)?;
    if let (true, Some(parent)) = (sync, path.parent()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Bytes of the files beneath `p` (not following links).
pub(crate) fn du(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !m.is_dir() {
        return if m.is_file() { m.size() } else { 0 };
    }
    std::fs::read_dir(p)
        .map(|d| d.flatten().map(|e| du(&e.path())).sum())
        .unwrap_or(0)
}
