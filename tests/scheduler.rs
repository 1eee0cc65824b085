//! The model scheduler with real servers: several models resident, LRU eviction that never
//! touches running work, the wait queue, liveness, remote endpoints with failover, and a soak.

use crate::manager::{
    alive, ask, descriptor, kinds, model_events, setup_with, wait_for, TestResult,
};
use crate::util::{llama_install, pending_signals, TestServer};
use correx::{
    CancelToken, InferenceError, InferenceProvider, InferenceResponse, ModelDescriptor,
    ModelLoadError, ModelManager, ModelState, ResidencyMode, StreamControl,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Running = std::thread::JoinHandle<Result<InferenceResponse, InferenceError>>;

/// Starts a long answer on `provider` and returns once its first piece arrived.
fn start_streaming(
    provider: Arc<dyn InferenceProvider>,
    max_tokens: u32,
    token: &CancelToken,
) -> Result<Running, Box<dyn std::error::Error>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let token = token.clone();
    let running = std::thread::spawn(move || {
        let mut first = Some(tx);
        provider.infer_stream(&ask(max_tokens), &token, &mut |_| {
            if let Some(tx) = first.take() {
                let _ = tx.send(());
            }
            StreamControl::Continue
        })
    });
    rx.recv_timeout(Duration::from_secs(120))?;
    Ok(running)
}

fn servers_of(prefix: &str) -> usize {
    server_pids(prefix).len()
}

/// The pids of live (not zombie) llama-servers whose alias starts with `prefix`.
fn server_pids(prefix: &str) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            cmd.contains("llama-server")
                && cmd.contains(&format!("--alias {prefix}"))
                && alive(*pid as u32)
        })
        .collect()
}

/// The pids the log says are serving, by replaying the model events.
fn replay(events: &[correx::RecordedEvent]) -> Result<HashMap<String, u64>, String> {
    let mut loaded: HashMap<String, u64> = HashMap::new();
    for e in events {
        let id = e.payload["model_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match e.type_id.as_str() {
            "model.loaded" => {
                let pid = e.payload["pid"].as_u64().ok_or("loaded without a pid")?;
                if let Some(old) = loaded.insert(id.clone(), pid) {
                    return Err(format!("{id} loaded twice (pid {old}, then {pid})"));
                }
            }
            "model.unloaded" if loaded.remove(&id).is_none() => {
                return Err(format!("{id} unloaded while not loaded"));
            }
            _ => {}
        }
    }
    Ok(loaded)
}

#[test]
fn two_models_stay_resident_and_the_least_recently_used_idle_one_is_evicted() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.max_loaded = 2)?;
    let a = descriptor(&s.install, "res-a", ResidencyMode::Persistent);
    let b = descriptor(&s.install, "res-b", ResidencyMode::Persistent);
    let c = descriptor(&s.install, "res-c", ResidencyMode::Persistent);
    let pa = s.manager.load(&a)?;
    let pb = s.manager.load(&b)?;
    // Both answer, each from its own server on its own port, with no load in between.
    assert!(pa.infer(&ask(3))?.usage.completion_tokens > 0);
    assert!(pb.infer(&ask(3))?.usage.completion_tokens > 0);
    assert!(pa.infer(&ask(3))?.usage.completion_tokens > 0);
    let status = s.manager.status();
    assert_eq!(status.len(), 2, "{status:?}");
    assert!(status.iter().all(|m| m.state == ModelState::Loaded));
    assert_ne!(status[0].port, status[1].port);
    assert_ne!(status[0].pid, status[1].pid);
    let (pid_a, pid_b) = (
        s.manager.server_pid_of("res-a").ok_or("a not loaded")?,
        s.manager.server_pid_of("res-b").ok_or("b not loaded")?,
    );
    // A third evicts b, used less recently than a.
    s.manager.load(&c)?;
    assert!(!alive(pid_b), "the evicted server still runs");
    assert!(alive(pid_a), "the recently used model was evicted");
    let loaded: Vec<String> = s
        .manager
        .loaded_models()
        .into_iter()
        .map(|d| d.model_id)
        .collect();
    assert_eq!(loaded, ["res-c", "res-a"]);
    let events = model_events(&s.store)?;
    assert_eq!(
        kinds(&events),
        [
            "loaded:res-a",
            "loaded:res-b",
            "inference.completed",
            "inference.completed",
            "inference.completed",
            "unloaded:evicted",
            "loaded:res-c"
        ]
    );
    assert_eq!(events[5].payload["model_id"], "res-b");
    assert_eq!(events[5].payload["pid"], pid_b);
    Ok(())
}

