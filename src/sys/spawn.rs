//! A supervised spawn: nothing a child starts outlives its run.
//!
//! The host clones a small supervisor (no exec: it runs only async-signal-safe syscalls), which
//! clones the program's process, confines it (limits, Landlock, seccomp) and execs it. When the
//! program exits, the host asks for a stop, or the host dies (the supervisor watches a pipe whose
//! only write end the host holds), the supervisor kills every descendant and exits.
//!
//! Containment is kernel-enforced either way:
//! - **PID namespace** (root, or any user where unprivileged user namespaces are allowed): the
//!   supervisor is the namespace's init; when it exits the kernel kills everything in it, and
//!   nothing inside can signal it.
//! - **Subreaper** (elsewhere): the supervisor is a child subreaper, so every orphan, however it
//!   detached (setsid, setpgid, double fork), is reparented to it; it kills its children from
//!   `/proc/thread-self/children` until it has none.
//!
//! The supervisor is cloned with no exit signal, so a host that ignores SIGCHLD (which makes
//! the kernel reap ordinary children before anyone can wait for them) still gets exit statuses.

use super::child::{map_ids, supervisor_entry, ChildPlan, Stack, Stage};
use super::landlock::last_errno;
use super::limits::Rlimit;
use super::syscall;
use std::ffi::{CString, OsStr};
use std::fmt;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the host waits for the supervisor to finish its kill after a stop before it kills
/// the supervisor itself.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long pipes are still read after the run ended; only something outside the run holding a
/// pipe could keep them open that long.
const DRAIN_DEADLINE: Duration = Duration::from_millis(500);

/// The stacks the supervisor and (until it execs) the program's process run on.
const CHILD_STACK: usize = 64 * 1024;

/// The supervisor and the plan it reads. Dropped without [`Supervised::reap`] (an early
/// return, or this thread unwinding), it kills and reaps the supervisor. The plan is freed
/// only after the reap, and leaked when the supervisor had to be killed in subreaper mode: its
/// program's process, which shares our memory until it execs, may still be reading it for the
/// moment its parent-death signal takes.
struct Supervised {
    pidfd: OwnedFd,
    plan: Option<Box<ChildPlan>>,
    killed: bool,
    /// The run's own mount namespace, held so that its end (which waits for an RCU grace
    /// period) comes after the run's, on another thread ([`close_later`]), or never: it goes
    /// back to its pool (with the runs it served) for the next run.
    mount_ns: Option<OwnedFd>,
    pool: Option<(std::sync::Arc<super::view::ProcPool>, u32)>,
}

// SAFETY: the plan's raw pointers point into allocations the plan itself owns (its strings,
// filter and stacks), which no thread of this process touches; only the supervisor and the
// program's process (sharing our memory) read them. Handing the owner to another thread moves
// no allocation and changes nothing they read.
unsafe impl Send for Supervised {}

impl Supervised {
    /// Waits for the supervisor to exit and reaps it, then releases the plan.
    fn reap(&mut self) {
        let _ = reap(&self.pidfd);
        self.release();
    }

    fn release(&mut self) {
        if let Some(ns) = self.mount_ns.take() {
            let done = match self.pool.take() {
                Some((pool, uses)) => pool.give(ns, uses + 1),
                None => Some(ns),
            };
            if let Some(ns) = done {
                close_later(ns);
            }
        }
        if let Some(plan) = self.plan.take() {
            if self.killed && plan.containment == Containment::Subreaper {
                Box::leak(plan);
            }
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.plan.is_none() {
            return;
        }
        let _ = syscall!(
            SYS_pidfd_send_signal,
            self.pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32
        );
        self.killed = true;
        let _ = reap(&self.pidfd);
        self.release();
    }
}

/// Drops `fd` (a run's mount namespace) on a thread of its own: when it is the last hold,
/// destroying the namespace waits for an RCU grace period, which no run should wait for.
fn close_later(fd: OwnedFd) {
    static CLOSER: std::sync::OnceLock<
        Option<parking_lot::Mutex<std::sync::mpsc::Sender<OwnedFd>>>,
    > = std::sync::OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
        std::thread::Builder::new()
            .name("correx-ns-closer".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| parking_lot::Mutex::new(tx))
    });
    if let Some(tx) = closer {
        // Sent, or (the thread gone) dropped here.
        let _ = tx.lock().send(fd);
    }
}

/// The host's `/proc`, opened once (`O_PATH`): a subreaper inside a view reads its children
/// through it. -1 where it cannot be opened.
fn host_proc() -> RawFd {
    static PROC: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    PROC.get_or_init(|| {
        super::fs::openat(
            libc::AT_FDCWD,
            OsStr::new("/proc"),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )
        .ok()
    })
    .as_ref()
    .map_or(-1, |fd| fd.as_raw_fd())
}

