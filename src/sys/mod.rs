//! The OS layer every child process correx starts goes through: the fence a child gets before
//! exec, killing and stopping process groups, pidfds, executable resolution, and (for the shell)
//! a supervised, kernel-confined spawn. The few raw syscalls live here, each behind a `// SAFETY:`
//! line.

pub(crate) mod cgroup;
mod child;
pub(crate) mod fs;
pub(crate) mod landlock;
pub(crate) mod limits;
pub(crate) mod mediate;
pub(crate) mod namespaces;
pub(crate) mod net;
mod raw;
pub(crate) mod seccomp;
pub(crate) mod spawn;
pub(crate) mod spawner;
pub(crate) mod view;

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A raw syscall through `libc::syscall`, as `io::Result<c_long>`: -1 becomes the errno.
macro_rules! syscall {
    ($name:ident $(, $arg:expr)* $(,)?) => {{
        // SAFETY: each call site passes arguments of the types the syscall takes, and pointers
        // that stay valid for the call; the kernel checks the rest.
        let r = unsafe { libc::syscall(libc::$name $(, $arg)*) };
        if r < 0 {
            Err(::std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }};
}
pub(crate) use syscall;

/// The only `PATH` a child sees, and the one executables are resolved through.
pub const FIXED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The fence every child gets: a cleared environment but for `PATH` (callers add their own
/// variables after this), stdin from `/dev/null`, its own process group (in the host's
/// session, unlike a shell run: a confined llama-server's Landlock rules give it no terminal,
/// and a session of its own would also change how the kernel's autogroup schedules it
/// against the host), `PR_SET_PDEATHSIG`
/// checked against the parent's pid (so a child whose parent already died does not run), and
/// every inherited descriptor above stderr marked close-on-exec.
///
/// The parent-death signal fires when the *thread* that forked the child exits: spawn from a
/// thread that outlives the child.
pub(crate) fn fence(cmd: &mut Command) {
    cmd.env_clear()
        .env("PATH", FIXED_PATH)
        .stdin(Stdio::null())
        .process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only calls `fence_in_child`, which
    // makes async-signal-safe syscalls and allocates nothing.
    unsafe {
        cmd.pre_exec(move || fence_in_child(parent).map_err(io::Error::from_raw_os_error));
    }
}

/// The child's half of [`fence`], callable between fork and exec: async-signal-safe syscalls
/// only. Returns an errno on failure.
pub(crate) fn fence_in_child(parent: libc::pid_t) -> Result<(), i32> {
    // SAFETY: prctl with integer arguments; no memory involved.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        return Err(libc::ESRCH);
    }
    close_inherited_on_exec();
    Ok(())
}

/// Marks every descriptor above stderr close-on-exec, so a host's descriptors opened without
/// `O_CLOEXEC` never reach a child. Linux >= 5.11; on older kernels the host's own flags stay.
pub(crate) fn close_inherited_on_exec() {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        );
    }
}

/// Confinement a forked child (a `Command`) applies to itself before exec: limits, every
/// capability dropped (the bounding set too with `drop_bounding`), `no_new_privs`, the Landlock
/// ruleset and the seccomp filter.
#[derive(Debug)]
pub(crate) struct ForkConfinement {
    pub ruleset: Option<landlock::Ruleset>,
    pub filter: Option<seccomp::Filter>,
    pub rlimits: Vec<limits::Rlimit>,
    pub drop_bounding: bool,
    /// The server's own view, built in a mount namespace of its own before the rest.
    pub view: Option<ForkView>,
}

/// A view a forked child builds for itself: in a new mount namespace (inside a new user
/// namespace, `maps` mapping the host's ids to themselves, where the host is not root), then
/// back in its working directory where the view holds it.
#[derive(Debug)]
pub(crate) struct ForkView {
    pub plan: view::ViewPlan,
    pub maps: Option<[std::ffi::CString; 2]>,
    pub cwd: Option<std::ffi::CString>,
}

