//! File operations through [`Roots`]: every open goes beneath a root fd.

use super::confine::{ConfineError, Located, Roots};
use crate::sys::fs::{fchmod, fstat, lstatat, openat, renameat, unlinkat};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Why a file operation failed; each message is written for a model to act on.
#[derive(Debug)]
pub(crate) enum FsError {
    Confine(ConfineError),
    NotAFile {
        path: String,
    },
    NotADirectory {
        path: String,
    },
    TooLarge {
        path: String,
        size: u64,
        cap: u64,
    },
    Symlink {
        path: String,
    },
    HardLinked {
        path: String,
        links: u64,
    },
    Io {
        path: String,
        op: &'static str,
        source: io::Error,
    },
}

impl FsError {
    /// The failure's kind for programs.
    pub fn kind(&self) -> crate::tools::ToolErrorKind {
        use crate::tools::ToolErrorKind as K;
        match self {
            FsError::Confine(c) => c.kind(),
            FsError::NotAFile { .. } | FsError::NotADirectory { .. } => K::WrongKind,
            FsError::TooLarge { .. } => K::TooLarge,
            FsError::Symlink { .. } | FsError::HardLinked { .. } => K::NotAllowed,
            FsError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ELOOP) => K::SymlinkLoop,
                Some(libc::ENOTDIR | libc::EISDIR) => K::WrongKind,
                Some(libc::ENOENT) => K::NotFound,
                _ => K::Io,
            },
        }
    }

    pub fn recoverable(&self) -> bool {
        match self {
            FsError::Confine(c) => c.recoverable(),
            FsError::NotAFile { .. } | FsError::NotADirectory { .. } | FsError::TooLarge { .. } => {
                true
            }
            FsError::Symlink { .. } | FsError::HardLinked { .. } => false,
            FsError::Io { .. } => true,
        }
    }
}

impl From<ConfineError> for FsError {
    fn from(e: ConfineError) -> Self {
        FsError::Confine(e)
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsError::Confine(e) => e.fmt(f),
            FsError::NotAFile { path } => write!(f, "{path} is not a regular file"),
            FsError::NotADirectory { path } => write!(f, "{path} is not a directory"),
            FsError::TooLarge { path, size, cap } => write!(
                f,
                "{path} is {size} bytes, over the read cap of {cap} bytes; read a smaller file"
            ),
            FsError::Symlink { path } => write!(
                f,
                "{path} is a symlink; refusing to write through it, write to its target's path instead"
            ),
            FsError::HardLinked { path, links } => write!(
                f,
                "{path} has {links} hard links; refusing to modify a file that other paths share"
            ),
            FsError::Io { path, op, source } => write!(f, "{op} {path} failed: {source}"),
        }
    }
}

fn io<'a>(path: &'a Located, op: &'static str) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |source| FsError::Io {
        path: path.request().to_owned(),
        op,
        source,
    }
}

fn is_kind(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// Reads a regular file (following symlinks that stay inside the root), refusing files over
/// `cap` bytes.
pub(crate) fn read(roots: &Roots, loc: &Located, cap: u64) -> Result<Vec<u8>, FsError> {
    let fd = roots.open_at(loc, libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK, 0)?;
    let st = fstat(fd.as_raw_fd()).map_err(io(loc, "stat"))?;
    if !is_kind(&st, libc::S_IFREG) {
        return Err(FsError::NotAFile {
            path: loc.request().to_owned(),
        });
    }
    let size = st.st_size as u64;
    if size > cap {
        return Err(FsError::TooLarge {
            path: loc.request().to_owned(),
            size,
            cap,
        });
    }
    let mut file = std::fs::File::from(fd);
    let mut buf = Vec::with_capacity(size as usize);
    if size > 0 {
        // The bytes the file held when it was stat'ed: one read for a whole file, and a
        // file that grows meanwhile can never push the read past the cap.
        // (`Take` answers the end-of-file probe itself, without a syscall.)
        (&mut file)
            .take(size)
            .read_to_end(&mut buf)
            .map_err(io(loc, "read"))?;
        return Ok(buf);
    }
    // A size of 0 may be a file whose size the kernel does not report (procfs, sysfs): read
    // to its end, never more than the cap.
    (&mut file)
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(io(loc, "read"))?;
    if buf.len() as u64 > cap {
        return Err(FsError::TooLarge {
            path: loc.request().to_owned(),
            size: buf.len() as u64,
            cap,
        });
    }
    Ok(buf)
}

/// One directory entry's kind, as `list` reports it.
pub(crate) fn kind_name(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_fifo() || ft.is_socket() || ft.is_block_device() || ft.is_char_device() {
        "special"
    } else {
        "other"
    }
}

/// Lists a directory: sorted `(name, kind)` pairs. Symlinks are listed as such, not followed.
pub(crate) fn list(roots: &Roots, loc: &Located) -> Result<Vec<(String, &'static str)>, FsError> {
    let fd = roots
        .open_at(loc, libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .map_err(|e| match e {
            ConfineError::Io { ref source, .. } if source.raw_os_error() == Some(libc::ENOTDIR) => {
                FsError::NotADirectory {
                    path: loc.request().to_owned(),
                }
            }
            other => FsError::Confine(other),
        })?;
    // Our own fd through /proc: the directory is already confined, this only reads it.
    let dir =
        std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io(loc, "list"))?;
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry.map_err(io(loc, "list"))?;
        let ft = entry.file_type().map_err(io(loc, "list"))?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            kind_name(&ft),
        ));
    }
    out.sort();
    drop(fd);
    Ok(out)
}