/// The descriptor limit (soft), bounded: what a close-by-close fallback has to cover.
fn max_fd() -> u32 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct on this frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 1024;
    }
    l.rlim_cur.min(1 << 20) as u32
}

/// How the run's descendants are contained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Containment {
    /// A new PID namespace (with a user namespace when not root).
    PidNamespace { user_ns: bool },
    /// The supervisor is a child subreaper that kills every descendant.
    Subreaper,
}

impl Containment {
    /// The name recorded in the applied policy.
    pub fn name(self) -> &'static str {
        match self {
            Containment::PidNamespace { user_ns: false } => "pid_namespace",
            Containment::PidNamespace { user_ns: true } => "user_and_pid_namespace",
            Containment::Subreaper => "subreaper",
        }
    }

    fn clone_flags(self) -> libc::c_ulong {
        match self {
            Containment::PidNamespace { user_ns: false } => libc::CLONE_NEWPID as libc::c_ulong,
            // A user namespace of its own lets an unprivileged host give the run UTS and IPC
            // namespaces too.
            Containment::PidNamespace { user_ns: true } => {
                (libc::CLONE_NEWPID | libc::CLONE_NEWUSER | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC)
                    as libc::c_ulong
            }
            Containment::Subreaper => 0,
        }
    }
}

/// The strongest containment this process can use, probed once: a PID namespace when the
/// kernel lets us create one (directly, or inside a new user namespace), else a subreaper.
pub(crate) fn best_containment() -> Containment {
    static BEST: std::sync::OnceLock<Containment> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| {
        let candidates = if super::euid() == 0 {
            &[
                Containment::PidNamespace { user_ns: false },
                Containment::PidNamespace { user_ns: true },
            ][..]
        } else {
            &[Containment::PidNamespace { user_ns: true }][..]
        };
        candidates
            .iter()
            .copied()
            .find(|c| probe(*c))
            .unwrap_or(Containment::Subreaper)
    })
}

/// Whether a child can be cloned into `c`'s namespaces (and, in a user namespace, map its ids:
/// a host that is not dumpable, such as one that dropped privileges, cannot).
fn probe(c: Containment) -> bool {
    probe_flags(c, 0)
}

/// As [`probe`], with `extra` clone flags.
fn probe_flags(c: Containment, extra: libc::c_ulong) -> bool {
    let Ok(maps) = id_maps() else {
        return false;
    };
    let mut pidfd: RawFd = -1;
    // SAFETY: clone without CLONE_VM forks this process; the child only calls _exit.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            c.clone_flags() | extra | libc::CLONE_PIDFD as libc::c_ulong,
            0usize,
            &mut pidfd as *mut RawFd,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: in the cloned child: async-signal-safe writes of prepared strings, then _exit.
        unsafe {
            let mapped =
                c != (Containment::PidNamespace { user_ns: true }) || map_ids(&maps).is_ok();
            libc::_exit(if mapped { 0 } else { 1 })
        }
    }
    if pid < 0 {
        return false;
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    reap(&pidfd) == Some(0)
}

/// Whether a run in `c` can also get a network namespace of its own (probed once: a
/// container without CAP_SYS_ADMIN, or `user.max_net_namespaces=0`, refuses one).
pub(crate) fn network_namespace_works(c: Containment) -> bool {
    use std::sync::OnceLock;
    // Only the containment asked about is probed: each probe is a clone.
    static WORKS: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = match c {
        Containment::PidNamespace { user_ns: false } => 0,
        Containment::PidNamespace { user_ns: true } => 1,
        Containment::Subreaper => 2,
    };
    *WORKS[i].get_or_init(|| probe_flags(c, libc::CLONE_NEWNET as libc::c_ulong))
}

/// The uid and gid map lines that map our effective ids to themselves in a new user namespace
/// (the kernel requires the writer's effective ids).
pub(crate) fn id_maps() -> io::Result<[CString; 2]> {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Ok([
        cstring(format!("{uid} {uid} 1\n").as_bytes(), "uid map")?,
        cstring(format!("{gid} {gid} 1\n").as_bytes(), "gid map")?,
    ])
}

/// Whether the subreaper can list its children (`CONFIG_PROC_CHILDREN`, a readable /proc):
/// without it, it could not find the orphans it must kill.
pub(crate) fn subreaper_works() -> bool {
    std::fs::read("/proc/thread-self/children").is_ok()
}

