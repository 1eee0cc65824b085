//! The scheduler's decisions: whether a model needs a server, whether there is room for one,
//! which model to evict, and the steps of loading and stopping, each taken with the state lock
//! held and released for the slow part.
//!
//! The rules: a running inference is never killed (a swap, an eviction or an unload waits for
//! the model's in-flight count to reach zero, at most the drain timeout); the victim of an
//! eviction is the least recently used spawned model with nothing in flight; when nothing can
//! be evicted, the load waits in a bounded queue. Servers starting or stopping count towards
//! `max_loaded`, so never more servers exist than it allows.

use super::*;
use estimate::estimate_bytes;

/// Loads `d` unless it is loaded as it is. Called with the lock held; returns with it held.
pub(super) fn ensure_loaded(
    inner: &Arc<Inner>,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    d.validate()?;
    let mut queued = false;
    let result = ensure_loaded_queued(inner, st, d, cancel, &mut queued);
    if queued {
        st.queued -= 1;
    }
    result
}

/// What a load may do about the bounds.
enum Room {
    Yes,
    Evict(String),
    Wait,
}

fn ensure_loaded_queued(
    inner: &Arc<Inner>,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
    cancel: &CancelToken,
    queued: &mut bool,
) -> Result<(), ModelLoadError> {
    let started = Instant::now();
    let deadline = started + inner.options.drain_timeout;
    let id = d.model_id.as_str();
    // Checked once, after the already-loaded answer (the path every inference takes) and
    // before anything waits, is replaced or is evicted: a load that cannot work changes
    // nothing.
    let mut local: Option<(PathBuf, Option<u64>)> = None;
    loop {
        if !settled(inner, st, id, cancel)? {
            continue;
        }
        let uses = st.touch();
        if let Some(r) = st.models.get_mut(id) {
            if !r.alive() {
                stop_model(inner, st, id, UnloadReason::Crashed)?;
                continue;
            }
            if r.descriptor.same_server(d) {
                adopt_residency(inner, r, d);
                r.last_used = uses;
                return Ok(());
            }
        }
        if local.is_none() && !d.is_remote() {
            // May release the lock (the estimate reads the file): look at the state again.
            local = Some(prepare_local(inner, st, d)?);
            continue;
        }
        if let Some(r) = st.models.get_mut(id) {
            if r.in_flight > 0 {
                let in_flight = r.in_flight;
                wait_or_busy(inner, st, id, deadline, started, |_| {
                    Holders::inferences(id, in_flight)
                })?;
                continue;
            }
            stop_model(inner, st, id, UnloadReason::Replaced)?;
            continue;
        }
        let Some((bin, estimate)) = &local else {
            return connect_remote(inner, st, d, cancel);
        };
        match room(inner, st, *estimate) {
            Room::Yes => return spawn_local(inner, st, d, bin, *estimate, cancel),
            Room::Evict(victim) => {
                stop_model(inner, st, &victim, UnloadReason::Evicted)?;
            }
            Room::Wait => {
                if !*queued {
                    if st.queued >= inner.options.max_queued {
                        let held = holders(st);
                        return Err(ModelLoadError::Busy {
                            requested: id.to_owned(),
                            model_id: held.models,
                            in_flight: held.in_flight,
                            holding: format!(
                                "a place in the queue of loads waiting for room ({} of \
                                 max_queued {} taken)",
                                st.queued, inner.options.max_queued
                            ),
                            waited_ms: 0,
                        });
                    }
                    st.queued += 1;
                    *queued = true;
                }
                wait_or_busy(inner, st, id, deadline, started, holders)?;
            }
        }
    }
}

/// Whether `id` is not being loaded or stopped by another call (whose outcome decides what
/// this one does); otherwise waits one slice and says no. Fails when the manager shuts down
/// or `cancel` is set.
fn settled(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    id: &str,
    cancel: &CancelToken,
) -> Result<bool, ModelLoadError> {
    if st.shutdown {
        return Err(ModelLoadError::ManagerGone);
    }
    if cancel.is_cancelled() {
        return Err(ModelLoadError::Cancelled);
    }
    if st.loading.contains_key(id) || st.stopping.contains_key(id) {
        inner.settled.wait_for(st, WAIT_SLICE);
        return Ok(false);
    }
    Ok(true)
}

