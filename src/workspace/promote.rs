//! Applying a change set to the real tree, and taking it back. Each step is one rename: a
//! path of the layer swapped with the real one (`RENAME_EXCHANGE`: the old one lands in the
//! layer, its backup), moved into an empty place, or a real path moved into the layer. The
//! steps are written to the layer's journal (synced) before the first is taken, and each can
//! tell from the inodes whether it was taken, so a promotion cut short anywhere is undone
//! whole from the journal, and one that finished is marked so.

use super::changes::{self, ChangeSet, Op};
use super::layer::{self, RunLayer};
use crate::sys::fs::{rename2, Rename};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a change set was not promoted. Nothing of it was applied.
#[derive(Debug)]
#[non_exhaustive]
pub enum PromoteError {
    /// Paths the run changed were changed in the real tree too while it ran (or since).
    Conflict {
        /// Each path, and what happened to it.
        conflicts: Vec<Conflict>,
    },
    /// The layer is on another filesystem (or mount) than a working dir, so its files cannot
    /// be renamed into place.
    CrossDevice {
        /// The working dir.
        root: PathBuf,
    },
    /// The filesystem refused a step (every step taken was undone).
    Io {
        /// The path at which it failed.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
}

/// One path in conflict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    /// The real path.
    pub path: PathBuf,
    /// What someone else did to it.
    pub why: String,
}

impl std::fmt::Display for PromoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromoteError::Conflict { conflicts } => {
                write!(f, "not promoted: the real tree changed beneath the run: ")?;
                write_conflicts(f, conflicts)?;
                write!(f, " (nothing was applied)")
            }
            PromoteError::CrossDevice { root } => write!(
                f,
                "not promoted: the staging directory is on another filesystem than {}; set \
                 TMPDIR to a directory on the working dirs' filesystem (nothing was applied)",
                root.display()
            ),
            PromoteError::Io { path, source } => write!(
                f,
                "not promoted: {}: {source} (every step taken was undone)",
                path.display()
            ),
        }
    }
}

/// `conflicts` in a message: the first ten, and how many more.
pub(crate) fn write_conflicts(
    f: &mut std::fmt::Formatter<'_>,
    conflicts: &[Conflict],
) -> std::fmt::Result {
    for (i, c) in conflicts.iter().take(10).enumerate() {
        if i > 0 {
            write!(f, "; ")?;
        }
        write!(f, "{} {}", c.path.display(), c.why)?;
    }
    if conflicts.len() > 10 {
        write!(f, "; and {} more", conflicts.len() - 10)?;
    }
    Ok(())
}

impl std::error::Error for PromoteError {}

impl PromoteError {
    /// The stable kind: `conflict`, `cross_device` or `io`.
    pub fn kind(&self) -> &'static str {
        match self {
            PromoteError::Conflict { .. } => "conflict",
            PromoteError::CrossDevice { .. } => "cross_device",
            PromoteError::Io { .. } => "io",
        }
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> PromoteError + '_ {
    move |source| PromoteError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the journal holds: the steps, in order.
#[derive(serde::Serialize, serde::Deserialize)]
struct Journal {
    ops: Vec<Op>,
}

fn real(layer: &RunLayer, root: usize, rel: &Path) -> PathBuf {
    layer.record.roots[root].join(rel)
}

/// The paths of the change set that someone else changed since the run started.
fn conflicts(layer: &RunLayer, set: &ChangeSet) -> Vec<Conflict> {
    let (secs, nanos) = layer.record.started;
    // Both times are the filesystem's. A change stamped with the very tick the run started
    // in is not seen: counting it would refuse the next run over what a run just promoted.
    let after_start = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec()) > (secs, nanos);
    let mut out = Vec::new();
    for op in &set.ops {
        let (path, why) = match op {
            Op::Place {
                root, rel, replace, ..
            } => {
                let path = real(layer, *root, rel);
                let why = match (std::fs::symlink_metadata(&path), replace) {
                    (Ok(_), false) => Some("was created"),
                    (Err(_), true) => Some("was removed"),
                    (Ok(m), true) if after_start(&m) => Some("was changed"),
                    _ => None,
                };
                (path, why)
            }
            Op::Remove { root, rel, ino } => {
                let path = real(layer, *root, rel);
                let why = match std::fs::symlink_metadata(&path) {
                    Err(_) => Some("was removed"),
                    Ok(m) if m.ino() != *ino => Some("was replaced"),
                    Ok(m) if after_start(&m) => Some("was changed"),
                    Ok(_) => None,
                };
                (path, why)
            }
            Op::Chmod {
                root, rel, before, ..
            } => {
                let path = real(layer, *root, rel);
                let why = match std::fs::symlink_metadata(&path) {
                    Err(_) => Some("was removed"),
                    Ok(m) if m.mode() & 0o7777 != *before => Some("had its mode changed"),
                    Ok(_) => None,
                };
                (path, why)
            }
        };
        if let Some(why) = why {
            out.push(Conflict {
                path,
                why: format!("{why} while the run was staged"),
            });
        }
    }
    out
}

