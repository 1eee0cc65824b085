//! `cargo bench --bench model_load`: how soon `load()` returns after llama-server is ready,
//! measured against an independent poller hitting `/health` every 2 ms; `load()` against the
//! same server spawned by hand and polled every millisecond (`load_ratio_vs_bare`); short
//! requests alternating between two resident models against the same requests to one
//! (`hot_switch_ratio`), beside the same switch by a bare client straight to the two servers
//! (`raw_hot_switch_ratio`: what alternating two llama-server processes costs the machine) and
//! their quotient (`hot_switch_vs_raw`: correx's part); a load that must evict (`evict_and_load_ms_p50`); and a confined load
//! against one with `isolation: none` (`confined_load_ratio`); embeddings through the manager
//! against the same body POSTed to the same server's `/v1/embeddings` by a bare client on a
//! kept-alive connection, both answers parsed into vectors (`embed_ratio_vs_raw`, of the
//! totals: raw time over ours); and a session's next turn after an eviction, its prompt cache
//! restored, against the same turn on a warm server, first token against first token
//! (`resume_ttft_ratio_vs_warm`; beside it the same turn computed from nothing,
//! `resume_cold_ttft_ratio_vs_warm`). Real Gemma.

use correx::{
    CancelToken, ContextEntry, ContextPack, DefaultModelManager, EventStore, GenerationConfig,
    InferenceProvider, InferenceRequest, LlamaInstall, ManagerOptions, ModelDescriptor,
    ModelManager, ModelRole, PromptCacheOptions, ResidencyMode, ServerIsolation, SourceType,
    SqliteEventStore, StreamControl, MODEL_STREAM,
};
#[allow(dead_code)]
#[path = "common/bare_client.rs"]
mod bare_client;
use bare_client::BareClient;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LOADS: usize = 10;
const SWAPS: usize = 6;
const BARE_PAIRS: usize = 12;
const CONFINED_PAIRS: usize = 10;
const EVICTIONS: usize = 6;
const SWITCH_REQUESTS: usize = 160;
const EMBED_PAIRS: usize = 20;
const RESUME_PAIRS: usize = 3;

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
    // The same switch by a bare client straight to the two servers: what alternating between
    // two llama-server processes costs on this machine without correx (their threads compete
    // for the same cores and caches).
    let ports: Vec<u16> = manager.status().iter().filter_map(|s| s.port).collect();
    let [port_a, port_b] = ports[..] else {
        return Err("two servers were not resident".into());
    };
    let body = correx::chat_body("gemma", &request).to_string();
    let (mut one, mut alternating, mut raw_one, mut raw_alternating) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..4 {
        let ours = |alternate: bool| -> Result<f64, Box<dyn std::error::Error>> {
            let t = Instant::now();
            for i in 0..SWITCH_REQUESTS / 4 {
                let p = if alternate && i % 2 == 1 { &pb } else { &pa };
                p.infer(&request)?;
            }
            Ok(t.elapsed().as_secs_f64())
        };
        let raw = |alternate: bool| -> Result<f64, Box<dyn std::error::Error>> {
            // Connected anew for each block: llama-server closes a connection idle for 5 s.
            let mut bare = [BareClient::connect(port_a)?, BareClient::connect(port_b)?];
            let t = Instant::now();
            for i in 0..SWITCH_REQUESTS / 4 {
                let c = usize::from(alternate && i % 2 == 1);
                bare[c].post("/v1/chat/completions", &body)?;
            }
            Ok(t.elapsed().as_secs_f64())
        };
        // Alternate which goes first, so drift favours neither.
        if round % 2 == 0 {
            one.push(ours(false)?);
            alternating.push(ours(true)?);
            raw_one.push(raw(false)?);
            raw_alternating.push(raw(true)?);
        } else {
            raw_alternating.push(raw(true)?);
            raw_one.push(raw(false)?);
            alternating.push(ours(true)?);
            one.push(ours(false)?);
        }
    }
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let hot_switch_ratio = sum(&alternating) / sum(&one);
    let raw_hot_switch_ratio = sum(&raw_alternating) / sum(&raw_one);

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
    let (embed_ratio, embed_ms) = embed_ratio(&install, &dir, &descriptor)?;
    let resume = resume_ratios(&install, &dir, &descriptor)?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("load_ms_p50: {:.1}", pct(loads, 0.5));
    println!("swap_ms_p50: {:.1}", pct(swaps, 0.5));
    println!("readiness_lag_ms_p50: {:.2}", pct(lags.clone(), 0.5));
    println!("readiness_lag_ms_max: {:.2}", pct(lags, 1.0));
    println!("load_ratio_vs_bare: {:.4}", pct(bare_ratios, 0.5));
    println!("hot_switch_ratio: {hot_switch_ratio:.4}");
    println!("raw_hot_switch_ratio: {raw_hot_switch_ratio:.4}");
    println!(
        "hot_switch_vs_raw: {:.4}",
        hot_switch_ratio / raw_hot_switch_ratio
    );
    println!("confined_load_ratio: {:.4}", pct(confined_ratios, 0.5));
    println!("evict_and_load_ms_p50: {:.1}", pct(evictions, 0.5));
    println!(
        "status_during_load_ms_p50: {:.3}",
        pct(status_ms.clone(), 0.5)
    );
    println!("status_during_load_ms_max: {:.3}", pct(status_ms, 1.0));
    println!("embed_ms_p50: {embed_ms:.2}");
    println!("embed_ratio_vs_raw: {embed_ratio:.4}");
    println!("resume_warm_ttft_ms_p50: {:.1}", resume.warm_ms);
    println!("resume_restored_ttft_ms_p50: {:.1}", resume.restored_ms);
    println!("resume_cold_ttft_ms: {:.1}", resume.cold_ms);
    println!("resume_ttft_ratio_vs_warm: {:.4}", resume.restored_ratio);
    println!("resume_cold_ttft_ratio_vs_warm: {:.4}", resume.cold_ratio);
    Ok(())
}

