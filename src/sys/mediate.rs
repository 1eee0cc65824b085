//! Connections of a run that shares the host's network, made by correx. The run's seccomp
//! filter holds every `connect` for us (`SECCOMP_RET_USER_NOTIF`, [`super::seccomp`]): we read
//! where it was going from the run's memory, take the run's socket (`pidfd_getfd`), and either
//! connect that socket ourselves, to the one address the caller allows, or refuse. The run's
//! own `connect` never happens, so nothing the run changes in its memory after we read it can
//! steer the connection: the address we connect to is ours, not the one we read.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a wait for a held call looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Whether this kernel lets a run's `connect` be made by correx: user notification with a
/// listener (Linux 5.0), `pidfd_open` (5.3) and `pidfd_getfd` (5.6), and Yama allowing a
/// process to read its own descendants (`kernel.yama.ptrace_scope` below 3). Probed once, by
/// asking the kernel, not by its version.
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        const GET_NOTIF_SIZES: u32 = 3;
        let mut sizes = [0u16; 3];
        let notify = super::seccomp::available()
            && super::syscall!(SYS_seccomp, GET_NOTIF_SIZES, 0u32, sizes.as_mut_ptr()).is_ok()
            && usize::from(sizes[0]) <= std::mem::size_of::<libc::seccomp_notif>();
        // A call with a descriptor that cannot be a pidfd: EBADF where the syscall exists.
        let exists = |nr: libc::c_long| {
            // SAFETY: -1 is no descriptor; the kernel refuses it before reading anything.
            let r = unsafe { libc::syscall(nr, -1, 0, 0) };
            r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
        };
        let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        notify
            && exists(libc::SYS_pidfd_open)
            && exists(libc::SYS_pidfd_getfd)
            && yama.is_none_or(|scope| scope < 3)
    })
}

/// A run's socket, taken from it while its `connect` is held.
pub(crate) struct HeldSocket(OwnedFd);

impl HeldSocket {
    /// Connects the run's socket to `127.0.0.1:port` (an IPv6 socket to the same address,
    /// IPv4-mapped). Binds it first to an ephemeral loopback port, unless the run bound it, and
    /// tells `bound` its address before connecting, so the listener can tell this connection
    /// from any other. The errno to answer with: 0, `EINPROGRESS` for a non-blocking socket,
    /// or why it failed.
    pub(crate) fn connect_loopback(&self, port: u16, bound: impl FnOnce(SocketAddr)) -> i32 {
        let fd = self.0.as_raw_fd();
        let Some(family) = local_address(fd).map(|a| a.is_ipv6()) else {
            return libc::EAFNOSUPPORT;
        };
        let loopback = |p: u16| {
            if family {
                SocketAddr::new(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()), p)
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)
            }
        };
        if local_address(fd).is_some_and(|a| a.port() == 0) {
            let (addr, len) = raw_address(&loopback(0));
            if let Err(e) = super::syscall!(SYS_bind, fd, addr.as_ptr(), len) {
                return e.raw_os_error().unwrap_or(libc::EACCES);
            }
        }
        match local_address(fd) {
            Some(a) => bound(SocketAddr::new(a.ip().to_canonical(), a.port())),
            None => return libc::EAFNOSUPPORT,
        }
        let (addr, len) = raw_address(&loopback(port));
        loop {
            match super::syscall!(SYS_connect, fd, addr.as_ptr(), len) {
                Ok(_) => return 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return e.raw_os_error().unwrap_or(libc::EACCES),
            }
        }
    }
}

/// Answers every `connect` the filter behind `listener` holds, until `stop` is set or no
/// process holds the filter any more. `decide` gets where the call was going (`None`: not an
/// IPv4 or IPv6 address) and the run's socket, and returns the errno the run's `connect`
/// returns (0 for success). A call that cannot be read or taken is refused (`EACCES`).
pub(crate) fn serve(
    listener: OwnedFd,
    stop: &AtomicBool,
    mut decide: impl FnMut(Option<SocketAddr>, HeldSocket) -> i32,
) {
    let fd = listener.as_raw_fd();
    while !stop.load(Ordering::SeqCst) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = STOP_CHECK.as_millis() as libc::c_int;
        match super::syscall!(SYS_poll, &mut p as *mut libc::pollfd, 1, ms) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        if p.revents & libc::POLLIN == 0 {
            // POLLHUP: every process that held the filter has exited.
            return;
        }
        // SAFETY: seccomp_notif is plain data; the kernel wants it zeroed.
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        let recv = super::syscall!(
            SYS_ioctl,
            fd,
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut n as *mut libc::seccomp_notif
        );
        if recv.is_err() {
            // ENOENT: the caller died, or its call was interrupted, before we read it.
            continue;
        }
        let errno = if n.data.nr == libc::SYS_connect as i32 {
            held_connect(fd, &n, &mut decide)
        } else {
            libc::ENOSYS
        };
        let resp = libc::seccomp_notif_resp {
            id: n.id,
            val: 0,
            error: -errno,
            flags: 0,
        };
        // ENOENT: the caller is gone, or a signal interrupted its call; nothing to answer.
        let _ = super::syscall!(
            SYS_ioctl,
            fd,
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &resp as *const libc::seccomp_notif_resp
        );
    }
}