/// Applies `set` (read from `layer`) to the real tree: checked for conflicts, prepared (the
/// run's special files dropped, opaque marks cleared, ownership given to `owners` where set),
/// journaled, applied step by step; any step that fails undoes the ones before it.
///
/// # Errors
/// [`PromoteError`]; nothing of the change set is applied then.
pub(crate) fn promote(
    layer: &RunLayer,
    set: &ChangeSet,
    owners: &[Option<(u32, u32)>],
) -> Result<(), PromoteError> {
    let found = conflicts(layer, set);
    if !found.is_empty() {
        return Err(PromoteError::Conflict { conflicts: found });
    }
    for (k, root) in layer.record.roots.iter().enumerate() {
        let (a, b) = (
            std::fs::metadata(root).map_err(io_at(root))?,
            std::fs::metadata(layer.upper(k)).map_err(io_at(root))?,
        );
        if a.dev() != b.dev() {
            return Err(PromoteError::CrossDevice { root: root.clone() });
        }
    }
    prepare(layer, set, owners)?;
    let record = layer.dir.join(layer::RECORD);
    layer.make_durable().map_err(io_at(&record))?;
    let journal = serde_json::to_vec(&Journal {
        ops: set.ops.clone(),
    })
    .map_err(|e| PromoteError::Io {
        path: layer.dir.join(layer::JOURNAL),
        source: io::Error::other(e),
    })?;
    let at = layer.dir.join(layer::JOURNAL);
    layer::write_synced(&at, &journal).map_err(io_at(&at))?;
    super::seam("journaled");
    for (i, op) in set.ops.iter().enumerate() {
        if let Err(e) = apply(layer, i, op) {
            // The step's own error is the one to report; an undo's failure is logged.
            let _ = undo(layer, &set.ops[..i]);
            let _ = std::fs::remove_file(&at);
            return Err(e);
        }
        if i == set.ops.len() / 2 {
            super::seam("applying");
        }
    }
    let done = layer.dir.join(layer::PROMOTED);
    layer.mark(layer::PROMOTED).map_err(|e| {
        let _ = undo(layer, &set.ops);
        let _ = std::fs::remove_file(&at);
        PromoteError::Io {
            path: done,
            source: e,
        }
    })?;
    super::seam("promoted");
    Ok(())
}

/// Gets the layer ready: nothing here changes the real tree.
fn prepare(
    layer: &RunLayer,
    set: &ChangeSet,
    owners: &[Option<(u32, u32)>],
) -> Result<(), PromoteError> {
    for s in &set.specials {
        match std::fs::remove_file(s) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(PromoteError::Io {
                    path: s.clone(),
                    source: e,
                })
            }
        }
    }
    for op in &set.ops {
        if let Op::Place {
            root,
            rel,
            opaque,
            dir,
            ..
        } = op
        {
            let src = layer.upper(*root).join(rel);
            if *opaque {
                changes::clear_opaque(&src).map_err(io_at(&src))?;
            }
            if let Some(Some((uid, gid))) = owners.get(*root) {
                chown_tree(&src, *dir, *uid, *gid).map_err(io_at(&src))?;
            }
        }
    }
    Ok(())
}

