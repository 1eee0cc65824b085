//! [`DefaultModelManager`]: one llama-server at a time, spawned as a child in its own process
//! group, health-checked, swapped by restart and unloaded by residency policy.
//!
//! One `parking_lot::Mutex` guards the process, its descriptor and the count of inferences in
//! flight. Events follow committed state: `ModelLoaded` after health passed and the state is
//! set, `ModelUnloaded` after the process is reaped and the state cleared; a failed load appends
//! nothing.

use super::llama::{capabilities_for, HttpOptions, LlamaCppInferenceProvider, LlamaCppTokenizer};
use super::manager_error::ModelLoadError;
use super::{
    CapabilityScore, InferenceError, InferenceProvider, InferenceRequest, InferenceResponse,
    ProviderHealth, StreamChunk, StreamControl, Tokenizer,
};
use crate::cancel::CancelToken;
use crate::events::{append_domain, DomainEvent, EventStore, UnloadReason};
use crate::ids::ProviderId;
use crate::sys::{self, kill_group};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The event stream model events go to.
pub const MODEL_STREAM: &str = "model-manager";

/// Lines of the server's log kept in memory for load errors.
const LOG_TAIL_LINES: usize = 100;
/// How often the manager asks `/health` while a server loads: tight, so readiness is noticed
/// within a few milliseconds (Ollama polls every 250 ms, llama-swap every second).
const HEALTH_POLL: Duration = Duration::from_millis(2);
/// How long a server gets to exit after SIGTERM before its group gets SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(1500);

/// When a loaded model is unloaded without being asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyMode {
    /// Never unloads by itself.
    Persistent,
    /// Unloads after `idle_timeout` with no inference in flight.
    Dynamic,
    /// Unloads as soon as no inference is in flight after one completes.
    Ephemeral,
}

/// A model the manager can load.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDescriptor {
    /// The model's id; loading the same id again is a no-op.
    pub model_id: String,
    /// The GGUF file.
    pub model_path: PathBuf,
    /// When it unloads by itself.
    pub residency: ResidencyMode,
    /// DYNAMIC's idle timeout; default 60 s.
    #[serde(
        default = "default_idle_ms",
        with = "duration_ms",
        rename = "idle_timeout_ms"
    )]
    pub idle_timeout: Duration,
    /// The server's context size; default 8192.
    #[serde(default = "default_ctx")]
    pub context_size: u32,
    /// Extra server arguments, e.g. `["--no-jinja", "--chat-template", "gemma"]`.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Threads for generation; default: llama-server's own choice.
    #[serde(default)]
    pub threads: Option<u32>,
}

fn default_idle_ms() -> Duration {
    Duration::from_secs(60)
}

fn default_ctx() -> u32 {
    8192
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

impl ModelDescriptor {
    /// A descriptor with the defaults (60 s idle timeout, 8192 context, no extra arguments).
    pub fn new(
        model_id: impl Into<String>,
        model_path: impl Into<PathBuf>,
        residency: ResidencyMode,
    ) -> Self {
        ModelDescriptor {
            model_id: model_id.into(),
            model_path: model_path.into(),
            residency,
            idle_timeout: default_idle_ms(),
            context_size: default_ctx(),
            extra_args: Vec::new(),
            threads: None,
        }
    }
}

/// Settings of a [`DefaultModelManager`].
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// The llama-server binary; default `llama-server` as found by [`crate::LlamaInstall`].
    pub server_bin: PathBuf,
    /// Address the server binds; default `127.0.0.1`.
    pub host: String,
    /// Port the server binds; default 10000.
    pub port: u16,
    /// How long a load waits for `/health`; default 30 s.
    pub health_timeout: Duration,
    /// Where `llama-server.log` goes; default `$XDG_DATA_HOME/correx/logs`
    /// (`~/.local/share/correx/logs`).
    pub log_dir: Option<PathBuf>,
    /// HTTP timeouts of the provider.
    pub http: HttpOptions,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            server_bin: crate::LlamaInstall::locate()
                .map(|i| i.server)
                .unwrap_or_else(|| PathBuf::from("llama-server")),
            host: "127.0.0.1".into(),
            port: 10000,
            health_timeout: Duration::from_secs(30),
            log_dir: None,
            http: HttpOptions::default(),
        }
    }
}

