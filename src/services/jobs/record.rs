//! Which jobs a runtime has running, on disk, so the next runtime opened on the same sandbox
//! root can close those a dead host left: a private directory `jobs-<uuid>/` locked while its
//! table lives, one small file per running job, written before `job.started` is recorded and
//! removed once `job.exited` is.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const LOCK: &str = "lock";
const DIR_PREFIX: &str = "jobs-";
const SUFFIX: &str = ".job";

/// One running job, as its record file holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub session_id: String,
    pub job_id: String,
}

/// A live table's record directory, locked while it lives and removed when dropped.
#[derive(Debug)]
pub(crate) struct Records {
    dir: PathBuf,
    _lock: File,
}

impl Records {
    /// A fresh directory under `work_root`, made and locked under a name no recovery reads,
    /// then renamed into view: a recovery never sees it unlocked.
    pub fn create(work_root: &Path) -> io::Result<Records> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(work_root)?;
        let id = crate::ids::random_uuid();
        let fresh = work_root.join(format!(".new-{id}"));
        let dir = work_root.join(format!("{DIR_PREFIX}{id}"));
        std::fs::DirBuilder::new().mode(0o700).create(&fresh)?;
        let held = crate::private_dir::lock_dir(&fresh, LOCK, true)
            .and_then(|l| l.ok_or_else(|| io::Error::other("a fresh directory was already locked")))
            .and_then(|l| std::fs::rename(&fresh, &dir).map(|()| l));
        match held {
            Ok(l) => Ok(Records { dir, _lock: l }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&fresh);
                Err(e)
            }
        }
    }

    fn path_of(&self, job_id: &str) -> PathBuf {
        self.dir.join(format!("{job_id}{SUFFIX}"))
    }

    /// Writes the record of a job about to be recorded started, durably.
    pub fn add(&self, record: &Record) -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(self.path_of(&record.job_id))?;
        f.write_all(&serde_json::to_vec(record).map_err(io::Error::other)?)?;
        f.sync_all()?;
        File::open(&self.dir)?.sync_all()
    }

    /// Removes a job's record once its end is recorded.
    pub fn remove(&self, job_id: &str) {
        if let Err(e) = std::fs::remove_file(self.path_of(job_id)) {
            log::warn!("removing the record of job {job_id}: {e}");
        }
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        // Records still here belong to jobs whose end could not be recorded: kept, for the
        // next runtime to close.
        let only_lock = std::fs::read_dir(&self.dir)
            .map(|d| d.flatten().all(|e| e.file_name() == LOCK))
            .unwrap_or(false);
        if only_lock {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A dead table's directory (its lock was free), locked while recovery works on it.
#[derive(Debug)]
pub(crate) struct Dead {
    pub dir: PathBuf,
    _held: File,
    /// Its records (torn ones, from a power loss before the job was recorded, left out).
    pub records: Vec<Record>,
}

impl Dead {
    /// Removes the directory once every record in it is closed.
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The record directories under `work_root` whose table is gone; a missing root has none.
pub(crate) fn dead(work_root: &Path) -> io::Result<Vec<Dead>> {
    let entries = match std::fs::read_dir(work_root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for d in entries.flatten() {
        if !d.file_name().to_string_lossy().starts_with(DIR_PREFIX)
            || !d.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        let dir = d.path();
        // A live table (this process or another) holds its lock: not ours to touch. One
        // without its lock file is one a host was killed removing (the lock goes first).
        let held = match crate::private_dir::lock_dir(&dir, LOCK, false) {
            Ok(Some(held)) => held,
            Ok(None) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match crate::private_dir::lock_dir(&dir, LOCK, true) {
                    Ok(Some(held)) => held,
                    _ => continue,
                }
            }
            Err(_) => continue,
        };
        let mut records = Vec::new();
        for f in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if f.file_name().to_string_lossy().ends_with(SUFFIX) {
                if let Some(r) = std::fs::read(f.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
                {
                    records.push(r);
                }
            }
        }
        out.push(Dead {
            dir,
            _held: held,
            records,
        });
    }
    Ok(out)
}
