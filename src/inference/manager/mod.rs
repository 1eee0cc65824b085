//! [`DefaultModelManager`]: a scheduler of llama-servers. Several models stay resident, each
//! on its own server and loopback port, within `max_loaded` and a memory budget; the least
//! recently used model with nothing in flight is evicted to make room, and nothing running is
//! ever killed by a swap, an eviction or an unload. Remote models name servers already running
//! elsewhere.
//!
//! One `parking_lot::Mutex` guards the state; it is released for everything slow: spawning a
//! server and polling it healthy, stopping one, health checks, and every append to the log.
//! The ids being loaded or stopped are kept in the state meanwhile, so that a call for the
//! same id waits for the change and counts see every server that exists. Events follow real
//! state: `model.loaded` once the server is healthy (while the id is still loading, before
//! any use), `model.unloaded` after its process is reaped (and before a new server for the id
//! can load). A failed load appends nothing, except when the manager shut down after the
//! server was recorded: its unload is recorded too.
//!
//! Here: the state and the public API. `scheduler` decides and performs loads, evictions and
//! unloads; `descriptor` holds what a model and the options are; `server` the processes;
//! `residency` the housekeeping thread (idle unloads, liveness); `remote` endpoints elsewhere;
//! `estimate` memory before a load; `provider` the inference path.

mod applied;
mod descriptor;
mod estimate;
mod isolation;
mod options;
mod placement;
mod prompt_cache;
mod provider;
mod remote;
mod residency;
mod scheduler;
mod server;

pub use descriptor::{
    EndpointStatus, ModelDescriptor, ModelRole, ModelState, ModelStatus, ResidencyMode,
};
pub use isolation::ServerIsolation;
pub use options::{ManagerOptions, PromptCacheOptions};
pub use provider::ManagedInferenceProvider;

use remote::EndpointSet;
use residency::housekeeper;
use scheduler::{ensure_loaded, stop_model, unload_model};
use server::{default_log_dir, spawner_thread};

use super::llama::{
    capabilities_for, EndpointFeatures, EndpointKind, HttpOptions, LlamaCppInferenceProvider,
    LlamaCppTokenizer,
};
use super::manager_error::ModelLoadError;
use super::{
    CapabilityScore, InferenceError, InferenceProvider, InferenceRequest, InferenceResponse,
    ProviderHealth, ResponseFormat, StreamChunk, StreamControl, Tokenizer,
};
use crate::cancel::CancelToken;
pub use crate::domain::MODEL_STREAM;
use crate::domain::{append_domain, DomainEvent, UnloadReason};
use crate::events::EventStore;
use crate::ids::ProviderId;
use crate::sys::{self, kill_group};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

/// Lines of a server's log kept in memory for load errors.
const LOG_TAIL_LINES: usize = 100;
/// How often the manager asks `/health` while a server loads: tight, so readiness is noticed
/// within a few milliseconds (Ollama polls every 250 ms, llama-swap every second).
const HEALTH_POLL: Duration = Duration::from_millis(2);
/// Failed liveness checks in a row after which a spawned server counts as unresponsive.
const LIVENESS_MISSES: u32 = 3;
/// How long waiting calls sleep between looks at the state, so a cancel is seen promptly.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Loads and unloads models. Blocking; shared across threads.
pub trait ModelManager: Send + Sync {
    /// Loads `descriptor` (a no-op when its id is loaded with the same server settings),
    /// evicting the least recently used idle model when the bounds require it.
    ///
    /// # Errors
    /// [`ModelLoadError`]; nothing is recorded for a failed load (a load that completes as the
    /// manager shuts down is recorded with its unload, and fails with `ManagerGone`).
    fn load(
        &self,
        descriptor: &ModelDescriptor,
    ) -> Result<Arc<dyn InferenceProvider>, ModelLoadError>;
    /// Unloads `model_id` if it is loaded, after its running inferences finish.
    ///
    /// # Errors
    /// [`ModelLoadError::Busy`] when they do not finish within the drain timeout;
    /// [`ModelLoadError::Events`] when the unload could not be recorded.
    fn unload(&self, model_id: &str) -> Result<(), ModelLoadError>;
    /// The most recently used loaded model, if any.
    fn current_model(&self) -> Option<ModelDescriptor>;
    /// Whether every loaded model's server answers.
    fn health_check(&self) -> ProviderHealth;
}