/// Confinement a child applies to itself before exec. Every capability is dropped.
#[derive(Debug)]
pub(crate) struct Confinement {
    /// A Landlock ruleset to enforce.
    pub ruleset: Option<super::landlock::Ruleset>,
    /// A seccomp filter to install.
    pub filter: Option<super::seccomp::Filter>,
    /// Resource limits.
    pub rlimits: Vec<Rlimit>,
    /// Namespaces to join (mount, UTS, IPC; -1 for none), held by the caller for the run.
    pub join: [RawFd; 3],
    /// Empty the bounding set (possible with CAP_SETPCAP: root, or in a user namespace).
    pub drop_bounding: bool,
    /// The uid and gid the program runs as; `None` keeps the host's.
    pub run_as: Option<(u32, u32)>,
    /// The run's own view, built by its supervisor (an unprivileged host's run).
    pub view: Option<std::sync::Arc<super::view::ViewPlan>>,
    /// The supervisor mounts a /proc of the run's own over the tool's view (a root host), in
    /// a mount namespace of this pool's (or a new one, which goes to the pool after the run).
    pub proc_pool: Option<std::sync::Arc<super::view::ProcPool>>,
    /// The Landlock rights the run's own /proc gets in its ruleset (0: none to add).
    pub proc_rights: u64,
    /// A staged run's overlays (its working dirs' layers), mounted by its supervisor in the
    /// run's own mount namespace: a new one, never a pooled one.
    pub overlays: Vec<super::view::Overlay>,
}

impl Default for Confinement {
    fn default() -> Self {
        Confinement {
            ruleset: None,
            filter: None,
            rlimits: Vec::new(),
            join: [-1; 3],
            drop_bounding: false,
            run_as: None,
            view: None,
            proc_pool: None,
            proc_rights: 0,
            overlays: Vec::new(),
        }
    }
}

/// What to run.
pub(crate) struct SpawnSpec<'a> {
    pub program: &'a Path,
    /// Every argument, `argv[0]` included.
    pub argv: &'a [&'a OsStr],
    /// The whole environment.
    pub env: &'a [(String, String)],
    /// A directory descriptor to start in; default the host's working directory.
    pub cwd: Option<RawFd>,
    /// The directory to start in by path, for a run that builds its own view (a descriptor
    /// of the host's tree would be outside it); takes the place of `cwd`.
    pub cwd_path: Option<&'a Path>,
    pub confinement: Option<&'a Confinement>,
    pub containment: Containment,
    /// A cgroup's `cgroup.procs` the program's process joins before exec (its process bound).
    pub cgroup: Option<&'a std::ffi::CStr>,
    /// A thread inside the tool's cgroup to clone the supervisor from (the process bound
    /// without a migration per run).
    pub spawner: Option<&'a super::spawner::Spawner>,
    pub timeout: Duration,
    /// Most bytes kept of stdout, and separately of stderr; the rest is read and dropped.
    pub output_cap: usize,
    /// Cancelling it stops the run as its timeout would: every process of it is killed.
    pub cancel: Option<&'a crate::cancel::CancelToken>,
    /// The run's way to its proxy, if it has one.
    pub net: Option<RunNet>,
    /// Give the program a pipe for stdin ([`Started::take_stdin`]); otherwise `/dev/null`.
    pub stdin: bool,
}

/// How a run reaches its proxy and nothing else.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RunNet {
    /// A network namespace of its own, with only loopback: the supervisor listens on `port`
    /// there and sends the listener over `sock` (see [`super::net`]).
    Namespace { sock: RawFd, port: u16 },
    /// The host's network, every `connect` held by the run's seccomp filter: the program's
    /// process sends the filter's listener over `sock` (see [`super::mediate`]).
    Mediated { sock: RawFd },
    /// A network namespace of its own with only loopback, up, for the run alone.
    Loopback,
}

/// How the program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
}

/// One captured stream.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub bytes: Vec<u8>,
    /// Bytes read past the cap and dropped.
    pub dropped: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.dropped > 0
    }
}

/// What a run produced.
#[derive(Debug)]
pub(crate) struct RunOutput {
    pub exit: Exit,
    pub stdout: Captured,
    pub stderr: Captured,
    pub timed_out: bool,
    /// Stopped because the spec's cancel token was cancelled.
    pub cancelled: bool,
    pub duration: Duration,
}

/// An eventfd a cancel makes readable, so the pump's `poll` wakes at once.
fn cancel_wake(
    token: &crate::cancel::CancelToken,
) -> io::Result<(OwnedFd, crate::cancel::CancelHook)> {
    // SAFETY: eventfd returns a new descriptor or -1; owned at once.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let writer = fd.try_clone()?;
    let hook = token.on_cancel(move || {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write to an eventfd this closure owns.
        let _ = unsafe { libc::write(writer.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    });
    Ok((fd, hook))
}

/// A pipe, both ends close-on-exec and above stderr (so moving one onto 0..=2 never clobbers
/// another).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((high(r)?, high(w)?))
}

fn high(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor we own to a new one >= 3.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: n is a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn cstring(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} holds a NUL byte"),
        )
    })
}

