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
    model_id: &str,
    generation: u64,
    log: std::fs::File,
    tail: &Arc<LogTail>,
) {
    let mut handles = Vec::with_capacity(3);
    let weak = Arc::downgrade(inner);
    let prefix: Arc<str> = Arc::from(format!("[{model_id}] "));
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
        let (tail, log, prefix) = (Arc::clone(tail), Arc::clone(&log), Arc::clone(&prefix));
        let drain = std::thread::Builder::new()
            .name("correx-server-log".into())
            .spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(log.lock(), "{prefix}{line}");
                    tail.push(line);
                }
            });
        handles.extend(drain.ok());
    }
    let pid = child.id() as i32;
    let id = model_id.to_owned();
    let watch = std::thread::Builder::new()
        .name("correx-server-watch".into())
        .spawn(move || watch_exit(weak, pidfd, pid, &id, generation));
    handles.extend(watch.ok());
    // Kept so that dropping the manager can join them: no correx thread outlives it.
    let mut helpers = inner.helpers.lock();
    helpers.retain(|h| !h.is_finished());
    helpers.extend(handles);
}

/// Whether the server of `generation` is still the one loading or serving `id`.
fn current(st: &State, id: &str, generation: u64) -> bool {
    st.models
        .get(id)
        .is_some_and(|r| r.generation == generation)
        || st
            .loading
            .get(id)
            .is_some_and(|p| p.generation == generation)
}

pub(super) fn watch_exit(
    weak: Weak<Inner>,
    pidfd: Option<OwnedFd>,
    pid: i32,
    id: &str,
    generation: u64,
) {
    loop {
        let exited = match &pidfd {
            // A timeout lets us notice a dropped manager.
            Some(fd) => sys::wait_readable(fd.as_raw_fd(), 500),
            // Without pidfds, look every 100 ms.
            None => {
                std::thread::sleep(Duration::from_millis(100));
                sys::exited_unreaped(pid)
            }
        };
        let Some(inner) = weak.upgrade() else { return };
        let mut st = inner.state.lock();
        if st.shutdown || !current(&st, id, generation) {
            return; // unloaded or replaced: nothing to watch
        }
        if exited
            && st
                .models
                .get(id)
                .is_some_and(|r| r.generation == generation)
        {
            log::warn!("llama-server for {id} exited on its own; recording a crash");
            if let Err(e) = stop_model(&inner, &mut st, id, UnloadReason::Crashed) {
                log::error!("recording the crash: {e}");
            }
            return;
        }
        if exited {
            // Died while its load was still being recorded: once the load puts it in place,
            // it is a crash to record; if the load failed instead, nothing is current.
            inner.settled.wait_for(&mut st, super::WAIT_SLICE);
        }
    }
}

