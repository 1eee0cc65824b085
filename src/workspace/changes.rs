//! A staged run's change set: what its upper layers hold, read against the real tree. An
//! overlay's upper layer holds every file the run wrote (copied up whole), every directory it
//! made, a whiteout (a character device 0:0) for each path it removed, and marks a directory
//! it removed and made again opaque.

use serde::Serialize;
use std::fs::Metadata;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What happened to one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// It did not exist before.
    Added,
    /// Its content (a symlink's target) or type changed.
    Modified,
    /// It was removed.
    Deleted,
    /// Only its permission bits changed.
    ModeChanged,
    /// Written with the same content and mode (its times changed).
    Touched,
    /// A device, FIFO or socket the run made: listed, never promoted.
    Special,
}

/// What a changed path is (after the run, or before it for a deletion).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket.
    Special,
}

impl EntryType {
    fn of(m: &Metadata) -> EntryType {
        let t = m.file_type();
        if t.is_file() {
            EntryType::File
        } else if t.is_dir() {
            EntryType::Dir
        } else if t.is_symlink() {
            EntryType::Symlink
        } else {
            EntryType::Special
        }
    }
}

/// One changed path of a staged run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The path in the real tree.
    pub path: PathBuf,
    /// What happened to it.
    pub kind: ChangeKind,
    /// What it is now (what it was, for a deletion).
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// Its size now, for a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Its size before, for a modified file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_size: Option<u64>,
    /// Its permission bits now, where they changed or it is new.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Its permission bits before, where they changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_mode: Option<u32>,
    /// Where it points, for a symlink.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<PathBuf>,
}

/// What promoting does with one path, in order. `rel` is relative to working dir `root`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
    /// The upper layer's path takes the real one's place: swapped with what is there
    /// (`replace`; the old one is left in the layer, its backup) or moved into an empty
    /// place. `ino` is the layer's inode, which tells whether it was done.
    Place {
        root: usize,
        rel: PathBuf,
        replace: bool,
        ino: u64,
        /// A directory that replaces the real one whole (its opaque mark goes first).
        opaque: bool,
        /// The layer's path is a directory (what beneath it is placed with it).
        #[serde(default)]
        dir: bool,
        /// The layer's modification time (seconds, nanoseconds): with `ino`, what tells
        /// a rewind that the real path is still the one placed.
        #[serde(default)]
        mtime: (i64, i64),
    },
    /// The real path goes, moved into the layer as its backup; `ino` is the real inode.
    Remove { root: usize, rel: PathBuf, ino: u64 },
    /// A directory of both trees whose permission bits changed.
    Chmod {
        root: usize,
        rel: PathBuf,
        before: u32,
        after: u32,
    },
}

/// A staged run's change set: the paths it changed, and how promoting applies them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// Every changed path, in tree order.
    pub changes: Vec<Change>,
    /// Bytes of the files it wrote (what its layers hold).
    pub bytes: u64,
    pub(crate) ops: Vec<Op>,
    /// Special files in the layers, removed before promotion.
    pub(crate) specials: Vec<PathBuf>,
}

impl ChangeSet {
    /// Counts by kind: `{"added": 3, "modified": 1, ...}` (kinds with none left out), and the
    /// bytes.
    pub fn summary(&self) -> serde_json::Value {
        let mut counts = serde_json::Map::new();
        for c in &self.changes {
            let k = serde_json::to_value(c.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let n = counts.get(&k).and_then(|v| v.as_u64()).unwrap_or(0);
            counts.insert(k, (n + 1).into());
        }
        counts.insert("paths".into(), self.changes.len().into());
        counts.insert("bytes".into(), self.bytes.into());
        serde_json::Value::Object(counts)
    }
}

/// The overlay's marks of a directory that replaces the lower one (a mount as root writes
/// `trusted.*`, one in a user namespace `user.*`).
const OPAQUE: [&std::ffi::CStr; 2] = [c"trusted.overlay.opaque", c"user.overlay.opaque"];

/// Whether `upper` (a directory of a layer) is marked opaque.
pub(crate) fn is_opaque(upper: &Path) -> bool {
    OPAQUE
        .iter()
        .any(|n| crate::sys::fs::xattr_is(upper, n, b"y"))
}

/// Removes a directory's opaque marks (before it takes a real directory's place).
pub(crate) fn clear_opaque(upper: &Path) -> io::Result<()> {
    for n in OPAQUE {
        crate::sys::fs::remove_xattr(upper, n)?;
    }
    Ok(())
}

fn is_whiteout(m: &Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

fn perm(m: &Metadata) -> u32 {
    m.mode() & 0o7777
}

/// Reads the change set of one working dir: `upper` is its layer, `real` the directory.
pub(crate) fn read(root: usize, real: &Path, upper: &Path, into: &mut ChangeSet) -> io::Result<()> {
    let mut walk = Walk {
        root,
        real,
        upper,
        out: into,
    };
    walk.merged(Path::new(""))
}

struct Walk<'a> {
    root: usize,
    real: &'a Path,
    upper: &'a Path,
    out: &'a mut ChangeSet,
}

impl Walk<'_> {
    fn change(&self, rel: &Path, kind: ChangeKind, m: &Metadata) -> Change {
        change_at(self.real.join(rel), kind, m, &self.upper.join(rel))
    }

