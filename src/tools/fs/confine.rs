//! Confinement by file descriptors: every allowed root is opened once as a directory fd, and
//! every request is resolved beneath it by the kernel (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS`) or, where `openat2` is missing, by a component-by-component walk that
//! never follows a link out of the root. No path is checked and then opened by name, so a
//! symlink swapped in between cannot redirect an open.

use crate::sys::fs::{lstatat, openat, openat2_beneath, openat2_resolve, readlinkat};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

/// Most symlinks one resolution follows, as the kernel's own limit.
const MAX_SYMLINK_HOPS: u32 = 40;

/// Why a path was refused or could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfineError {
    /// No allowed roots are configured, so every path is denied.
    NoRoots,
    /// The request path is empty, holds a NUL byte, or names no file.
    InvalidPath {
        /// The path as requested.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An absolute path that lies under no allowed root.
    OutsideRoots {
        /// The path as requested.
        path: String,
    },
    /// Resolving the path would leave its root (`..` out of it, an absolute or escaping
    /// symlink, a magic link).
    EscapesRoot {
        /// The path as requested.
        path: String,
        /// The root it was resolved under.
        root: PathBuf,
    },
    /// Resolving the path met a symlink loop inside its root (too many symlinks in a row).
    SymlinkLoop {
        /// The path as requested.
        path: String,
    },
    /// The path (or a directory on the way) does not exist.
    NotFound {
        /// The path as requested.
        path: String,
    },
    /// Any other system error.
    Io {
        /// The path as requested.
        path: String,
        /// The system's error.
        source: io::Error,
    },
}

impl fmt::Display for ConfineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfineError::NoRoots => {
                f.write_str("no allowed paths are configured, so every path is denied")
            }
            ConfineError::InvalidPath { path, reason } => {
                write!(f, "invalid path {path:?}: {reason}")
            }
            ConfineError::OutsideRoots { path } => {
                write!(f, "{path} is outside the allowed paths")
            }
            // The root is not named: the message reaches the model, which sees paths relative
            // to their root, never the host's layout.
            ConfineError::EscapesRoot { path, .. } => write!(
                f,
                "{path} resolves outside its allowed root (through '..', an absolute or escaping symlink, or a magic link)"
            ),
            ConfineError::SymlinkLoop { path } => write!(
                f,
                "{path} runs into a symlink loop (too many symlinks in a row); fix the links or use another path"
            ),
            ConfineError::NotFound { path } => write!(f, "{path} does not exist"),
            ConfineError::Io { path, source } => write!(f, "{path}: {source}"),
        }
    }
}

impl std::error::Error for ConfineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfineError::Io { source, .. } => Some(source),
            ConfineError::NoRoots
            | ConfineError::InvalidPath { .. }
            | ConfineError::OutsideRoots { .. }
            | ConfineError::EscapesRoot { .. }
            | ConfineError::SymlinkLoop { .. }
            | ConfineError::NotFound { .. } => None,
        }
    }
}

impl ConfineError {
    /// Whether the model could fix the request (a path that does not exist yet, a typo);
    /// refusals (outside, escaping, no roots) are not recoverable.
    pub fn recoverable(&self) -> bool {
        match self {
            ConfineError::NotFound { .. }
            | ConfineError::InvalidPath { .. }
            | ConfineError::SymlinkLoop { .. } => true,
            ConfineError::Io { .. } => true,
            ConfineError::NoRoots
            | ConfineError::OutsideRoots { .. }
            | ConfineError::EscapesRoot { .. } => false,
        }
    }
}

impl ConfineError {
    /// The failure's kind for programs.
    pub fn kind(&self) -> crate::tools::ToolErrorKind {
        use crate::tools::ToolErrorKind as K;
        match self {
            ConfineError::NoRoots => K::NotAllowed,
            ConfineError::InvalidPath { .. } => K::InvalidRequest,
            ConfineError::OutsideRoots { .. } | ConfineError::EscapesRoot { .. } => K::Escape,
            ConfineError::SymlinkLoop { .. } => K::SymlinkLoop,
            ConfineError::NotFound { .. } => K::NotFound,
            ConfineError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOTDIR | libc::EISDIR) => K::WrongKind,
                _ => K::Io,
            },
        }
    }
}

/// How requests are resolved beneath a root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveMode {
    /// The kernel resolves (`openat2`, Linux >= 5.6).
    Openat2,
    /// A component-by-component walk with `O_NOFOLLOW`.
    Walk,
}

struct Root {
    /// As configured (absolute).
    given: PathBuf,
    /// Canonical (symlinks resolved once, at construction).
    canonical: PathBuf,
    fd: OwnedFd,
}

