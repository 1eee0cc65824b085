//! Promoted change sets kept for rewind. A promoted layer holds exactly what its promotion
//! replaced and removed, and its journal says how it was applied, so taking it back is
//! undoing the journal's steps. Each session's layers live in `history/<session>/`, named in
//! the order they were promoted, bounded in bytes (the oldest go first).
//!
//! A rewind marks each layer before it undoes it, newest first, and removes it after: a host
//! killed meanwhile leaves a marked layer, which the next tool on the base undoes again
//! (every step tells from the inodes whether it was taken) and removes. So the working dirs
//! are always as they were before one of the session's promotions.

use super::changes::Op;
use super::layer::RunLayer;
use super::promote::{self, Conflict};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

const REWINDING: &str = "rewinding";

/// The history beneath a staging base.
#[derive(Debug)]
pub(crate) struct History {
    dir: PathBuf,
    /// The most bytes one session's kept layers may hold.
    max_bytes: u64,
}

/// Why a rewind was refused; nothing was changed.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The invocation has no promoted change set kept for the session.
    NotKept,
    /// Paths the rewind would take back were changed since by someone else.
    Changed(Vec<Conflict>),
    Io(PathBuf, io::Error),
}

impl History {
    pub fn new(stage: &Path, max_bytes: u64) -> History {
        History {
            dir: stage.join("history"),
            max_bytes,
        }
    }

    fn session_dir(&self, session_id: &str) -> PathBuf {
        self.dir.join(crate::text::safe_component(session_id))
    }

    /// Keeps a layer just promoted (or removes it when nothing may be kept), then drops the
    /// session's oldest layers past the bound.
    pub fn add(&self, layer: &RunLayer) {
        if self.max_bytes == 0 {
            layer.remove();
            return;
        }
        let dir = self.session_dir(&layer.record.session_id);
        let kept = (|| {
            make_private(&self.dir)?;
            make_private(&dir)?;
            let _lock = lock(&dir)?;
            // Named in promotion order, with its bytes (what the bound counts, read back
            // without walking every kept layer).
            let name = format!(
                "{:020}-{:016}-{}",
                promoted_at(layer),
                layer.bytes(),
                crate::text::safe_component(&layer.record.invocation_id)
            );
            std::fs::rename(&layer.dir, dir.join(name))?;
            self.trim(&dir);
            Ok::<(), io::Error>(())
        })();
        if let Err(e) = kept {
            log::warn!(
                "a promoted change set of {} is not kept for rewind: {e}",
                layer.record.invocation_id
            );
            layer.remove();
        }
    }

    /// Drops the layers whose working dirs are gone (nothing to rewind there) and the oldest
    /// past the bound (the lock held).
    fn trim(&self, dir: &Path) {
        let (entries, gone): (Vec<_>, Vec<_>) = entries(dir)
            .into_iter()
            .partition(|(_, l)| l.record.roots.iter().all(|r| r.is_dir()));
        for (_, l) in gone {
            remove_entry(&l);
        }
        let sizes: Vec<u64> = entries.iter().map(|(d, _)| bytes_of(d)).collect();
        let mut total: u64 = sizes.iter().sum();
        for ((_, l), size) in entries.iter().zip(&sizes) {
            if total <= self.max_bytes {
                break;
            }
            // A rewind in progress (or cut short) finishes first.
            if l.has(REWINDING) {
                continue;
            }
            remove_entry(l);
            total -= size;
        }
    }

    /// The promoted change sets kept for a session, oldest first: their invocations.
    pub fn kept(&self, session_id: &str) -> Vec<String> {
        entries(&self.session_dir(session_id))
            .into_iter()
            .map(|(_, l)| l.record.invocation_id)
            .collect()
    }

