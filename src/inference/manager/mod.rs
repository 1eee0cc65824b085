//! [`DefaultModelManager`]: one llama-server at a time, spawned as a child in its own process
//! group, health-checked, swapped by restart and unloaded by residency policy.
//!
//! One `parking_lot::Mutex` guards the process, its descriptor and the count of inferences in
//! flight; it is released while a server spawns and becomes healthy (other loads wait for that
//! one; status, health and inference on what is loaded answer at once). Events follow
//! committed state: `ModelLoaded` after health passed and the state is set, `ModelUnloaded`
//! after the process is reaped and the state cleared; a failed load appends nothing.
//!
//! Here: the state, loading and unloading. `descriptor` holds what a model and the manager's
//! options are, `server` the processes (spawning, log drains, exit watch), `residency` the
//! idle timer, `provider` the inference path.

mod descriptor;
mod provider;
mod residency;
mod server;

pub use descriptor::{ManagerOptions, ModelDescriptor, ModelState, ModelStatus, ResidencyMode};
pub use provider::ManagedInferenceProvider;

use residency::idle_timer;
use server::{default_log_dir, served_alias, spawner_thread, start_log_drain, LogTail};

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
use parking_lot::{Condvar, Mutex, MutexGuard};
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

struct Running {
    descriptor: ModelDescriptor,
    child: Child,
    generation: u64,
    provider: LlamaCppInferenceProvider,
    loaded_at: std::time::SystemTime,
}