#[test]
fn an_eviction_passes_over_a_model_with_work_in_flight_and_a_full_queue_is_busy_at_once(
) -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| {
        o.max_loaded = 2;
        o.max_queued = 0;
        o.drain_timeout = Duration::from_secs(300);
    })?;
    let a = descriptor(&s.install, "busy-a", ResidencyMode::Persistent);
    let b = descriptor(&s.install, "busy-b", ResidencyMode::Persistent);
    let c = descriptor(&s.install, "busy-c", ResidencyMode::Persistent);
    let pa = s.manager.load(&a)?;
    let pb = s.manager.load(&b)?;
    let token = CancelToken::new();
    let running = start_streaming(pa, 4000, &token)?;
    // b is now the more recently used: the LRU model is a, but a is busy.
    assert!(pb.infer(&ask(2))?.usage.completion_tokens > 0);
    let pid_a = s.manager.server_pid_of("busy-a").ok_or("a not loaded")?;
    s.manager.load(&c)?;
    assert!(alive(pid_a), "the model with work in flight was evicted");
    assert_eq!(
        s.manager.server_pid_of("busy-b"),
        None,
        "b should make room"
    );
    // a is busy and c was just used: with no queue, a fourth model is Busy at once.
    let d = descriptor(&s.install, "busy-d", ResidencyMode::Persistent);
    let pc = s.manager.load(&c)?;
    let hold_token = CancelToken::new();
    let hold = start_streaming(pc, 400, &hold_token)?;
    let t = Instant::now();
    match s.manager.load(&d) {
        Err(ModelLoadError::Busy { model_id, .. }) => {
            assert!(model_id.contains("busy-a"), "{model_id}");
            assert!(t.elapsed() < Duration::from_secs(5), "it waited");
        }
        other => return Err(format!("expected Busy, got {:?}", other.map(|_| ())).into()),
    }
    // Both answers ran on through all of this: they end by their cancel, not by a kill.
    token.cancel();
    hold_token.cancel();
    for r in [running, hold] {
        match r.join().map_err(|_| "inference thread panicked")? {
            Ok(_) | Err(InferenceError::Cancelled) => {}
            other => return Err(format!("expected an answer or a cancel, got {other:?}").into()),
        }
    }
    let lifecycle: Vec<String> = kinds(&model_events(&s.store)?)
        .into_iter()
        .filter(|k| !k.starts_with("inference"))
        .collect();
    assert_eq!(
        lifecycle,
        [
            "loaded:busy-a",
            "loaded:busy-b",
            "unloaded:evicted",
            "loaded:busy-c"
        ]
    );
    Ok(())
}

#[test]
fn a_model_alone_over_the_memory_budget_is_refused_before_anything_runs() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.memory_budget = Some(64 << 20))?;
    let d = descriptor(&s.install, "big", ResidencyMode::Persistent);
    match s.manager.load(&d) {
        Err(e @ ModelLoadError::OverBudget { .. }) => {
            assert!(e.to_string().contains("budget"), "{e}");
        }
        other => return Err(format!("expected OverBudget, got {:?}", other.map(|_| ())).into()),
    }
    assert!(model_events(&s.store)?.is_empty());
    assert!(s.manager.status().is_empty());
    // A budget that fits one model but not two: the second evicts the first.
    let s = setup_with(s.install.clone(), |o| {
        o.max_loaded = 4;
        o.memory_budget = Some(650 << 20);
    })?;
    s.manager
        .load(&descriptor(&s.install, "fit-a", ResidencyMode::Persistent))?;
    let est = s.manager.status()[0].estimated_bytes.ok_or("no estimate")?;
    assert!(est > 100 << 20, "estimate {est} is below the GGUF size");
    let mut wide = descriptor(&s.install, "fit-b", ResidencyMode::Persistent);
    // A KV cache of about 300 MiB: alone it fits, with the first server it does not.
    wide.context_size = 16384;
    s.manager.load(&wide)?;
    let lifecycle: Vec<String> = kinds(&model_events(&s.store)?);
    assert_eq!(
        lifecycle,
        ["loaded:fit-a", "unloaded:evicted", "loaded:fit-b"],
        "estimate of fit-b: {:?}",
        s.manager.status()
    );
    Ok(())
}

