//! The two children of a supervised spawn: the supervisor and the program's process.
//!
//! The supervisor shares the host's memory (CLONE_VM, on its own stack) and so does the
//! program's process until it execs (CLONE_VM | CLONE_VFORK): no page tables are copied, which
//! would cost more than the rest of a spawn. Sharing memory also means sharing the host
//! thread's thread-local storage, errno included, while that thread keeps running: so the
//! children make raw syscalls that never write errno (`raw::*`), take no locks, allocate
//! nothing, and only read memory the host keeps alive and unchanged until the supervisor has
//! been reaped.

use super::limits::Rlimit;
use super::raw::call;
use super::spawn::Containment;
use std::ffi::CString;
use std::os::fd::RawFd;

/// Where a child failed before its program ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Stage {
    UserNamespace = 1,
    Subreaper,
    Clone,
    Stdio,
    Cwd,
    Limits,
    NoNewPrivs,
    Landlock,
    Seccomp,
    Exec,
    Fence,
    Cgroup,
    Namespaces,
    Capabilities,
    Identity,
    Network,
    /// Building the run's view (or mounting its /proc): the view's step and entry are packed
    /// above the stage's byte.
    View,
}

impl Stage {
    pub(crate) fn describe(n: u32) -> &'static str {
        match n {
            1 => "mapping its user namespace",
            2 => "becoming a subreaper",
            3 => "cloning the program's process",
            4 => "redirecting stdin, stdout and stderr",
            5 => "entering its working directory",
            6 => "setting resource limits",
            7 => "setting no_new_privs",
            8 => "enforcing the Landlock ruleset",
            9 => "installing the seccomp filter",
            10 => "exec",
            11 => "arming its parent-death signal",
            12 => "joining its cgroup",
            13 => "joining the tool's namespaces",
            14 => "dropping capabilities",
            15 => "switching to the run's uid and gid",
            16 => "setting up its network namespace (loopback and the proxy's listener)",
            17 => "building its view",
            _ => "starting",
        }
    }

    /// A view failure's (step, entry), unpacked from a report's stage.
    pub(crate) fn view_failure(n: u32) -> Option<(u8, Option<u16>)> {
        if n & 0xff != Stage::View as u32 {
            return None;
        }
        Some(super::view::Failed::unpack(n >> 8))
    }
}