#[derive(Default)]
struct State {
    current: Option<Running>,
    /// Bumped at every spawn; timers and watchers carry the generation they belong to.
    generation: u64,
    in_flight: u32,
    /// The model a load is spawning or health-polling a server for, with the lock released.
    loading: Option<ModelDescriptor>,
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
    /// Notified when the in-flight count drops or a load ends, for calls waiting on either.
    settled: Condvar,
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

impl DefaultModelManager {
    /// A manager that records its events in `events`.
    pub fn new(events: Arc<dyn EventStore>, options: ManagerOptions) -> Self {
        let base_url = format!("http://{}:{}", options.host, options.port);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            timer: Condvar::new(),
            settled: Condvar::new(),
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

    /// What is loaded or loading, like Ollama's `/api/ps`: answers at once, also during a load.
    pub fn status(&self) -> Vec<ModelStatus> {
        let st = self.inner.state.lock();
        let mut out = Vec::new();
        if let Some(r) = &st.current {
            let idle_expires_in_ms = st.idle.and_then(|(at, generation)| {
                (generation == r.generation)
                    .then(|| at.saturating_duration_since(Instant::now()).as_millis() as u64)
            });
            out.push(ModelStatus {
                model_id: r.descriptor.model_id.clone(),
                state: ModelState::Loaded,
                pid: Some(r.child.id()),
                port: self.inner.options.port,
                residency: r.descriptor.residency,
                loaded_at_ms: r
                    .loaded_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64),
                idle_expires_in_ms,
                in_flight: st.in_flight,
                rss_bytes: sys::rss_bytes(r.child.id() as i32),
            });
        }
        if let Some(d) = &st.loading {
            out.push(ModelStatus {
                model_id: d.model_id.clone(),
                state: ModelState::Loading,
                pid: None,
                port: self.inner.options.port,
                residency: d.residency,
                loaded_at_ms: None,
                idle_expires_in_ms: None,
                in_flight: 0,
                rss_bytes: None,
            });
        }
        out
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
        // A load in progress finishes first: the unload then applies to what it loaded.
        wait_for_load(&self.inner, &mut st, &CancelToken::new())?;
        if st.current.as_ref().map(|r| r.descriptor.model_id.as_str()) != Some(model_id) {
            return Ok(());
        }
        drain_locked(&self.inner, &mut st, &CancelToken::new())?;
        if st.current.as_ref().map(|r| r.descriptor.model_id.as_str()) != Some(model_id) {
            return Ok(()); // unloaded by someone else while this call waited
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
    // A server that died on its own is a crash, whichever call noticed it first.
    let reason = if exited_unreaped(&running.child) {
        UnloadReason::Crashed
    } else {
        reason
    };
    stop_child(&mut running.child);
    let event = DomainEvent::ModelUnloaded {
        model_id: running.descriptor.model_id.clone(),
        reason,
        pid: Some(running.child.id()),
        port: Some(inner.options.port),
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

/// Waits (the lock released meanwhile) while another call loads a server.
fn wait_for_load(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    while st.loading.is_some() {
        if cancel.is_cancelled() {
            return Err(ModelLoadError::Cancelled);
        }
        inner.settled.wait_for(st, Duration::from_millis(20));
    }
    if st.shutdown {
        return Err(ModelLoadError::ManagerGone);
    }
    Ok(())
}

/// Whether the loaded server serves `d` as it is.
fn serves(st: &State, d: &ModelDescriptor) -> bool {
    st.current
        .as_ref()
        .is_some_and(|r| r.descriptor.model_id == d.model_id && r.descriptor.same_server(d))
}

/// Waits (the lock released meanwhile) until no inference runs on the loaded model, so that
/// stopping its server kills nothing; at most the drain timeout.
fn drain_locked(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    let started = Instant::now();
    let deadline = started + inner.options.drain_timeout;
    while st.in_flight > 0 && st.current.is_some() {
        if cancel.is_cancelled() {
            return Err(ModelLoadError::Cancelled);
        }
        if st.shutdown {
            return Err(ModelLoadError::ManagerGone);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ModelLoadError::Busy {
                model_id: st
                    .current
                    .as_ref()
                    .map(|r| r.descriptor.model_id.clone())
                    .unwrap_or_default(),
                in_flight: st.in_flight,
                waited_ms: started.elapsed().as_millis() as u64,
            });
        }
        // Short slices, so a cancel is seen while waiting.
        inner
            .settled
            .wait_until(st, deadline.min(now + Duration::from_millis(20)));
    }
    Ok(())
}

fn load_locked(
    inner: &Arc<Inner>,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    wait_for_load(inner, st, cancel)?;
    if !serves(st, d) {
        // Another model (or this one with other settings) is loaded: never kill its running
        // inferences; wait for them, then look again (the state may have changed meanwhile).
        drain_locked(inner, st, cancel)?;
        // The drain released the lock: another call may have loaded meanwhile.
        wait_for_load(inner, st, cancel)?;
    }
    let state: &mut State = st;
    let in_flight = state.in_flight;
    if let Some(r) = state.current.as_mut() {
        if r.descriptor.model_id == d.model_id
            && r.descriptor.same_server(d)
            && matches!(r.child.try_wait(), Ok(None))
        {
            // Residency is the latest load's; it needs no new server.
            r.descriptor.residency = d.residency;
            r.descriptor.idle_timeout = d.idle_timeout;
            if d.residency != ResidencyMode::Dynamic {
                state.idle = None;
            } else if in_flight == 0 {
                state.idle = Some((Instant::now() + d.idle_timeout, r.generation));
                inner.timer.notify_all();
            }
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
    let provider =
        LlamaCppInferenceProvider::new(&d.model_id, &inner.base_url, &inner.options.http);
    let started = Instant::now();
    // Spawning and health polling are the slow part: the lock is released for them, so status,
    // health and inference on other calls answer at once; other loads wait for this one.
    st.loading = Some(d.clone());
    let spawned = MutexGuard::unlocked(st, || {
        start_and_wait_healthy(inner, d, &bin, &alias, generation, log_file, addr, cancel)
    });
    st.loading = None;
    inner.settled.notify_all();
    let mut child = spawned?;
    if st.shutdown {
        stop_child(&mut child);
        return Err(ModelLoadError::ManagerGone);
    }
    let load_ms = started.elapsed().as_millis() as u64;
    let pid = child.id();
    st.current = Some(Running {
        descriptor: d.clone(),
        child,
        generation,
        provider,
        loaded_at: std::time::SystemTime::now(),
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
    // DYNAMIC's idle clock starts at the load: a model loaded and never used unloads too.
    if d.residency == ResidencyMode::Dynamic {
        st.idle = Some((Instant::now() + d.idle_timeout, generation));
        inner.timer.notify_all();
    }
    Ok(())
}

/// Starts the server for `d` and polls it until it is healthy and ours; called without the
/// state lock.
#[allow(clippy::too_many_arguments)]
fn start_and_wait_healthy(
    inner: &Arc<Inner>,
    d: &ModelDescriptor,
    bin: &std::path::Path,
    alias: &str,
    generation: u64,
    log_file: std::fs::File,
    addr: String,
    cancel: &CancelToken,
) -> Result<Child, ModelLoadError> {
    let mut cmd = Command::new(bin);
    cmd.arg("--model")
        .arg(&d.model_path)
        .args(["--ctx-size", &d.context_size.to_string()])
        .args(["--host", &inner.options.host])
        .args(["--port", &inner.options.port.to_string()])
        .args(["--alias", alias]);
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
        path: bin.to_path_buf(),
        source,
    })?;
    start_log_drain(inner, &mut child, generation, log_file);

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
        if inner.state.lock().shutdown {
            return fail(&mut child, ModelLoadError::ManagerGone);
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
    Ok(child)
}
