//! Connections of a run that shares the host's network, made by correx. The run's seccomp
//! filter holds every `connect` for us (`SECCOMP_RET_USER_NOTIF`, [`super::seccomp`]): we read
//! where it was going from the run's memory, and either refuse, or make a socket of our own,
//! connect it to the one address the caller allows, and put it in the run's place of the
//! socket it called with (`SECCOMP_IOCTL_NOTIF_ADDFD` with `SETFD`). The run's own `connect`
//! never happens, so nothing it changes in its memory after we read it steers the connection:
//! the address we connect to is ours. We never take a descriptor of the run's into the host
//! (closing a copy of a file the host has locked would drop the host's locks on it).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a wait for a held call looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long correx waits for its own connect to the proxy's loopback listener.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether this kernel lets a run's `connect` be made by correx, asked of the kernel rather
/// than read from its version, once: user notification with a listener and
/// `SECCOMP_IOCTL_NOTIF_ADDFD` (Linux 5.9; a forked child installs a filter with a listener
/// and we ask the listener for a call it never made), `process_vm_readv` allowed (a container's
/// seccomp profile may refuse it), and Yama letting the host read its descendants
/// (`kernel.yama.ptrace_scope` 0 or 1, or 2 for root).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        const GET_NOTIF_SIZES: u32 = 3;
        let mut sizes = [0u16; 3];
        let sizes_fit = super::syscall!(SYS_seccomp, GET_NOTIF_SIZES, 0u32, sizes.as_mut_ptr())
            .is_ok()
            && usize::from(sizes[0]) <= std::mem::size_of::<libc::seccomp_notif>()
            && usize::from(sizes[1]) <= std::mem::size_of::<libc::seccomp_notif_resp>();
        let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        let yama_allows = match yama {
            None | Some(0 | 1) => true,
            Some(2) => super::euid() == 0,
            Some(_) => false,
        };
        super::seccomp::available()
            && sizes_fit
            && yama_allows
            && reads_memory()
            && listener_adds_descriptors()
    })
}

/// Whether `process_vm_readv` works here, on our own memory.
fn reads_memory() -> bool {
    let source = [7u8; 4];
    let mut copy = [0u8; 4];
    let local = libc::iovec {
        iov_base: copy.as_mut_ptr().cast(),
        iov_len: copy.len(),
    };
    let remote = libc::iovec {
        iov_base: source.as_ptr() as *mut libc::c_void,
        iov_len: source.len(),
    };
    let r = super::syscall!(
        SYS_process_vm_readv,
        std::process::id() as libc::pid_t,
        &local as *const libc::iovec,
        1 as libc::c_ulong,
        &remote as *const libc::iovec,
        1 as libc::c_ulong,
        0 as libc::c_ulong
    );
    r.is_ok() && copy == source
}

/// Whether a seccomp listener can be made and answers `SECCOMP_IOCTL_NOTIF_ADDFD`: a forked
/// child installs a filter that allows everything, with a listener, sends us the listener and
/// exits; asked to add a descriptor for a call that does not exist, a kernel that has the
/// ioctl says `ENOENT` (one without it, `EINVAL`).
fn listener_adds_descriptors() -> bool {
    let Ok((ours, theirs)) = super::net::socketpair() else {
        return false;
    };
    let allow = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: allow.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the child makes raw, async-signal-safe syscalls on memory that exists before
    // the fork, allocates nothing and exits without unwinding.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; `prog` points at `allow`, both alive in the child's copy.
        unsafe {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            let l = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &prog as *const libc::sock_fprog,
            );
            if l >= 0 {
                super::child::send_fd(theirs.as_raw_fd(), l as RawFd);
            }
            libc::_exit(0);
        }
    }
    drop(theirs);
    if pid < 0 {
        return false;
    }
    let listener = super::net::recv_fd(&ours);
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let Ok(Some(listener)) = listener else {
        return false;
    };
    let add = libc::seccomp_notif_addfd {
        id: 0,
        flags: 0,
        srcfd: listener.as_raw_fd() as u32,
        newfd: 0,
        newfd_flags: 0,
    };
    let r = super::syscall!(
        SYS_ioctl,
        listener.as_raw_fd(),
        libc::SECCOMP_IOCTL_NOTIF_ADDFD,
        &add as *const libc::seccomp_notif_addfd
    );
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::ENOENT))
}

/// A new socket of ours connected to `127.0.0.1:port` (IPv6 and IPv4-mapped with `v6`), bound
/// first to an ephemeral loopback port whose address `bound` is told before the connect, so
/// the listener can tell this connection from any other. The connect waits at most
/// [`CONNECT_TIMEOUT`]; an error is the errno to answer the run with.
pub(crate) fn connect_loopback(
    v6: bool,
    port: u16,
    bound: impl FnOnce(SocketAddr),
) -> Result<OwnedFd, i32> {
    let errno = |e: io::Error| e.raw_os_error().unwrap_or(libc::EACCES);
    let loopback = |p: u16| {
        if v6 {
            SocketAddr::new(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()), p)
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)
        }
    };
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    let fd = super::syscall!(
        SYS_socket,
        family,
        libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
        0
    )
    .map_err(errno)?;
    // SAFETY: socket returned a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let s = socket.as_raw_fd();
    let (addr, len) = raw_address(&loopback(0));
    super::syscall!(SYS_bind, s, addr.as_ptr(), len).map_err(errno)?;
    let local = local_address(s).ok_or(libc::EAFNOSUPPORT)?;
    bound(SocketAddr::new(local.ip().to_canonical(), local.port()));
    let timeout = |d: Duration| libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    let set_timeout = |t: libc::timeval| {
        super::syscall!(
            SYS_setsockopt,
            s,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &t as *const libc::timeval,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t
        )
    };
    // A connect on a blocking socket waits for SO_SNDTIMEO at most.
    set_timeout(timeout(CONNECT_TIMEOUT)).map_err(errno)?;
    let (addr, len) = raw_address(&loopback(port));
    super::syscall!(SYS_connect, s, addr.as_ptr(), len).map_err(errno)?;
    set_timeout(timeout(Duration::ZERO)).map_err(errno)?;
    Ok(socket)
}