/// Everything the two children read, prepared before the first clone: they allocate nothing.
/// Owned: when a supervisor had to be killed in subreaper mode, its program's process may
/// still be reading the plan for a moment (it shares our memory until exec), so the plan is
/// then leaked rather than freed under it.
pub(crate) struct ChildPlan {
    pub(crate) program: CString,
    pub(crate) argv: Vec<*const libc::c_char>,
    pub(crate) envp: Vec<*const libc::c_char>,
    /// What `argv` and `envp` point into.
    pub(crate) _strings: Vec<CString>,
    pub(crate) devnull: RawFd,
    pub(crate) out_w: RawFd,
    pub(crate) err_w: RawFd,
    pub(crate) fail_w: RawFd,
    pub(crate) stop_r: RawFd,
    pub(crate) status_w: RawFd,
    pub(crate) cwd: RawFd,
    /// The start directory by path (in a view the run builds itself), in place of `cwd`.
    pub(crate) cwd_path: Option<CString>,
    /// The run's own view, which the supervisor builds.
    pub(crate) view: Option<std::sync::Arc<super::view::ViewPlan>>,
    /// The supervisor mounts the run's own /proc over the tool's view (in `proc_ns`, a mount
    /// namespace an earlier run left, or -1: a new one), starting in `cwd_path`.
    pub(crate) own_proc: bool,
    pub(crate) proc_ns: RawFd,
    /// Landlock rights for the run's /proc, added to `ruleset` once it is mounted.
    pub(crate) proc_rights: u64,
    /// A staged run's overlays, mounted by the supervisor once the view is in place.
    pub(crate) overlays: Vec<super::view::Overlay>,
    pub(crate) user_maps: Option<[CString; 2]>,
    pub(crate) containment: Containment,
    /// Whether to confine (no_new_privs, then the rest).
    pub(crate) confined: bool,
    pub(crate) rlimits: Vec<Rlimit>,
    /// A Landlock ruleset descriptor, or -1.
    pub(crate) ruleset: RawFd,
    /// The seccomp filter's instructions, and a `sock_fprog` pointing into them.
    pub(crate) _filter: Vec<libc::sock_filter>,
    pub(crate) seccomp: Option<libc::sock_fprog>,
    /// The `cgroup.procs` the program's process joins.
    pub(crate) cgroup: Option<CString>,
    /// Namespaces (mount, UTS, IPC) the program's process joins first; -1 for none.
    pub(crate) join: [RawFd; 3],
    /// Empty the bounding set too (needs CAP_SETPCAP: root, or a user namespace of our own).
    pub(crate) drop_bounding: bool,
    /// Switch to these ids (uid, gid), with no supplementary groups, before exec.
    pub(crate) run_as: Option<(u32, u32)>,
    /// In a new network namespace: the socket the supervisor sends the proxy's listener on
    /// (-1: none), and the listener's port. With `net_mediated`, no namespace: the program's
    /// process sends its seccomp filter's listener on the socket instead.
    pub(crate) net_sock: RawFd,
    pub(crate) net_port: u16,
    pub(crate) net_mediated: bool,
    /// A network namespace with loopback alone (no listener to send).
    pub(crate) net_loopback: bool,
    /// The host's dumpable flag (0 or 1; -1 unknown), given back after a uid switch.
    pub(crate) host_dumpable: i32,
    /// Descriptors the supervisor keeps until the program has exec'd (besides the pipes).
    pub(crate) keep: [RawFd; 5],
    /// The host's `/proc` (an `O_PATH` descriptor, or -1), where a subreaper finds its
    /// children: a view holds none, or only the run's.
    pub(crate) proc_dir: RawFd,
    /// The supervisor's pid as the program's process sees it (its parent).
    pub(crate) supervisor_pid: std::sync::atomic::AtomicI32,
    /// The highest descriptor to close one by one where `close_range` is missing.
    pub(crate) max_fd: u32,
    /// The supervisor's stack.
    pub(crate) supervisor_stack: Stack,
    /// The program's process runs on this stack until it execs.
    pub(crate) program_stack: Stack,
}

/// A child's stack: its own mapping with an inaccessible guard page below it, so an overflow
/// faults instead of writing over the host's heap. Dropped stacks go back to a small pool:
/// unmapping memory another process touched costs a TLB shootdown on every CPU.
#[derive(Debug)]
pub(crate) struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; nothing else aliases it.
unsafe impl Send for Stack {}

impl Stack {
    /// A stack of `size` bytes (a multiple of the page size) plus one guard page, from the
    /// pool when it has one of that size.
    pub(crate) fn new(size: usize) -> std::io::Result<Stack> {
        let mut pool = STACKS.lock();
        if let Some(i) = pool.iter().position(|s| s.len == size + 4096) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        Self::map(size)
    }