/// Runs `spec` to completion (or its timeout) inside a supervisor, and returns its output. When
/// this returns, the program and everything it started are gone.
///
/// # Errors
/// The program could not start (the error names the step: exec, Landlock, limits, ...), or a
/// pipe or poll failed.
pub(crate) fn run(spec: &SpawnSpec<'_>) -> io::Result<RunOutput> {
    let begun = Instant::now();
    let Some(started) = start(spec)? else {
        return Ok(RunOutput {
            exit: Exit::Signal(libc::SIGKILL),
            stdout: Captured::default(),
            stderr: Captured::default(),
            timed_out: true,
            cancelled: false,
            duration: begun.elapsed(),
        });
    };
    let mut sink = Capture {
        cap: spec.output_cap,
        streams: [Captured::default(), Captured::default()],
    };
    let ended = started.wait(&mut sink, spec.cancel)?;
    let [stdout, stderr] = sink.streams;
    Ok(RunOutput {
        exit: ended.exit,
        stdout,
        stderr,
        timed_out: ended.timed_out,
        cancelled: ended.cancelled,
        duration: ended.duration,
    })
}

/// Where a running program's output goes as it is read.
pub(crate) trait Sink {
    /// `bytes` read from stdout (`stream` 0) or stderr (1).
    fn take(&mut self, stream: usize, bytes: &[u8]);

    /// `stream` was closed by the run (it may go on running).
    fn closed(&mut self, _stream: usize) {}
}

/// Both streams kept up to `cap` bytes each; the rest counted and dropped.
struct Capture {
    cap: usize,
    streams: [Captured; 2],
}

impl Sink for Capture {
    fn take(&mut self, stream: usize, bytes: &[u8]) {
        let sink = &mut self.streams[stream.min(1)];
        let room = self.cap.saturating_sub(sink.bytes.len());
        let keep = room.min(bytes.len());
        sink.bytes.extend_from_slice(&bytes[..keep]);
        sink.dropped += (bytes.len() - keep) as u64;
    }
}

/// How a started program ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ended {
    pub exit: Exit,
    pub timed_out: bool,
    /// Stopped because the cancel token was cancelled.
    pub cancelled: bool,
    pub duration: Duration,
}

/// What a started run holds until it ends (its temp directory, cgroup, proxy), given back
/// when this runs, once every process of it is gone.
pub(crate) type Cleanup = Box<dyn FnOnce() + Send>;

/// A program that has exec'd, confined and contained, and is running: its supervisor and its
/// pipes. [`Started::wait`] reads its output until it ends; dropped instead, it kills and
/// reaps everything it started.
pub(crate) struct Started {
    /// Taken by [`Started::wait`]; still here on drop, the run is stopped as at its timeout.
    parts: Option<Parts>,
    supervisor: libc::pid_t,
    stop_w: Option<OwnedFd>,
    stdin: Option<OwnedFd>,
    start: Instant,
    deadline: Instant,
}

struct Parts {
    guard: Supervised,
    out_r: OwnedFd,
    err_r: OwnedFd,
    status_r: OwnedFd,
}

impl Drop for Started {
    /// Stops a run no one waits for as its timeout would: the supervisor is told to kill
    /// every process of it (closing the stop pipe) and given [`STOP_GRACE`] before it is
    /// killed itself, so a subreaper kills the program's descendants rather than leave them.
    fn drop(&mut self) {
        let Some(mut parts) = self.parts.take() else {
            return;
        };
        drop(self.stop_w.take());
        if wait_readable(parts.guard.pidfd.as_raw_fd(), STOP_GRACE) {
            parts.guard.reap();
        } else {
            parts.guard.killed = true;
        } // else the guard kills and reaps it
    }
}

impl fmt::Debug for Started {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started")
            .field("supervisor", &self.supervisor)
            .finish_non_exhaustive()
    }
}