/// What serves a loaded model.
// One per loaded model, so the size of the local variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Backend {
    /// A server this manager spawned.
    Local {
        child: Child,
        port: u16,
        provider: Arc<LlamaCppInferenceProvider>,
        tokenizer: LlamaCppTokenizer,
    },
    /// Servers running elsewhere.
    Remote(Arc<EndpointSet>),
}

/// Where one inference goes.
enum Target {
    Local(Arc<LlamaCppInferenceProvider>),
    Remote(Arc<EndpointSet>),
}

struct Running {
    descriptor: ModelDescriptor,
    backend: Backend,
    generation: u64,
    in_flight: u32,
    /// Inferences of those in flight whose completion is being appended (a stop waits for
    /// them, so the completion is before the unload in the log).
    recording: u32,
    /// DYNAMIC's idle deadline, set while nothing is in flight.
    idle: Option<Instant>,
    /// The manager's use counter at the last load or inference: the LRU order.
    last_used: u64,
    loaded_at: SystemTime,
    estimate: Option<u64>,
    /// Liveness checks failed in a row.
    misses: u32,
    /// A spawned chat server's prompt cache, with `models.prompt_cache` set.
    cache: Option<prompt_cache::ServerCache>,
}

impl Running {
    fn is_local(&self) -> bool {
        matches!(self.backend, Backend::Local { .. })
    }

    fn pid(&self) -> Option<u32> {
        match &self.backend {
            Backend::Local { child, .. } => Some(child.id()),
            Backend::Remote(_) => None,
        }
    }

    fn port(&self) -> Option<u16> {
        match &self.backend {
            Backend::Local { port, .. } => Some(*port),
            Backend::Remote(_) => None,
        }
    }

    /// Whether its server still runs (a remote model always counts as present).
    fn alive(&self) -> bool {
        match &self.backend {
            Backend::Local { child, .. } => !exited_unreaped(child),
            Backend::Remote(_) => true,
        }
    }

    fn target(&self) -> Target {
        match &self.backend {
            Backend::Local { provider, .. } => Target::Local(Arc::clone(provider)),
            Backend::Remote(set) => Target::Remote(Arc::clone(set)),
        }
    }

    fn tokenizer(&self) -> Option<LlamaCppTokenizer> {
        match &self.backend {
            Backend::Local { tokenizer, .. } => Some(tokenizer.clone()),
            Backend::Remote(set) => set.tokenizer(),
        }
    }

    /// The memory it is counted for: its measured RSS, else its estimate.
    fn memory(&self) -> u64 {
        self.pid()
            .and_then(|p| sys::rss_bytes(p as i32))
            .or(self.estimate)
            .unwrap_or(0)
    }
}

/// A server being started, with the lock released.
struct Pending {
    descriptor: ModelDescriptor,
    port: Option<u16>,
    generation: u64,
    estimate: Option<u64>,
}

/// A server being stopped, with the lock released.
struct Stopping {
    residency: ResidencyMode,
    /// A local server's (`None`: a remote model).
    pid: Option<u32>,
    port: Option<u16>,
    estimate: Option<u64>,
}

#[derive(Default)]
struct State {
    models: HashMap<String, Running>,
    loading: HashMap<String, Pending>,
    stopping: HashMap<String, Stopping>,
    /// Loads waiting for a model to become evictable.
    queued: usize,
    /// Bumped at every spawn; watchers carry the generation they belong to.
    generation: u64,
    /// Bumped at every load and inference, for the LRU order.
    uses: u64,
    shutdown: bool,
}

impl State {
    fn most_recent(&self) -> Option<&Running> {
        self.models.values().max_by_key(|r| r.last_used)
    }

    fn touch(&mut self) -> u64 {
        self.uses += 1;
        self.uses
    }
}

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<std::io::Result<Child>>,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the housekeeper when an idle deadline is set or the manager shuts down.
    timer: Condvar,
    /// Notified when an in-flight count drops, a load ends or a server is gone, for calls
    /// waiting on any of these.
    settled: Condvar,
    events: Arc<dyn EventStore>,
    options: ManagerOptions,
    spawner: Mutex<mpsc::Sender<SpawnRequest>>,
    /// Memory estimates by model file and context size (reading a GGUF header takes a while).
    estimates: Mutex<HashMap<(PathBuf, u32), Option<u64>>>,
    /// Log drains and exit watchers of the servers started so far.
    helpers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Sessions' saved prompt caches, with `models.prompt_cache` set.
    cache: Option<prompt_cache::PromptCache>,
}