/// Loads and unloads models. Blocking; shared across threads.
pub trait ModelManager: Send + Sync {
    /// Loads `descriptor` (a no-op when its id is loaded), replacing any other model.
    ///
    /// # Errors
    /// [`ModelLoadError`]; nothing is recorded for a failed load.
    fn load(
        &self,
        descriptor: &ModelDescriptor,
    ) -> Result<Arc<dyn InferenceProvider>, ModelLoadError>;
    /// Unloads `model_id` if it is loaded.
    ///
    /// # Errors
    /// [`ModelLoadError::Events`] when the unload could not be recorded.
    fn unload(&self, model_id: &str) -> Result<(), ModelLoadError>;
    /// The loaded model, if any.
    fn current_model(&self) -> Option<ModelDescriptor>;
    /// Whether the loaded model's server answers.
    fn health_check(&self) -> ProviderHealth;
}

/// The last lines of the server's log.
#[derive(Default)]
struct LogTail(Mutex<VecDeque<String>>);

impl LogTail {
    fn push(&self, line: String) {
        let mut q = self.0.lock();
        if q.len() == LOG_TAIL_LINES {
            q.pop_front();
        }
        q.push_back(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().iter().cloned().collect()
    }
}

struct Running {
    descriptor: ModelDescriptor,
    child: Child,
    generation: u64,
    provider: LlamaCppInferenceProvider,
}

#[derive(Default)]
struct State {
    current: Option<Running>,
    /// Bumped at every spawn; timers and watchers carry the generation they belong to.
    generation: u64,
    in_flight: u32,
    idle: Option<(Instant, u64)>,
    shutdown: bool,
}

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<std::io::Result<Child>>,
}

struct Inner {
    state: Mutex<State>,
    timer: Condvar,
    events: Arc<dyn EventStore>,
    options: ManagerOptions,
    spawner: Mutex<mpsc::Sender<SpawnRequest>>,
    tail: Arc<LogTail>,
    base_url: String,
    /// The server's tokenizer, on one keep-alive agent shared by every provider handed out.
    tokenizer: LlamaCppTokenizer,
    /// Log drains and exit watchers of the servers started so far.
    helpers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// The llama-server lifecycle manager. Dropping it unloads the model.
pub struct DefaultModelManager {
    inner: Arc<Inner>,
    timer_thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for DefaultModelManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DefaultModelManager")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// The thread every server is forked from. PR_SET_PDEATHSIG fires when the forking *thread*
/// exits, so servers are forked from this thread, which lives as long as the manager; when the
/// host dies (even by SIGKILL) the kernel kills the server.
fn spawner_thread() -> mpsc::Sender<SpawnRequest> {
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

fn default_log_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir)
        .join("correx/logs")
}

impl DefaultModelManager {
    /// A manager that records its events in `events`.
    pub fn new(events: Arc<dyn EventStore>, options: ManagerOptions) -> Self {
        let base_url = format!("http://{}:{}", options.host, options.port);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            timer: Condvar::new(),
            events,
            spawner: Mutex::new(spawner_thread()),
            tail: Arc::new(LogTail::default()),
            tokenizer: LlamaCppTokenizer::new(&base_url, &options.http),
            base_url,
            helpers: Mutex::new(Vec::new()),
            options,
        });
        let weak = Arc::downgrade(&inner);
        let timer_thread = std::thread::Builder::new()
            .name("correx-idle-timer".into())
            .spawn(move || idle_timer(weak))
            .map_err(|e| log::error!("could not start the idle timer: {e}"))
            .ok();
        DefaultModelManager {
            inner,
            timer_thread,
        }
    }

    /// Loads `descriptor`, giving up when `cancel` is set.
    ///
    /// # Errors
    /// As [`ModelManager::load`], plus [`ModelLoadError::Cancelled`].
    pub fn load_with_cancel(
        &self,
        descriptor: &ModelDescriptor,
        cancel: &CancelToken,
    ) -> Result<Arc<dyn InferenceProvider>, ModelLoadError> {
        let mut st = self.inner.state.lock();
        load_locked(&self.inner, &mut st, descriptor, cancel)?;
        drop(st);
        Ok(Arc::new(ManagedInferenceProvider::new(
            Arc::downgrade(&self.inner),
            descriptor.clone(),
        )))
    }

    /// The tokenizer of whichever model is loaded (it falls back to characters / 4 when none
    /// is).
    pub fn tokenizer(&self) -> &LlamaCppTokenizer {
        &self.inner.tokenizer
    }

    /// The tokenizer of the loaded model; `None` when no model is loaded, so that nothing is
    /// sent to whatever else may listen on the port.
    pub fn loaded_tokenizer(&self) -> Option<LlamaCppTokenizer> {
        let st = self.inner.state.lock();
        st.current.as_ref().map(|_| self.inner.tokenizer.clone())
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.inner.options.port
    }

    /// The pid of the running server, if any.
    pub fn server_pid(&self) -> Option<u32> {
        self.inner
            .state
            .lock()
            .current
            .as_ref()
            .map(|r| r.child.id())
    }

    /// The path of the server log.
    pub fn log_path(&self) -> PathBuf {
        self.inner
            .options
            .log_dir
            .clone()
            .unwrap_or_else(default_log_dir)
            .join("llama-server.log")
    }

    /// A provider for `descriptor` that loads it on first use.
    pub fn provider(&self, descriptor: &ModelDescriptor) -> Arc<dyn InferenceProvider> {
        Arc::new(self.managed(descriptor))
    }

    /// As [`DefaultModelManager::provider`], as the concrete type (for
    /// [`ManagedInferenceProvider::infer_with_cancel`]).
    pub fn managed(&self, descriptor: &ModelDescriptor) -> ManagedInferenceProvider {
        ManagedInferenceProvider::new(Arc::downgrade(&self.inner), descriptor.clone())
    }
}

