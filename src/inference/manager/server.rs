//! The llama-server processes: forked from one long-lived thread, their output drained to
//! the log and a tail kept for errors, their exit watched.

use super::*;

/// The last lines of the server's log.
#[derive(Default)]
pub(super) struct LogTail(Mutex<VecDeque<String>>);

impl LogTail {
    pub(super) fn push(&self, line: String) {
        let mut q = self.0.lock();
        if q.len() == LOG_TAIL_LINES {
            q.pop_front();
        }
        q.push_back(line);
    }

    pub(super) fn lines(&self) -> Vec<String> {
        self.0.lock().iter().cloned().collect()
    }
}

/// The thread every server is forked from. PR_SET_PDEATHSIG fires when the forking *thread*
/// exits, so servers are forked from this thread, which lives as long as the manager; when the
/// host dies (even by SIGKILL) the kernel kills the server.
pub(super) fn spawner_thread() -> mpsc::Sender<SpawnRequest> {
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new()
        .name("correx-spawner".into())
        .spawn(move || {
            for mut req in rx {
                let _ = req.reply.send(req.command.spawn());
            }
        })
        .map(|_| ())
        .unwrap_or_else(|e| log::error!("could not start the spawner thread: {e}"));
    tx
}

pub(super) fn default_log_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir)
        .join("correx/logs")
}

pub(super) fn served_alias(agent: &ureq::Agent, base: &str) -> Option<String> {
    let mut resp = agent.get(&format!("{base}/v1/models")).call().ok()?;
    let body: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()?;
    body.get("data")?
        .as_array()?
        .first()?
        .get("id")?
        .as_str()
        .map(str::to_owned)
}

/// Drains the server's stdout and stderr into the log file and the in-memory tail, and when the
/// process exits on its own (its pidfd turns readable while it is still the current server),
/// records the crash.
pub(super) fn start_log_drain(
    inner: &Arc<Inner>,
    child: &mut Child,
    generation: u64,
    log: std::fs::File,
) {
    let mut handles = Vec::with_capacity(3);
    let weak = Arc::downgrade(inner);
    let tail = Arc::clone(&inner.tail);
    let log = Arc::new(Mutex::new(log));
    let pidfd = sys::pidfd_open(child.id() as i32);
    let pipes: Vec<Box<dyn std::io::Read + Send>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .collect();
    for pipe in pipes {
        let (tail, log) = (Arc::clone(&tail), Arc::clone(&log));
        let drain = std::thread::Builder::new()
            .name("correx-server-log".into())
            .spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(log.lock(), "{line}");
                    tail.push(line);
                }
            });
        handles.extend(drain.ok());
    }
    let pid = child.id() as i32;
    let watch = std::thread::Builder::new()
        .name("correx-server-watch".into())
        .spawn(move || watch_exit(weak, pidfd, pid, generation));
    handles.extend(watch.ok());
    // Kept so that dropping the manager can join them: no correx thread outlives it.
    let mut helpers = inner.helpers.lock();
    helpers.retain(|h| !h.is_finished());
    helpers.extend(handles);
}

pub(super) fn watch_exit(weak: Weak<Inner>, pidfd: Option<OwnedFd>, pid: i32, generation: u64) {
    match &pidfd {
        Some(fd) => loop {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; a timeout lets us notice a dropped manager.
            let n = unsafe { libc::poll(&mut p, 1, 500) };
            if n > 0 {
                break;
            }
            let Some(inner) = weak.upgrade() else { return };
            let st = inner.state.lock();
            let ours = st
                .current
                .as_ref()
                .is_some_and(|r| r.generation == generation);
            let loading = st.current.is_none() && st.generation == generation;
            if !ours && !loading {
                return; // unloaded or replaced: nothing to watch
            }
        },
        // Without pidfds, poll the state every 100 ms.
        None => loop {
            std::thread::sleep(Duration::from_millis(100));
            let Some(inner) = weak.upgrade() else { return };
            let mut st = inner.state.lock();
            // SAFETY: kill with signal 0 only checks that the process exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0;
            if st.shutdown || (st.current.is_none() && gone) {
                return;
            }
            let loading = st.current.is_none() && st.generation == generation;
            let exited = match st.current.as_mut() {
                Some(r) if r.generation == generation => !matches!(r.child.try_wait(), Ok(None)),
                _ if loading => false,
                _ => return,
            };
            if exited {
                break;
            }
        },
    }
    let Some(inner) = weak.upgrade() else { return };
    let mut st = inner.state.lock();
    if st
        .current
        .as_ref()
        .is_some_and(|r| r.generation == generation)
    {
        log::warn!("llama-server exited on its own; recording a crash");
        if let Err(e) = unload_locked(&inner, &mut st, UnloadReason::Crashed) {
            log::error!("recording the crash: {e}");
        }
    }
}