impl Inner {
    fn base_url(&self, port: u16) -> String {
        format!("http://{}:{port}", self.options.host)
    }

    fn log_path(&self) -> PathBuf {
        self.options
            .log_dir
            .clone()
            .unwrap_or_else(default_log_dir)
            .join("llama-server.log")
    }
}

/// The llama-server scheduler. Dropping it unloads every model it spawned.
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
    ///
    /// # Errors
    /// [`ConfigError`](crate::ConfigError) for options a `models` config section would refuse
    /// (the same checks and messages; from Rust, `port` 0 is allowed: a free port for each
    /// server).
    pub fn new(
        events: Arc<dyn EventStore>,
        options: ManagerOptions,
    ) -> Result<Self, crate::settings::ConfigError> {
        options.check_values()?;
        let cache = match &options.prompt_cache {
            None => None,
            Some(c) => Some(
                prompt_cache::PromptCache::open(c.clone(), Arc::clone(&events)).map_err(|e| {
                    crate::settings::ConfigError::new(
                        "prompt_cache.dir",
                        format!("{}: {e}", c.dir().display()),
                    )
                })?,
            ),
        };
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            timer: Condvar::new(),
            settled: Condvar::new(),
            events,
            spawner: Mutex::new(spawner_thread()),
            estimates: Mutex::new(HashMap::new()),
            helpers: Mutex::new(Vec::new()),
            options,
            cache,
        });
        let weak = Arc::downgrade(&inner);
        let timer_thread = std::thread::Builder::new()
            .name("correx-models".into())
            .spawn(move || housekeeper(weak))
            .map_err(|e| log::error!("could not start the model housekeeper: {e}"))
            .ok();
        Ok(DefaultModelManager {
            inner,
            timer_thread,
        })
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
        ensure_loaded(&self.inner, &mut st, descriptor, cancel)?;
        drop(st);
        Ok(Arc::new(ManagedInferenceProvider::new(
            Arc::downgrade(&self.inner),
            descriptor.clone(),
        )))
    }

    /// The tokenizer of the most recently used loaded model; `None` when no model is loaded,
    /// so that nothing is sent to whatever else may listen on a port.
    pub fn loaded_tokenizer(&self) -> Option<LlamaCppTokenizer> {
        self.inner
            .state
            .lock()
            .most_recent()
            .and_then(Running::tokenizer)
    }

    /// The loaded models, the most recently used first.
    pub fn loaded_models(&self) -> Vec<ModelDescriptor> {
        let st = self.inner.state.lock();
        let mut models: Vec<&Running> = st.models.values().collect();
        models.sort_by_key(|r| std::cmp::Reverse(r.last_used));
        models.into_iter().map(|r| r.descriptor.clone()).collect()
    }

    /// What is loaded, loading or unloading, like Ollama's `/api/ps`, sorted by model id:
    /// answers at once, from memory, also during a load, an unload or an append to the log
    /// (no lock is held across one); resident memory is read from `/proc` after.
    pub fn status(&self) -> Vec<ModelStatus> {
        let st = self.inner.state.lock();
        let now = Instant::now();
        let mut out: Vec<ModelStatus> = st
            .models
            .iter()
            .map(|(id, r)| ModelStatus {
                model_id: id.clone(),
                state: ModelState::Loaded,
                pid: r.pid(),
                port: r.port(),
                endpoints: match &r.backend {
                    Backend::Remote(set) => set.status(),
                    Backend::Local { .. } => Vec::new(),
                },
                residency: r.descriptor.residency,
                loaded_at_ms: r
                    .loaded_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64),
                idle_expires_in_ms: r
                    .idle
                    .map(|at| at.saturating_duration_since(now).as_millis() as u64),
                in_flight: r.in_flight,
                rss_bytes: None,
                estimated_bytes: r.estimate,
            })
            .collect();
        out.extend(st.loading.iter().map(|(id, p)| ModelStatus {
            model_id: id.clone(),
            state: ModelState::Loading,
            pid: None,
            port: p.port,
            endpoints: Vec::new(),
            residency: p.descriptor.residency,
            loaded_at_ms: None,
            idle_expires_in_ms: None,
            in_flight: 0,
            rss_bytes: None,
            estimated_bytes: p.estimate,
        }));
        out.extend(st.stopping.iter().map(|(id, s)| ModelStatus {
            model_id: id.clone(),
            state: ModelState::Unloading,
            pid: s.pid,
            port: s.port,
            endpoints: Vec::new(),
            residency: s.residency,
            loaded_at_ms: None,
            idle_expires_in_ms: None,
            in_flight: 0,
            rss_bytes: None,
            estimated_bytes: s.estimate,
        }));
        drop(st);
        // Not an unloading server's: it may be reaped by now, and its pid another process's.
        for row in out.iter_mut().filter(|r| r.state != ModelState::Unloading) {
            row.rss_bytes = row.pid.and_then(|p| sys::rss_bytes(p as i32));
        }
        out.sort_by(|a, b| a.model_id.cmp(&b.model_id));
        out
    }

    /// The first port of the range servers bind (0: ports chosen by the kernel).
    pub fn port(&self) -> u16 {
        self.inner.options.port
    }

    /// The pid of the most recently used spawned server, if any.
    pub fn server_pid(&self) -> Option<u32> {
        let st = self.inner.state.lock();
        st.models
            .values()
            .filter(|r| r.is_local())
            .max_by_key(|r| r.last_used)
            .and_then(Running::pid)
    }

    /// The pid of the server that serves `model_id`, if it is loaded and spawned here.
    pub fn server_pid_of(&self, model_id: &str) -> Option<u32> {
        self.inner
            .state
            .lock()
            .models
            .get(model_id)
            .and_then(Running::pid)
    }

    /// The path of the server log (every server's lines, each prefixed with its model id).
    pub fn log_path(&self) -> PathBuf {
        self.inner.log_path()
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

    /// Embeds `inputs` on `descriptor`'s model (one whose descriptor says `"serves":
    /// "embeddings"`), loading it first if needed, like any other resident; see
    /// [`ManagedInferenceProvider::embed`].
    ///
    /// # Errors
    /// As [`ManagedInferenceProvider::embed`].
    pub fn embed(
        &self,
        descriptor: &ModelDescriptor,
        inputs: &[String],
        cancel: &CancelToken,
    ) -> Result<crate::inference::Embeddings, InferenceError> {
        self.managed(descriptor).embed(inputs, cancel)
    }
}

