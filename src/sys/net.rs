//! The host's half of a run's private network: the socket pair its supervisor sends the
//! proxy's listener over, receiving it, and shutting sockets to wake their waiters. (The
//! supervisor's half, in the run's new network namespace, is in `child.rs`.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A connected pair of `AF_UNIX` datagram-boundary sockets, close-on-exec.
pub(crate) fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    super::syscall!(
        SYS_socketpair,
        libc::AF_UNIX,
        libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
        0,
        fds.as_mut_ptr()
    )?;
    // SAFETY: socketpair stored two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A message of one byte (`iov`) with room for one descriptor (`control`): what a run's
/// supervisor sends the proxy's listener in, and the host receives it in. Allocates nothing.
pub(crate) fn fd_message(iov: &mut libc::iovec, control: &mut [u64; 4]) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is valid; the pointers set below are the caller's, who keeps
    // them alive while it uses the message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(control);
    msg
}

/// Waits for one descriptor sent over `sock` (`SCM_RIGHTS`); `None` when the sender closed
/// its end, or the socket was shut, without sending one.
pub(crate) fn recv_fd(sock: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    let mut msg = fd_message(&mut iov, &mut control);
    let n = loop {
        match super::syscall!(
            SYS_recvmsg,
            sock.as_raw_fd(),
            &mut msg as *mut libc::msghdr,
            libc::MSG_CMSG_CLOEXEC
        ) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR reads within msg_control's length.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return Ok(None);
    }
    // SAFETY: cmsg points into `control`, inside the length the kernel wrote.
    let (level, ty, len) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
    // SAFETY: CMSG_LEN is arithmetic on its argument.
    let want = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as usize;
    if level != libc::SOL_SOCKET || ty != libc::SCM_RIGHTS || len < want {
        return Ok(None);
    }
    // SAFETY: an SCM_RIGHTS message of at least one descriptor: CMSG_DATA holds it (unaligned).
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const RawFd) };
    // SAFETY: the kernel installed this descriptor for us (close-on-exec); nothing else owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Shuts a socket both ways: a thread blocked in `accept` or `recvmsg` on it returns.
pub(crate) fn shut(fd: RawFd) {
    let _ = super::syscall!(SYS_shutdown, fd, libc::SHUT_RDWR);
}

/// Moves bytes from socket `from` to socket `to` through a pipe with `splice` (no copy through
/// user space) until `from` ends, a call fails, or `allow` (told each chunk's size before it
/// is passed on) says stop. A read that times out (`SO_RCVTIMEO`) goes on waiting while
/// `keep_waiting` says so. The bytes passed on; `None` when `splice` cannot be used on these
/// descriptors before anything moved (the caller copies instead).
pub(crate) fn pump(
    from: RawFd,
    to: RawFd,
    mut allow: impl FnMut(u64) -> bool,
    mut keep_waiting: impl FnMut() -> bool,
) -> Option<u64> {
    const CHUNK: usize = 1 << 20;
    let mut fds = [0 as RawFd; 2];
    super::syscall!(SYS_pipe2, fds.as_mut_ptr(), libc::O_CLOEXEC).ok()?;
    // SAFETY: pipe2 stored two new descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A bigger pipe moves more per call; the default (64 KiB) works too.
    let _ = super::syscall!(
        SYS_fcntl,
        w.as_raw_fd(),
        libc::F_SETPIPE_SZ,
        CHUNK as libc::c_int
    );
    // Not SPLICE_F_MORE: it corks the socket, and the last segment of a burst (a TLS flight,
    // a response) would wait ~200 ms for data that is not coming.
    let flags = libc::SPLICE_F_MOVE;
    let null = std::ptr::null_mut::<libc::loff_t>();
    let mut total = 0u64;
    loop {
        let n = match super::syscall!(SYS_splice, from, null, w.as_raw_fd(), null, CHUNK, flags) {
            Ok(0) => return Some(total),
            Ok(n) => n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && keep_waiting() => continue,
            Err(e) if total == 0 && e.raw_os_error() == Some(libc::EINVAL) => return None,
            Err(_) => return Some(total),
        };
        if !allow(n) {
            return Some(total);
        }
        let mut left = n;
        while left > 0 {
            match super::syscall!(
                SYS_splice,
                r.as_raw_fd(),
                null,
                to,
                null,
                left as usize,
                flags
            ) {
                Ok(0) => return Some(total),
                Ok(m) => left -= m as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Some(total),
            }
        }
        total += n;
    }
}