    fn map(size: usize) -> std::io::Result<Stack> {
        let page = 4096;
        let len = size + page;
        // SAFETY: an anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping made above.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The (16-byte aligned) top of the stack, where a child starts.
    pub(crate) fn top(&self) -> usize {
        (self.base as usize + self.len) & !15
    }
}

/// Stacks kept for later runs; a handful covers the runs one host makes at once.
static STACKS: parking_lot::Mutex<Vec<Stack>> = parking_lot::Mutex::new(Vec::new());
const POOLED: usize = 8;

impl Drop for Stack {
    fn drop(&mut self) {
        let mut pool = STACKS.lock();
        if pool.len() < POOLED && !self.base.is_null() {
            pool.push(Stack {
                base: std::mem::replace(&mut self.base, std::ptr::null_mut()),
                len: self.len,
            });
            return;
        }
        drop(pool);
        if !self.base.is_null() {
            // SAFETY: unmapping the mapping this value owns, once.
            unsafe {
                libc::munmap(self.base, self.len);
            }
        }
    }
}

/// The kernel's `struct sigaction` for `rt_sigaction` (not glibc's).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Reports `stage` and `errno` to the host and exits.
fn fail(plan: &ChildPlan, stage: Stage, errno: i32) -> ! {
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    msg[4..].copy_from_slice(&errno.to_ne_bytes());
    call!(SYS_write, plan.fail_w, msg.as_ptr(), msg.len());
    exit(127)
}

/// Reports a failed view build (its step and entry packed into the stage) and exits.
fn fail_view(plan: &ChildPlan, f: super::view::Failed) -> ! {
    let mut msg = [0u8; 8];
    let stage = Stage::View as u32 | (f.packed() << 8);
    msg[..4].copy_from_slice(&stage.to_ne_bytes());
    msg[4..].copy_from_slice(&f.errno.to_ne_bytes());
    call!(SYS_write, plan.fail_w, msg.as_ptr(), msg.len());
    exit(127)
}

fn exit(code: i32) -> ! {
    loop {
        call!(SYS_exit_group, code);
    }
}

fn errno_of(r: isize) -> i32 {
    (-r) as i32
}

fn write_file(path: &std::ffi::CStr, data: &[u8]) -> Result<(), i32> {
    let fd = call!(
        SYS_openat,
        libc::AT_FDCWD,
        path.as_ptr(),
        libc::O_WRONLY | libc::O_CLOEXEC
    );
    if fd < 0 {
        return Err(errno_of(fd));
    }
    let n = call!(SYS_write, fd, data.as_ptr(), data.len());
    call!(SYS_close, fd);
    if n < 0 {
        return Err(errno_of(n));
    }
    if n as usize != data.len() {
        return Err(libc::EIO);
    }
    Ok(())
}

/// In a new user namespace: map our own uid and gid (`[uid_map, gid_map]` lines) to themselves.
pub(crate) fn map_ids(maps: &[CString; 2]) -> Result<(), i32> {
    write_file(c"/proc/self/setgroups", b"deny")?;
    write_file(c"/proc/self/uid_map", maps[0].as_bytes())?;
    write_file(c"/proc/self/gid_map", maps[1].as_bytes())
}

fn set_signal_mask(all: bool) {
    let set: u64 = if all { !0 } else { 0 };
    call!(
        SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &set as *const u64,
        0usize,
        8usize
    );
}

fn default_action(sig: libc::c_int) {
    let act = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    call!(
        SYS_rt_sigaction,
        sig,
        &act as *const KernelSigaction,
        0usize,
        8usize
    );
}

pub(crate) extern "C" fn supervisor_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the host's `ChildPlan`, which the host keeps alive and unchanged until
    // it has reaped us.
    supervisor(unsafe { &*(arg as *const ChildPlan) })
}