#[test]
fn a_stopped_server_is_recorded_unresponsive_killed_and_loaded_again_on_next_use() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| {
        o.liveness_interval = Duration::from_millis(200);
        o.http.health_timeout = Duration::from_millis(300);
    })?;
    let d = descriptor(&s.install, "frozen", ResidencyMode::Persistent);
    let provider = s.manager.load(&d)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    // SAFETY: kill(2) on the manager's own server.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    wait_for(
        "the liveness check to unload it",
        Duration::from_secs(20),
        || s.manager.status().is_empty(),
    )?;
    wait_for("the stopped server to die", Duration::from_secs(5), || {
        !alive(pid)
    })?;
    assert_eq!(
        kinds(&model_events(&s.store)?),
        ["loaded:frozen", "unloaded:unresponsive"]
    );
    // The next use loads it again.
    assert!(provider.infer(&ask(2))?.usage.completion_tokens > 0);
    let again = s.manager.server_pid().ok_or("not reloaded")?;
    assert_ne!(again, pid);
    Ok(())
}

#[test]
fn remote_endpoints_answer_every_request_when_one_is_killed_mid_run() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let one = TestServer::start(&s.install);
    let mut two = TestServer::start(&s.install);
    let d = ModelDescriptor::remote("far", vec![one.base_url(), two.base_url() + "/"]);
    let provider = s.manager.load(&d)?;
    let status = s.manager.status();
    assert_eq!(status.len(), 1);
    assert_eq!((status[0].pid, status[0].port), (None, None));
    assert_eq!(status[0].endpoints.len(), 2);
    let answered = AtomicUsize::new(0);
    let killed = AtomicBool::new(false);
    std::thread::scope(|scope| -> TestResult {
        let workers: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| -> Result<(), String> {
                    for _ in 0..6 {
                        provider.infer(&ask(3)).map_err(|e| e.to_string())?;
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        wait_for("a few answers", Duration::from_secs(120), || {
            answered.load(Ordering::Relaxed) >= 3
        })?;
        two.stop();
        killed.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().map_err(|_| "worker panicked")??;
        }
        Ok(())
    })?;
    assert!(killed.load(Ordering::Relaxed));
    assert_eq!(answered.load(Ordering::Relaxed), 18);
    let events = model_events(&s.store)?;
    let failovers: Vec<_> = events
        .iter()
        .filter(|e| e.type_id == "model.endpoint_failover")
        .collect();
    assert!(
        !failovers.is_empty(),
        "no failover recorded: {:?}",
        kinds(&events)
    );
    assert_eq!(failovers[0].payload["from"], two.base_url());
    assert_eq!(failovers[0].payload["to"], one.base_url());
    let status = s.manager.status();
    let far = status.first().ok_or("far is gone")?;
    assert!(far.endpoints.iter().any(|e| !e.healthy), "{far:?}");
    // Unloading a remote model stops nothing.
    s.manager.unload("far")?;
    assert!(alive(one.pid()));
    assert_eq!(events[0].payload["endpoints"][0], one.base_url());
    Ok(())
}

