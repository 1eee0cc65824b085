//! Path syscalls relative to directory descriptors (`openat`, `openat2`, `fstatat`,
//! `readlinkat`, `renameat`, `unlinkat`, `symlinkat`) and descriptor calls (`fstat`, `fchmod`,
//! `flock`), each as a safe function returning `io::Result`: the file tools and the sandbox
//! use these, never libc directly.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `p` as a C string; a NUL byte in it is `EINVAL`.
pub(crate) fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `openat(dir, path, flags | O_CLOEXEC, mode)` as an owned fd.
pub(crate) fn openat(dir: RawFd, path: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    loop {
        // SAFETY: c is a valid NUL-terminated string; dir is an open fd for the call's duration.
        let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if fd >= 0 {
            // SAFETY: fd is new and owned by nothing else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `openat2` beneath `dir` with no magic links.
pub(crate) fn openat2_beneath(
    dir: RawFd,
    path: &OsStr,
    flags: i32,
    mode: u32,
) -> io::Result<OwnedFd> {
    openat2_resolve(dir, path, flags, mode, 0)
}

/// `openat2` beneath `dir` with no magic links, and `extra` resolve flags.
pub(crate) fn openat2_resolve(
    dir: RawFd,
    path: &OsStr,
    flags: i32,
    mode: u32,
    extra: u64,
) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: open_how is plain data; zero is a valid value for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | extra;
    let mut again = 0;
    loop {
        // SAFETY: openat2 reads `how` (size given) and the NUL-terminated path; dir is open.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: fd is new and owned by nothing else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // A concurrent rename moved something on the path; the kernel asks to retry.
            Some(libc::EAGAIN) if again < 16 => again += 1,
            _ => return Err(e),
        }
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn lstatat(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: stat is plain data, written by fstatat on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated name, open dir fd, writable stat buffer.
    let r = unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, written by fstat on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `readlinkat(dir, name)`: the link's target.
pub(crate) fn readlinkat(dir: RawFd, name: &OsStr) -> io::Result<PathBuf> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf is writable for buf.len() bytes; c is NUL-terminated; dir is open.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    use std::os::unix::ffi::OsStringExt;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(buf)))
}

/// `renameat(dir, from, dir, to)`.
pub(crate) fn renameat(dir: RawFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names are NUL-terminated; dir is an open directory fd.
    if unsafe { libc::renameat(dir, f.as_ptr(), dir, t.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unlinkat(dir, name, 0)`: removes a file (not a directory).
pub(crate) fn unlinkat(dir: RawFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: NUL-terminated name; dir is an open directory fd.
    if unsafe { libc::unlinkat(dir, c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `symlinkat(target, dir, name)`.
pub(crate) fn symlinkat(target: &Path, dir: RawFd, name: &OsStr) -> io::Result<()> {
    let (t, n) = (cstr(target.as_os_str())?, cstr(name)?);
    // SAFETY: both strings are NUL-terminated; dir is an open directory fd.
    if unsafe { libc::symlinkat(t.as_ptr(), dir, n.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fchmod(fd, mode)`: the exact permission bits, whatever the umask made of them.
pub(crate) fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on an open fd; no memory is involved.
    if unsafe { libc::fchmod(fd, mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An exclusive `flock` without waiting: `Ok(false)` when another holder has it.
pub(crate) fn try_lock_exclusive(fd: RawFd) -> io::Result<bool> {
    // SAFETY: flock on an open fd; no memory is involved.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(true)
}

/// How [`rename2`] moves a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rename {
    /// Fails with `EEXIST` when the destination exists.
    NoReplace,
    /// Swaps the two paths, both of which must exist, in one step.
    Exchange,
}

/// `renameat2(AT_FDCWD, from, AT_FDCWD, to, flags)` by path.
pub(crate) fn rename2(from: &Path, to: &Path, how: Rename) -> io::Result<()> {
    let (f, t) = (cstr(from.as_os_str())?, cstr(to.as_os_str())?);
    let flags = match how {
        Rename::NoReplace => libc::RENAME_NOREPLACE,
        Rename::Exchange => libc::RENAME_EXCHANGE,
    };
    // SAFETY: both names are NUL-terminated; AT_FDCWD resolves them as paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether extended attribute `name` of `path` (not followed) holds exactly `value`.
pub(crate) fn xattr_is(path: &Path, name: &std::ffi::CStr, value: &[u8]) -> bool {
    let Ok(p) = cstr(path.as_os_str()) else {
        return false;
    };
    let mut buf = [0u8; 8];
    // SAFETY: NUL-terminated strings; the buffer's length is passed with it.
    let n = unsafe {
        libc::lgetxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n >= 0 && &buf[..n as usize] == value
}

/// Removes extended attribute `name` of `path` (not followed); absent is fine.
pub(crate) fn remove_xattr(path: &Path, name: &std::ffi::CStr) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: NUL-terminated strings.
    if unsafe { libc::lremovexattr(p.as_ptr(), name.as_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENODATA) {
            return Err(e);
        }
    }
    Ok(())
}

/// `lchown(path, uid, gid)`: the link itself, not what it points to.
pub(crate) fn lchown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: a NUL-terminated path; no other memory is involved.
    if unsafe { libc::lchown(p.as_ptr(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