/// The supervisor: starts the program, waits for it or for a stop, kills every descendant,
/// reports the program's status and exits.
fn supervisor(plan: &ChildPlan) -> ! {
    // Signals stay blocked (the host blocked them around the clone): no host handler may run
    // on this stack. SIGCHLD must not be ignored, or our children would be reaped before we
    // could wait for them.
    default_action(libc::SIGCHLD);
    // Only what this run needs: not the stop pipe's write end (the host holds the only other
    // one, so its death closes the pipe), nor any other host descriptor, such as another run's
    // pipes, which would keep those open past their owners' ends.
    close_all_except(
        [
            plan.devnull,
            plan.out_w,
            plan.err_w,
            plan.fail_w,
            plan.stop_r,
            plan.status_w,
            plan.keep[0],
            plan.keep[1],
            plan.keep[2],
            plan.keep[3],
            plan.keep[4],
            plan.net_sock,
            plan.proc_dir,
            plan.proc_ns,
        ],
        plan.max_fd,
    );
    if let Some(maps) = &plan.user_maps {
        if let Err(e) = map_ids(maps) {
            fail(plan, Stage::UserNamespace, e);
        }
    }
    // The run's filesystem: its own view (built here, in the user and mount namespaces it was
    // cloned with), or its own /proc over its tool's view. The program's process inherits it.
    let landlock =
        (plan.ruleset >= 0 && plan.proc_rights != 0).then_some((plan.ruleset, plan.proc_rights));
    if let Some(view) = &plan.view {
        if let Err(f) = super::view::build(view, &[], landlock)
            .and_then(|()| super::view::mount_overlays(&plan.overlays, plan.ruleset))
        {
            fail_view(plan, f);
        }
    } else if let (true, Some(cwd)) = (plan.own_proc, &plan.cwd_path) {
        if let Err(f) = super::view::own_proc(plan.proc_ns, cwd, landlock, &plan.overlays) {
            fail_view(plan, f);
        }
    }
    if plan.net_loopback {
        if let Err(e) = loopback_up() {
            fail(plan, Stage::Network, e);
        }
    }
    // Mediated: the program's process sends its filter's listener over the socket (and the
    // supervisor's copy is closed with the rest once the program has exec'd).
    if plan.net_sock >= 0 && !plan.net_mediated {
        let sent = proxy_listener(plan.net_sock, plan.net_port);
        // The program must not hold the host's end of the pair.
        call!(SYS_close, plan.net_sock);
        if let Err(e) = sent {
            fail(plan, Stage::Network, e);
        }
    }
    if plan.containment == Containment::Subreaper {
        let r = call!(SYS_prctl, libc::PR_SET_CHILD_SUBREAPER, 1);
        if r < 0 {
            fail(plan, Stage::Subreaper, errno_of(r));
        }
    }
    plan.supervisor_pid.store(
        call!(SYS_getpid) as i32,
        std::sync::atomic::Ordering::Relaxed,
    );
    let mut child_pidfd: RawFd = -1;
    // vfork-style: the program's process runs on its own stack, and we are suspended until it
    // execs or exits. (glibc's clone writes errno only if it fails, and then we stop.)
    let stack_top = plan.program_stack.top();
    // SAFETY: a valid entry point and 16-byte aligned stack top; `plan` outlives the child's
    // use of it (we are suspended until it execs).
    let pid = unsafe {
        libc::clone(
            program_entry,
            stack_top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            plan as *const ChildPlan as *mut libc::c_void,
            &mut child_pidfd as *mut RawFd,
        )
    };
    if pid < 0 {
        // glibc stored the reason in errno (the host thread's, which we share): read it back.
        // SAFETY: __errno_location returns this thread's errno slot.
        let errno = unsafe { *libc::__errno_location() };
        fail(plan, Stage::Clone, errno);
    }
    // The program holds what it needs now. Ours (and any other host descriptor, such as
    // another run's pipes) would keep pipes open past their owners' ends.
    // The program has exec'd (or failed): a uid switch on its way cleared the dumpable flag of
    // the memory we share with the host; give the host its own value back.
    if plan.run_as.is_some() && plan.host_dumpable >= 0 {
        call!(
            SYS_prctl,
            libc::PR_SET_DUMPABLE,
            plan.host_dumpable,
            0,
            0,
            0
        );
    }
    close_all_except(
        [plan.stop_r, plan.status_w, child_pidfd, plan.proc_dir],
        plan.max_fd,
    );
    let status = watch(plan, child_pidfd, pid as libc::pid_t);
    if plan.containment == Containment::Subreaper {
        kill_descendants(plan.proc_dir);
    }
    call!(SYS_write, plan.status_w, status.as_ptr(), status.len());
    // As a namespace's init, exiting kills whatever is left in it.
    exit(0)
}