#[test]
fn status_of_a_loaded_model_answers_while_another_loads() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.max_loaded = 2)?;
    let a = descriptor(&s.install, "st-a", ResidencyMode::Persistent);
    let b = descriptor(&s.install, "st-b", ResidencyMode::Persistent);
    let pa = s.manager.load(&a)?;
    std::thread::scope(|scope| -> TestResult {
        let loading = scope.spawn(|| s.manager.load(&b).map(|_| ()));
        wait_for("b to start loading", Duration::from_secs(30), || {
            s.manager
                .status()
                .iter()
                .any(|m| m.model_id == "st-b" && m.state == ModelState::Loading)
        })?;
        let status = s.manager.status();
        let health = pa.health_check();
        let still_loading = s
            .manager
            .status()
            .iter()
            .any(|m| m.model_id == "st-b" && m.state == ModelState::Loading);
        assert!(
            still_loading,
            "the load ended before status and health answered"
        );
        assert_eq!(health, correx::ProviderHealth::Healthy);
        assert!(status
            .iter()
            .any(|m| m.model_id == "st-a" && m.state == ModelState::Loaded));
        loading.join().map_err(|_| "the load panicked")??;
        Ok(())
    })
}

/// Eight threads load, infer, cancel and unload three models with room for two, for
/// `CORREX_SOAK_SECS` (default 60) seconds, while /proc is sampled every 50 ms: no inference
/// that was not cancelled fails, never more than two servers exist, and the log replays to
/// the true state at the end.
#[test]
fn soak_three_models_two_slots_eight_threads() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let secs: u64 = std::env::var("CORREX_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let s = setup_with(install, |o| {
        o.max_loaded = 2;
        o.drain_timeout = Duration::from_secs(600);
    })?;
    let ids = ["soak-a", "soak-b", "soak-c"];
    let stop = AtomicBool::new(false);
    let (most, ops, cancels) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    std::thread::scope(|scope| -> TestResult {
        // Reality against the log every 50 ms. A server the log calls loaded may be gone
        // only for the moment between its end and the append of its unload (event after
        // state: one append, which a loaded 2-core machine can stretch); gone for longer than
        // LIE_AFTER, the log lies. The longest such window is printed.
        const LIE_AFTER: Duration = Duration::from_secs(2);
        let sampler = scope.spawn(|| -> Result<Duration, String> {
            let mut missing_since: HashMap<u64, Instant> = HashMap::new();
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let live = server_pids("soak-");
                most.fetch_max(live.len(), Ordering::Relaxed);
                let events = model_events(&s.store).map_err(|e| e.to_string())?;
                let logged = replay(&events)?;
                let now = Instant::now();
                missing_since
                    .retain(|pid, _| logged.values().any(|p| p == pid) && !live.contains(pid));
                for pid in logged.values().filter(|pid| !live.contains(pid)) {
                    let since = *missing_since.entry(*pid).or_insert(now);
                    longest = longest.max(now - since);
                    if now - since > LIE_AFTER {
                        return Err(format!(
                            "the log says pid {pid} serves, but it has been gone for {:?}",
                            now - since
                        ));
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(longest)
        });
        let deadline = Instant::now() + Duration::from_secs(secs);
        let workers: Vec<_> = (0..8usize)
            .map(|t| {
                let (s, ops, cancels, ids) = (&s, &ops, &cancels, &ids);
                scope.spawn(move || -> Result<(), String> {
                    let mut i = t * 7;
                    while Instant::now() < deadline {
                        let residency = if i % 5 == 0 {
                            ResidencyMode::Ephemeral
                        } else {
                            ResidencyMode::Persistent
                        };
                        let d = descriptor(&s.install, ids[i % 3], residency);
                        match i % 6 {
                            0..=2 => {
                                s.manager
                                    .provider(&d)
                                    .infer(&ask(2))
                                    .map_err(|e| format!("{}: {e}", d.model_id))?;
                            }
                            3 => {
                                let token = CancelToken::new();
                                let canceller = {
                                    let token = token.clone();
                                    std::thread::spawn(move || {
                                        std::thread::sleep(Duration::from_millis(150));
                                        token.cancel();
                                    })
                                };
                                match s.manager.managed(&d).infer_with_cancel(&ask(64), &token) {
                                    Ok(_) | Err(InferenceError::Cancelled) => {}
                                    Err(e) => return Err(format!("{}: {e}", d.model_id)),
                                }
                                let _ = canceller.join();
                                cancels.fetch_add(1, Ordering::Relaxed);
                            }
                            4 => {
                                s.manager
                                    .load(&d)
                                    .map_err(|e| format!("load {}: {e}", d.model_id))?;
                            }
                            _ => s
                                .manager
                                .unload(&d.model_id)
                                .map_err(|e| format!("unload {}: {e}", d.model_id))?,
                        }
                        ops.fetch_add(1, Ordering::Relaxed);
                        i += 5;
                    }
                    Ok(())
                })
            })
            .collect();
        let mut failures = Vec::new();
        for w in workers {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(e),
                Err(_) => failures.push("a worker panicked".into()),
            }
        }
        stop.store(true, Ordering::Relaxed);
        match sampler.join() {
            Ok(Ok(longest)) => println!("soak: longest gap between a server's end and its unload event: {longest:?} (sampled every 50 ms)"),
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("the sampler panicked".into()),
        }
        assert!(failures.is_empty(), "failures: {failures:?}");
        Ok(())
    })?;
    let ops = ops.load(Ordering::Relaxed);
    println!(
        "soak: {ops} operations ({} cancels) in {secs} s, at most {} servers",
        cancels.load(Ordering::Relaxed),
        most.load(Ordering::Relaxed)
    );
    assert!(ops > 24, "only {ops} operations");
    assert!(
        most.load(Ordering::Relaxed) <= 2,
        "more than two servers were alive"
    );
    // Replaying the log gives the true state: which models are loaded, with which pids.
    let replayed = replay(&model_events(&s.store)?)?;
    let truth: HashMap<String, u64> = s
        .manager
        .status()
        .into_iter()
        .map(|m| (m.model_id, u64::from(m.pid.unwrap_or(0))))
        .collect();
    assert_eq!(replayed, truth);
    for pid in truth.values() {
        assert!(alive(*pid as u32), "pid {pid} from the log is not running");
    }
    assert_eq!(servers_of("soak-"), truth.len());
    Ok(())
}