/// The latest load's residency applies; it needs no new server.
fn adopt_residency(inner: &Inner, r: &mut Running, d: &ModelDescriptor) {
    r.descriptor.residency = d.residency;
    r.descriptor.idle_timeout = d.idle_timeout;
    if d.residency != ResidencyMode::Dynamic {
        r.idle = None;
    } else if r.in_flight == 0 {
        r.idle = Some(Instant::now() + d.idle_timeout);
        inner.timer.notify_all();
    }
}

/// What a waiting call waited for, as a Busy error names it.
struct Holders {
    /// The models with inferences running, and their total.
    models: String,
    in_flight: u32,
    /// In words, each thing it waited for.
    holding: String,
}

impl Holders {
    /// The inferences running on `id`.
    fn inferences(id: &str, in_flight: u32) -> Holders {
        Holders {
            models: id.to_owned(),
            in_flight,
            holding: format!("{in_flight} inference(s) on {id} to finish"),
        }
    }
}

/// What holds the room a load waits for: models with inferences running, servers starting
/// and servers stopping (each counts towards `max_loaded` and the memory budget).
fn holders(st: &State) -> Holders {
    // Local servers only: remote models take no room.
    let mut running: Vec<(&str, u32)> = st
        .models
        .iter()
        .filter(|(_, r)| r.in_flight > 0 && r.is_local())
        .map(|(id, r)| (id.as_str(), r.in_flight))
        .collect();
    running.sort_unstable();
    let mut starting: Vec<&str> = st
        .loading
        .iter()
        .filter(|(_, p)| p.port.is_some())
        .map(|(id, _)| id.as_str())
        .collect();
    starting.sort_unstable();
    let mut stopping: Vec<&str> = st
        .stopping
        .iter()
        .filter(|(_, s)| s.pid.is_some())
        .map(|(id, _)| id.as_str())
        .collect();
    stopping.sort_unstable();
    let mut holding: Vec<String> = running
        .iter()
        .map(|(id, n)| format!("{n} inference(s) on {id} to finish"))
        .collect();
    holding.extend(starting.iter().map(|id| format!("{id} to finish loading")));
    holding.extend(stopping.iter().map(|id| format!("{id} to stop")));
    if holding.is_empty() {
        holding.push("room under max_loaded or the memory budget".to_owned());
    }
    Holders {
        models: running
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>()
            .join(", "),
        in_flight: running.iter().map(|(_, n)| n).sum(),
        holding: holding.join(", "),
    }
}

/// Waits one slice for the state to change, or fails with Busy after the deadline.
fn wait_or_busy(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    requested: &str,
    deadline: Instant,
    started: Instant,
    busy: impl FnOnce(&State) -> Holders,
) -> Result<(), ModelLoadError> {
    let now = Instant::now();
    if now >= deadline {
        let held = busy(st);
        return Err(ModelLoadError::Busy {
            requested: requested.to_owned(),
            model_id: held.models,
            in_flight: held.in_flight,
            holding: held.holding,
            waited_ms: started.elapsed().as_millis() as u64,
        });
    }
    inner.settled.wait_until(st, deadline.min(now + WAIT_SLICE));
    Ok(())
}

/// Whether one more spawned server fits, which model to evict if not.
fn room(inner: &Inner, st: &State, estimate: Option<u64>) -> Room {
    let servers = st.models.values().filter(|r| r.is_local()).count()
        + st.loading.values().filter(|p| p.port.is_some()).count()
        + st.stopping.values().filter(|s| s.pid.is_some()).count();
    let over_count = servers + 1 > inner.options.max_loaded;
    // Loaded servers count with their measured RSS, the new one with its estimate (the
    // estimate alone was checked against the budget before).
    let over_memory = inner.options.memory_budget.is_some_and(|budget| {
        let used: u64 = st.models.values().map(Running::memory).sum::<u64>()
            + st.loading.values().filter_map(|p| p.estimate).sum::<u64>()
            + st.stopping.values().filter_map(|s| s.estimate).sum::<u64>();
        used + estimate.unwrap_or(0) > budget
    });
    if !over_count && !over_memory {
        return Room::Yes;
    }
    let victim = st
        .models
        .iter()
        .filter(|(_, r)| r.is_local() && r.in_flight == 0)
        .min_by_key(|(_, r)| r.last_used)
        .map(|(id, _)| id.clone());
    victim.map_or(Room::Wait, Room::Evict)
}