impl Drop for DefaultModelManager {
    fn drop(&mut self) {
        {
            let mut st = self.inner.state.lock();
            st.shutdown = true;
            if let Err(e) = unload_locked(&self.inner, &mut st, UnloadReason::Requested) {
                log::warn!("unloading on drop: {e}");
            }
        }
        self.inner.timer.notify_all();
        if let Some(t) = self.timer_thread.take() {
            let _ = t.join();
        }
        // The server is gone, so its pipes closed and its watcher wakes: these end promptly.
        let helpers = std::mem::take(&mut *self.inner.helpers.lock());
        for h in helpers {
            let _ = h.join();
        }
    }
}

impl ModelManager for DefaultModelManager {
    fn load(
        &self,
        descriptor: &ModelDescriptor,
    ) -> Result<Arc<dyn InferenceProvider>, ModelLoadError> {
        self.load_with_cancel(descriptor, &CancelToken::new())
    }

    fn unload(&self, model_id: &str) -> Result<(), ModelLoadError> {
        let mut st = self.inner.state.lock();
        if st.current.as_ref().map(|r| r.descriptor.model_id.as_str()) != Some(model_id) {
            return Ok(());
        }
        unload_locked(&self.inner, &mut st, UnloadReason::Requested)
    }

    fn current_model(&self) -> Option<ModelDescriptor> {
        self.inner
            .state
            .lock()
            .current
            .as_ref()
            .map(|r| r.descriptor.clone())
    }

    fn health_check(&self) -> ProviderHealth {
        let provider = match self.inner.state.lock().current.as_ref() {
            Some(r) => r.provider.clone(),
            None => {
                return ProviderHealth::Unhealthy {
                    reason: "no model loaded".into(),
                }
            }
        };
        provider.health_check()
    }
}

/// Stops the current server: SIGTERM to its group, SIGKILL after a grace period, reaped; then
/// clears the state and records the unload.
fn unload_locked(
    inner: &Inner,
    st: &mut State,
    reason: UnloadReason,
) -> Result<(), ModelLoadError> {
    let Some(mut running) = st.current.take() else {
        return Ok(());
    };
    st.idle = None;
    stop_child(&mut running.child);
    let event = DomainEvent::ModelUnloaded {
        model_id: running.descriptor.model_id.clone(),
        reason,
    };
    append_domain(inner.events.as_ref(), MODEL_STREAM, &event).map_err(ModelLoadError::Events)?;
    Ok(())
}

fn stop_child(child: &mut Child) {
    sys::stop_group(child, TERM_GRACE);
}

/// Whether the child has exited, without reaping it.
fn exited_unreaped(child: &Child) -> bool {
    sys::exited_unreaped(child.id() as i32)
}