/// A request path located under one root: which root, and the path relative to it.
#[derive(Clone, Debug)]
pub struct Located {
    root: usize,
    rel: PathBuf,
    request: String,
}

impl Located {
    /// The path as the request gave it.
    pub fn request(&self) -> &str {
        &self.request
    }
}

/// The allowed roots, each held open as a directory fd.
pub struct Roots {
    roots: Vec<Root>,
    mode: ResolveMode,
}

impl fmt::Debug for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Roots")
            .field(
                "roots",
                &self.roots.iter().map(|r| &r.canonical).collect::<Vec<_>>(),
            )
            .field("mode", &self.mode)
            .finish()
    }
}

fn exdev() -> io::Error {
    io::Error::from_raw_os_error(libc::EXDEV)
}

/// The fallback resolver: walks `rel` beneath `root` one component at a time with
/// `O_NOFOLLOW`, splicing in relative symlink targets and refusing absolute ones and any `..`
/// that would climb above the root.
fn walk_beneath(root: RawFd, rel: &Path, mut flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let mut stack: Vec<OwnedFd> = vec![openat(
        root,
        OsStr::new("."),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?];
    let mut queue: VecDeque<OsString> = VecDeque::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => queue.push_back(n.to_os_string()),
            Component::ParentDir => queue.push_back(OsString::from("..")),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(exdev()),
        }
    }
    let mut hops = 0;
    while let Some(name) = queue.pop_front() {
        let last = queue.is_empty();
        if name == ".." {
            if stack.len() == 1 {
                return Err(exdev());
            }
            stack.pop();
            continue;
        }
        let cur = stack.last().map(|f| f.as_raw_fd()).ok_or_else(exdev)?;
        match lstatat(cur, &name) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = readlinkat(cur, &name)?;
                if target.is_absolute() {
                    return Err(exdev());
                }
                // Components drop a target's trailing "/" (or "/."), which asks for a
                // directory as the kernel reads it: when the target ends the path, so does
                // that demand.
                if last && names_a_directory(target.as_os_str()) {
                    flags |= libc::O_DIRECTORY;
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => queue.push_front(n.to_os_string()),
                        Component::ParentDir => queue.push_front(OsString::from("..")),
                        Component::CurDir => {}
                        Component::RootDir | Component::Prefix(_) => return Err(exdev()),
                    }
                }
                continue;
            }
            Ok(_) => {}
            Err(e)
                if last && e.raw_os_error() == Some(libc::ENOENT) && flags & libc::O_CREAT != 0 => {
            }
            Err(e) => return Err(e),
        }
        if last {
            // O_NOFOLLOW: if a symlink was swapped in since the lstat, refuse rather than follow.
            return openat(cur, &name, flags | libc::O_NOFOLLOW, mode);
        }
        let next = openat(
            cur,
            &name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        stack.push(next);
    }
    // The path named the directory we ended in.
    let cur = stack.last().map(|f| f.as_raw_fd()).ok_or_else(exdev)?;
    openat(cur, OsStr::new("."), flags & !libc::O_CREAT, 0)
}

pub(crate) fn openat2_supported(dir: RawFd) -> bool {
    match openat2_beneath(dir, OsStr::new("."), libc::O_PATH, 0) {
        Ok(_) => true,
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)),
    }
}

impl Roots {
    /// Opens every root once. Roots that do not exist are refused: a typo in a config must not
    /// silently deny everything. An empty list gives roots that deny every path.
    ///
    /// # Errors
    /// [`ConfineError::Io`] or [`ConfineError::NotFound`] naming the root that failed.
    pub fn open(paths: &[PathBuf]) -> Result<Roots, ConfineError> {
        Self::open_with_mode(paths, None)
    }

    /// As [`Roots::open`], forcing a resolution mode (`None`: `openat2` where the kernel has it).
    pub fn open_with_mode(
        paths: &[PathBuf],
        mode: Option<ResolveMode>,
    ) -> Result<Roots, ConfineError> {
        let mut roots = Vec::with_capacity(paths.len());
        for p in paths {
            let request = p.display().to_string();
            if !p.is_absolute() {
                return Err(ConfineError::InvalidPath {
                    path: request,
                    reason: "allowed paths must be absolute",
                });
            }
            let canonical = std::fs::canonicalize(p).map_err(|e| io_err(&request, e))?;
            let fd = openat(
                libc::AT_FDCWD,
                canonical.as_os_str(),
                libc::O_PATH | libc::O_DIRECTORY,
                0,
            )
            .map_err(|e| io_err(&request, e))?;
            roots.push(Root {
                given: p.clone(),
                canonical,
                fd,
            });
        }
        let mode = match (mode, roots.first()) {
            (Some(m), _) => m,
            (None, Some(r)) if openat2_supported(r.fd.as_raw_fd()) => ResolveMode::Openat2,
            (None, Some(_)) => ResolveMode::Walk,
            (None, None) => ResolveMode::Openat2,
        };
        Ok(Roots { roots, mode })
    }