/// Whether the path exists inside its root (following symlinks that stay inside).
pub(crate) fn exists(roots: &Roots, loc: &Located) -> Result<bool, FsError> {
    match roots.open_at(loc, libc::O_PATH, 0) {
        Ok(_) => Ok(true),
        Err(ConfineError::NotFound { .. }) => Ok(false),
        Err(ConfineError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOTDIR) => {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// What stands at the entry a write would replace.
fn existing_entry(dir: RawFd, name: &OsStr, loc: &Located) -> Result<Option<libc::stat>, FsError> {
    match lstatat(dir, name) {
        Ok(st) => {
            let path = loc.request().to_owned();
            if is_kind(&st, libc::S_IFLNK) {
                return Err(FsError::Symlink { path });
            }
            if !is_kind(&st, libc::S_IFREG) {
                return Err(FsError::NotAFile { path });
            }
            if st.st_nlink > 1 {
                return Err(FsError::HardLinked {
                    path,
                    links: st.st_nlink as _,
                });
            }
            Ok(Some(st))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(io(loc, "stat")(e)),
    }
}

/// Replaces (or creates) the file with `content` atomically: a temp file in the same directory,
/// written and flushed, then renamed over the entry. Readers see the old or the new content,
/// never a mix; a crash leaves at most a stray temp file, never a half-written target.
/// Refuses symlinks (including dangling ones) and files with more than one hard link.
pub(crate) fn write_atomic(roots: &Roots, loc: &Located, content: &[u8]) -> Result<(), FsError> {
    let (dir, name) = roots.open_parent(loc)?;
    let existing = existing_entry(dir.as_raw_fd(), &name, loc)?;
    // Never carry setuid/setgid over: the rewritten file belongs to whoever runs correx.
    let mode = existing.map(|st| st.st_mode & 0o1777).unwrap_or(0o644);
    let tmp = temp_name(&name);
    let fd = openat(
        dir.as_raw_fd(),
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        mode,
    )
    .map_err(io(loc, "create temp file for"))?;
    let written = fill(fd, mode, content).and_then(|()| renameat(dir.as_raw_fd(), &tmp, &name));
    if let Err(e) = written {
        let _ = unlinkat(dir.as_raw_fd(), &tmp);
        return Err(io(loc, "write")(e));
    }
    Ok(())
}

fn fill(fd: OwnedFd, mode: u32, content: &[u8]) -> io::Result<()> {
    // The exact mode, which the umask may have narrowed.
    fchmod(fd.as_raw_fd(), mode)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(content)?;
    file.sync_data()
}

fn temp_name(name: &OsStr) -> OsString {
    let r = crate::ids::random_bytes::<8>();
    let suffix: String = r.iter().map(|b| format!("{b:02x}")).collect();
    let mut t = OsString::from(".");
    // Keep the name short enough for NAME_MAX even when the target's name is long.
    let bytes = name.as_bytes();
    t.push(OsStr::from_bytes(&bytes[..bytes.len().min(200)]));
    t.push(format!(".correx-tmp-{suffix}"));
    t
}

/// Removes the entry (a symlink is removed, never its target). Directories are refused.
pub(crate) fn delete(roots: &Roots, loc: &Located) -> Result<(), FsError> {
    let (dir, name) = roots.open_parent(loc)?;
    match lstatat(dir.as_raw_fd(), &name) {
        Ok(st) if is_kind(&st, libc::S_IFDIR) => Err(FsError::NotAFile {
            path: loc.request().to_owned(),
        }),
        Ok(_) => unlinkat(dir.as_raw_fd(), &name).map_err(io(loc, "delete")),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Err(ConfineError::NotFound {
            path: loc.request().to_owned(),
        }
        .into()),
        Err(e) => Err(io(loc, "stat")(e)),
    }
}
