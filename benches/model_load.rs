//! `cargo bench --bench model_load`: how soon `load()` returns after llama-server is ready,
//! measured against an independent poller hitting `/health` every 2 ms, plus load and swap
//! times, with the real Gemma model.

use correx::{
    DefaultModelManager, LlamaInstall, ManagerOptions, ModelDescriptor, ModelManager,
    ResidencyMode, SqliteEventStore,
};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LOADS: usize = 10;
const SWAPS: usize = 6;

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
    );
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
    let _ = std::fs::remove_dir_all(&dir);
    println!("load_ms_p50: {:.1}", pct(loads, 0.5));
    println!("swap_ms_p50: {:.1}", pct(swaps, 0.5));
    println!("readiness_lag_ms_p50: {:.2}", pct(lags.clone(), 0.5));
    println!("readiness_lag_ms_max: {:.2}", pct(lags, 1.0));
    Ok(())
}
