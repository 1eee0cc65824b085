//! Landlock through raw syscalls: the ABI probe, a ruleset built in the parent, and the
//! async-signal-safe `restrict_self` the child calls before exec.

use super::syscall;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: u32 = 1;
const RULE_NET_PORT: u32 = 2;

const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_MAKE_CHAR: u64 = 1 << 6;
const FS_MAKE_BLOCK: u64 = 1 << 11;
const FS_REFER: u64 = 1 << 13;
const FS_TRUNCATE: u64 = 1 << 14;
const FS_IOCTL_DEV: u64 = 1 << 15;

const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;

const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

/// The lowest ABI whose filesystem rules cover everything a confined child could write with:
/// ABI 3 adds truncation, without which a read-only file could still be emptied.
pub(crate) const MIN_FS_ABI: u32 = 3;
/// The ABI that adds TCP bind/connect rules.
pub(crate) const NET_ABI: u32 = 4;
/// The ABI that adds signal and abstract-socket scoping.
pub(crate) const SCOPE_ABI: u32 = 6;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version the running kernel offers; 0 when Landlock is missing or disabled.
pub(crate) fn abi() -> u32 {
    match syscall!(
        SYS_landlock_create_ruleset,
        std::ptr::null::<RulesetAttr>(),
        0usize,
        CREATE_RULESET_VERSION
    ) {
        Ok(v) => u32::try_from(v).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Every filesystem right the ABI knows.
fn fs_all(abi: u32) -> u64 {
    let mut all = (1u64 << 13) - 1; // ABI 1: EXECUTE ..= MAKE_SYM
    if abi >= 2 {
        all |= FS_REFER;
    }
    if abi >= 3 {
        all |= FS_TRUNCATE;
    }
    if abi >= 5 {
        all |= FS_IOCTL_DEV;
    }
    all
}

/// What a writable directory grants: everything handled but execute (a program may not write
/// a binary and run it past the allowlist) and device nodes (handled and never granted, so
/// `mknod` of a character or block device fails everywhere, whatever the uid).
fn read_write(handled_fs: u64) -> u64 {
    handled_fs & !(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK)
}

/// What a rule grants beneath its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read files and list directories, and execute.
    ReadExec,
    /// Everything but execute: read, write, create, remove, rename.
    ReadWrite,
    /// A single device file to read and write (`/dev/null`).
    DeviceReadWrite,
}

/// One filesystem rule.
#[derive(Clone, Debug)]
pub(crate) struct FsRule {
    pub path: PathBuf,
    pub access: Access,
}

/// One rule of `access` for each of `paths`.
pub(crate) fn rules_for<P: AsRef<Path>>(
    paths: impl IntoIterator<Item = P>,
    access: Access,
) -> impl Iterator<Item = FsRule> {
    paths.into_iter().map(move |p| FsRule {
        path: p.as_ref().to_path_buf(),
        access,
    })
}

/// A Landlock ruleset, ready for a child to enforce on itself.
#[derive(Debug)]
pub(crate) struct Ruleset {
    fd: OwnedFd,
}

impl Ruleset {
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Rules opened once (an `O_PATH` descriptor and the rights each grants), added to every
/// ruleset built from them; paths that do not exist here are left out.
#[derive(Debug)]
pub(crate) struct OpenedRules {
    abi: u32,
    rules: Vec<(OwnedFd, u64)>,
    pub skipped: Vec<PathBuf>,
}

/// The rights a writable directory's rule grants under ABI `abi`.
pub(crate) fn write_rights(abi: u32) -> u64 {
    read_write(fs_all(abi))
}

/// Opens `rules` for ABI `abi` (at most the kernel's).
pub(crate) fn open_rules(abi: u32, rules: &[FsRule]) -> io::Result<OpenedRules> {
    let handled_fs = fs_all(abi);
    let mut opened = OpenedRules {
        abi,
        rules: Vec::new(),
        skipped: Vec::new(),
    };
    for rule in rules {
        let Some(fd) = open_path(&rule.path)? else {
            opened.skipped.push(rule.path.clone());
            continue;
        };
        let is_dir = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .or_else(|_| std::fs::metadata(&rule.path))
            .map(|m| m.is_dir())
            .unwrap_or(false);
        let file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
        let wanted = match rule.access {
            Access::ReadExec => FS_READ_FILE | FS_READ_DIR | FS_EXECUTE,
            Access::ReadWrite => read_write(handled_fs),
            Access::DeviceReadWrite => FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE,
        };
        // A rule on a file may grant only rights that apply to files.
        let allowed = wanted & handled_fs & if is_dir { u64::MAX } else { file_rights };
        opened.rules.push((fd, allowed));
    }
    Ok(opened)
}

/// TCP rules: with the ABI for them, only these ports may be bound and connected to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TcpPorts {
    pub bind: Vec<u16>,
    pub connect: Vec<u16>,
}

/// Builds a ruleset from `base` plus read-write access beneath `extra_rw` (a run's temp
/// directory): TCP denied when `deny_tcp` and the ABI has it, and the child scoped from
/// signalling processes outside it (and from abstract UNIX sockets outside it when `deny_tcp`)
/// where the ABI has scopes.
pub(crate) fn build(base: &OpenedRules, extra_rw: &Path, deny_tcp: bool) -> io::Result<Ruleset> {
    let tcp = deny_tcp.then(TcpPorts::default);
    build_with(base, Some(extra_rw), tcp.as_ref(), deny_tcp)
}

/// Builds a ruleset from `base`, read-write access beneath `extra_rw`, TCP limited to `tcp`'s
/// ports (where the ABI has TCP rules; `None` leaves TCP alone), signals scoped and, with
/// `scope_abstract`, abstract UNIX sockets too (where the ABI has scopes).
pub(crate) fn build_with(
    base: &OpenedRules,
    extra_rw: Option<&Path>,
    tcp: Option<&TcpPorts>,
    scope_abstract: bool,
) -> io::Result<Ruleset> {
    let abi = base.abi;
    let handled_fs = fs_all(abi);
    let tcp = tcp.filter(|_| abi >= NET_ABI);
    let scopes = abi >= SCOPE_ABI;
    let attr = RulesetAttr {
        handled_access_fs: handled_fs,
        handled_access_net: if tcp.is_some() {
            NET_BIND_TCP | NET_CONNECT_TCP
        } else {
            0
        },
        scoped: match (scopes, scope_abstract) {
            (false, _) => 0,
            (true, true) => SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET,
            (true, false) => SCOPE_SIGNAL,
        },
    };
    // The kernel refuses fields it does not know: pass only the ABI's part of the struct.
    let size = match abi {
        0..=3 => 8,
        4 | 5 => 16,
        _ => std::mem::size_of::<RulesetAttr>(),
    };
    let fd = syscall!(
        SYS_landlock_create_ruleset,
        &attr as *const RulesetAttr,
        size as libc::size_t,
        0u32
    )?;
    // SAFETY: a freshly created ruleset descriptor (close-on-exec) that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let extra = match extra_rw {
        Some(p) => Some((
            open_path(p)?.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{} is gone", p.display()))
            })?,
            read_write(handled_fs),
        )),
        None => None,
    };
    for (target, allowed) in base.rules.iter().chain(extra.as_ref()) {
        let beneath = PathBeneathAttr {
            allowed_access: *allowed,
            parent_fd: target.as_raw_fd(),
        };
        syscall!(
            SYS_landlock_add_rule,
            fd.as_raw_fd(),
            RULE_PATH_BENEATH,
            &beneath as *const PathBeneathAttr,
            0u32
        )?;
    }
    if let Some(tcp) = tcp {
        let rules = tcp
            .bind
            .iter()
            .map(|p| (*p, NET_BIND_TCP))
            .chain(tcp.connect.iter().map(|p| (*p, NET_CONNECT_TCP)));
        for (port, access) in rules {
            let rule = NetPortAttr {
                allowed_access: access,
                port: u64::from(port),
            };
            syscall!(
                SYS_landlock_add_rule,
                fd.as_raw_fd(),
                RULE_NET_PORT,
                &rule as *const NetPortAttr,
                0u32
            )?;
        }
    }
    Ok(Ruleset { fd })
}

/// An `O_PATH` descriptor for `path`, or `None` when it does not exist.
fn open_path(path: &Path) -> io::Result<Option<OwnedFd>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: c is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: a freshly opened descriptor that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The rights to read files and list directories, as ABI `abi` handles them (a rule a
/// child adds itself, for a `/proc` it mounts).
pub(crate) fn read_rights(abi: u32) -> u64 {
    (FS_READ_FILE | FS_READ_DIR) & fs_all(abi)
}

pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