fn load_locked(
    inner: &Arc<Inner>,
    st: &mut State,
    d: &ModelDescriptor,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    if st.shutdown {
        return Err(ModelLoadError::ManagerGone);
    }
    if let Some(r) = st.current.as_mut() {
        if r.descriptor.model_id == d.model_id && matches!(r.child.try_wait(), Ok(None)) {
            return Ok(());
        }
    }
    let bin = &inner.options.server_bin;
    let bin = if bin.components().count() == 1 {
        sys::resolve_executable(&bin.to_string_lossy())
            .ok_or_else(|| ModelLoadError::BinaryNotFound { path: bin.clone() })?
    } else if bin.is_file() {
        bin.clone()
    } else {
        return Err(ModelLoadError::BinaryNotFound { path: bin.clone() });
    };
    if !d.model_path.is_file() {
        return Err(ModelLoadError::ModelFileMissing {
            path: d.model_path.clone(),
        });
    }
    if cancel.is_cancelled() {
        return Err(ModelLoadError::Cancelled);
    }
    let reason = if st.current.is_some() {
        UnloadReason::Replaced
    } else {
        UnloadReason::Requested
    };
    unload_locked(inner, st, reason)?;
    let addr = format!("{}:{}", inner.options.host, inner.options.port);
    match std::net::TcpListener::bind(&addr) {
        Ok(l) => drop(l),
        Err(e) => {
            return Err(ModelLoadError::PortInUse {
                addr,
                detail: e.to_string(),
            })
        }
    }
    let log_dir = inner
        .options
        .log_dir
        .clone()
        .unwrap_or_else(default_log_dir);
    let log_path = log_dir.join("llama-server.log");
    std::fs::create_dir_all(&log_dir).map_err(|source| ModelLoadError::Log {
        path: log_dir.clone(),
        source,
    })?;
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|source| ModelLoadError::Log {
            path: log_path.clone(),
            source,
        })?;

    st.generation += 1;
    let generation = st.generation;
    // A unique alias: a 200 from a server that is not ours is caught by /v1/models.
    let alias = format!("{}#correx-{}-{generation}", d.model_id, std::process::id());
    let mut cmd = Command::new(&bin);
    cmd.arg("--model")
        .arg(&d.model_path)
        .args(["--ctx-size", &d.context_size.to_string()])
        .args(["--host", &inner.options.host])
        .args(["--port", &inner.options.port.to_string()])
        .args(["--alias", &alias]);
    if let Some(t) = d.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    cmd.args(&d.extra_args);
    // Cleared environment, own group, parent-death signal, no inherited host descriptors.
    sys::fence(&mut cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let (tx, rx) = mpsc::channel();
    let sent = inner.spawner.lock().send(SpawnRequest {
        command: cmd,
        reply: tx,
    });
    let spawned = match sent {
        Ok(()) => rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("spawner thread is gone"))),
        Err(_) => Err(std::io::Error::other("spawner thread is gone")),
    };
    let mut child = spawned.map_err(|source| ModelLoadError::Spawn {
        path: bin.clone(),
        source,
    })?;
    start_log_drain(inner, &mut child, generation, log_file);

    let provider =
        LlamaCppInferenceProvider::new(&d.model_id, &inner.base_url, &inner.options.http);
    let probe = super::llama::agent(&HttpOptions {
        connect_timeout: Duration::from_millis(200),
        read_timeout: Duration::from_secs(2),
        ..HttpOptions::default()
    });
    let started = Instant::now();
    let fail = |child: &mut Child, e: ModelLoadError| {
        stop_child(child);
        Err(e)
    };
    loop {
        if cancel.is_cancelled() {
            return fail(&mut child, ModelLoadError::Cancelled);
        }
        if exited_unreaped(&child) {
            kill_group(child.id() as i32);
            let status = child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            // Give the drain thread a moment to collect the last lines.
            std::thread::sleep(Duration::from_millis(50));
            return Err(ModelLoadError::ExitedWhileLoading {
                status,
                log_tail: inner.tail.lines(),
            });
        }
        if started.elapsed() > inner.options.health_timeout {
            let waited_ms = started.elapsed().as_millis() as u64;
            let log_tail = inner.tail.lines();
            return fail(
                &mut child,
                ModelLoadError::Timeout {
                    waited_ms,
                    log_tail,
                },
            );
        }
        if let Ok(resp) = probe.get(&format!("{}/health", inner.base_url)).call() {
            if resp.status().as_u16() == 200 {
                match served_alias(&probe, &inner.base_url) {
                    Some(a) if a == alias => break,
                    other => {
                        let detail = format!(
                            "a server answered health checks but serves {:?}, not ours",
                            other.unwrap_or_default()
                        );
                        return fail(&mut child, ModelLoadError::PortInUse { addr, detail });
                    }
                }
            }
        }
        std::thread::sleep(HEALTH_POLL);
    }
    let load_ms = started.elapsed().as_millis() as u64;
    let pid = child.id();
    st.current = Some(Running {
        descriptor: d.clone(),
        child,
        generation,
        provider,
    });
    let event = DomainEvent::ModelLoaded {
        model_id: d.model_id.clone(),
        model_path: d.model_path.display().to_string(),
        port: inner.options.port,
        pid,
        load_ms,
    };
    if let Err(e) = append_domain(inner.events.as_ref(), MODEL_STREAM, &event) {
        // The log must not say a model is loaded when it could not record it: roll back.
        if let Some(mut r) = st.current.take() {
            stop_child(&mut r.child);
        }
        return Err(ModelLoadError::Events(e));
    }
    Ok(())
}