/// Starts `spec`'s program inside a supervisor and returns once it has exec'd; `None` when it
/// did not exec within the spec's timeout (everything it started is killed and reaped).
///
/// # Errors
/// As [`run`].
pub(crate) fn start(spec: &SpawnSpec<'_>) -> io::Result<Option<Started>> {
    let start = Instant::now();
    let deadline = start
        .checked_add(spec.timeout)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "timeout too large"))?;
    let program = cstring(spec.program.as_os_str().as_bytes(), "the program path")?;
    let argv_c: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| cstring(a.as_bytes(), "an argument"))
        .collect::<io::Result<_>>()?;
    let env_c: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}").as_bytes(), "an environment variable"))
        .collect::<io::Result<_>>()?;
    let with_null = |v: &[CString]| {
        v.iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect::<Vec<_>>()
    };
    let filter = spec
        .confinement
        .and_then(|c| c.filter.as_ref())
        .map(|f| f.instructions())
        .unwrap_or_default();
    let devnull = high(OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?,
    ))?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (fail_r, fail_w) = pipe()?;
    let (stop_r, stop_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let (stdin_r, stdin_w) = if spec.stdin {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let user_maps = match spec.containment {
        Containment::PidNamespace { user_ns: true } => Some(id_maps()?),
        _ => None,
    };
    let ruleset = spec
        .confinement
        .and_then(|c| c.ruleset.as_ref())
        .map_or(-1, |r| r.raw());
    let join = spec.confinement.map_or([-1; 3], |c| c.join);
    // A mount namespace an earlier run left for this one's /proc, if the pool has one.
    let pool = spec.confinement.and_then(|c| c.proc_pool.clone());
    let overlays = spec
        .confinement
        .map(|c| c.overlays.clone())
        .unwrap_or_default();
    let own_proc = pool.is_some();
    // A staged run's layers go with its namespace: never one of the pool's, nor back to it.
    let pool = pool.filter(|_| overlays.is_empty());
    let pooled = pool.as_ref().and_then(|p| p.take());
    let mut plan = Box::new(ChildPlan {
        argv: with_null(&argv_c),
        envp: with_null(&env_c),
        _strings: argv_c.into_iter().chain(env_c).collect(),
        program,
        devnull: stdin_r.as_ref().unwrap_or(&devnull).as_raw_fd(),
        out_w: out_w.as_raw_fd(),
        err_w: err_w.as_raw_fd(),
        fail_w: fail_w.as_raw_fd(),
        stop_r: stop_r.as_raw_fd(),
        status_w: status_w.as_raw_fd(),
        cwd: spec.cwd.unwrap_or(-1),
        cwd_path: match spec.cwd_path {
            Some(p) => Some(cstring(p.as_os_str().as_bytes(), "the start directory")?),
            None => None,
        },
        view: spec.confinement.and_then(|c| c.view.clone()),
        own_proc,
        proc_ns: pooled.as_ref().map_or(-1, |(ns, _)| ns.as_raw_fd()),
        proc_rights: spec.confinement.map_or(0, |c| c.proc_rights),
        overlays,
        user_maps,
        containment: spec.containment,
        confined: spec.confinement.is_some(),
        rlimits: spec
            .confinement
            .map(|c| c.rlimits.clone())
            .unwrap_or_default(),
        ruleset,
        seccomp: None,
        _filter: filter,
        cgroup: spec.cgroup.map(std::ffi::CStr::to_owned),
        join,
        drop_bounding: spec.confinement.is_some_and(|c| c.drop_bounding),
        run_as: spec.confinement.and_then(|c| c.run_as),
        net_sock: match spec.net {
            Some(RunNet::Namespace { sock, .. } | RunNet::Mediated { sock }) => sock,
            Some(RunNet::Loopback) | None => -1,
        },
        net_port: match spec.net {
            Some(RunNet::Namespace { port, .. }) => port,
            _ => 0,
        },
        net_mediated: matches!(spec.net, Some(RunNet::Mediated { .. })),
        net_loopback: matches!(spec.net, Some(RunNet::Loopback)),
        host_dumpable: host_dumpable(),
        keep: [spec.cwd.unwrap_or(-1), ruleset, join[0], join[1], join[2]],
        proc_dir: match spec.containment {
            Containment::Subreaper => host_proc(),
            Containment::PidNamespace { .. } => -1,
        },
        supervisor_pid: std::sync::atomic::AtomicI32::new(0),
        max_fd: max_fd(),
        supervisor_stack: Stack::new(CHILD_STACK)?,
        program_stack: Stack::new(CHILD_STACK)?,
    });
    if !plan._filter.is_empty() {
        plan.seccomp = Some(super::seccomp::prog_of(&plan._filter));
    }

    let stack_top = plan.supervisor_stack.top();
    let plan_addr = &*plan as *const ChildPlan as usize;
    let mut flags =
        libc::CLONE_VM | libc::CLONE_PIDFD | spec.containment.clone_flags() as libc::c_int;
    if matches!(spec.net, Some(RunNet::Namespace { .. } | RunNet::Loopback)) {
        flags |= libc::CLONE_NEWNET;
    }
    // A run that builds its own view does so in a mount namespace of its own (owned by its
    // user namespace).
    if plan.view.is_some() {
        flags |= libc::CLONE_NEWNS;
    }
    let (pid, pidfd, clone_error) = match spec.spawner {
        // From a thread already inside the tool's cgroup: the supervisor, and all it starts,
        // are born in it (joining one later is a slow migration).
        Some(spawner) => spawner
            .call(move || clone_supervisor(plan_addr, stack_top, flags))
            .map_err(|e| io::Error::new(e.kind(), format!("the shell's spawner thread: {e}")))?,
        None => clone_supervisor(plan_addr, stack_top, flags),
    };
    if pid < 0 {
        return Err(io::Error::new(
            clone_error.kind(),
            format!(
                "could not start the supervisor ({}): {clone_error}",
                spec.containment.name()
            ),
        ));
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // Owns the plan from here: it is freed only once the supervisor is reaped (and leaked if
    // the supervisor had to be killed while its program could still be reading it).
    let own_mount_ns = plan.own_proc || plan.view.is_some();
    let (mount_ns, uses) = match pooled {
        Some((ns, uses)) => (Some(ns), uses),
        None => (None, 0),
    };
    let mut guard = Supervised {
        pidfd,
        plan: Some(plan),
        killed: false,
        pool: pool.map(|p| (p, uses)),
        mount_ns,
    };
    // The children hold their own copies; ours would keep the pipes from ever closing.
    drop((devnull, stdin_r, out_w, err_w, fail_w, stop_r, status_w));

    // Waits until the program has exec'd (the pipe closes) or a child reported a failure; a
    // program process that stalls before exec (stopped, or exec on a hung mount) counts
    // against the run's timeout.
    let mut report = [0u8; 8];
    if !wait_readable(
        fail_r.as_raw_fd(),
        deadline.saturating_duration_since(Instant::now()),
    ) {
        drop(stop_w);
        drop(guard); // kills and reaps the supervisor
        return Ok(None);
    }
    let n = read_full(fail_r.as_raw_fd(), &mut report);
    if n == report.len() {
        drop(stop_w);
        let stage = u32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
        let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
        let e = io::Error::from_raw_os_error(errno);
        // Read from the plan before the reap releases it.
        let view = guard.plan.as_ref().and_then(|p| p.view.as_deref());
        let message = match Stage::view_failure(stage) {
            Some((step, entry)) if step == super::view::Step::Overlay as u8 => {
                let overlays = guard.plan.as_ref().map_or(&[][..], |p| &p.overlays[..]);
                format!(
                    "staging the run's working dirs failed: {}",
                    super::view::explain_overlay(overlays, entry, errno)
                )
            }
            Some((step, entry)) => match view {
                Some(v) => format!(
                    "building the run's view failed: {}",
                    v.explain(step, entry, errno)
                ),
                None => format!(
                    "mounting the run's /proc failed ({}): {e}",
                    super::view::Step::describe(step)
                ),
            },
            None => format!("{} failed: {e}", Stage::describe(stage)),
        };
        guard.reap();
        return Err(io::Error::new(e.kind(), message));
    }
    drop(fail_r);
    if own_mount_ns && guard.mount_ns.is_none() {
        // Made before the program's process was: held from here. (Gone already if the run
        // ended meanwhile; its end was then paid by the supervisor.)
        guard.mount_ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
            .ok()
            .map(OwnedFd::from);
    }
    Ok(Some(Started {
        parts: Some(Parts {
            guard,
            out_r,
            err_r,
            status_r,
        }),
        supervisor: pid,
        stop_w: Some(stop_w),
        stdin: stdin_w,
        start,
        deadline,
    }))
}

impl Started {
    /// The pipe to the program's stdin, when the spec asked for one; closing it is the end of
    /// the program's input.
    pub fn take_stdin(&mut self) -> Option<OwnedFd> {
        self.stdin.take()
    }

    /// A pidfd of the program's process while it runs (a signal sent through it can never
    /// reach another process that reused its pid).
    pub fn program_pidfd(&self) -> Option<OwnedFd> {
        let pid = self.program_pid()?;
        let fd = super::pidfd_open(pid)?;
        // Still the supervisor's child once open: the pid was not reused in between.
        (self.program_pid() == Some(pid)).then_some(fd)
    }

    /// The program's process (its pid as this host sees it), while it runs.
    fn program_pid(&self) -> Option<libc::pid_t> {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.supervisor))
                .ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// Reads the program's output into `sink` until it has ended and its pipes closed, stopping
    /// it at the spec's timeout or when `cancel` is set; when this returns, the program and
    /// everything it started are gone.
    ///
    /// # Errors
    /// A pipe or poll failed (the program is killed and reaped all the same).
    pub fn wait(
        mut self,
        sink: &mut dyn Sink,
        cancel: Option<&crate::cancel::CancelToken>,
    ) -> io::Result<Ended> {
        let start = self.start;
        let Some(Parts {
            mut guard,
            out_r,
            err_r,
            status_r,
        }) = self.parts.take()
        else {
            return Err(io::Error::other("this run was already waited for"));
        };
        let mut stop_w = self.stop_w.take();

        // Registered after the start: a cancel before it makes the eventfd readable at once.
        let wake = cancel.map(cancel_wake).transpose();
        let wake = match wake {
            Ok(w) => w,
            Err(e) => {
                drop(stop_w.take());
                guard.killed = !wait_readable(guard.pidfd.as_raw_fd(), STOP_GRACE);
                return Err(e);
            }
        };
        let pumped = pump(
            &guard.pidfd,
            [Some(out_r), Some(err_r)],
            sink,
            self.deadline,
            &mut stop_w,
            wake.as_ref().map(|(fd, _)| fd),
        );
        drop(wake);
        let (timed_out, cancelled) = match pumped {
            Ok(Pumped {
                timed_out,
                cancelled,
                killed,
            }) => {
                guard.killed = killed;
                (timed_out, cancelled)
            }
            Err(e) => {
                drop(stop_w.take());
                guard.killed = !wait_readable(guard.pidfd.as_raw_fd(), STOP_GRACE);
                return Err(e); // the guard kills (if needed) and reaps
            }
        };
        guard.reap();
        // The supervisor is gone, and wrote its report (if it could) before it exited.
        let mut status = [0u8; 8];
        let exit = if read_now(status_r.as_raw_fd(), &mut status) == status.len() {
            let kind = i32::from_ne_bytes([status[0], status[1], status[2], status[3]]);
            let value = i32::from_ne_bytes([status[4], status[5], status[6], status[7]]);
            if kind == libc::CLD_EXITED {
                Exit::Code(value)
            } else {
                Exit::Signal(value)
            }
        } else {
            // The supervisor itself was killed before it could report.
            Exit::Signal(libc::SIGKILL)
        };
        Ok(Ended {
            exit,
            timed_out,
            cancelled,
            duration: start.elapsed(),
        })
    }
}

/// This process's dumpable flag as `PR_SET_DUMPABLE` takes it (0 or 1), or -1; read once,
/// before any run could have cleared it (a run's uid switch clears it until its supervisor
/// gives it back, so a later read could see a run's value, not the host's).
fn host_dumpable() -> i32 {
    static DUMPABLE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *DUMPABLE.get_or_init(
        || match syscall!(SYS_prctl, libc::PR_GET_DUMPABLE, 0, 0, 0, 0) {
            Ok(v @ 0..=1) => v as i32,
            _ => -1,
        },
    )
}

/// Clones the supervisor (sharing our memory, on its own stack, with every signal blocked so
/// no host handler runs in it); returns its pid (or -1), its pidfd and the clone's error.
fn clone_supervisor(
    plan_addr: usize,
    stack_top: usize,
    flags: libc::c_int,
) -> (i32, RawFd, io::Error) {
    let mut pidfd: RawFd = -1;
    // Every signal, glibc's internal ones too (pthread_sigmask would leave those out).
    let all: u64 = !0;
    let mut saved: u64 = 0;
    let _ = syscall!(
        SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &all as *const u64,
        &mut saved as *mut u64,
        8usize
    );
    // SAFETY: the supervisor shares our memory on its own 16-byte aligned stack and reads only
    // the plan at `plan_addr`, which the caller keeps alive and unchanged until the supervisor
    // is reaped (on every path, and by `Reaper` if its thread unwinds). No exit signal: no
    // SIGCHLD, no auto-reap.
    let pid = unsafe {
        libc::clone(
            supervisor_entry,
            (stack_top & !15) as *mut libc::c_void,
            flags,
            plan_addr as *mut libc::c_void,
            &mut pidfd as *mut RawFd,
        )
    };
    let error = io::Error::last_os_error();
    let _ = syscall!(
        SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &saved as *const u64,
        std::ptr::null_mut::<u64>(),
        8usize
    );
    (pid, pidfd, error)
}

/// Reads what is already in a pipe into `buf`, without waiting; returns the bytes read.
fn read_now(fd: RawFd, buf: &mut [u8]) -> usize {
    if !wait_readable(fd, Duration::ZERO) {
        return 0;
    }
    // SAFETY: reading into a live buffer of buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    n.max(0) as usize
}

/// Reads into `buf` until it is full or the pipe closes; returns the bytes read.
fn read_full(fd: RawFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled tail of a live buffer.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || last_errno() != libc::EINTR {
            break;
        }
    }
    got
}