struct Resume {
    warm_ms: f64,
    restored_ms: f64,
    cold_ms: f64,
    restored_ratio: f64,
    cold_ratio: f64,
}

/// A conversation of about 1,900 tokens and its next turn.
fn resume_turns(session: &str) -> (InferenceRequest, InferenceRequest) {
    let mut system = String::from("You answer in a few words. ");
    for i in 0..110 {
        system += &format!("Fact {i}: the value of item {i} is {}. ", i * 7 % 13);
    }
    let first = InferenceRequest {
        context: ContextPack {
            system: Some(system),
            task: Some("What is item 3?".into()),
            entries: Vec::new(),
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 8,
            seed: Some(7),
            ..GenerationConfig::default()
        },
        session: Some(session.to_owned()),
    };
    let mut next = first.clone();
    next.context.entries = vec![
        ContextEntry::new(SourceType::Model, "Item 3 is 8."),
        ContextEntry::new(SourceType::User, "And item 5?"),
    ];
    (first, next)
}

/// Pairs of two sessions with the same conversation: one's next turn on the warm server, the
/// other's after an eviction and a reload (the load is not timed: `load_ms_p50` is), its
/// cache restored; each timed to its first streamed piece. Then a third session's next turn
/// with nothing saved: computed from nothing.
fn resume_ratios(
    install: &LlamaInstall,
    dir: &std::path::Path,
    descriptor: &dyn Fn(&str) -> ModelDescriptor,
) -> Result<Resume, Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteEventStore::open(dir.join("resume.db"))?);
    let manager = DefaultModelManager::new(
        store.clone(),
        ManagerOptions {
            server_bin: install.server.clone(),
            port: 0,
            max_loaded: 1,
            log_dir: Some(dir.join("logs")),
            prompt_cache: Some(PromptCacheOptions {
                dir: Some(dir.join("prompt-cache")),
                ..PromptCacheOptions::default()
            }),
            ..ManagerOptions::default()
        },
    )?;
    let mut chat = descriptor("gemma-resume");
    // Room for both sessions of a pair in the slots' shared cache (llama-server's unified KV).
    chat.context_size = 8192;
    let other = descriptor("gemma-other");
    let provider = manager.managed(&chat);
    let cancel = CancelToken::new();
    let ttft = |r: &InferenceRequest| -> Result<f64, Box<dyn std::error::Error>> {
        let start = Instant::now();
        let mut first = None;
        provider.infer_stream(r, &cancel, &mut |_| {
            first.get_or_insert(start.elapsed());
            StreamControl::Continue
        })?;
        Ok(first.ok_or("no piece streamed")?.as_secs_f64() * 1e3)
    };
    let saved = |session: &str| -> Result<bool, Box<dyn std::error::Error>> {
        Ok(store
            .read_stream(MODEL_STREAM, 1, 100_000)?
            .iter()
            .any(|e| e.type_id == "model.cache_saved" && e.payload["session_id"] == session))
    };
    let (mut warm, mut restored, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..RESUME_PAIRS {
        let (a1, a2) = resume_turns(&format!("warm-{i}"));
        let (b1, b2) = resume_turns(&format!("restored-{i}"));
        manager.load(&chat)?;
        provider.infer(&a1)?;
        provider.infer(&b1)?;
        let w = ttft(&a2)?;
        let give_up = Instant::now() + Duration::from_secs(60);
        while !saved(&format!("restored-{i}"))? {
            if Instant::now() > give_up {
                return Err("the first turn was never saved".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        manager.load(&other)?;
        manager.load(&chat)?;
        let r = ttft(&b2)?;
        warm.push(w);
        restored.push(r);
        ratios.push(r / w);
    }
    let restores = store
        .read_stream(MODEL_STREAM, 1, 100_000)?
        .iter()
        .filter(|e| e.type_id == "model.cache_restored")
        .count();
    if restores != RESUME_PAIRS {
        return Err(format!("{restores} restores recorded of {RESUME_PAIRS}").into());
    }
    manager.load(&other)?;
    manager.load(&chat)?;
    let (_, c2) = resume_turns("cold");
    let cold = ttft(&c2)?;
    let warm_ms = pct(warm, 0.5);
    Ok(Resume {
        warm_ms,
        restored_ms: pct(restored, 0.5),
        cold_ms: cold,
        restored_ratio: pct(ratios, 0.5),
        cold_ratio: cold / warm_ms,
    })
}

/// Embeddings of eight short texts through `DefaultModelManager::embed` against the same body
/// POSTed by a bare client to the server the manager started, in pairs, order alternating:
/// (raw total / ours total, our p50 in ms).
fn embed_ratio(
    install: &LlamaInstall,
    dir: &std::path::Path,
    descriptor: &dyn Fn(&str) -> ModelDescriptor,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteEventStore::open(dir.join("embed.db"))?);
    let manager = DefaultModelManager::new(
        store,
        ManagerOptions {
            server_bin: install.server.clone(),
            port: 0,
            log_dir: Some(dir.join("logs")),
            ..ManagerOptions::default()
        },
    )?;
    let mut d = descriptor("gemma-embed");
    d.serves = ModelRole::Embeddings;
    let inputs: Vec<String> = [
        "fn main() { println!(\"hello\"); }",
        "The event log is append-only and every fact in it is chained.",
        "llama-server keeps a model resident between requests.",
        "A confined tool sees only the paths it was granted.",
        "Saved prompt caches are restored only into the same model file and build.",
        "An approval held for a human survives a restart of the host.",
        "Every child process is started through one audited module.",
        "The bench prints each figure as a name and a value on its own line.",
    ]
    .map(String::from)
    .to_vec();
    let cancel = CancelToken::new();
    let first = manager.embed(&d, &inputs, &cancel)?;
    let port = manager
        .status()
        .into_iter()
        .find(|s| s.model_id == "gemma-embed")
        .and_then(|s| s.port)
        .ok_or("the embedding server has no port")?;
    let body =
        serde_json::json!({"model": "gemma-embed", "input": inputs, "encoding_format": "float"})
            .to_string();
    let mut client = BareClient::connect(port)?;
    let raw = |client: &mut BareClient| -> Result<f64, Box<dyn std::error::Error>> {
        let t = Instant::now();
        let answer: serde_json::Value =
            serde_json::from_str(&client.post("/v1/embeddings", &body)?)?;
        let vectors: Vec<Vec<f32>> = answer["data"]
            .as_array()
            .ok_or("no data in the raw answer")?
            .iter()
            .map(|e| serde_json::from_value(e["embedding"].clone()))
            .collect::<Result<_, _>>()?;
        let took = t.elapsed().as_secs_f64();
        if vectors.len() != inputs.len() || vectors[0].len() != first.vectors[0].len() {
            return Err("the raw answer has another shape".into());
        }
        Ok(took)
    };
    let ours = |_: &mut BareClient| -> Result<f64, Box<dyn std::error::Error>> {
        let t = Instant::now();
        manager.embed(&d, &inputs, &cancel)?;
        Ok(t.elapsed().as_secs_f64())
    };
    // Warm both paths.
    raw(&mut client)?;
    ours(&mut client)?;
    let (mut raws, mut oursv) = (Vec::new(), Vec::new());
    for i in 0..EMBED_PAIRS {
        if i % 2 == 0 {
            raws.push(raw(&mut client)?);
            oursv.push(ours(&mut client)?);
        } else {
            oursv.push(ours(&mut client)?);
            raws.push(raw(&mut client)?);
        }
    }
    let ratio = raws.iter().sum::<f64>() / oursv.iter().sum::<f64>();
    Ok((ratio, pct(oursv, 0.5) * 1e3))
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