fn served_alias(agent: &ureq::Agent, base: &str) -> Option<String> {
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
fn start_log_drain(inner: &Arc<Inner>, child: &mut Child, generation: u64, log: std::fs::File) {
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

fn watch_exit(weak: Weak<Inner>, pidfd: Option<OwnedFd>, pid: i32, generation: u64) {
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

/// Unloads a DYNAMIC model when its idle deadline passes with nothing in flight.
fn idle_timer(weak: Weak<Inner>) {
    let Some(inner) = weak.upgrade() else { return };
    let mut st = inner.state.lock();
    loop {
        if st.shutdown {
            return;
        }
        match st.idle {
            None => {
                inner.timer.wait(&mut st);
            }
            Some((deadline, _)) if Instant::now() < deadline => {
                inner.timer.wait_until(&mut st, deadline);
            }
            Some((_, generation)) => {
                st.idle = None;
                let current = st.current.as_ref().map(|r| r.generation);
                if current == Some(generation) && st.in_flight == 0 {
                    if let Err(e) = unload_locked(&inner, &mut st, UnloadReason::Idle) {
                        log::error!("idle unload: {e}");
                    }
                }
            }
        }
    }
}

/// Wraps the loaded model's provider: reloads it if residency unloaded it, counts inferences in
/// flight, applies DYNAMIC and EPHEMERAL residency after each, and records `InferenceCompleted`.
pub struct ManagedInferenceProvider {
    manager: Weak<Inner>,
    descriptor: ModelDescriptor,
    id: ProviderId,
    tokenizer: LlamaCppTokenizer,
}

impl std::fmt::Debug for ManagedInferenceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedInferenceProvider")
            .field("model_id", &self.descriptor.model_id)
            .finish_non_exhaustive()
    }
}

impl ManagedInferenceProvider {
    fn new(manager: Weak<Inner>, descriptor: ModelDescriptor) -> Self {
        let tokenizer = match manager.upgrade() {
            Some(i) => i.tokenizer.clone(),
            None => LlamaCppTokenizer::new("http://127.0.0.1:0", &HttpOptions::default()),
        };
        ManagedInferenceProvider {
            id: ProviderId::from_string(format!("llama-cpp:{}", descriptor.model_id)),
            tokenizer,
            manager,
            descriptor,
        }
    }

    /// The descriptor this provider serves.
    pub fn descriptor(&self) -> &ModelDescriptor {
        &self.descriptor
    }

    /// Runs one inference, reloading the model first if needed; `cancel` stops the load or the
    /// generation (the connection closes, so the server stops decoding).
    ///
    /// # Errors
    /// As [`InferenceProvider::infer`]; a failed reload is [`InferenceError::ModelUnavailable`].
    pub fn infer_with_cancel(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
    ) -> Result<InferenceResponse, InferenceError> {
        self.infer_stream(request, cancel, &mut |_| StreamControl::Continue)
    }
}

/// One inference in flight: counted while it lives; its bookkeeping runs when it ends, also
/// when a stream callback panics.
struct InFlight<'a> {
    inner: &'a Inner,
    descriptor: &'a ModelDescriptor,
    generation: u64,
    finished: bool,
}