    /// A directory of both trees: what its upper side holds, entry by entry.
    fn merged(&mut self, rel: &Path) -> io::Result<()> {
        for name in sorted_names(&self.upper.join(rel))? {
            let rel = rel.join(&name);
            let up = std::fs::symlink_metadata(self.upper.join(&rel))?;
            let low = lstat_opt(&self.real.join(&rel))?;
            self.entry(&rel, &up, low.as_ref())?;
        }
        Ok(())
    }

    fn entry(&mut self, rel: &Path, up: &Metadata, low: Option<&Metadata>) -> io::Result<()> {
        let root = self.root;
        if is_whiteout(up) {
            if let Some(low) = low {
                self.deleted(rel, low)?;
                self.out.ops.push(Op::Remove {
                    root,
                    rel: rel.to_owned(),
                    ino: low.ino(),
                });
            }
            return Ok(());
        }
        let kind = EntryType::of(up);
        if kind == EntryType::Special {
            self.out.specials.push(self.upper.join(rel));
            self.out
                .changes
                .push(self.change(rel, ChangeKind::Special, up));
            return Ok(());
        }
        if kind == EntryType::Dir {
            return self.dir(rel, up, low);
        }
        // A file or symlink: it takes the real path's place whole.
        let what = match low {
            None => ChangeKind::Added,
            Some(low) => self.compare(rel, up, low)?,
        };
        if kind == EntryType::File {
            self.out.bytes += up.size();
        }
        let mut c = self.change(rel, what, up);
        if let Some(low) = low {
            if EntryType::of(low) == EntryType::File && what == ChangeKind::Modified {
                c.before_size = Some(low.size());
            }
            if perm(low) != perm(up) && kind != EntryType::Symlink {
                c.before_mode = Some(perm(low));
            }
        }
        self.out.changes.push(c);
        self.out.ops.push(Op::Place {
            root,
            rel: rel.to_owned(),
            replace: low.is_some(),
            ino: up.ino(),
            opaque: false,
            dir: up.is_dir(),
            mtime: (up.mtime(), up.mtime_nsec()),
        });
        Ok(())
    }

    fn dir(&mut self, rel: &Path, up: &Metadata, low: Option<&Metadata>) -> io::Result<()> {
        let root = self.root;
        match low {
            Some(low) if low.is_dir() && !is_opaque(&self.upper.join(rel)) => {
                if perm(low) != perm(up) {
                    let mut c = self.change(rel, ChangeKind::ModeChanged, up);
                    c.before_mode = Some(perm(low));
                    self.out.changes.push(c);
                    self.out.ops.push(Op::Chmod {
                        root,
                        rel: rel.to_owned(),
                        before: perm(low),
                        after: perm(up),
                    });
                }
                self.merged(rel)
            }
            // New, or replacing the real path whole (a directory removed and made again, or
            // something else): every path beneath is the layer's.
            _ => {
                let opaque = low.is_some_and(Metadata::is_dir);
                if let Some(low) = low {
                    self.deleted(rel, low)?;
                }
                self.out
                    .changes
                    .push(self.change(rel, ChangeKind::Added, up));
                self.added_beneath(rel)?;
                self.out.ops.push(Op::Place {
                    root,
                    rel: rel.to_owned(),
                    replace: low.is_some(),
                    ino: up.ino(),
                    opaque,
                    dir: up.is_dir(),
                    mtime: (up.mtime(), up.mtime_nsec()),
                });
                Ok(())
            }
        }
    }