    /// Takes back, newest first, every promoted change set of `session_id` back to and
    /// including `invocation_id`'s: the invocations rewound with their steps' counts, newest
    /// first.
    pub fn rewind(
        &self,
        session_id: &str,
        invocation_id: &str,
    ) -> Result<Vec<(String, serde_json::Value)>, Refused> {
        let dir = self.session_dir(session_id);
        if !dir.is_dir() {
            return Err(Refused::NotKept);
        }
        let _lock = lock(&dir).map_err(|e| Refused::Io(dir.clone(), e))?;
        let entries = entries(&dir);
        let from = entries
            .iter()
            .position(|(_, l)| l.record.invocation_id == invocation_id)
            .ok_or(Refused::NotKept)?;
        let mut tail = Vec::new();
        for (d, l) in entries.into_iter().skip(from).rev() {
            let ops = promote::journal_ops(&l).ok_or_else(|| {
                Refused::Io(
                    d.clone(),
                    io::Error::other("its journal is missing or unreadable"),
                )
            })?;
            tail.push((l, ops));
        }
        // Each path as the newest of them left it: what someone else changed since.
        let mut seen = HashSet::new();
        let conflicts: Vec<Conflict> = tail
            .iter()
            .flat_map(|(l, ops)| promote::changed_since(l, ops, &mut seen))
            .collect();
        if !conflicts.is_empty() {
            return Err(Refused::Changed(conflicts));
        }
        // Each layer whole, newest first; one that cannot be undone whole stays (marked, so
        // the next tool tries again) and ends the rewind: the newer ones are taken back.
        let mut done = Vec::new();
        for (l, ops) in &tail {
            l.mark(REWINDING)
                .map_err(|e| Refused::Io(l.dir.clone(), e))?;
            super::seam("rewinding");
            promote::undo(l, ops).map_err(|e| Refused::Io(l.dir.clone(), e))?;
            remove_entry(l);
            done.push((l.record.invocation_id.clone(), counts(ops)));
        }
        Ok(done)
    }

    /// Finishes the rewinds a dead host left: each marked layer undone again and removed.
    pub fn recover(&self) {
        let Ok(sessions) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for s in sessions.flatten() {
            let dir = s.path();
            let Ok(_lock) = lock(&dir) else { continue };
            remove_trash(&dir);
            for (_, l) in entries(&dir).into_iter().rev() {
                if l.has(REWINDING) {
                    let undone = match promote::journal_ops(&l) {
                        Some(ops) => promote::undo(&l, &ops),
                        None => Ok(()),
                    };
                    match undone {
                        Ok(()) => remove_entry(&l),
                        Err(e) => log::error!("finishing a rewind in {}: {e}", l.dir.display()),
                    }
                }
            }
        }
    }
}

/// What a promotion's steps did, counted as a change set's summary is.
fn counts(ops: &[Op]) -> serde_json::Value {
    let (mut added, mut modified, mut deleted, mut mode) = (0u64, 0u64, 0u64, 0u64);
    for op in ops {
        match op {
            Op::Place { replace: false, .. } => added += 1,
            Op::Place { replace: true, .. } => modified += 1,
            Op::Remove { .. } => deleted += 1,
            Op::Chmod { .. } => mode += 1,
        }
    }
    serde_json::json!({
        "paths": ops.len(), "added": added, "modified": modified,
        "deleted": deleted, "mode_changed": mode,
    })
}

/// A kept layer's bytes, from its name.
fn bytes_of(entry: &Path) -> u64 {
    entry
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('-').nth(1))
        .and_then(|b| b.parse().ok())
        .unwrap_or(0)
}

/// What a crash left of removed layers.
fn remove_trash(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().as_encoded_bytes().starts_with(b".trash-") {
            crate::private_dir::remove_tree(&e.path());
        }
    }
}

/// A session's kept layers, oldest first.
fn entries(dir: &Path) -> Vec<(PathBuf, RunLayer)> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| e.path())
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|d| RunLayer::open(d.clone()).map(|l| (d, l)))
        .collect()
}

/// The session directory's lock: held while a layer is added or rewound (another process's
/// rewind or add waits, up to a few seconds).
fn lock(dir: &Path) -> io::Result<std::fs::File> {
    for _ in 0..500 {
        if let Some(f) = crate::private_dir::lock_dir(dir, "lock", true)? {
            return Ok(f);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("{} stayed locked by another process", dir.display()),
    ))
}

fn make_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// When the layer was promoted (its mark's time; now, if it has none): a layer a dead host
/// promoted and the next tool adds sorts where it was promoted, not where it was found.
fn promoted_at(layer: &RunLayer) -> u128 {
    std::fs::metadata(layer.dir.join(super::layer::PROMOTED))
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| std::time::SystemTime::now())
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// Removes a kept layer: renamed out of the listing first, so a crash while it is removed
/// leaves no half layer that looks rewindable (recovery removes what is left).
fn remove_entry(layer: &RunLayer) {
    let trash = layer.dir.with_file_name(format!(
        ".trash-{}",
        layer
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    match std::fs::rename(&layer.dir, &trash) {
        Ok(()) => crate::private_dir::remove_tree(&trash),
        Err(_) => layer.remove(),
    }
}