/// In the run's new network namespace (we hold its capabilities: root, or a user namespace of
/// our own): loopback up, a listener on `127.0.0.1:port`, sent to the host over `sock`. The
/// proxy's listener is the only thing the run can reach.
fn proxy_listener(sock: RawFd, port: u16) -> Result<(), i32> {
    loopback_up()?;
    let l = inet_socket(libc::SOCK_STREAM)?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut r = call!(
        SYS_bind,
        l,
        &addr as *const libc::sockaddr_in,
        std::mem::size_of::<libc::sockaddr_in>()
    );
    if r >= 0 {
        r = call!(SYS_listen, l, 128);
    }
    if r >= 0 {
        r = send_fd(sock, l as RawFd);
    }
    call!(SYS_close, l);
    if r < 0 {
        return Err(errno_of(r));
    }
    Ok(())
}

/// Loopback up in the run's new network namespace (we hold its capabilities).
fn loopback_up() -> Result<(), i32> {
    let s = inet_socket(libc::SOCK_DGRAM)?;
    // SAFETY: ifreq is plain data, valid all zero.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_name[0] = b'l' as libc::c_char;
    ifr.ifr_name[1] = b'o' as libc::c_char;
    let mut r = call!(
        SYS_ioctl,
        s,
        libc::SIOCGIFFLAGS,
        &mut ifr as *mut libc::ifreq
    );
    if r >= 0 {
        // SAFETY: SIOCGIFFLAGS filled the union's flags member, which we update.
        unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        r = call!(SYS_ioctl, s, libc::SIOCSIFFLAGS, &ifr as *const libc::ifreq);
    }
    call!(SYS_close, s);
    if r < 0 {
        return Err(errno_of(r));
    }
    Ok(())
}

/// A close-on-exec IPv4 socket of type `ty`.
fn inet_socket(ty: libc::c_int) -> Result<RawFd, i32> {
    let s = call!(SYS_socket, libc::AF_INET, ty | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        Err(errno_of(s))
    } else {
        Ok(s as RawFd)
    }
}

/// Sends descriptor `fd` over the UNIX socket `sock` (`SCM_RIGHTS`), with one byte.
pub(crate) fn send_fd(sock: RawFd, fd: RawFd) -> isize {
    let byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    let mut msg = super::net::fd_message(&mut iov, &mut control);
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: msg_control has room for one header and one descriptor (CMSG_SPACE above, within
    // `control`); CMSG_FIRSTHDR and CMSG_DATA point into it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
    }
    call!(
        SYS_sendmsg,
        sock,
        &msg as *const libc::msghdr,
        libc::MSG_NOSIGNAL
    )
}

/// Closes every descriptor above stderr but `keep`.
fn close_all_except<const N: usize>(mut keep: [RawFd; N], max_fd: u32) {
    keep.sort_unstable();
    let mut from: u32 = 3;
    let close = |lo: u32, hi: u32| {
        if call!(SYS_close_range, lo, hi, 0) < 0 {
            // Before Linux 5.9: one by one, up to the descriptor limit.
            for fd in lo..=hi.min(max_fd) {
                call!(SYS_close, fd);
            }
        }
    };
    for fd in keep {
        let fd = fd.max(0) as u32;
        if fd > from {
            close(from, fd - 1);
        }
        from = from.max(fd + 1);
    }
    close(from, u32::MAX);
}