    /// Every path beneath a new directory of the layer, as added.
    fn added_beneath(&mut self, rel: &Path) -> io::Result<()> {
        for name in sorted_names(&self.upper.join(rel))? {
            let rel = rel.join(&name);
            let up = std::fs::symlink_metadata(self.upper.join(&rel))?;
            match EntryType::of(&up) {
                // A whiteout beneath a directory that replaces the real one is meaningless.
                EntryType::Special if is_whiteout(&up) => {
                    self.out.specials.push(self.upper.join(&rel));
                }
                EntryType::Special => {
                    self.out.specials.push(self.upper.join(&rel));
                    self.out
                        .changes
                        .push(self.change(&rel, ChangeKind::Special, &up));
                }
                EntryType::Dir => {
                    self.out
                        .changes
                        .push(self.change(&rel, ChangeKind::Added, &up));
                    self.added_beneath(&rel)?;
                }
                t => {
                    if t == EntryType::File {
                        self.out.bytes += up.size();
                    }
                    self.out
                        .changes
                        .push(self.change(&rel, ChangeKind::Added, &up));
                }
            }
        }
        Ok(())
    }

    /// A real path removed: it, and for a directory everything beneath, as deleted.
    fn deleted(&mut self, rel: &Path, low: &Metadata) -> io::Result<()> {
        let path = self.real.join(rel);
        let mut c = change_at(path.clone(), ChangeKind::Deleted, low, &path);
        c.mode = None;
        c.target = None;
        self.out.changes.push(c);
        if low.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<_, _>>()?;
            names.sort();
            for name in names {
                let rel = rel.join(name);
                let m = std::fs::symlink_metadata(self.real.join(&rel))?;
                self.deleted(&rel, &m)?;
            }
        }
        Ok(())
    }

    /// How a file or symlink of the layer differs from the real one.
    fn compare(&self, rel: &Path, up: &Metadata, low: &Metadata) -> io::Result<ChangeKind> {
        let (u, l) = (self.upper.join(rel), self.real.join(rel));
        let same = match (EntryType::of(up), EntryType::of(low)) {
            (EntryType::File, EntryType::File) => up.size() == low.size() && same_bytes(&u, &l)?,
            (EntryType::Symlink, EntryType::Symlink) => {
                std::fs::read_link(&u)? == std::fs::read_link(&l)?
            }
            _ => false,
        };
        Ok(match (same, perm(up) == perm(low)) {
            (false, _) => ChangeKind::Modified,
            (true, false) if EntryType::of(up) != EntryType::Symlink => ChangeKind::ModeChanged,
            (true, _) => ChangeKind::Touched,
        })
    }
}

/// A change of `path`, described by `m`, the metadata of `at` (where a symlink's target is
/// read: the layer's path, or the real one for a deletion).
fn change_at(path: PathBuf, kind: ChangeKind, m: &Metadata, at: &Path) -> Change {
    let entry_type = EntryType::of(m);
    Change {
        target: match (kind, entry_type) {
            (ChangeKind::Deleted, _) => None,
            (_, EntryType::Symlink) => std::fs::read_link(at).ok(),
            _ => None,
        },
        path,
        kind,
        entry_type,
        size: (entry_type == EntryType::File).then(|| m.size()),
        before_size: None,
        mode: match (kind, entry_type) {
            (ChangeKind::Deleted, _) | (_, EntryType::Symlink) => None,
            _ => Some(perm(m)),
        },
        before_mode: None,
    }
}

/// The names in `dir`, sorted (a change set lists paths in tree order).
fn sorted_names(dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    Ok(names)
}

fn lstat_opt(p: &Path) -> io::Result<Option<Metadata>> {
    match std::fs::symlink_metadata(p) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // A path beneath something that is no directory (any more) is not there.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether two files of equal size hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> io::Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