/// The errno for one held `connect(fd, addr, len)` of process `n.pid`.
fn held_connect(
    listener: RawFd,
    n: &libc::seccomp_notif,
    decide: &mut impl FnMut(Option<SocketAddr>, HeldSocket) -> i32,
) -> i32 {
    let (fd, ptr, len) = (n.data.args[0], n.data.args[1], n.data.args[2]);
    let mut raw = [0u8; 28];
    let want = (len as usize).min(raw.len());
    let local = libc::iovec {
        iov_base: raw.as_mut_ptr().cast(),
        iov_len: want,
    };
    let remote = libc::iovec {
        iov_base: ptr as *mut libc::c_void,
        iov_len: want,
    };
    let read = super::syscall!(
        SYS_process_vm_readv,
        n.pid as libc::pid_t,
        &local as *const libc::iovec,
        1,
        &remote as *const libc::iovec,
        1,
        0
    );
    let target = match read {
        Ok(got) => parse_address(&raw[..got as usize]),
        Err(_) if want == 0 => None,
        // The run's own bad pointer, as its connect would have said.
        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => return libc::EFAULT,
        // Not ours to read (Yama, or a process that changed its credentials): refused.
        Err(e) => {
            log::warn!("shell network: cannot read a run's connect address: {e}");
            return libc::EACCES;
        }
    };
    // The pid is the caller's while its call is held: checked after the pidfd is opened, so
    // the pidfd cannot be another process that took the pid since.
    let Ok(pidfd) = super::syscall!(SYS_pidfd_open, n.pid as libc::pid_t, 0) else {
        return libc::EACCES;
    };
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    if !still_held(listener, n.id) {
        return libc::EACCES;
    }
    let socket = match super::syscall!(SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as RawFd, 0) {
        // SAFETY: pidfd_getfd returned a new (close-on-exec) descriptor that nothing else owns.
        Ok(s) => HeldSocket(unsafe { OwnedFd::from_raw_fd(s as RawFd) }),
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => return libc::EBADF,
        Err(_) => return libc::EACCES,
    };
    decide(target, socket)
}

/// Whether the held call `id` is still waiting for its answer.
fn still_held(listener: RawFd, id: u64) -> bool {
    super::syscall!(
        SYS_ioctl,
        listener,
        libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
        &id as *const u64
    )
    .is_ok()
}

/// A `sockaddr_in` or `sockaddr_in6` as the run wrote it; `None` for any other family or a
/// short one.
fn parse_address(raw: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*raw.first()?, *raw.get(1)?]));
    let port = u16::from_be_bytes([*raw.get(2)?, *raw.get(3)?]);
    match family {
        libc::AF_INET if raw.len() >= 8 => {
            let ip = Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        libc::AF_INET6 if raw.len() >= 24 => {
            let octets: [u8; 16] = raw[8..24].try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
        }
        _ => None,
    }
}

/// The socket's bound address (port 0 when unbound); `None` when it is not IPv4 or IPv6.
fn local_address(fd: RawFd) -> Option<SocketAddr> {
    let mut raw = [0u8; 28];
    let mut len = raw.len() as libc::socklen_t;
    super::syscall!(
        SYS_getsockname,
        fd,
        raw.as_mut_ptr(),
        &mut len as *mut libc::socklen_t
    )
    .ok()?;
    parse_address(&raw[..(len as usize).min(raw.len())])
}

/// `a` as a `sockaddr_in` or `sockaddr_in6`, and its length.
fn raw_address(a: &SocketAddr) -> ([u8; 28], libc::socklen_t) {
    let mut raw = [0u8; 28];
    raw[2..4].copy_from_slice(&a.port().to_be_bytes());
    match a.ip() {
        IpAddr::V4(ip) => {
            raw[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            raw[4..8].copy_from_slice(&ip.octets());
            (raw, 16)
        }
        IpAddr::V6(ip) => {
            raw[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            raw[8..24].copy_from_slice(&ip.octets());
            (raw, 28)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_from_a_run_parse_strictly() {
        for a in [
            "127.0.0.1:3128",
            "[::ffff:127.0.0.1]:3128",
            "[2001:db8::1]:443",
        ] {
            let a: SocketAddr = a.parse().expect("an address");
            let (raw, len) = raw_address(&a);
            assert_eq!(parse_address(&raw[..len as usize]), Some(a));
            let short = if a.is_ipv4() { 7 } else { 23 };
            assert_eq!(parse_address(&raw[..short]), None, "{a} cut short");
        }
        let mut unix = [0u8; 28];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(parse_address(&unix), None);
        assert_eq!(parse_address(&[]), None);
        assert_eq!(parse_address(&[2]), None);
    }
}