/// Marks every descriptor above stderr close-on-exec.
fn cloexec_all(max_fd: u32) {
    if call!(SYS_close_range, 3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) < 0 {
        // Before Linux 5.11: one by one, up to the descriptor limit.
        for fd in 3..=max_fd {
            call!(SYS_fcntl, fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

fn zeroed_siginfo() -> libc::siginfo_t {
    // SAFETY: siginfo_t is plain data, valid when zeroed.
    unsafe { std::mem::zeroed() }
}

fn si_pid(info: &libc::siginfo_t) -> libc::pid_t {
    // SAFETY: reading the pid field of a siginfo the kernel filled for a child event.
    unsafe { info.si_pid() }
}

/// A non-blocking `waitid` for any exited child (reaping it unless `extra` has `WNOWAIT`):
/// the raw result (`-ECHILD` when there are no children) and the child's pid (0: none yet).
fn wait_any(extra: libc::c_int) -> (isize, libc::pid_t) {
    let mut info = zeroed_siginfo();
    let r = call!(
        SYS_waitid,
        libc::P_ALL,
        0,
        &mut info as *mut libc::siginfo_t,
        libc::WEXITED | libc::WNOHANG | libc::__WALL | extra,
        0usize
    );
    (r, si_pid(&info))
}

/// Waits until the program exits or the host asks for a stop (or dies), reaping orphans on the
/// way; returns the program's status as (si_code, si_status) bytes.
fn watch(plan: &ChildPlan, child_pidfd: RawFd, child: libc::pid_t) -> [u8; 8] {
    let mut stopped = false;
    loop {
        // ppoll writes the time left back: a fresh tick every round.
        let mut tick = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let mut fds = [
            libc::pollfd {
                fd: child_pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: plan.stop_r,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let nfds: usize = if stopped { 1 } else { 2 };
        let n = call!(
            SYS_ppoll,
            fds.as_mut_ptr(),
            nfds,
            &mut tick as *mut libc::timespec,
            0usize,
            8usize
        );
        if n > 0 && fds[1].revents != 0 && !stopped {
            stopped = true;
            call!(SYS_kill, child, libc::SIGKILL);
        }
        // Reap orphans (reparented to us), but never the program: its status is read below.
        loop {
            let (r, zombie) = wait_any(libc::WNOWAIT);
            if r < 0 || zombie == 0 || zombie == child {
                break;
            }
            let mut info = zeroed_siginfo();
            call!(
                SYS_waitid,
                libc::P_PID,
                zombie,
                &mut info as *mut libc::siginfo_t,
                libc::WEXITED | libc::__WALL,
                0usize
            );
        }
        if n > 0 && fds[0].revents != 0 {
            let mut info = zeroed_siginfo();
            let r = call!(
                SYS_waitid,
                libc::P_PIDFD,
                child_pidfd,
                &mut info as *mut libc::siginfo_t,
                libc::WEXITED,
                0usize
            );
            if r == 0 {
                // SAFETY: si_status is valid after a successful waitid for a child event.
                let status = unsafe { info.si_status() };
                let mut out = [0u8; 8];
                out[..4].copy_from_slice(&info.si_code.to_ne_bytes());
                out[4..].copy_from_slice(&status.to_ne_bytes());
                return out;
            }
        }
    }
}

/// Kills every child until none is left; orphans of killed children are reparented to us (a
/// subreaper) and killed in the next round.
fn kill_descendants(proc_dir: RawFd) {
    let mut buf = [0u8; 4096];
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // A process that cannot die (uninterruptible sleep) must not keep us here for ever: after
    // about 10 s the host's deadline has long passed and it kills us.
    for _ in 0..10_000 {
        let fd = if proc_dir >= 0 {
            call!(
                SYS_openat,
                proc_dir,
                c"thread-self/children".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC
            )
        } else {
            call!(
                SYS_openat,
                libc::AT_FDCWD,
                c"/proc/thread-self/children".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC
            )
        };
        if fd < 0 {
            return; // no children list on this kernel: nothing more we can find
        }
        {
            let n = call!(SYS_read, fd, buf.as_mut_ptr(), buf.len());
            call!(SYS_close, fd);
            if n < 0 {
                return; // no children list on this kernel: nothing more we can find
            }
            let n = n.max(0) as usize;
            let mut pid: libc::pid_t = 0;
            for &b in &buf[..n] {
                if b.is_ascii_digit() {
                    pid = pid
                        .saturating_mul(10)
                        .saturating_add(libc::pid_t::from(b - b'0'));
                } else {
                    if pid > 0 {
                        call!(SYS_kill, pid, libc::SIGKILL);
                    }
                    pid = 0;
                }
            }
            // A number at the very end of a full buffer may be cut short: it is killed in the
            // next round, once the ones before it are gone.
            if pid > 0 && n < buf.len() {
                call!(SYS_kill, pid, libc::SIGKILL);
            }
        }
        loop {
            let (r, reaped) = wait_any(0);
            if r < 0 {
                return; // ECHILD: nobody left
            }
            if reaped == 0 {
                break;
            }
        }
        call!(SYS_nanosleep, &pause as *const libc::timespec, 0usize);
    }
}

/// What a process applies to itself before exec: limits, then privileges, then Landlock and
/// seccomp. Everything it points to stays alive and unchanged until exec.
pub(crate) struct SelfConfinement<'a> {
    pub rlimits: &'a [Rlimit],
    /// Empty the bounding set too (needs CAP_SETPCAP: root, or a user namespace of our own).
    pub drop_bounding: bool,
    /// Switch to these ids (uid, gid), with no supplementary groups.
    pub run_as: Option<(u32, u32)>,
    /// The parent whose death must kill this process (checked again after a uid switch).
    pub parent: Option<i32>,
    /// A Landlock ruleset descriptor, or -1.
    pub ruleset: RawFd,
    pub seccomp: Option<&'a libc::sock_fprog>,
    /// A UNIX socket to send the filter's listener over (the filter holds calls for whoever
    /// holds it, [`super::mediate`]), then closed; -1 for a filter without a listener.
    pub listener_to: RawFd,
}

/// Applies `c` to the calling process: raw syscalls only, async-signal-safe, no allocation
/// (callable between fork or clone and exec). After it the process holds no capability
/// (effective, permitted, inheritable, ambient; the bounding set too with `drop_bounding`),
/// `no_new_privs` is set, and the ruleset and filter are enforced. The error names the
/// step and the errno.
pub(crate) fn confine_self(c: &SelfConfinement<'_>) -> Result<(), (Stage, i32)> {
    let check = |r: isize, stage: Stage| {
        if r < 0 {
            Err((stage, errno_of(r)))
        } else {
            Ok(())
        }
    };
    for l in c.rlimits {
        let v = libc::rlimit {
            rlim_cur: l.value,
            rlim_max: l.value,
        };
        check(
            call!(
                SYS_prlimit64,
                0,
                l.resource,
                &v as *const libc::rlimit,
                0usize
            ),
            Stage::Limits,
        )?;
    }
    if c.drop_bounding {
        for cap in 0..64 {
            let r = call!(SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            if r == -(libc::EINVAL as isize) {
                break; // past the kernel's last capability
            }
            check(r, Stage::Capabilities)?;
        }
    }
    // EINVAL before Linux 4.3, which has no ambient set to clear.
    let r = call!(
        SYS_prctl,
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0,
        0,
        0
    );
    if r != -(libc::EINVAL as isize) {
        check(r, Stage::Capabilities)?;
    }
    if let Some((uid, gid)) = c.run_as {
        // Raw syscalls change only this process's credentials, which is all there is: it is
        // not a thread of the host.
        check(call!(SYS_setgroups, 0, 0usize), Stage::Identity)?;
        check(call!(SYS_setresgid, gid, gid, gid), Stage::Identity)?;
        check(call!(SYS_setresuid, uid, uid, uid), Stage::Identity)?;
        // A new uid resets this process's parent-death signal: armed again, and the parent
        // checked again. (It also clears the dumpable flag of the memory it may still share
        // with the host until exec: the supervisor, root, gives the host its value back once
        // this process has exec'd; setting it here, as the new uid, would open the host's
        // memory to that uid.)
        check(
            call!(SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL),
            Stage::Fence,
        )?;
        if let Some(parent) = c.parent {
            if call!(SYS_getppid) as i32 != parent {
                return Err((Stage::Fence, libc::ESRCH));
            }
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let none = || Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    };
    let data = [none(), none()];
    check(
        call!(SYS_capset, &header as *const Header, data.as_ptr()),
        Stage::Capabilities,
    )?;
    check(
        call!(SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        Stage::NoNewPrivs,
    )?;
    if c.ruleset >= 0 {
        check(
            call!(SYS_landlock_restrict_self, c.ruleset, 0),
            Stage::Landlock,
        )?;
    }
    if let Some(prog) = c.seccomp {
        let flags = if c.listener_to >= 0 {
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
        } else {
            0
        };
        let listener = call!(
            SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            prog as *const libc::sock_fprog
        );
        check(listener, Stage::Seccomp)?;
        if c.listener_to >= 0 {
            // The program must never hold the listener: it could answer its own calls.
            let sent = send_fd(c.listener_to, listener as RawFd);
            call!(SYS_close, listener);
            call!(SYS_close, c.listener_to);
            check(sent, Stage::Network)?;
        }
    } else if c.listener_to >= 0 {
        // A mediated network without a filter would be an open one.
        return Err((Stage::Seccomp, libc::ENOSYS));
    }
    Ok(())
}

extern "C" fn program_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` the supervisor holds while it is suspended in vfork.
    program(unsafe { &*(arg as *const ChildPlan) })
}

/// The program's process: stdio, working directory, limits, confinement, exec.
fn program(plan: &ChildPlan) -> ! {
    // Die with the supervisor, and do not run if it is already gone.
    let r = call!(SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    if r < 0 {
        fail(plan, Stage::Fence, errno_of(r));
    }
    let supervisor = plan
        .supervisor_pid
        .load(std::sync::atomic::Ordering::Relaxed);
    if call!(SYS_getppid) as i32 != supervisor {
        fail(plan, Stage::Fence, libc::ESRCH);
    }
    // A program starts with default dispositions (the host's handlers are meaningless after
    // exec, and signals it ignores, such as SIGPIPE, must not stay ignored), then unblocked.
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            default_action(sig);
        }
    }
    set_signal_mask(false);
    // Every source descriptor is above stderr, so dup3 never sees equal descriptors.
    for (from, to) in [(plan.devnull, 0), (plan.out_w, 1), (plan.err_w, 2)] {
        let r = call!(SYS_dup3, from, to, 0);
        if r < 0 {
            fail(plan, Stage::Stdio, errno_of(r));
        }
    }
    // Joining a mount namespace resets the working directory: join first, then enter it.
    for fd in plan.join {
        if fd >= 0 {
            let r = call!(SYS_setns, fd, 0);
            if r < 0 {
                fail(plan, Stage::Namespaces, errno_of(r));
            }
        }
    }
    if plan.own_proc {
        // In the supervisor's working directory, entered in its own mount namespace.
    } else if let Some(dir) = &plan.cwd_path {
        let r = call!(SYS_chdir, dir.as_ptr());
        if r < 0 {
            fail(plan, Stage::Cwd, errno_of(r));
        }
    } else if plan.cwd >= 0 {
        let r = call!(SYS_fchdir, plan.cwd);
        if r < 0 {
            fail(plan, Stage::Cwd, errno_of(r));
        }
    }
    // The host's controlling terminal must stay out of reach (TIOCSTI types into it). Landlock
    // grants no terminal; without it, a session of its own. Not always: each new session is a
    // scheduling group of its own under autogroup, which costs every spawn measurably.
    if plan.confined && plan.ruleset < 0 {
        call!(SYS_setsid);
    } else {
        call!(SYS_setpgid, 0, 0);
    }
    cloexec_all(plan.max_fd);
    // Before Landlock, which would deny the write.
    if let Some(procs) = &plan.cgroup {
        if let Err(e) = write_file(procs, b"0") {
            fail(plan, Stage::Cgroup, e);
        }
    }
    if plan.confined {
        let own = SelfConfinement {
            rlimits: &plan.rlimits,
            drop_bounding: plan.drop_bounding,
            run_as: plan.run_as,
            parent: Some(
                plan.supervisor_pid
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
            ruleset: plan.ruleset,
            seccomp: plan.seccomp.as_ref(),
            listener_to: if plan.net_mediated { plan.net_sock } else { -1 },
        };
        if let Err((stage, errno)) = confine_self(&own) {
            fail(plan, stage, errno);
        }
    }
    let r = call!(
        SYS_execve,
        plan.program.as_ptr(),
        plan.argv.as_ptr(),
        plan.envp.as_ptr()
    );
    fail(plan, Stage::Exec, errno_of(r))
}