/// What the chaos did to the servers.
#[derive(Default)]
struct Chaos {
    killed: Vec<u32>,
    stopped_and_resumed: Vec<u32>,
    left_stopped: Vec<u32>,
}

/// Six threads infer, load and unload three models with room for two while a chaos thread
/// SIGKILLs loaded servers, SIGSTOPs and resumes others, and leaves some stopped, for
/// `CORREX_CHAOS_SECS` (default 40) seconds. Calls may fail (their server died); the record
/// may not lie: a server is recorded `crashed` exactly when the chaos killed it, never more
/// than two servers exist, and the log replays to the true state at the end.
#[test]
fn chaos_every_crash_recorded_as_one_and_no_other() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let secs: u64 = std::env::var("CORREX_CHAOS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let s = setup_with(install, |o| {
        o.max_loaded = 2;
        o.drain_timeout = Duration::from_secs(20);
        o.liveness_interval = Duration::from_millis(500);
        o.http.read_timeout = Duration::from_secs(10);
    })?;
    let ids = ["chaos-a", "chaos-b", "chaos-c"];
    let stop = AtomicBool::new(false);
    let (ops, failed, most) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let chaos = std::thread::scope(|scope| -> Result<Chaos, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let workers: Vec<_> = (0..6usize)
            .map(|t| {
                let (s, ids, ops, failed) = (&s, &ids, &ops, &failed);
                scope.spawn(move || {
                    let mut i = t * 7;
                    while Instant::now() < deadline {
                        let d = descriptor(&s.install, ids[i % 3], ResidencyMode::Persistent);
                        let ok = match i % 5 {
                            0..=2 => s.manager.provider(&d).infer(&ask(2)).is_ok(),
                            3 => s.manager.load(&d).is_ok(),
                            _ => s.manager.unload(&d.model_id).is_ok(),
                        };
                        if !ok {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        ops.fetch_add(1, Ordering::Relaxed);
                        i += 3;
                    }
                })
            })
            .collect();
        let (s, most) = (&s, &most);
        let chaos = scope.spawn(move || {
            let mut done = Chaos::default();
            let mut n = 0usize;
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(700));
                most.fetch_max(servers_of("chaos-"), Ordering::Relaxed);
                let loaded: Vec<u32> = s
                    .manager
                    .status()
                    .into_iter()
                    .filter(|r| r.state == ModelState::Loaded)
                    .filter_map(|r| r.pid)
                    .collect();
                let Some(&pid) = loaded.get(n % loaded.len().max(1)) else {
                    continue;
                };
                // Not a server correx is already stopping (its SIGTERM pending), nor one gone,
                // nor one left stopped (correx kills it at once with SIGKILL when its liveness
                // checks fail: a second SIGKILL of ours would be indistinguishable).
                if !alive(pid)
                    || pending_signals(pid) & (1 << (libc::SIGTERM - 1)) != 0
                    || done.left_stopped.contains(&pid)
                {
                    continue;
                }
                let signal = |sig| {
                    // SAFETY: kill(2) on a server this test's manager started.
                    unsafe { libc::kill(pid as i32, sig) }
                };
                match n % 3 {
                    0 => {
                        signal(libc::SIGKILL);
                        done.killed.push(pid);
                    }
                    1 => {
                        signal(libc::SIGSTOP);
                        std::thread::sleep(Duration::from_millis(300));
                        signal(libc::SIGCONT);
                        done.stopped_and_resumed.push(pid);
                    }
                    _ => {
                        signal(libc::SIGSTOP);
                        done.left_stopped.push(pid);
                    }
                }
                n += 1;
            }
            done
        });
        for w in workers {
            w.join().map_err(|_| "a worker panicked")?;
        }
        let chaos = chaos.join().map_err(|_| "the chaos thread panicked")?;
        stop.store(true, Ordering::Relaxed);
        Ok(chaos)
    })?;
    // Every server the chaos killed is recorded, in time, as crashed.
    wait_for("every kill to be recorded", Duration::from_secs(30), || {
        model_events(&s.store).is_ok_and(|events| {
            chaos.killed.iter().all(|pid| {
                events.iter().any(|e| {
                    e.type_id == "model.unloaded"
                        && e.payload["pid"].as_u64() == Some(u64::from(*pid))
                })
            })
        })
    })?;
    let events = model_events(&s.store)?;
    let mut wrong = Vec::new();
    for e in events.iter().filter(|e| e.type_id == "model.unloaded") {
        let Some(pid) = e.payload["pid"].as_u64().map(|p| p as u32) else {
            continue;
        };
        let reason = e.payload["reason"].as_str().unwrap_or("?");
        let killed = chaos.killed.contains(&pid);
        if (reason == "crashed") != killed {
            let done = if killed {
                "SIGKILL"
            } else if chaos.left_stopped.contains(&pid) {
                "SIGSTOP, left stopped"
            } else if chaos.stopped_and_resumed.contains(&pid) {
                "SIGSTOP then SIGCONT"
            } else {
                "nothing"
            };
            wrong.push(format!(
                "pid {pid}: recorded {reason}, the chaos did {done}"
            ));
        }
    }
    println!(
        "chaos: {} operations ({} failed) in {secs} s; {} killed, {} stopped and resumed, {} left stopped; at most {} servers",
        ops.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        chaos.killed.len(),
        chaos.stopped_and_resumed.len(),
        chaos.left_stopped.len(),
        most.load(Ordering::Relaxed)
    );
    assert!(
        wrong.is_empty(),
        "unload reasons that disagree with what was done: {wrong:?}"
    );
    assert!(!chaos.killed.is_empty(), "the chaos killed nothing");
    assert!(
        most.load(Ordering::Relaxed) <= 2,
        "more than two servers were alive"
    );
    // Resume any server still stopped, so the end state is not waiting on a liveness check.
    for pid in &chaos.left_stopped {
        // SAFETY: kill(2) on a server this test's manager started (or a pid already gone).
        unsafe { libc::kill(*pid as i32, libc::SIGCONT) };
    }
    let replayed = replay(&model_events(&s.store)?)?;
    let truth: HashMap<String, u64> = s
        .manager
        .status()
        .into_iter()
        .filter(|m| m.state == ModelState::Loaded)
        .map(|m| (m.model_id, u64::from(m.pid.unwrap_or(0))))
        .collect();
    assert_eq!(replayed, truth);
    Ok(())
}