/// Answers every `connect` the filter behind `listener` holds, until `stop` is set or no
/// process holds the filter any more (Linux 5.8; before it, until `stop`). `route` gets where
/// the call was going (`None`: not an IPv4 or IPv6 address, or not readable) and returns a
/// connected socket to put in the run's place of the one it called with, or the errno its
/// `connect` returns.
pub(crate) fn serve(
    listener: OwnedFd,
    stop: &AtomicBool,
    mut route: impl FnMut(Option<SocketAddr>) -> Result<OwnedFd, i32>,
) {
    let fd = listener.as_raw_fd();
    while !stop.load(Ordering::SeqCst) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = STOP_CHECK.as_millis() as libc::c_int;
        match super::syscall!(SYS_poll, &mut p as *mut libc::pollfd, 1 as libc::nfds_t, ms) {
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
            held_connect(fd, &n, &mut route)
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

/// The errno for one held `connect(fd, addr, len)` of thread `n.pid`.
fn held_connect(
    listener: RawFd,
    n: &libc::seccomp_notif,
    route: &mut impl FnMut(Option<SocketAddr>) -> Result<OwnedFd, i32>,
) -> i32 {
    let (run_fd, ptr, len) = (n.data.args[0], n.data.args[1], n.data.args[2]);
    let Ok(run_fd) = RawFd::try_from(run_fd) else {
        return libc::EBADF;
    };
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
    // Any thread's id reads its process's memory.
    let read = super::syscall!(
        SYS_process_vm_readv,
        n.pid as libc::pid_t,
        &local as *const libc::iovec,
        1 as libc::c_ulong,
        &remote as *const libc::iovec,
        1 as libc::c_ulong,
        0 as libc::c_ulong
    );
    let target = match read {
        Ok(got) => parse_address(&raw[..got as usize]),
        // The run's own bad pointer, as its connect would have said.
        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => return libc::EFAULT,
        // Nothing to read, or not ours to read: refused (and recorded by `route`).
        Err(_) => None,
    };
    // What was read belongs to the caller only if its call is still held: a pid taken over
    // since by another process has no held call under this id.
    if !still_held(listener, n.id) {
        return libc::EACCES;
    }
    // What the run called with: a socket, and its flags for ours.
    let Some(flags) = descriptor_flags(n.pid, run_fd) else {
        return libc::EBADF;
    };
    if !is_socket(n.pid, run_fd) {
        return libc::ENOTSOCK;
    }
    let ours = match route(target) {
        Ok(s) => s,
        Err(errno) => return errno,
    };
    if flags & libc::O_NONBLOCK != 0
        && super::syscall!(
            SYS_fcntl,
            ours.as_raw_fd(),
            libc::F_SETFL,
            libc::O_NONBLOCK as libc::c_ulong
        )
        .is_err()
    {
        return libc::EACCES;
    }
    let add = libc::seccomp_notif_addfd {
        id: n.id,
        flags: libc::SECCOMP_ADDFD_FLAG_SETFD as u32,
        srcfd: ours.as_raw_fd() as u32,
        newfd: run_fd as u32,
        newfd_flags: (flags & libc::O_CLOEXEC) as u32,
    };
    match super::syscall!(
        SYS_ioctl,
        listener,
        libc::SECCOMP_IOCTL_NOTIF_ADDFD,
        &add as *const libc::seccomp_notif_addfd
    ) {
        Ok(_) => 0,
        Err(_) => libc::EACCES,
    }
}

/// The open-file flags of the run's descriptor `fd` (`/proc/<tid>/fdinfo`); `None` when it
/// has none by that number.
fn descriptor_flags(tid: u32, fd: RawFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| i32::from_str_radix(v.trim(), 8).ok())
}

/// Whether the run's descriptor `fd` is a socket (`/proc/<tid>/fd`).
fn is_socket(tid: u32, fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/{tid}/fd/{fd}"))
        .is_ok_and(|l| l.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
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

/// The socket's bound address; `None` when it is not IPv4 or IPv6.
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

    #[test]
    fn a_descriptor_is_described_from_proc() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let fd = l.as_raw_fd();
        let me = std::process::id();
        assert!(is_socket(me, fd));
        let flags = descriptor_flags(me, fd).expect("flags");
        assert_ne!(
            flags & libc::O_CLOEXEC,
            0,
            "std's sockets are close-on-exec"
        );
        l.set_nonblocking(true).expect("nonblocking");
        let flags = descriptor_flags(me, fd).expect("flags");
        assert_ne!(flags & libc::O_NONBLOCK, 0);
        let f = std::fs::File::open("/proc/self/stat").expect("a file");
        assert!(!is_socket(me, f.as_raw_fd()));
        assert_eq!(descriptor_flags(me, 1 << 20), None);
    }

    #[test]
    fn the_probe_agrees_with_a_listener_made_here() {
        // This kernel (6.x, CI's too) has every piece: the probe must find them, or the
        // network tests' mediated scenario would be refused instead of run.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let major: u32 = release
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if major >= 6 && super::super::seccomp::available() {
            assert!(listener_adds_descriptors());
            assert!(reads_memory());
        }
    }
}