impl InFlight<'_> {
    fn finish(mut self, result: &Result<InferenceResponse, InferenceError>) {
        self.finished = true;
        finish_inference(self.inner, self.descriptor, self.generation, result);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            finish_inference(
                self.inner,
                self.descriptor,
                self.generation,
                &Err(InferenceError::Cancelled),
            );
        }
    }
}

/// After an inference: the in-flight count, the event, and the residency policy.
fn finish_inference(
    inner: &Inner,
    descriptor: &ModelDescriptor,
    generation: u64,
    result: &Result<InferenceResponse, InferenceError>,
) {
    let mut st = inner.state.lock();
    st.in_flight = st.in_flight.saturating_sub(1);
    if let Ok(r) = result {
        let event = DomainEvent::InferenceCompleted {
            model_id: descriptor.model_id.clone(),
            usage: r.usage,
            latency_ms: r.latency_ms,
            finish_reason: r.finish_reason.as_str().to_owned(),
        };
        if let Err(e) = append_domain(inner.events.as_ref(), MODEL_STREAM, &event) {
            log::error!("recording an inference: {e}");
        }
    }
    let ours = st.current.as_ref().map(|r| r.generation) == Some(generation);
    if ours && st.in_flight == 0 {
        match descriptor.residency {
            ResidencyMode::Persistent => {}
            ResidencyMode::Dynamic => {
                st.idle = Some((Instant::now() + descriptor.idle_timeout, generation));
                inner.timer.notify_all();
            }
            ResidencyMode::Ephemeral => {
                if let Err(e) = unload_locked(inner, &mut st, UnloadReason::Ephemeral) {
                    log::error!("ephemeral unload: {e}");
                }
            }
        }
    }
}

impl InferenceProvider for ManagedInferenceProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn infer(&self, request: &InferenceRequest) -> Result<InferenceResponse, InferenceError> {
        self.infer_with_cancel(request, &CancelToken::new())
    }

    fn infer_stream(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<InferenceResponse, InferenceError> {
        let inner = self
            .manager
            .upgrade()
            .ok_or_else(|| InferenceError::ModelUnavailable {
                detail: ModelLoadError::ManagerGone.to_string(),
            })?;
        let (provider, generation) = {
            let mut st = inner.state.lock();
            load_locked(&inner, &mut st, &self.descriptor, cancel).map_err(|e| match e {
                ModelLoadError::Cancelled => InferenceError::Cancelled,
                other => InferenceError::ModelUnavailable {
                    detail: other.to_string(),
                },
            })?;
            let r = st
                .current
                .as_ref()
                .ok_or_else(|| InferenceError::ModelUnavailable {
                    detail: "the model vanished while loading".into(),
                })?;
            let picked = (r.provider.clone(), r.generation);
            st.in_flight += 1;
            st.idle = None;
            picked
        };
        // The call runs on this thread: a cancel shuts its socket, so it returns at once and
        // the server stops generating; no worker is left behind.
        let flight = InFlight {
            inner: &inner,
            descriptor: &self.descriptor,
            generation,
            finished: false,
        };
        let result = provider
            .infer_stream(request, cancel, on_chunk)
            .map(|mut r| {
                r.model = self.descriptor.model_id.clone();
                r
            });
        // Recorded before the caller sees the answer.
        flight.finish(&result);
        result
    }

    fn health_check(&self) -> ProviderHealth {
        let Some(inner) = self.manager.upgrade() else {
            return ProviderHealth::Unhealthy {
                reason: "the model manager was dropped".into(),
            };
        };
        let provider = {
            let st = inner.state.lock();
            match st.current.as_ref() {
                Some(r) if r.descriptor.model_id == self.descriptor.model_id => r.provider.clone(),
                _ => {
                    return ProviderHealth::Unhealthy {
                        reason: format!("{} is not loaded", self.descriptor.model_id),
                    }
                }
            }
        };
        provider.health_check()
    }

    fn capabilities(&self) -> Vec<CapabilityScore> {
        capabilities_for(&self.descriptor.model_id)
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }
}