/// Makes `cmd`'s child apply `c` before exec (after [`fence`], when both are used). A step
/// that fails fails the spawn with its errno.
pub(crate) fn confine_command(cmd: &mut Command, c: ForkConfinement) {
    let program = c.filter.as_ref().map(|f| f.instructions());
    // SAFETY: the closure runs between fork and exec: `confine_self` makes raw,
    // async-signal-safe syscalls and allocates nothing; everything it reads is owned by the
    // closure and unchanged.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(v) = &c.view {
                enter_view(v)?;
            }
            let prog = program.as_deref().map(seccomp::prog_of);
            let own = child::SelfConfinement {
                rlimits: &c.rlimits,
                drop_bounding: c.drop_bounding,
                run_as: None,
                parent: None,
                ruleset: c.ruleset.as_ref().map_or(-1, |r| r.raw()),
                seccomp: prog.as_ref(),
                listener_to: -1,
            };
            child::confine_self(&own).map_err(|(_, errno)| io::Error::from_raw_os_error(errno))
        });
    }
}

/// In a forked child: a mount namespace of its own (in a user namespace of its own where `v`
/// maps ids), `v`'s view built and entered, then its working directory again if the view
/// holds it. Raw syscalls only.
fn enter_view(v: &ForkView) -> io::Result<()> {
    let flags = if v.maps.is_some() {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWNS
    };
    let r = raw::call!(SYS_unshare, flags);
    if r < 0 {
        return Err(io::Error::from_raw_os_error((-r) as i32));
    }
    if let Some(maps) = &v.maps {
        child::map_ids(maps).map_err(io::Error::from_raw_os_error)?;
    }
    view::build(&v.plan, &[], None).map_err(|f| io::Error::from_raw_os_error(f.errno))?;
    if let Some(cwd) = &v.cwd {
        // Relative arguments name files from the host's working directory; where the view
        // does not hold it, the server starts in its root.
        let _ = raw::call!(SYS_chdir, cwd.as_ptr());
    }
    Ok(())
}

/// SIGKILL to every process in group `pgid`; ESRCH (nobody left) counts as done.
pub(crate) fn kill_group(pgid: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg with a positive group id of a group we created; no memory involved.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// A pidfd for `pid`, readable once the process exits (Linux >= 5.3), or `None`.
pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    let fd = syscall!(SYS_pidfd_open, pid, 0).ok()?;
    // SAFETY: fd is a freshly created descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether child `pid` has exited, without reaping it (so its pid and group id stay reserved
/// until we kill the group and reap). An error (not our child) counts as exited.
pub(crate) fn exited_unreaped(pid: i32) -> bool {
    // SAFETY: siginfo_t is plain data; waitid writes it on success.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid with WNOWAIT on our own child does not reap it; info is valid for writes.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is valid to read after a successful waitid.
    r != 0 || unsafe { info.si_pid() } != 0 || zombie(pid)
}

/// The resident memory of process `pid` (`VmRSS`), when it can be read.
pub(crate) fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Sends `signal` to the process behind `pidfd`.
pub(crate) fn pidfd_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    syscall!(
        SYS_pidfd_send_signal,
        pidfd.as_raw_fd(),
        signal,
        std::ptr::null::<libc::siginfo_t>(),
        0u32
    )
    .map(drop)
}