/// Starts the server for `d` on `port` and polls it until it is healthy and ours; called
/// without the state lock.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_and_wait_healthy(
    inner: &Arc<Inner>,
    d: &ModelDescriptor,
    bin: &std::path::Path,
    alias: &str,
    generation: u64,
    log_file: std::fs::File,
    port: u16,
    estimate: Option<u64>,
    slot_dir: Option<&std::path::Path>,
    cancel: &CancelToken,
) -> Result<(Child, serde_json::Value), ModelLoadError> {
    let mut cmd = server_command(bin, d, &inner.options.host, port, alias, slot_dir);
    let (confinement, isolation) = super::isolation::plan(
        inner.options.isolation,
        bin,
        &d.model_path,
        port,
        &d.extra_args,
        estimate,
        slot_dir,
    )
    .map_err(|reason| ModelLoadError::Isolation {
        model_id: d.model_id.clone(),
        reason,
    })?;
    if let Some(c) = confinement {
        sys::confine_command(&mut cmd, c);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = spawn(inner, cmd).map_err(|source| ModelLoadError::Spawn {
        path: bin.to_path_buf(),
        source,
    })?;
    let tail = Arc::new(LogTail::default());
    start_log_drain(inner, &mut child, &d.model_id, generation, log_file, &tail);
    wait_healthy(inner, &mut child, &tail, port, alias, cancel)?;
    Ok((child, isolation))
}

/// The server's command line: the model, its context, the address and alias it answers
/// under, threads, where it saves slots (`slot_dir`), the descriptor's extra arguments; fenced (cleared environment, own group,
/// parent-death signal, no inherited host descriptors).
fn server_command(
    bin: &std::path::Path,
    d: &ModelDescriptor,
    host: &str,
    port: u16,
    alias: &str,
    slot_dir: Option<&std::path::Path>,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("--model")
        .arg(&d.model_path)
        .args(["--ctx-size", &d.context_size.to_string()])
        .args(["--host", host])
        .args(["--port", &port.to_string()])
        .args(["--alias", alias]);
    if let Some(t) = d.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    if d.serves == ModelRole::Embeddings {
        cmd.arg("--embeddings");
        // A chat model's own pooling is often `none` (a vector per token), which the OpenAI
        // shape cannot carry.
        if !d.extra_args.iter().any(|a| a == "--pooling") {
            cmd.args(["--pooling", "mean"]);
        }
    }
    if let Some(dir) = slot_dir {
        cmd.arg("--slot-save-path").arg(dir);
    }
    cmd.args(&d.extra_args);
    // Cleared environment, own group, parent-death signal, no inherited host descriptors.
    sys::fence(&mut cmd);
    if slot_dir.is_some() {
        // Set in the environment, which a build that lacks them ignores and the arguments
        // override. A sliding-window model keeps its whole cache: the window alone cannot
        // serve a restored prefix. Idle slots stay in place: by default a new task moves them
        // to the server's RAM cache and clears them, and a pinned session's next turn then
        // computed its prompt again (both measured on Gemma 3; the restore check catches it).
        cmd.env("LLAMA_ARG_SWA_FULL", "1");
        cmd.env("LLAMA_ARG_CACHE_IDLE_SLOTS", "0");
    }
    cmd
}

/// Spawns `cmd` from the manager's spawner thread.
fn spawn(inner: &Inner, cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    let sent = inner.spawner.lock().send(SpawnRequest {
        command: cmd,
        reply: tx,
    });
    match sent {
        Ok(()) => rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("spawner thread is gone"))),
        Err(_) => Err(std::io::Error::other("spawner thread is gone")),
    }
}

/// Polls the started server's `/health` until it answers as ours; the load's cancel, the
/// manager's shutdown, the server's exit, the health timeout or another server on the port
/// end it with the error (the server stopped, or reaped when it exited on its own).
fn wait_healthy(
    inner: &Arc<Inner>,
    child: &mut Child,
    tail: &LogTail,
    port: u16,
    alias: &str,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    let host = &inner.options.host;
    let base = inner.base_url(port);
    let probe = super::super::llama::agent(&HttpOptions {
        connect_timeout: Duration::from_millis(200),
        read_timeout: Duration::from_secs(2),
        ..HttpOptions::default()
    });
    let started = Instant::now();
    let fail = |child: &mut Child, e: ModelLoadError| {
        stop_child(inner, child);
        Err(e)
    };
    loop {
        if cancel.is_cancelled() {
            return fail(child, ModelLoadError::Cancelled);
        }
        if inner.state.lock().shutdown {
            return fail(child, ModelLoadError::ManagerGone);
        }
        if exited_unreaped(child) {
            kill_group(child.id() as i32);
            let status = child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            // Give the drain thread a moment to collect the last lines.
            std::thread::sleep(Duration::from_millis(50));
            return Err(ModelLoadError::ExitedWhileLoading {
                status,
                log_tail: tail.lines(),
            });
        }
        if started.elapsed() > inner.options.health_timeout {
            let waited_ms = started.elapsed().as_millis() as u64;
            return fail(
                child,
                ModelLoadError::Timeout {
                    waited_ms,
                    log_tail: tail.lines(),
                },
            );
        }
        if let Ok(resp) = probe.get(&format!("{base}/health")).call() {
            if resp.status().as_u16() == 200 {
                match served_alias(&probe, &base) {
                    Some(a) if a == alias => break,
                    other => {
                        let detail = format!(
                            "a server answered health checks but serves {:?}, not ours",
                            other.unwrap_or_default()
                        );
                        let addr = format!("{host}:{port}");
                        return fail(child, ModelLoadError::PortInUse { addr, detail });
                    }
                }
            }
        }
        std::thread::sleep(HEALTH_POLL);
    }
    Ok(())
}
