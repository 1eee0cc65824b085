//! Fenced child processes: cleared environment, stdin from `/dev/null`, own process group,
//! parent-death signal, capped output, a timeout that kills the whole group, and nothing left
//! behind when the run returns.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The only `PATH` a child sees, and the one executables are resolved through.
pub const FIXED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long the runner keeps reading pipes after the child exited and its group was killed: a
/// process that left the group (setsid) and still holds a pipe must not hang the caller.
const DRAIN_DEADLINE: Duration = Duration::from_millis(500);

/// What to run.
pub(crate) struct RunSpec<'a> {
    pub program: &'a Path,
    /// What the child sees as `argv[0]`; default the program path.
    pub arg0: Option<&'a str>,
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub timeout: Duration,
    /// Most bytes kept of stdout, and separately of stderr; the rest is read and dropped.
    pub output_cap: usize,
}

/// How the child ended.
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
    pub duration: Duration,
}

/// Runs `spec` to completion (or timeout) and returns its output.
///
/// # Errors
/// The spawn's `io::Error` (binary missing, not executable, bad working directory).
pub(crate) fn run(spec: &RunSpec<'_>) -> io::Result<RunOutput> {
    let start = Instant::now();
    let mut cmd = Command::new(spec.program);
    cmd.args(spec.args)
        .env_clear()
        .env("PATH", FIXED_PATH)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(dir) = spec.cwd {
        cmd.current_dir(dir);
    }
    if let Some(a) = spec.arg0 {
        cmd.arg0(a);
    }
    arm_parent_death_signal(&mut cmd);
    let mut child = cmd.spawn()?;
    let pgid = child.id() as i32;
    // From here on the child exists: every path below kills its group before returning.
    let stdout = child.stdout.take().map(OwnedFd::from);
    let stderr = child.stderr.take().map(OwnedFd::from);
    let mut out = Captured::default();
    let mut err = Captured::default();
    let outcome = pump(
        &mut child,
        pgid,
        [stdout, stderr],
        [&mut out, &mut err],
        spec,
        start,
    );
    // On success `pump` killed the group before reaping the leader (so the group id could not
    // have been reused); only the error path still has a live child to clean up.
    let (exit, timed_out) = match outcome {
        Ok(v) => v,
        Err(e) => {
            kill_group(pgid);
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    Ok(RunOutput {
        exit,
        stdout: out,
        stderr: err,
        timed_out,
        duration: start.elapsed(),
    })
}

/// Makes the child die with the thread that spawned it (the caller's thread, which waits for
/// it), and refuses to start if that parent is already gone.
fn arm_parent_death_signal(cmd: &mut Command) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and makes only raw syscalls (prctl,
    // getppid, close_range), all async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            // A host may hold descriptors without close-on-exec; the tool's child gets none
            // of them. (Linux >= 5.11; older kernels keep the host's own flags.)
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
            );
            Ok(())
        });
    }
}

/// SIGKILL to every process in group `pgid`; ESRCH (nobody left) is fine.
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
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is a freshly created descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether `pid` has exited, without reaping it (so its group id stays reserved until we kill
/// the group and reap).
fn exited_unreaped(pid: i32) -> io::Result<bool> {
    // SAFETY: siginfo_t is plain data; waitid writes it on success.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on our own child with WNOWAIT does not reap; info is valid for writes.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: si_pid is valid to read after a successful waitid.
    Ok(unsafe { info.si_pid() } != 0)
}

fn to_exit(status: std::process::ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Code(-1),
    }
}

fn read_into(fd: &OwnedFd, sink: &mut Captured, cap: usize) -> io::Result<bool> {
    let mut buf = [0u8; 64 * 1024];
    // Borrow the fd as a File without taking ownership.
    // SAFETY: fd stays open for the duration of this borrow; ManuallyDrop keeps it from closing.
    let mut file =
        std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) });
    match file.read(&mut buf) {
        Ok(0) => Ok(false),
        Ok(n) => {
            let room = cap.saturating_sub(sink.bytes.len());
            let keep = room.min(n);
            sink.bytes.extend_from_slice(&buf[..keep]);
            sink.dropped += (n - keep) as u64;
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

/// Reads both pipes until the child has exited and the pipes closed (or the drain deadline
/// passed), killing the group at the timeout. Returns how the child ended and whether it timed
/// out; the child is reaped.
fn pump(
    child: &mut Child,
    pgid: i32,
    mut pipes: [Option<OwnedFd>; 2],
    sinks: [&mut Captured; 2],
    spec: &RunSpec<'_>,
    start: Instant,
) -> io::Result<(Exit, bool)> {
    let [out_sink, err_sink] = sinks;
    let pid = child.id() as i32;
    let pidfd = pidfd_open(pid);
    let deadline = start + spec.timeout;
    let mut exit: Option<Exit> = None;
    let mut timed_out = false;
    let mut drain_until: Option<Instant> = None;
    loop {
        if exit.is_none() {
            let gone = match &pidfd {
                Some(_) => false, // the pidfd's readiness tells us below
                None => exited_unreaped(pid)?,
            };
            if gone {
                kill_group(pgid);
                exit = Some(to_exit(child.wait()?));
            }
        }
        if exit.is_some() {
            if pipes.iter().all(Option::is_none) {
                break;
            }
            let until = *drain_until.get_or_insert_with(|| Instant::now() + DRAIN_DEADLINE);
            if Instant::now() >= until {
                break;
            }
        } else if Instant::now() >= deadline {
            timed_out = true;
            kill_group(pgid);
            // The leader may have moved itself to another group; kill it by pid too so the
            // wait below cannot hang.
            let _ = child.kill();
            exit = Some(to_exit(child.wait()?));
            continue;
        }
        let wake_at = match (exit, drain_until) {
            (Some(_), Some(d)) => d,
            _ => deadline,
        };
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(3);
        for p in pipes.iter().flatten() {
            fds.push(libc::pollfd {
                fd: p.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let pidfd_slot = match (&pidfd, exit) {
            (Some(p), None) => {
                fds.push(libc::pollfd {
                    fd: p.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let mut wait_ms = wake_at
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32;
        if pidfd.is_none() && exit.is_none() {
            wait_ms = wait_ms.min(5); // without a pidfd, look at the child every few ms
        }
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
                // Exited but not reaped: kill the rest of its group while the id is still ours.
                kill_group(pgid);
                exit = Some(to_exit(child.wait()?));
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
            let sink: &mut Captured = if k == 0 { out_sink } else { err_sink };
            let open = if revents & libc::POLLIN != 0 {
                read_into(fd, sink, spec.output_cap)?
            } else {
                false // POLLHUP or POLLERR with nothing left to read
            };
            if !open {
                *pipe = None;
            }
        }
    }
    Ok((exit.unwrap_or(Exit::Code(-1)), timed_out))
}

/// Resolves `name` to a canonical absolute executable path: a bare name through
/// [`FIXED_PATH`], a path with a slash as given (relative paths are refused: they depend on the
/// host's working directory).
pub(crate) fn resolve_executable(name: &str) -> Option<std::path::PathBuf> {
    resolve_both(name).map(|(_, canonical)| canonical)
}

/// As [`resolve_executable`], also returning the path before symlinks were followed.
pub(crate) fn resolve_both(name: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
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