impl Drop for DefaultModelManager {
    fn drop(&mut self) {
        {
            let mut st = self.inner.state.lock();
            st.shutdown = true;
            let ids: Vec<String> = st.models.keys().cloned().collect();
            for id in ids {
                if let Err(e) = stop_model(&self.inner, &mut st, &id, UnloadReason::Requested) {
                    log::warn!("unloading {id} on drop: {e}");
                }
            }
        }
        self.inner.timer.notify_all();
        self.inner.settled.notify_all();
        if let Some(cache) = &self.inner.cache {
            cache.saver.close();
        }
        if let Some(t) = self.timer_thread.take() {
            let _ = t.join();
        }
        // The servers are gone, so their pipes closed and their watchers wake: these end
        // promptly.
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
        unload_model(&self.inner, &mut st, model_id, &CancelToken::new())
    }

    fn current_model(&self) -> Option<ModelDescriptor> {
        self.inner
            .state
            .lock()
            .most_recent()
            .map(|r| r.descriptor.clone())
    }

    fn health_check(&self) -> ProviderHealth {
        let targets: Vec<(String, Target)> = {
            let st = self.inner.state.lock();
            st.models
                .iter()
                .map(|(id, r)| (id.clone(), r.target()))
                .collect()
        };
        if targets.is_empty() {
            return ProviderHealth::Unhealthy {
                reason: "no model loaded".into(),
            };
        }
        for (id, target) in targets {
            let health = match target {
                Target::Local(p) => p.health_check(),
                Target::Remote(set) => match set.check_all(&CancelToken::new()) {
                    Ok(()) => ProviderHealth::Healthy,
                    Err(reason) => ProviderHealth::Unhealthy { reason },
                },
            };
            if let ProviderHealth::Unhealthy { reason } = health {
                return ProviderHealth::Unhealthy {
                    reason: format!("{id}: {reason}"),
                };
            }
        }
        ProviderHealth::Healthy
    }
}

/// Stops a server: SIGTERM, `stop_grace` to exit, then SIGKILL; says how it ended.
fn stop_child(inner: &Inner, child: &mut Child) -> sys::Ended {
    let grace = inner.options.stop_grace;
    sys::stop_group(child, grace)
}

/// Whether the child has exited, without reaping it.
fn exited_unreaped(child: &Child) -> bool {
    sys::exited_unreaped(child.id() as i32)
}
