//! A spawner thread: the thread a tool's supervisors are cloned from, prepared once.

use std::io;

/// What a spawner thread does first, on itself.
pub(crate) type Prepare = Box<dyn FnOnce() -> io::Result<()> + Send>;

type Job = Box<dyn FnOnce() + Send>;

/// A thread, prepared once (moved into a cgroup, into a tool's namespaces, its bounding set
/// emptied, a filter installed), that runs what it is handed: processes it clones inherit what
/// it was prepared with, so no run pays for it again. Every signal is blocked on it, so what it
/// clones starts that way too.
#[derive(Debug)]
pub(crate) struct Spawner {
    jobs: parking_lot::Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spawner {
    /// Starts the thread and runs `prepare` on it; its error is this call's.
    pub fn start(prepare: Prepare) -> io::Result<Spawner> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        let thread = std::thread::Builder::new()
            .name("correx-shell-spawner".into())
            .spawn(move || {
                // Every signal on this thread only, but glibc's SIGCANCEL (32) and SIGSETXID
                // (33): a host thread calling setuid() waits for every thread to take the
                // latter. (The supervisor's clone blocks every signal around itself.)
                let all: u64 = !((1 << 31) | (1 << 32));
                let _ = crate::sys::syscall!(
                    SYS_rt_sigprocmask,
                    libc::SIG_SETMASK,
                    &all as *const u64,
                    std::ptr::null_mut::<u64>(),
                    8usize
                );
                let prepared = prepare();
                let ok = prepared.is_ok();
                let _ = ready_tx.send(prepared);
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })?;
        let spawner = Spawner {
            jobs: parking_lot::Mutex::new(Some(tx)),
            thread: Some(thread),
        };
        ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the spawner thread died")))?;
        Ok(spawner)
    }

    /// Runs `f` on the spawner thread and returns its result.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> io::Result<R> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        let gone = || io::Error::other("the spawner thread is gone");
        self.jobs
            .lock()
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.jobs.lock().take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The part of a root host's run confinement its spawner thread takes once, for every run it
/// clones: the tool's namespaces (`join`: mount, UTS, IPC), an empty capability bounding set,
/// and `filter` (the syscall floor). The thread keeps root's effective capabilities, which the
/// runs' processes drop themselves. Call on the spawner thread.
///
/// # Errors
/// The step that failed.
pub(crate) fn confine_thread(
    join: &[std::os::fd::OwnedFd],
    filter: Option<&[libc::sock_filter]>,
) -> io::Result<()> {
    use super::syscall;
    use std::os::fd::AsRawFd;
    let step =
        |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    if !join.is_empty() {
        // A thread shares its filesystem context with the others: it needs its own to move
        // to another mount namespace.
        syscall!(SYS_unshare, libc::CLONE_FS).map_err(step("unshare(CLONE_FS)"))?;
        for ns in join {
            syscall!(SYS_setns, ns.as_raw_fd(), 0)
                .map_err(step("joining the tool's namespaces"))?;
        }
    }
    for cap in 0..64 {
        match syscall!(SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break, // past the last one
            Err(e) => return Err(step("emptying the bounding set")(e)),
        }
    }
    if let Some(program) = filter {
        let prog = super::seccomp::prog_of(program);
        // Root (CAP_SYS_ADMIN) needs no no_new_privs for a filter; this thread only.
        syscall!(
            SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog
        )
        .map_err(step("installing the syscall floor"))?;
    }
    Ok(())
}