/// Waits for a child (by pidfd) to exit and reaps it; returns its exit code when it exited.
pub(crate) fn reap(pidfd: &OwnedFd) -> Option<i32> {
    loop {
        // SAFETY: siginfo_t is plain data; waitid writes it. __WALL: the supervisor sends no
        // exit signal, so it is a "clone" child.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on a pidfd we own; info is valid for writes.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::__WALL,
            )
        };
        if r == 0 {
            // SAFETY: si_status is valid to read after a successful waitid.
            return (info.si_code == libc::CLD_EXITED).then(|| unsafe { info.si_status() });
        }
        if last_errno() != libc::EINTR {
            return None;
        }
    }
}

fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd on this frame.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
        if n == 0 || (n < 0 && last_errno() != libc::EINTR) {
            return false;
        }
    }
}

fn read_into(fd: &OwnedFd, stream: usize, sink: &mut dyn Sink) -> io::Result<bool> {
    let mut buf = [0u8; 64 * 1024];
    // SAFETY: fd stays open for the duration of this borrow; ManuallyDrop keeps it from closing.
    let mut file =
        std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) });
    match file.read(&mut buf) {
        Ok(0) => Ok(false),
        Ok(n) => {
            sink.take(stream, &buf[..n]);
            Ok(true)
        }
        Err(e)
            if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock =>
        {
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// How a pump ended.
struct Pumped {
    timed_out: bool,
    cancelled: bool,
    /// The supervisor had to be killed.
    killed: bool,
}

/// Reads both pipes until the supervisor has exited and the pipes closed, asking it to stop at
/// the deadline or when `wake` (a cancel's eventfd) turns readable; the supervisor is reaped.
fn pump(
    pidfd: &OwnedFd,
    mut pipes: [Option<OwnedFd>; 2],
    sink: &mut dyn Sink,
    deadline: Instant,
    stop_w: &mut Option<OwnedFd>,
    wake: Option<&OwnedFd>,
) -> io::Result<Pumped> {
    let mut exited = false;
    let mut timed_out = false;
    let mut cancelled = false;
    let mut drain_until: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        if exited {
            if pipes.iter().all(Option::is_none) {
                break;
            }
            let until = *drain_until.get_or_insert_with(|| Instant::now() + DRAIN_DEADLINE);
            if Instant::now() >= until {
                break;
            }
        } else if Instant::now() >= deadline && !timed_out && !cancelled {
            timed_out = true;
            // Closing the only write end tells the supervisor to kill the run and exit.
            drop(stop_w.take());
            kill_at = Some(Instant::now() + STOP_GRACE);
        } else if kill_at.is_some_and(|k| Instant::now() >= k) {
            log::error!("the shell supervisor did not stop in time; killing it");
            // SAFETY: pidfd_send_signal on our own unreaped child's pidfd.
            let _ = syscall!(
                SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32
            );
            kill_at = None;
            killed = true;
        }
        let wake_at = match (exited, drain_until, kill_at) {
            (true, Some(d), _) => d,
            (false, _, Some(k)) => k,
            (false, _, None) if !timed_out && !cancelled => deadline,
            _ => Instant::now() + DRAIN_DEADLINE,
        };
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(3);
        for p in pipes.iter().flatten() {
            fds.push(libc::pollfd {
                fd: p.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let pidfd_slot = (!exited).then(|| {
            fds.push(libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.len() - 1
        });
        let wake_slot = wake
            .filter(|_| !exited && !cancelled && !timed_out)
            .map(|w| {
                fds.push(libc::pollfd {
                    fd: w.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                fds.len() - 1
            });
        let wait_ms = wake_at
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32;
        // SAFETY: fds is a valid array of fds.len() pollfd structs owned by this frame.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if let Some(slot) = pidfd_slot {
            if fds[slot].revents != 0 {
                let _ = reap(pidfd);
                exited = true;
            }
        }
        if let Some(slot) = wake_slot {
            if fds[slot].revents != 0 && !exited {
                cancelled = true;
                // As at the deadline: the supervisor kills the run and exits.
                drop(stop_w.take());
                kill_at = Some(Instant::now() + STOP_GRACE);
            }
        }
        let mut i = 0;
        for (k, pipe) in pipes.iter_mut().enumerate() {
            let Some(fd) = pipe.as_ref() else { continue };
            let revents = fds[i].revents;
            i += 1;
            if revents == 0 {
                continue;
            }
            let open = if revents & libc::POLLIN != 0 {
                read_into(fd, k, sink)?
            } else {
                false // POLLHUP or POLLERR with nothing left to read
            };
            if !open {
                *pipe = None;
                sink.closed(k);
            }
        }
    }
    Ok(Pumped {
        timed_out,
        cancelled,
        killed,
    })
}