    /// The same roots reached through other descriptors (a run's idmapped views of them), in
    /// the same order; paths are located and resolved as in `self`.
    pub(crate) fn with_fds(&self, fds: Vec<OwnedFd>) -> Roots {
        Roots {
            roots: self
                .roots
                .iter()
                .zip(fds)
                .map(|(r, fd)| Root {
                    given: r.given.clone(),
                    canonical: r.canonical.clone(),
                    fd,
                })
                .collect(),
            mode: self.mode,
        }
    }

    /// A new `O_PATH` descriptor of root `i` itself.
    pub(crate) fn open_root(&self, i: usize) -> io::Result<OwnedFd> {
        let r = self
            .roots
            .get(i)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        openat(
            r.fd.as_raw_fd(),
            OsStr::new("."),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )
    }

    /// The roots' canonical paths, in order.
    pub fn canonical_paths(&self) -> Vec<PathBuf> {
        self.roots.iter().map(|r| r.canonical.clone()).collect()
    }

    /// How this set resolves paths.
    pub fn mode(&self) -> ResolveMode {
        self.mode
    }

    /// Whether no root is configured (every path denied).
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Finds the root a request path lies under. Absolute paths must start with a root (as
    /// configured or canonical); relative paths are taken relative to the first root.
    ///
    /// # Errors
    /// [`ConfineError::NoRoots`], [`ConfineError::InvalidPath`], [`ConfineError::OutsideRoots`].
    pub fn locate(&self, request: &str) -> Result<Located, ConfineError> {
        if self.roots.is_empty() {
            return Err(ConfineError::NoRoots);
        }
        if request.is_empty() {
            return Err(ConfineError::InvalidPath {
                path: String::new(),
                reason: "the path is empty",
            });
        }
        if request.contains('\0') {
            return Err(ConfineError::InvalidPath {
                path: request.replace('\0', "\\0"),
                reason: "the path holds a NUL byte",
            });
        }
        let p = Path::new(request);
        if !p.is_absolute() {
            return Ok(Located {
                root: 0,
                rel: p.to_path_buf(),
                request: request.to_owned(),
            });
        }
        for (i, r) in self.roots.iter().enumerate() {
            for base in [&r.canonical, &r.given] {
                if let Ok(rel) = p.strip_prefix(base) {
                    return Ok(Located {
                        root: i,
                        rel: rel.to_path_buf(),
                        request: request.to_owned(),
                    });
                }
            }
        }
        Err(ConfineError::OutsideRoots {
            path: request.to_owned(),
        })
    }

    /// The root `loc` was located under. A `Located` made by another `Roots` may name a root
    /// this set does not have: that is refused, never an out-of-bounds panic.
    fn root(&self, loc: &Located) -> Result<&Root, ConfineError> {
        self.roots.get(loc.root).ok_or(ConfineError::NoRoots)
    }

    /// The real absolute path of the entry `loc` names: its parent directory resolved beneath
    /// the root (symlinks and `..` followed for real), joined with its last component. The
    /// entry itself is not followed, so a symlink there is named, not its target.
    ///
    /// # Errors
    /// As [`Roots::open_parent`].
    pub fn entry_path(&self, loc: &Located) -> Result<PathBuf, ConfineError> {
        // A path of plain names with no symlink on its way is its own real path: one kernel
        // check instead of asking /proc where the directory is.
        let plain = loc
            .rel
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
            && !names_a_directory(loc.rel.as_os_str())
            && !loc.rel.as_os_str().is_empty();
        if plain && self.mode == ResolveMode::Openat2 {
            let root = self.root(loc)?;
            let parent = match loc.rel.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.as_os_str(),
                _ => OsStr::new("."),
            };
            let no_links = openat2_resolve(
                root.fd.as_raw_fd(),
                parent,
                libc::O_PATH | libc::O_DIRECTORY,
                0,
                libc::RESOLVE_NO_SYMLINKS,
            );
            if no_links.is_ok() {
                return Ok(root.canonical.join(&loc.rel));
            }
        }
        let (dir, name) = self.open_parent(loc)?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .map_err(|e| io_err(&loc.request, e))?;
        Ok(real.join(name))
    }