/// The binary and the memory estimate for a spawned model; fails at once when either file is
/// missing. The estimate is read (once per file and context size) with the lock released.
fn prepare_local(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
) -> Result<(PathBuf, Option<u64>), ModelLoadError> {
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
    // Reading the header walks the whole tokenizer vocabulary (tens of milliseconds): only a
    // memory budget needs it, so without one nothing is estimated and loads pay nothing.
    let estimate = if inner.options.memory_budget.is_none() {
        None
    } else {
        let key = (d.model_path.clone(), d.context_size);
        let cached = inner.estimates.lock().get(&key).copied();
        match cached {
            Some(e) => e,
            None => {
                let e = MutexGuard::unlocked(st, || estimate_bytes(&d.model_path, d.context_size));
                inner.estimates.lock().insert(key, e);
                e
            }
        }
    };
    if let (Some(budget), Some(want)) = (inner.options.memory_budget, estimate) {
        if want > budget {
            return Err(ModelLoadError::OverBudget {
                model_id: d.model_id.clone(),
                estimated_bytes: want,
                budget_bytes: budget,
            });
        }
    }
    Ok((bin, estimate))
}

/// A port for a new server: the first of the range that no server of this manager uses and
/// that can be bound now; with port 0, one the kernel picks.
fn pick_port(inner: &Inner, st: &State) -> Result<u16, ModelLoadError> {
    let host = &inner.options.host;
    let first = inner.options.port;
    if first == 0 {
        let listener = std::net::TcpListener::bind((host.as_str(), 0)).map_err(|e| {
            ModelLoadError::PortInUse {
                addr: format!("{host}:0"),
                detail: e.to_string(),
            }
        })?;
        return listener
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| ModelLoadError::PortInUse {
                addr: format!("{host}:0"),
                detail: e.to_string(),
            });
    }
    let ours: Vec<u16> = st
        .models
        .values()
        .filter_map(Running::port)
        .chain(st.loading.values().filter_map(|p| p.port))
        .chain(st.stopping.values().filter_map(|s| s.port))
        .collect();
    let last = first.saturating_add(inner.options.port_count - 1);
    let mut detail = String::new();
    for port in first..=last {
        if ours.contains(&port) {
            continue;
        }
        match std::net::TcpListener::bind((host.as_str(), port)) {
            Ok(l) => {
                drop(l);
                return Ok(port);
            }
            Err(e) => detail = e.to_string(),
        }
    }
    let addr = if first == last {
        format!("{host}:{first}")
    } else {
        format!("{host}:{first}-{last}")
    };
    if detail.is_empty() {
        detail = "every port of the range serves another model of this manager".into();
    }
    Err(ModelLoadError::PortInUse { addr, detail })
}

fn spawn_local(
    inner: &Arc<Inner>,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
    bin: &std::path::Path,
    estimate: Option<u64>,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    let port = pick_port(inner, st)?;
    let log_path = inner.log_path();
    st.generation += 1;
    let generation = st.generation;
    // A unique alias: a 200 from a server that is not ours is caught by /v1/models.
    let alias = format!("{}#correx-{}-{generation}", d.model_id, std::process::id());
    let base = inner.base_url(port);
    let started = Instant::now();
    st.loading.insert(
        d.model_id.clone(),
        Pending {
            descriptor: d.clone(),
            port: Some(port),
            generation,
            estimate,
        },
    );
    // The slow part, with the lock released: status, health and inference on other models
    // answer meanwhile; calls for this id wait for it. `model.loaded` is appended here too,
    // once the server is healthy and before the model is in use (calls for the id wait while
    // it is loading), with no lock held across the disk write.
    let provider = Arc::new(LlamaCppInferenceProvider::new(
        &d.model_id,
        &base,
        &inner.options.http,
    ));
    let spawned = MutexGuard::unlocked(st, || {
        let cache = cache_key(inner, d, bin);
        let log_file = open_log(&log_path)?;
        let (mut child, isolation) = server::start_and_wait_healthy(
            inner,
            d,
            bin,
            &alias,
            generation,
            log_file,
            port,
            estimate,
            cache.as_ref().map(|(_, dir)| dir.as_path()),
            cancel,
        )?;
        let event = DomainEvent::ModelLoaded {
            model_id: d.model_id.clone(),
            model_path: d.model_path.display().to_string(),
            port: Some(port),
            pid: Some(child.id()),
            load_ms: started.elapsed().as_millis() as u64,
            endpoints: Vec::new(),
            endpoint_features: Vec::new(),
            isolation: Some(isolation),
        };
        if let Err(e) = append_domain(inner.events.as_ref(), MODEL_STREAM, &event) {
            // The log must not say a model is loaded when it could not record it.
            stop_child(inner, &mut child);
            return Err(ModelLoadError::Events(e));
        }
        let cache = cache.map(|(key, _)| prompt_cache::ServerCache {
            key,
            slots: prompt_cache::SlotTable::new(provider.total_slots().unwrap_or(1)),
        });
        Ok((child, cache))
    });
    st.loading.remove(&d.model_id);
    inner.settled.notify_all();
    let (child, cache) = spawned?;
    let tokenizer = LlamaCppTokenizer::new(&base, &inner.options.http);
    let uses = st.touch();
    st.models.insert(
        d.model_id.clone(),
        Running {
            descriptor: d.clone(),
            backend: Backend::Local {
                child,
                port,
                provider,
                tokenizer,
            },
            generation,
            in_flight: 0,
            recording: 0,
            idle: None,
            last_used: uses,
            loaded_at: SystemTime::now(),
            estimate,
            misses: 0,
            cache,
        },
    );
    loaded(inner, st, d)
}