/// Two real llama-servers as one remote model: each session's turns all go to one endpoint
/// (recorded in `inference.completed`), sessions are placed evenly over both, a session whose endpoint is
/// at the spill bound goes to the other, and requests without a session go to the least loaded.
#[test]
fn a_session_stays_on_its_endpoint_and_sessions_spread() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.session_spill_in_flight = 1)?;
    let one = TestServer::start(&s.install);
    let two = TestServer::start(&s.install);
    let d = ModelDescriptor::remote("pair", vec![one.base_url(), two.base_url()]);
    let provider = s.manager.load(&d)?;
    let completed_endpoints = || -> Result<Vec<String>, Box<dyn std::error::Error>> {
        Ok(model_events(&s.store)?
            .iter()
            .filter(|e| e.type_id == "inference.completed")
            .map(|e| e.payload["endpoint"].as_str().unwrap_or("?").to_owned())
            .collect())
    };
    // Four sessions of six turns each, turn by turn across the sessions.
    let sessions = ["alpha", "bravo", "charlie", "delta"];
    for _turn in 0..6 {
        for session in sessions {
            let mut r = ask(2);
            r.session = Some(session.to_owned());
            provider.infer(&r)?;
        }
    }
    let endpoints = completed_endpoints()?;
    assert_eq!(endpoints.len(), 24);
    let mut held = HashMap::<&String, usize>::new();
    for (i, session) in sessions.iter().enumerate() {
        let own: Vec<&String> = endpoints.iter().skip(i).step_by(4).collect();
        assert!(
            own.iter().all(|e| *e == own[0]),
            "{session} moved between endpoints: {own:?}"
        );
        *held.entry(own[0]).or_default() += 1;
    }
    // Placed with bounded loads: two each, whatever the hashes of these names and ports
    // (plain hashing puts three or four on one endpoint half the time).
    assert_eq!(
        held.values().copied().collect::<Vec<_>>(),
        [2, 2],
        "{held:?}"
    );
    // Sixteen more sessions, one turn each: eight on each endpoint.
    for n in 0..16 {
        let mut r = ask(2);
        r.session = Some(format!("spread-{n}"));
        provider.infer(&r)?;
    }
    let endpoints = completed_endpoints()?;
    let mut spread = HashMap::<&String, usize>::new();
    for e in &endpoints[24..] {
        *spread.entry(e).or_default() += 1;
    }
    assert_eq!(
        spread.values().copied().collect::<Vec<_>>(),
        [8, 8],
        "{spread:?}"
    );

    // A session whose endpoint has a request running (the bound is 1) goes to the other.
    let session = "held";
    let mut long = ask(4000);
    long.session = Some(session.to_owned());
    let token = CancelToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let running = std::thread::scope(|scope| -> TestResult {
        let stream = scope.spawn(|| {
            let mut first = Some(tx);
            provider.infer_stream(&long, &token, &mut |_| {
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
                StreamControl::Continue
            })
        });
        rx.recv_timeout(Duration::from_secs(120))?;
        let before = completed_endpoints()?.len();
        let mut short = ask(2);
        short.session = Some(session.to_owned());
        provider.infer(&short)?;
        token.cancel();
        let _ = stream.join();
        let after = completed_endpoints()?;
        assert_eq!(after.len(), before + 1);
        let spilled = after[before].clone();
        // The held session's own endpoint is the one the long answer streams from: once it is
        // cancelled, the session goes back there.
        let mut again = ask(2);
        again.session = Some(session.to_owned());
        provider.infer(&again)?;
        let own = completed_endpoints()?.last().cloned().unwrap_or_default();
        assert_ne!(
            spilled, own,
            "the spilled request went to the session's busy endpoint"
        );
        Ok(())
    });
    running?;
    Ok(())
}