/// Gives `p` and everything beneath it to `uid`:`gid` (a root host's run wrote them as the
/// host; the real tree's files are its owner's).
/// `dir`: whether `p` is a directory (known already, so a file costs one call).
fn chown_tree(p: &Path, dir: bool, uid: u32, gid: u32) -> io::Result<()> {
    crate::sys::fs::lchown(p, uid, gid)?;
    if dir {
        for e in std::fs::read_dir(p)? {
            let e = e?;
            chown_tree(&e.path(), e.file_type()?.is_dir(), uid, gid)?;
        }
    }
    Ok(())
}

fn apply(layer: &RunLayer, i: usize, op: &Op) -> Result<(), PromoteError> {
    match op {
        Op::Place {
            root, rel, replace, ..
        } => {
            let (src, dst) = (layer.upper(*root).join(rel), real(layer, *root, rel));
            let how = if *replace {
                Rename::Exchange
            } else {
                Rename::NoReplace
            };
            rename2(&src, &dst, how).map_err(io_at(&dst))
        }
        Op::Remove { root, rel, .. } => {
            let (src, dst) = (real(layer, *root, rel), layer.removed(*root, i));
            rename2(&src, &dst, Rename::NoReplace).map_err(io_at(&src))
        }
        Op::Chmod {
            root, rel, after, ..
        } => {
            use std::os::unix::fs::PermissionsExt;
            let p = real(layer, *root, rel);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*after)).map_err(io_at(&p))
        }
    }
}

fn ino(p: &Path) -> Option<u64> {
    std::fs::symlink_metadata(p).ok().map(|m| m.ino())
}