/// The prompt cache key and save directory of a chat server of `bin` for `d`, with
/// `models.prompt_cache` set; without one (the cache is a speed-up), a warning says why.
fn cache_key(
    inner: &Inner,
    d: &ModelDescriptor,
    bin: &std::path::Path,
) -> Option<(prompt_cache::CacheKey, PathBuf)> {
    let cache = inner.cache.as_ref()?;
    if d.serves != ModelRole::Chat {
        return None;
    }
    cache
        .key_for(d, bin)
        .map_err(|e| log::warn!("{} runs without a saved prompt cache: {e}", d.model_id))
        .ok()
}

/// The server's log file, its directory made first.
fn open_log(path: &std::path::Path) -> Result<std::fs::File, ModelLoadError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ModelLoadError::Log {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| ModelLoadError::Log {
            path: path.to_path_buf(),
            source,
        })
}

/// A model just recorded loaded and put in place: unloaded again (and recorded) when the
/// manager shut down meanwhile; else the DYNAMIC idle clock starts (a model loaded and never
/// used unloads too).
fn loaded(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
) -> Result<(), ModelLoadError> {
    if st.shutdown {
        stop_model(inner, st, &d.model_id, UnloadReason::Requested)?;
        return Err(ModelLoadError::ManagerGone);
    }
    if d.residency == ResidencyMode::Dynamic {
        if let Some(r) = st.models.get_mut(&d.model_id) {
            r.idle = Some(Instant::now() + d.idle_timeout);
            inner.timer.notify_all();
        }
    }
    Ok(())
}

/// A remote model: its endpoints are checked (lock released) and at least one must answer.
fn connect_remote(
    inner: &Arc<Inner>,
    st: &mut MutexGuard<'_, State>,
    d: &ModelDescriptor,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    st.generation += 1;
    let generation = st.generation;
    st.loading.insert(
        d.model_id.clone(),
        Pending {
            descriptor: d.clone(),
            port: None,
            generation,
            estimate: None,
        },
    );
    let started = Instant::now();
    let set = Arc::new(EndpointSet::new(
        d,
        &inner.options.http,
        inner.options.session_spill_in_flight,
    ));
    // Checked and recorded with the lock released; calls for this id wait meanwhile.
    let checked = MutexGuard::unlocked(st, || {
        set.check_all(cancel)
            .map_err(|detail| ModelLoadError::EndpointsDown {
                model_id: d.model_id.clone(),
                detail,
            })?;
        if cancel.is_cancelled() {
            return Err(ModelLoadError::Cancelled);
        }
        let event = DomainEvent::ModelLoaded {
            model_id: d.model_id.clone(),
            model_path: String::new(),
            port: None,
            pid: None,
            load_ms: started.elapsed().as_millis() as u64,
            endpoints: d.endpoints.clone(),
            endpoint_features: set
                .features()
                .into_iter()
                .map(|(url, f)| match f {
                    Ok(f) => {
                        let mut v = serde_json::to_value(f).unwrap_or_default();
                        v["url"] = url.into();
                        v
                    }
                    Err(reason) => {
                        serde_json::json!({"url": url, "probed": false, "reason": reason})
                    }
                })
                .collect(),
            isolation: None,
        };
        append_domain(inner.events.as_ref(), MODEL_STREAM, &event).map_err(ModelLoadError::Events)
    });
    st.loading.remove(&d.model_id);
    inner.settled.notify_all();
    if checked.is_err() && st.shutdown {
        return Err(ModelLoadError::ManagerGone);
    }
    checked?;
    let uses = st.touch();
    st.models.insert(
        d.model_id.clone(),
        Running {
            descriptor: d.clone(),
            backend: Backend::Remote(set),
            generation,
            in_flight: 0,
            recording: 0,
            idle: None,
            last_used: uses,
            loaded_at: SystemTime::now(),
            estimate: None,
            misses: 0,
            cache: None,
        },
    );
    loaded(inner, st, d)
}