    /// Opens `loc` beneath its root with `flags` (symlinks inside the root are followed).
    ///
    /// # Errors
    /// [`ConfineError::EscapesRoot`] for anything that leaves the root, [`ConfineError::NotFound`],
    /// [`ConfineError::Io`].
    pub fn open_at(&self, loc: &Located, flags: i32, mode: u32) -> Result<OwnedFd, ConfineError> {
        let root = self.root(loc)?;
        let rel: &OsStr = if loc.rel.as_os_str().is_empty() {
            OsStr::new(".")
        } else {
            loc.rel.as_os_str()
        };
        let r = match self.mode {
            ResolveMode::Openat2 => openat2_beneath(root.fd.as_raw_fd(), rel, flags, mode),
            // Path components drop a trailing "/" and "/."; the kernel reads them as "this must
            // be a directory", and so does the walk.
            ResolveMode::Walk => {
                let flags = if names_a_directory(rel) {
                    flags | libc::O_DIRECTORY
                } else {
                    flags
                };
                walk_beneath(root.fd.as_raw_fd(), Path::new(rel), flags, mode)
            }
        };
        r.map_err(|e| self.map_err(loc, e))
    }

    fn is_loop(&self, loc: &Located) -> bool {
        let Ok(root) = self.root(loc) else {
            return false;
        };
        let rel = if loc.rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            loc.rel.as_path()
        };
        matches!(
            walk_beneath(root.fd.as_raw_fd(), rel, libc::O_PATH, 0).map_err(|e| e.raw_os_error()),
            Err(Some(libc::ELOOP))
        )
    }

    /// Opens the directory that holds `loc`'s last component, and returns it with that
    /// component's name, for operations on the entry itself (create, rename, unlink).
    ///
    /// # Errors
    /// As [`Roots::open_at`]; [`ConfineError::InvalidPath`] when the path ends in `..` or names
    /// the root itself.
    pub fn open_parent(&self, loc: &Located) -> Result<(OwnedFd, OsString), ConfineError> {
        let norm = normalize(&loc.rel);
        let name = match norm.components().next_back() {
            Some(Component::Normal(n)) => n.to_os_string(),
            _ => {
                return Err(ConfineError::InvalidPath {
                    path: loc.request.clone(),
                    reason: "the path must name a file, not a directory like '..' or the root",
                })
            }
        };
        let parent = match loc.rel.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // The raw parent (not the normalized one): `a/l/../x` must resolve `l` for real.
        let raw_parent = raw_parent(&loc.rel).unwrap_or(parent);
        let ploc = Located {
            root: loc.root,
            rel: raw_parent,
            request: loc.request.clone(),
        };
        let dir = self.open_at(&ploc, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((dir, name))
    }

    fn map_err(&self, loc: &Located, e: io::Error) -> ConfineError {
        // ELOOP is a loop, a magic link (openat2) or a final symlink under O_NOFOLLOW: the walk,
        // following every link itself, tells a loop (ELOOP again) from an escape (EXDEV).
        if e.raw_os_error() == Some(libc::ELOOP) && self.is_loop(loc) {
            return ConfineError::SymlinkLoop {
                path: loc.request.clone(),
            };
        }
        match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => ConfineError::EscapesRoot {
                path: loc.request.clone(),
                root: self
                    .root(loc)
                    .map(|r| r.canonical.clone())
                    .unwrap_or_default(),
            },
            Some(libc::ENOENT) => ConfineError::NotFound {
                path: loc.request.clone(),
            },
            _ => io_err(&loc.request, e),
        }
    }
}

/// Whether a path ends in `/` or `/.` (or is `.`), which only a directory can satisfy.
fn names_a_directory(rel: &OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = rel.as_bytes();
    b.ends_with(b"/") || b.ends_with(b"/.") || b == b"."
}

fn io_err(path: &str, e: io::Error) -> ConfineError {
    if e.raw_os_error() == Some(libc::ENOENT) {
        ConfineError::NotFound {
            path: path.to_owned(),
        }
    } else {
        ConfineError::Io {
            path: path.to_owned(),
            source: e,
        }
    }
}

/// `rel` without its last component, keeping `..` and symlinks to be resolved for real.
fn raw_parent(rel: &Path) -> Option<PathBuf> {
    let mut comps: Vec<Component<'_>> = rel
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect();
    comps.pop()?;
    if comps.is_empty() {
        return Some(PathBuf::from("."));
    }
    Some(comps.iter().collect())
}

/// Lexically drops `.`; keeps `..` (resolution decides what it means).
fn normalize(rel: &Path) -> PathBuf {
    rel.components()
        .filter(|c| *c != Component::CurDir)
        .collect()
}
