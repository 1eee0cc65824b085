//! `cargo bench --bench model_load`: how soon `load()` returns after llama-server is ready,
//! measured against an independent poller hitting `/health` every 2 ms; `load()` against the
//! same server spawned by hand and polled every millisecond (`load_ratio_vs_bare`); short
//! requests alternating between two resident models against the same requests to one
//! (`hot_switch_ratio`); a load that must evict (`evict_and_load_ms_p50`); and a confined load
//! against one with `isolation: none` (`confined_load_ratio`). Real Gemma.

use correx::{
    ContextPack, DefaultModelManager, GenerationConfig, InferenceRequest, LlamaInstall,
    ManagerOptions, ModelDescriptor, ModelManager, ResidencyMode, ServerIsolation,
    SqliteEventStore,
};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LOADS: usize = 10;
const SWAPS: usize = 6;
const BARE_PAIRS: usize = 16;
const CONFINED_PAIRS: usize = 16;
const EVICTIONS: usize = 6;
const SWITCH_REQUESTS: usize = 160;

fn health_200(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && &head[9..12] == b"200"
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let install = LlamaInstall::locate()
        .ok_or("llama-server/model not installed: run scripts/install-llama.sh")?;
    let dir = std::env::temp_dir().join(format!("correx-bench-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let manager = DefaultModelManager::new(
        store,
        ManagerOptions {
            server_bin: install.server.clone(),
            port,
            log_dir: Some(dir.join("logs")),
            ..ManagerOptions::default()
        },
    )?;
    let descriptor = |id: &str| {
        let mut d = ModelDescriptor::new(id, &install.model, ResidencyMode::Persistent);
        d.context_size = 2048;
        d.extra_args = vec![
            "--no-jinja".into(),
            "--chat-template".into(),
            "gemma".into(),
        ];
        d
    };
    let a = descriptor("gemma-a");
    let b = descriptor("gemma-b");

    let (mut lags, mut loads) = (Vec::new(), Vec::new());
    for _ in 0..LOADS {
        let stop = Arc::new(AtomicBool::new(false));
        let first_ok: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let poller = {
            let (stop, first_ok) = (stop.clone(), first_ok.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if health_200(port) {
                        first_ok.lock().map(|mut f| *f = Some(t)).ok();
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2).saturating_sub(t.elapsed()));
                }
            })
        };
        let t = Instant::now();
        manager.load(&a)?;
        let returned = Instant::now();
        // Let the poller see its first 200 even when load() noticed readiness first (then the
        // lag is negative: correx was ahead of the 2 ms poller).
        let give_up = Instant::now() + Duration::from_secs(2);
        while first_ok.lock().map_err(|_| "poisoned")?.is_none() && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        poller.join().map_err(|_| "poller panicked")?;
        let seen = first_ok
            .lock()
            .map_err(|_| "poisoned")?
            .ok_or("the poller never saw a 200")?;
        let lag = if returned >= seen {
            (returned - seen).as_secs_f64()
        } else {
            -(seen - returned).as_secs_f64()
        };
        lags.push(lag * 1e3);
        loads.push((returned - t).as_secs_f64() * 1e3);
        manager.unload("gemma-a")?;
    }
    let mut swaps = Vec::new();
    manager.load(&a)?;
    for i in 0..SWAPS {
        let next = if i % 2 == 0 { &b } else { &a };
        let t = Instant::now();
        manager.load(next)?;
        swaps.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(manager);

    // load() against the same server by hand, polled every millisecond, in pairs, order
    // alternating.
    let mut bare_ratios = Vec::new();
    for i in 0..BARE_PAIRS {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let store = Arc::new(SqliteEventStore::open(dir.join(format!("bare-{i}.db")))?);
        let manager = DefaultModelManager::new(
            store,
            ManagerOptions {
                server_bin: install.server.clone(),
                port,
                log_dir: Some(dir.join("logs")),
                ..ManagerOptions::default()
            },
        )?;
        // Which goes first alternates, so drift (and whatever the first load of a pair pays
        // for the previous pair's teardown) favours neither.
        let bare_first = if i % 2 == 1 {
            Some(bare_load(&install, &a, port)?)
        } else {
            None
        };
        let t = Instant::now();
        manager.load(&a)?;
        let managed = t.elapsed().as_secs_f64();
        drop(manager);
        let bare = match bare_first {
            Some(b) => b,
            None => bare_load(&install, &a, port)?,
        };
        bare_ratios.push(managed / bare);
    }

    // A confined load (the default isolation) against the same load with `isolation: none`,
    // in pairs, order alternating.
    let mut confined_ratios = Vec::new();
    for i in 0..CONFINED_PAIRS {
        let time = |isolation: ServerIsolation| -> Result<f64, Box<dyn std::error::Error>> {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let store = Arc::new(SqliteEventStore::open(
                dir.join(format!("iso-{i}-{}.db", isolation.as_str())),
            )?);
            let manager = DefaultModelManager::new(
                store,
                ManagerOptions {
                    server_bin: install.server.clone(),
                    port,
                    log_dir: Some(dir.join("logs")),
                    isolation,
                    ..ManagerOptions::default()
                },
            )?;
            let t = Instant::now();
            manager.load(&a)?;
            Ok(t.elapsed().as_secs_f64())
        };
        let (confined, open) = if i % 2 == 0 {
            let c = time(ServerIsolation::Default)?;
            (c, time(ServerIsolation::None)?)
        } else {
            let o = time(ServerIsolation::None)?;
            (time(ServerIsolation::Default)?, o)
        };
        confined_ratios.push(confined / open);
    }

    // Two resident models: alternating costs no load.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let store = Arc::new(SqliteEventStore::open(dir.join("switch.db"))?);
    let manager = DefaultModelManager::new(
        store,
        ManagerOptions {
            server_bin: install.server.clone(),
            port,
            max_loaded: 2,
            log_dir: Some(dir.join("logs")),
            ..ManagerOptions::default()
        },
    )?;
    let (pa, pb) = (manager.load(&a)?, manager.load(&b)?);
    let request = InferenceRequest {
        context: ContextPack {
            task: Some("Say hi.".into()),
            ..ContextPack::default()
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 2,
            seed: Some(1),
            ..GenerationConfig::default()
        },
        session: None,
    };
    // Warm both prompt caches.
    pa.infer(&request)?;
    pb.infer(&request)?;
    let (mut one, mut alternating) = (Vec::new(), Vec::new());
    for round in 0..4 {
        let run = |alternate: bool| -> Result<f64, Box<dyn std::error::Error>> {
            let t = Instant::now();
            for i in 0..SWITCH_REQUESTS / 4 {
                let p = if alternate && i % 2 == 1 { &pb } else { &pa };
                p.infer(&request)?;
            }
            Ok(t.elapsed().as_secs_f64())
        };
        // Alternate which goes first, so drift favours neither.
        if round % 2 == 0 {
            one.push(run(false)?);
            alternating.push(run(true)?);
        } else {
            alternating.push(run(true)?);
            one.push(run(false)?);
        }
    }
    let hot_switch_ratio = alternating.iter().sum::<f64>() / one.iter().sum::<f64>();

    // Three models, two slots: every load of the absent one evicts the least recently used.
    let c = descriptor("gemma-c");
    let ids = [&a, &b, &c];
    let mut evictions = Vec::new();
    // Meanwhile another thread asks for the status every 10 ms: it must never wait for a load.
    let stop = AtomicBool::new(false);
    let status_ms = std::thread::scope(|scope| -> Result<Vec<f64>, Box<dyn std::error::Error>> {
        let asker = scope.spawn(|| {
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let _ = manager.status();
                took.push(t.elapsed().as_secs_f64() * 1e3);
                std::thread::sleep(Duration::from_millis(10));
            }
            took
        });
        for i in 0..EVICTIONS {
            let next = ids[(i + 2) % 3];
            let t = Instant::now();
            let loaded = manager.load(next);
            evictions.push(t.elapsed().as_secs_f64() * 1e3);
            if let Err(e) = loaded {
                stop.store(true, Ordering::Relaxed);
                return Err(e.into());
            }
        }
        stop.store(true, Ordering::Relaxed);
        asker
            .join()
            .map_err(|_| "the status thread panicked".into())
    })?;
    drop((pa, pb));
    drop(manager);
    let _ = std::fs::remove_dir_all(&dir);
    println!("load_ms_p50: {:.1}", pct(loads, 0.5));
    println!("swap_ms_p50: {:.1}", pct(swaps, 0.5));
    println!("readiness_lag_ms_p50: {:.2}", pct(lags.clone(), 0.5));
    println!("readiness_lag_ms_max: {:.2}", pct(lags, 1.0));
    println!("load_ratio_vs_bare: {:.4}", pct(bare_ratios, 0.5));
    println!("hot_switch_ratio: {hot_switch_ratio:.4}");
    println!("confined_load_ratio: {:.4}", pct(confined_ratios, 0.5));
    println!("evict_and_load_ms_p50: {:.1}", pct(evictions, 0.5));
    println!(
        "status_during_load_ms_p50: {:.3}",
        pct(status_ms.clone(), 0.5)
    );
    println!("status_during_load_ms_max: {:.3}", pct(status_ms, 1.0));
    Ok(())
}

/// Spawns the server `load()` would for `d` and polls `/health` every millisecond until its
/// first 200; seconds from spawn to that 200. The server is stopped afterwards.
fn bare_load(
    install: &LlamaInstall,
    d: &ModelDescriptor,
    port: u16,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut cmd = std::process::Command::new(&install.server);
    cmd.arg("--model")
        .arg(&d.model_path)
        .args(["--ctx-size", &d.context_size.to_string()])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--alias", "bare"])
        .args(&d.extra_args)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let t = Instant::now();
    let mut child = cmd.spawn()?;
    let give_up = t + Duration::from_secs(60);
    while !health_200(port) {
        if Instant::now() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the bare server never became healthy".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = t.elapsed().as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    Ok(took)
}