/// Takes back each step of `ops` that was taken, last first. Each tells from the inodes
/// whether it was: undoing twice, or a step never taken, changes nothing. A placed file
/// someone edited since (its modification time moved) is left as they made it. Every step
/// is tried; the first that fails is the error.
pub(crate) fn undo(layer: &RunLayer, ops: &[Op]) -> io::Result<()> {
    let mut first = None;
    for (i, op) in ops.iter().enumerate().rev() {
        let r = match op {
            Op::Place {
                root,
                rel,
                replace,
                ino: layer_ino,
                mtime,
                dir,
                ..
            } => {
                let (src, dst) = (layer.upper(*root).join(rel), real(layer, *root, rel));
                let Ok(now) = std::fs::symlink_metadata(&dst) else {
                    continue;
                };
                // (0, 0): a journal of a version that did not record the time.
                let edited = !*dir && *mtime != (0, 0) && (now.mtime(), now.mtime_nsec()) != *mtime;
                if now.ino() != *layer_ino || edited {
                    continue;
                }
                if *replace {
                    rename2(&src, &dst, Rename::Exchange)
                } else {
                    rename2(&dst, &src, Rename::NoReplace)
                }
            }
            Op::Remove {
                root,
                rel,
                ino: real_ino,
            } => {
                let (backup, dst) = (layer.removed(*root, i), real(layer, *root, rel));
                if ino(&backup) != Some(*real_ino) {
                    continue;
                }
                rename2(&backup, &dst, Rename::NoReplace)
            }
            Op::Chmod {
                root,
                rel,
                before,
                after,
            } => {
                use std::os::unix::fs::PermissionsExt;
                let p = real(layer, *root, rel);
                match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.mode() & 0o7777 == *after => {
                        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*before))
                    }
                    _ => continue,
                }
            }
        };
        if let Err(e) = r {
            log::error!("undoing a promotion step in {}: {e}", layer.dir.display());
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// The steps of a layer's journal (a promoted layer's: what taking it back undoes).
pub(crate) fn journal_ops(layer: &RunLayer) -> Option<Vec<Op>> {
    let bytes = std::fs::read(layer.dir.join(layer::JOURNAL)).ok()?;
    serde_json::from_slice::<Journal>(&bytes)
        .ok()
        .map(|j| j.ops)
}

/// The paths of a promoted layer's `ops` that someone else changed since it was promoted,
/// each looked at once: `seen` holds the paths a newer promotion (looked at first) answers
/// for. A placed file or symlink is the one placed while it is the same inode with the same
/// modification time (which renames and chown leave alone; a change time would move with
/// each promotion and rewind); a directory is looked at through the paths beneath it.
pub(crate) fn changed_since(
    layer: &RunLayer,
    ops: &[Op],
    seen: &mut std::collections::HashSet<PathBuf>,
) -> Vec<Conflict> {
    let promoted = std::fs::metadata(layer.dir.join(layer::PROMOTED))
        .and_then(|m| m.modified())
        .ok();
    let mut out = Vec::new();
    for op in ops {
        let (root, rel) = match op {
            Op::Place { root, rel, .. }
            | Op::Remove { root, rel, .. }
            | Op::Chmod { root, rel, .. } => (*root, rel),
        };
        let path = real(layer, root, rel);
        if !seen.insert(path.clone()) {
            continue;
        }
        let now = std::fs::symlink_metadata(&path).ok();
        let why = match (op, &now) {
            (Op::Place { .. }, None) => Some("was removed"),
            (Op::Place { ino, .. }, Some(m)) if m.ino() != *ino => Some("was replaced"),
            (Op::Place { mtime, .. }, Some(m))
                if !m.is_dir() && (m.mtime(), m.mtime_nsec()) != *mtime =>
            {
                Some("was changed")
            }
            (Op::Remove { .. }, Some(_)) => Some("was created"),
            (Op::Chmod { .. }, None) => Some("was removed"),
            (Op::Chmod { after, .. }, Some(m)) if m.mode() & 0o7777 != *after => {
                Some("had its mode changed")
            }
            _ => None,
        };
        if let Some(why) = why {
            out.push(Conflict {
                path,
                why: format!("{why} since the change set was promoted"),
            });
            continue;
        }
        // A directory it made is taken back whole: nothing in it may be newer than it.
        if let (Op::Place { dir: true, .. }, Some(promoted)) = (op, promoted) {
            newer_beneath(&path, &path, promoted, seen, &mut out);
        }
    }
    out
}

/// What beneath `dir` (a directory a promotion placed) was made or edited after `promoted`,
/// leaving out what a newer promotion answers for (`seen`, and what lies beneath it).
/// Creation times (which renames keep) tell what someone made; modification times what
/// someone edited; a directory's own modification time moves with what is made in it.
fn newer_beneath(
    top: &Path,
    dir: &Path,
    promoted: std::time::SystemTime,
    seen: &std::collections::HashSet<PathBuf>,
    out: &mut Vec<Conflict>,
) {
    let answered = |p: &Path| {
        p.ancestors()
            .take_while(|a| *a != top)
            .any(|a| seen.contains(a))
    };
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if answered(&p) {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let made = m.created().is_ok_and(|t| t > promoted);
        let edited = !m.is_dir() && m.modified().is_ok_and(|t| t > promoted);
        if made || edited {
            out.push(Conflict {
                path: p,
                why: format!(
                    "was {} since the change set that made its directory was promoted",
                    if made { "made" } else { "changed" }
                ),
            });
        } else if m.is_dir() {
            newer_beneath(top, &p, promoted, seen, out);
        }
    }
}

/// What recovery does with a layer whose promotion a dead host left: finished (marked), it
/// stays applied; cut short, every step taken is undone from the journal. `true` when the
/// change set is in place.
pub(crate) fn recover(layer: &RunLayer) -> bool {
    if layer.has(layer::PROMOTED) {
        return true;
    }
    let at = layer.dir.join(layer::JOURNAL);
    let Ok(bytes) = std::fs::read(&at) else {
        return false;
    };
    // A journal torn before its rename never existed: nothing was applied after it.
    if let Ok(j) = serde_json::from_slice::<Journal>(&bytes) {
        let _ = undo(layer, &j.ops);
    }
    let _ = std::fs::remove_file(&at);
    false
}