/// Whether `pid`'s leader thread has exited. A multi-threaded process (llama-server) is not
/// waitable until its last thread is gone, which takes a while after a SIGKILL, but its leader
/// shows as a zombie at once.
fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// When process `pid` started, in clock ticks after boot (`/proc/PID/stat`, field 22), and
/// whether it is a zombie (dead, not yet reaped): with the pid, the start time names one
/// process for the life of a boot, where a pid alone may be reused.
///
/// # Errors
/// `NotFound` when there is no such process; others (`/proc` mounted with `hidepid`, no
/// `/proc`) when it cannot be told.
pub(crate) fn process_start(pid: u32) -> io::Result<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces and parentheses): state is field 3,
    // so the start time (field 22) is the 20th after it.
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "an unreadable /proc stat line");
    let (_, rest) = stat.rsplit_once(')').ok_or_else(bad)?;
    let mut fields = rest.split_whitespace();
    let zombie = fields.next() == Some("Z");
    let start = fields
        .nth(18)
        .and_then(|f| f.parse().ok())
        .ok_or_else(bad)?;
    Ok((start, zombie))
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub(crate) fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// This machine's id (`/etc/machine-id`, else D-Bus's copy): what tells a claim made on another
/// host sharing the log (PostgreSQL) from one made here before a reboot.
pub(crate) fn machine_id() -> Option<String> {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The pid namespace process `pid` lives in, as the kernel names it (`pid:[4026531836]`).
pub(crate) fn pid_namespace(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// How a child we stopped ended, and which of our signals reached it alive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ended {
    /// It had exited before we sent anything.
    pub before: bool,
    /// We sent SIGTERM to it running.
    pub sent_term: bool,
    /// We sent SIGKILL to it running.
    pub sent_kill: bool,
    /// Its wait status, once reaped.
    pub status: Option<std::process::ExitStatus>,
}

impl Ended {
    /// Whether it died of something we did not do: it exited before we signalled it, or a
    /// signal we did not send ended it (a SIGKILL of someone else's while ours was only a
    /// SIGTERM, a SIGSEGV).
    pub(crate) fn not_by_us(&self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let ours = match self.status.and_then(|s| s.signal()) {
            Some(libc::SIGTERM) => self.sent_term,
            Some(libc::SIGKILL) => self.sent_kill,
            Some(_) => false,
            // An exit of its own after our SIGTERM (a graceful shutdown), or an unknown end.
            None => true,
        };
        self.before || !ours
    }
}

/// Stops a child that leads its own process group: SIGTERM to the group, up to `grace` for the
/// leader to exit, then SIGKILL to the group, and reaps the leader. Says how it ended.
pub(crate) fn stop_group(child: &mut std::process::Child, grace: Duration) -> Ended {
    let pgid = child.id() as i32;
    let before = exited_unreaped(pgid);
    if !before {
        // SAFETY: signalling the process group we created for this child.
        unsafe {
            libc::killpg(pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !exited_unreaped(pgid) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let sent_kill = !exited_unreaped(pgid);
    // The leader is at most a zombie here, so its group id is still ours to signal.
    kill_group(pgid);
    Ended {
        before,
        sent_term: !before,
        sent_kill,
        status: child.wait().ok(),
    }
}

/// Kills a child that leads its own process group at once (SIGKILL to the group: a stopped or
/// hung process handles no SIGTERM), and reaps the leader. Says how it ended.
pub(crate) fn kill_and_reap(child: &mut std::process::Child) -> Ended {
    let pgid = child.id() as i32;
    let before = exited_unreaped(pgid);
    kill_group(pgid);
    Ended {
        before,
        sent_term: false,
        sent_kill: !before,
        status: child.wait().ok(),
    }
}

/// Resolves `name` to a canonical absolute executable path: a bare name through
/// [`FIXED_PATH`], a path with a slash as given (relative paths are refused: they depend on the
/// host's working directory).
pub(crate) fn resolve_executable(name: &str) -> Option<PathBuf> {
    resolve_both(name).map(|(_, canonical)| canonical)
}

/// As [`resolve_executable`], also returning the path before symlinks were followed.
pub(crate) fn resolve_both(name: &str) -> Option<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    let candidate = if name.contains('/') {
        let p = Path::new(name);
        if !p.is_absolute() {
            return None;
        }
        p.to_path_buf()
    } else if name.is_empty() {
        return None;
    } else {
        FIXED_PATH
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| is_exec(p))?
    };
    let canonical = std::fs::canonicalize(&candidate).ok()?;
    is_exec(&canonical).then_some((candidate, canonical))
}

/// A close-on-exec descriptor for the directory `dir`, for a child to start in.
pub(crate) fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map(OwnedFd::from)
}

/// A close-on-exec `O_PATH` descriptor for the directory `rel` beneath `base`, not following a
/// symlink at its end.
pub(crate) fn open_dir_at(base: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    fs::openat(
        base.as_raw_fd(),
        rel.as_os_str(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

/// The real uid of this process.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Whether `fd` turns readable within `timeout_ms` (a pidfd: the process exited).
pub(crate) fn wait_readable(fd: std::os::fd::RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on this frame.
    unsafe { libc::poll(&mut p, 1, timeout_ms) > 0 }
}

/// Writes all of `bytes` to `fd` (a pipe set non-blocking by [`set_nonblocking`]), waiting
/// while the pipe is full for at most `timeout` in all.
///
/// # Errors
/// `TimedOut` when the reader did not drain the pipe in time; the write's own error.
pub(crate) fn write_all_within(
    fd: std::os::fd::RawFd,
    bytes: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    // A reader that is gone makes the write raise SIGPIPE, which kills a host that keeps the
    // default action (a C program): blocked on this thread for the write, and a pending one
    // taken back before the mask is restored.
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset before use.
    let mut pipe_set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers on this frame; pthread_sigmask changes this thread only.
    unsafe {
        libc::sigemptyset(&mut pipe_set);
        libc::sigaddset(&mut pipe_set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe_set, &mut old);
    }
    let written = write_all_blocked(fd, bytes, timeout);
    if matches!(&written, Err(e) if e.raw_os_error() == Some(libc::EPIPE)) {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: takes this thread's pending SIGPIPE, if any, without waiting.
        unsafe { libc::sigtimedwait(&pipe_set, std::ptr::null_mut(), &zero) };
    }
    // SAFETY: restores this thread's mask as it was.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    written
}

fn write_all_blocked(
    fd: std::os::fd::RawFd,
    mut bytes: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    let deadline = Instant::now().checked_add(timeout);
    while !bytes.is_empty() {
        // SAFETY: writing from a live slice of bytes.len() bytes.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n >= 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => {
                let left = deadline.map_or(Duration::from_secs(3600), |d| {
                    d.saturating_duration_since(Instant::now())
                });
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the reader did not drain the pipe in time",
                    ));
                }
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                let ms = left.as_millis().min(i32::MAX as u128) as i32;
                // SAFETY: one valid pollfd on this frame.
                unsafe { libc::poll(&mut p, 1, ms) };
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// Makes `fd` non-blocking.
pub(crate) fn set_nonblocking(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Fills `buf` from the kernel's random source; `false` when it could not (a kernel before
/// 3.17, or a seccomp filter refusing it).
pub(crate) fn getrandom(buf: &mut [u8]) -> bool {
    // SAFETY: buf is valid and writable for buf.len() bytes; getrandom writes at most that.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    n >= 0 && n as usize == buf.len()
}

/// The effective uid of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_child_is_exited_unreaped_until_it_is_waited_for() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!exited_unreaped(pid));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !exited_unreaped(pid) {
            assert!(Instant::now() < deadline, "never seen as exited");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(child.wait().is_ok());
    }

    /// In a child with SIGPIPE at its default action (as a C host has it), a write to a pipe
    /// whose reader is gone kills the process, unless it goes through `write_all_within`,
    /// which returns EPIPE instead.
    #[test]
    fn a_write_to_a_gone_reader_is_an_error_not_a_sigpipe() {
        let outcome = |protected: bool| -> i32 {
            // SAFETY: the child only makes syscalls (pipe, close, write, signal masks) and
            // exits with _exit; the parent waits for it.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: in the child: plain syscalls on its own descriptors, then _exit.
                unsafe {
                    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                    let mut fds = [0; 2];
                    if libc::pipe(fds.as_mut_ptr()) != 0 {
                        libc::_exit(3);
                    }
                    libc::close(fds[0]);
                    let written = if protected {
                        write_all_within(fds[1], b"x", Duration::from_secs(1))
                    } else {
                        write_all_blocked(fds[1], b"x", Duration::from_secs(1))
                    };
                    let epipe = matches!(written, Err(e) if e.raw_os_error() == Some(libc::EPIPE));
                    libc::_exit(if epipe { 0 } else { 1 });
                }
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            status
        };
        let killed = outcome(false);
        assert!(
            libc::WIFSIGNALED(killed) && libc::WTERMSIG(killed) == libc::SIGPIPE,
            "without the mask the write must kill the child: {killed}"
        );
        let kept = outcome(true);
        assert!(
            libc::WIFEXITED(kept) && libc::WEXITSTATUS(kept) == 0,
            "status {kept}"
        );
    }
}
