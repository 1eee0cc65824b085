//! `cargo bench --bench routing`: a remote model over two real llama-servers. Time to first
//! token of a conversation's later turns when its requests stay on one endpoint (sessions)
//! against the least-loaded endpoint, four agent conversations at once, each with a long
//! context of its own and a tool run between turns, on servers that each keep two
//! conversations (`affinity_ttft_ratio`, of the means; the medians' too), with the prompt
//! tokens each mode's turns computed (the servers' `timings.prompt_n`); and one endpoint
//! through the manager's router against the same requests posted by a bare client
//! (`routing_overhead_ratio`).

use correx::{
    chat_body, CancelToken, ContextEntry, ContextPack, DefaultModelManager, GenerationConfig,
    InferenceProvider, InferenceRequest, LlamaInstall, ManagerOptions, ModelDescriptor,
    ModelManager, SourceType, SqliteEventStore, StreamControl,
};
use std::process::{Child, Command, Stdio};

// The inference bench uses the rest of it (streaming posts).
#[allow(dead_code)]
#[path = "common/bare_client.rs"]
mod bare_client;
use bare_client::BareClient;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A llama-server on a free port, healthy; two slots sharing one KV cache and no host-memory
/// prompt cache: it keeps two conversations, half of those the bench runs, as a server with
/// more conversations than it can keep would (at a scale this machine runs).
fn server(install: &LlamaInstall) -> Result<(Server, u16), Box<dyn std::error::Error>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new(&install.server)
        .arg("--model")
        .arg(&install.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--ctx-size", "16384", "--parallel", "2", "--kv-unified"])
        .args(["--cache-ram", "0"])
        .args(["--threads", "1", "--no-jinja", "--chat-template", "gemma"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let healthy = BareClient::connect(port)
            .and_then(|mut c| c.request("GET", "/health", ""))
            .is_ok_and(|(status, _)| status == 200);
        if healthy {
            return Ok((server, port));
        }
        if Instant::now() > deadline {
            return Err("llama-server did not become healthy".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (v[(n - 1) / 2] + v[n / 2]) / 2.0
}

/// A turn of conversation `name`: a system prompt and a long task of its own (~900 tokens,
/// as an agent's instructions and project context), the earlier turns (each with a tool's
/// output), and the new question last, as an agent's transcript grows: each turn's prompt
/// extends the one before, so a server that kept it computes only the new part.
fn turn(
    name: &str,
    history: &[(String, String)],
    question: &str,
    session: bool,
) -> InferenceRequest {
    let log = "ship arrived at the harbour with cargo of grain and a crew of twelve; ";
    let mut entries = Vec::new();
    for (i, (q, a)) in history.iter().enumerate() {
        entries.push(ContextEntry::new(SourceType::User, q.clone()));
        entries.push(ContextEntry::new(SourceType::Model, a.clone()));
        entries.push(ContextEntry::new(
            SourceType::Tool,
            format!("{name} log page {i}: {}", log.repeat(2)),
        ));
    }
    entries.push(ContextEntry::new(SourceType::User, question.to_owned()));
    InferenceRequest {
        context: ContextPack {
            system: Some(format!("Conversation {name}. You keep the harbour log.")),
            task: Some(format!("The log so far: {}", log.repeat(56))),
            entries,
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 8,
            seed: Some(5),
            ..GenerationConfig::default()
        },
        session: session.then(|| name.to_owned()),
    }
}

/// How long conversation `c`'s tool runs after its turn `i`: 0 to 1.5 s, the same in both
/// modes. Agents think between turns; without it the conversations run in lockstep, and the
/// least loaded endpoint is the one a conversation just left, so it stays by accident.
fn tool_run(c: usize, i: usize) -> Duration {
    let h = ((c * 7919 + i * 104_729) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    Duration::from_millis(h % 1500)
}

/// What one later turn cost: its time to first token, and the prompt tokens the server
/// computed (the rest came from its cache), from the answer's `timings`.
type Turn = (f64, f64);

/// Four conversations of six turns at once on `manager`'s remote model; turns 2 to 6.
fn conversations(
    manager: &DefaultModelManager,
    model: &ModelDescriptor,
    tag: &str,
    session: bool,
) -> Result<Vec<Turn>, Box<dyn std::error::Error>> {
    let questions = [
        "Which ship came in first?",
        "What did it carry?",
        "Who was its captain?",
        "What was the weather?",
        "Which ship came in last?",
        "What should the keeper write down?",
    ];
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|c| {
                let provider = manager.managed(model);
                let name = format!("{tag}-{c}");
                scope.spawn(move || -> Result<Vec<Turn>, String> {
                    let mut history: Vec<(String, String)> = Vec::new();
                    let mut ttfts = Vec::new();
                    for (i, q) in questions.iter().enumerate() {
                        let request = turn(&name, &history, q, session);
                        let started = Instant::now();
                        let mut first = None;
                        let answer = provider
                            .infer_stream(&request, &CancelToken::new(), &mut |_| {
                                first.get_or_insert_with(|| started.elapsed());
                                StreamControl::Continue
                            })
                            .map_err(|e| e.to_string())?;
                        if i > 0 {
                            let ttft = first.unwrap_or_else(|| started.elapsed()).as_secs_f64();
                            let computed = answer
                                .timings
                                .as_ref()
                                .and_then(|t| t["prompt_n"].as_f64())
                                .unwrap_or(f64::NAN);
                            ttfts.push((ttft, computed));
                        }
                        history.push(((*q).to_owned(), answer.text));
                        std::thread::sleep(tool_run(c, i));
                    }
                    Ok(ttfts)
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in threads {
            all.extend(t.join().map_err(|_| "a conversation panicked")??);
        }
        Ok(all)
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(install) = LlamaInstall::locate() else {
        return Err("llama-server/model not installed: run scripts/install-llama.sh".into());
    };
    let dir = std::env::temp_dir().join(format!("correx-bench-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (_one, port_one) = server(&install)?;
    let (_two, port_two) = server(&install)?;
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    // The default spill bound (4 in flight): a session stays on its endpoint here.
    let manager = DefaultModelManager::new(store, ManagerOptions::default())?;
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let pair = ModelDescriptor::remote("pair", vec![url(port_one), url(port_two)]);
    manager.load(&pair)?;

    // Alternating which goes first, with conversations of their own each round (no cache
    // carried over from a round before).
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..2 {
        let affinity = |tag: &str| conversations(&manager, &pair, tag, true);
        let least = |tag: &str| conversations(&manager, &pair, tag, false);
        if round % 2 == 0 {
            with.extend(affinity(&format!("a{round}"))?);
            without.extend(least(&format!("l{round}"))?);
        } else {
            without.extend(least(&format!("l{round}"))?);
            with.extend(affinity(&format!("a{round}"))?);
        }
    }
    // How many prompt tokens each turn computed shows why: a turn whose endpoint kept its
    // conversation computes only what the turn added.
    let computed = |v: &[Turn]| v.iter().map(|t| t.1).sum::<f64>() / v.len() as f64;
    println!(
        "affinity_prompt_tokens_computed_mean: {:.0}",
        computed(&with)
    );
    println!(
        "least_loaded_prompt_tokens_computed_mean: {:.0}",
        computed(&without)
    );
    // The ratio is of the means, the time the turns waited in all: what affinity saves is the
    // turns that compute their whole conversation again, and a median does not see them while
    // fewer than half the turns are such. The medians are printed too.
    let p50 = |v: &[Turn]| median(v.iter().map(|t| t.0).collect());
    let mean = |v: &[Turn]| v.iter().map(|t| t.0).sum::<f64>() / v.len() as f64;
    println!("affinity_ttft_ms_p50: {:.1}", p50(&with) * 1e3);
    println!("least_loaded_ttft_ms_p50: {:.1}", p50(&without) * 1e3);
    println!("affinity_ttft_p50_ratio: {:.3}", p50(&with) / p50(&without));
    println!("affinity_ttft_ms_mean: {:.1}", mean(&with) * 1e3);
    println!("least_loaded_ttft_ms_mean: {:.1}", mean(&without) * 1e3);
    println!("affinity_ttft_ratio: {:.3}", mean(&with) / mean(&without));

    // One endpoint through the router against a bare client, alternating, the same body.
    let single = ModelDescriptor::remote("single", vec![url(port_one)]);
    manager.load(&single)?;
    let routed = manager.managed(&single);
    let request = InferenceRequest {
        context: ContextPack {
            system: Some("You answer briefly.".into()),
            task: Some("Say hello to the user.".into()),
            entries: vec![],
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 8,
            seed: Some(1234),
            ..GenerationConfig::default()
        },
        session: Some("bench".into()),
    };
    let body = chat_body("single", &request).to_string();
    let mut bare = BareClient::connect(port_one)?;
    routed.infer_with_cancel(&request, &CancelToken::new())?;
    bare.request("POST", "/v1/chat/completions", &body)?;
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        routed.infer_with_cancel(&request, &CancelToken::new())?;
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let (status, _) = bare.request("POST", "/v1/chat/completions", &body)?;
        raw.push(t.elapsed().as_secs_f64());
        assert_eq!(status, 200);
    }
    let (ours, raw) = (median(ours), median(raw));
    println!("routed_p50_ms: {:.2}", ours * 1e3);
    println!("bare_p50_ms: {:.2}", raw * 1e3);
    println!("routing_overhead_ratio: {:.4}", ours / raw);
    drop(manager);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