/// Stops `id`'s server now (the caller has drained it or it is dead) and records the unload
/// after it is reaped. The lock is released while the server stops and the unload is
/// appended; meanwhile the id is `stopping`, so a load of it waits, and a server still counts
/// towards `max_loaded`. The recorded reason is decided once the exit is known: a server that
/// died of something correx did not do (it had exited, or a signal correx did not send ended
/// it) crashed, whichever call noticed first.
pub(super) fn stop_model(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    id: &str,
    reason: UnloadReason,
) -> Result<(), ModelLoadError> {
    // A completion being recorded comes first in the log: a crash's stop waits for no
    // inference, but for the records of those that finished. The lock is released meanwhile:
    // the server asked about may be gone after, and another in its place is not this stop's.
    let asked = st.models.get(id).map(|r| r.generation);
    while st.models.get(id).is_some_and(|r| r.recording > 0) {
        inner.settled.wait_for(st, WAIT_SLICE);
    }
    if st.models.get(id).map(|r| r.generation) != asked {
        return Ok(());
    }
    let Some(running) = st.models.remove(id) else {
        return Ok(());
    };
    let (child, port) = match running.backend {
        Backend::Remote(_) => (None, None),
        Backend::Local { child, port, .. } => (Some(child), Some(port)),
    };
    let pid = child.as_ref().map(Child::id);
    let saves = inner
        .cache
        .as_ref()
        .filter(|_| running.cache.is_some())
        .map(|c| (&c.saver, running.generation));
    st.stopping.insert(
        id.to_owned(),
        Stopping {
            residency: running.descriptor.residency,
            pid,
            port,
            estimate: running.estimate,
        },
    );
    let recorded = MutexGuard::unlocked(st, || {
        // Saved on the way out: the slots' saves queued after their answers are made before
        // the server stops. A hung server answers none; its saves are dropped (a save sent
        // later could reach another server on its port).
        if let Some((saver, generation)) = saves {
            if reason == UnloadReason::Unresponsive {
                saver.discard(generation);
            } else {
                saver.flush(generation);
            }
        }
        let reason = match child {
            Some(mut child) => {
                let ended = if reason == UnloadReason::Unresponsive {
                    // A stopped or hung process handles no SIGTERM: no grace.
                    sys::kill_and_reap(&mut child)
                } else {
                    stop_child(inner, &mut child)
                };
                if ended.not_by_us() {
                    UnloadReason::Crashed
                } else {
                    reason
                }
            }
            None => reason,
        };
        append_domain(
            inner.events.as_ref(),
            MODEL_STREAM,
            &DomainEvent::ModelUnloaded {
                model_id: id.to_owned(),
                reason,
                pid,
                port,
            },
        )
    });
    st.stopping.remove(id);
    inner.settled.notify_all();
    recorded.map(|_| ()).map_err(ModelLoadError::Events)
}

/// An explicit unload: waits for a load or stop of the id in progress, then for its running
/// inferences (at most the drain timeout), then stops it.
pub(super) fn unload_model(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    id: &str,
    cancel: &CancelToken,
) -> Result<(), ModelLoadError> {
    let started = Instant::now();
    let deadline = started + inner.options.drain_timeout;
    loop {
        if !settled(inner, st, id, cancel)? {
            continue;
        }
        match st.models.get(id) {
            None => return Ok(()),
            Some(r) if r.in_flight > 0 => {
                let in_flight = r.in_flight;
                wait_or_busy(inner, st, id, deadline, started, |_| {
                    Holders::inferences(id, in_flight)
                })?;
            }
            Some(_) => return stop_model(inner, st, id, UnloadReason::Requested),
        }
    }
}
