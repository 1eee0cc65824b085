//! `cargo bench --bench inference`: correx's `infer()` and `infer_stream()` against a bare
//! keep-alive HTTP client posting the identical body to the same real llama-server,
//! alternating the two; and how fast a cancel frees the server's slot.

use correx::{
    chat_body, stream_body, CancelToken, ContextPack, GenerationConfig, HttpOptions,
    InferenceProvider, InferenceRequest, LlamaCppInferenceProvider, LlamaInstall, StreamControl,
};
use std::process::{Child, Command, Stdio};

#[path = "common/bare_client.rs"]
mod bare_client;
use bare_client::BareClient;
use std::time::{Duration, Instant};

const PAIRS: usize = 25;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether any slot of the server is decoding, over a kept-alive connection.
fn busy(client: &mut BareClient) -> std::io::Result<bool> {
    let (_, slots) = client.request("GET", "/slots", "")?;
    Ok(slots.contains("\"is_processing\":true"))
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(install) = LlamaInstall::locate() else {
        return Err("llama-server/model not installed: run scripts/install-llama.sh".into());
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let _server = Server(
        Command::new(&install.server)
            .arg("--model")
            .arg(&install.model)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--ctx-size",
                "2048",
            ])
            .args(["--threads", "2", "--no-jinja", "--chat-template", "gemma"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let base = format!("http://127.0.0.1:{port}");
    let provider = LlamaCppInferenceProvider::new("gemma", &base, &HttpOptions::default());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !provider.health_check().is_healthy() {
        if Instant::now() > deadline {
            return Err("llama-server did not become healthy".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
        session: None,
    };
    let body = chat_body("gemma", &request).to_string();
    let mut bare = BareClient::connect(port)?;
    // Warm both paths (prompt cache, connections).
    provider.infer(&request)?;
    bare.post("/v1/chat/completions", &body)?;
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        let t = Instant::now();
        let r = provider.infer(&request)?;
        ours.push(t.elapsed());
        assert!(r.usage.completion_tokens <= 8);
        let t = Instant::now();
        let answer = bare.post("/v1/chat/completions", &body)?;
        raw.push(t.elapsed());
        assert!(answer.contains("choices"));
    }
    let (ours, raw) = (p50(ours), p50(raw));
    println!("infer_p50_ms: {:.2}", ours.as_secs_f64() * 1e3);
    println!("raw_post_p50_ms: {:.2}", raw.as_secs_f64() * 1e3);

    let text: String = "The agent reads the file, plans a change, and asks for approval. "
        .repeat(20)
        .chars()
        .take(1024)
        .collect();
    let tokenizer = provider.tokenizer();
    let counts: Vec<Duration> = (0..50)
        .map(|_| {
            let t = Instant::now();
            let n = tokenizer.count(&text);
            assert!(n > 100);
            t.elapsed()
        })
        .collect();
    println!("count_1kib_p50_ms: {:.3}", p50(counts).as_secs_f64() * 1e3);
    // Generation speed through infer(): the figure a portable build must not lose.
    let long = InferenceRequest {
        context: ContextPack {
            system: None,
            task: Some("Write a long story about a robot who learns to paint.".into()),
            entries: vec![],
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 128,
            seed: Some(1234),
            ..GenerationConfig::default()
        },
        session: None,
    };
    // The same answer not streamed, by the bare client: what infer() would do without
    // streaming internally (it streams so that a cancel stops the server: this llama-server
    // keeps generating a non-streamed answer after its client has gone). Paired rounds,
    // alternating which goes first.
    let long_plain = chat_body("gemma", &long).to_string();
    let plain_speed = || -> Result<f64, Box<dyn std::error::Error>> {
        let t = Instant::now();
        let answer = BareClient::connect(port)?.post("/v1/chat/completions", &long_plain)?;
        let v: serde_json::Value = serde_json::from_str(&answer)?;
        let n = v["usage"]["completion_tokens"].as_f64().unwrap_or(0.0);
        Ok(n / t.elapsed().as_secs_f64())
    };
    let ours_speed = || -> Result<f64, Box<dyn std::error::Error>> {
        let t = Instant::now();
        let r = provider.infer(&long)?;
        Ok(f64::from(r.usage.completion_tokens) / t.elapsed().as_secs_f64())
    };
    // The ratio is the median of each pair's: a pair runs back to back, so a slow spell of
    // the machine lands on both of its halves.
    let (mut speeds, mut plain, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..6 {
        let (ours, raw) = if round % 2 == 0 {
            let ours = ours_speed()?;
            (ours, plain_speed()?)
        } else {
            let raw = plain_speed()?;
            (ours_speed()?, raw)
        };
        speeds.push(ours);
        plain.push(raw);
        ratios.push(ours / raw);
    }
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (v[(n - 1) / 2] + v[n / 2]) / 2.0
    };
    println!("generation_tokens_per_s: {:.1}", mid(speeds));
    println!("raw_post_tokens_per_s: {:.1}", mid(plain));
    println!("generation_ratio_vs_raw_post: {:.3}", mid(ratios));
    println!(
        "infer_overhead_ratio: {:.4}",
        ours.as_secs_f64() / raw.as_secs_f64()
    );

    // Streaming: time to the first piece, and the whole answer, against a bare SSE client on a
    // kept-alive connection, alternating.
    let stream_req = InferenceRequest {
        config: GenerationConfig {
            max_tokens: 32,
            ..long.config.clone()
        },
        ..long.clone()
    };
    let sse_body = stream_body("gemma", &stream_req).to_string();
    let none = CancelToken::new();
    // llama-server closes the connection after a streamed answer, so the bare client connects
    // for each one, as curl does.
    provider.infer_stream(&stream_req, &none, &mut |_| StreamControl::Continue)?;
    BareClient::connect(port)?.post_sse("/v1/chat/completions", &sse_body, |_| {})?;
    let (mut ttft_ours, mut ttft_raw, mut whole_ours, mut whole_raw) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        let t = Instant::now();
        let mut first = None;
        provider.infer_stream(&stream_req, &none, &mut |_| {
            first.get_or_insert_with(|| t.elapsed());
            StreamControl::Continue
        })?;
        whole_ours.push(t.elapsed());
        ttft_ours.push(first.ok_or("no piece streamed")?);
        let t = Instant::now();
        let mut first = None;
        BareClient::connect(port)?.post_sse("/v1/chat/completions", &sse_body, |data| {
            if data.contains("\"content\":\"") {
                first.get_or_insert_with(|| t.elapsed());
            }
        })?;
        whole_raw.push(t.elapsed());
        ttft_raw.push(first.ok_or("no piece streamed (bare)")?);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (ttft_ours, ttft_raw) = (p50(ttft_ours), p50(ttft_raw));
    let (whole_ours, whole_raw) = (p50(whole_ours), p50(whole_raw));
    println!("ttft_p50_ms: {:.2}", ms(ttft_ours));
    println!("raw_sse_ttft_p50_ms: {:.2}", ms(ttft_raw));
    println!(
        "ttft_ratio_vs_raw_sse: {:.4}",
        ttft_ours.as_secs_f64() / ttft_raw.as_secs_f64()
    );
    println!(
        "stream_overhead_ratio: {:.4}",
        whole_ours.as_secs_f64() / whole_raw.as_secs_f64()
    );

    // A long answer's speed, streamed through correx and through the bare client.
    let long_stream = stream_body("gemma", &long).to_string();
    let (mut through_ours, mut through_raw) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        let r = provider.infer_stream(&long, &none, &mut |_| StreamControl::Continue)?;
        through_ours.push(f64::from(r.usage.completion_tokens) / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut tokens = 0.0;
        BareClient::connect(port)?.post_sse("/v1/chat/completions", &long_stream, |data| {
            if let Some(i) = data.find("\"completion_tokens\":") {
                let rest = &data[i + 20..];
                let end = rest
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                tokens = rest[..end].parse().unwrap_or(0.0);
            }
        })?;
        through_raw.push(tokens / t.elapsed().as_secs_f64());
    }
    through_ours.sort_by(f64::total_cmp);
    through_raw.sort_by(f64::total_cmp);
    println!("stream_tokens_per_s: {:.1}", through_ours[1]);
    println!("raw_sse_tokens_per_s: {:.1}", through_raw[1]);

    // From the cancel call to the server's slot idle, 20 cancels mid-answer.
    let story = InferenceRequest {
        config: GenerationConfig {
            max_tokens: 2000,
            ..long.config.clone()
        },
        ..long.clone()
    };
    let mut lags = Vec::new();
    for _ in 0..20 {
        let mut probe = BareClient::connect(port)?;
        let token = CancelToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn({
            let (p, token, story) = (provider.clone(), token.clone(), story.clone());
            move || {
                let mut n = 0;
                p.infer_stream(&story, &token, &mut |_| {
                    n += 1;
                    if n == 10 {
                        let _ = tx.send(());
                    }
                    StreamControl::Continue
                })
            }
        });
        rx.recv_timeout(Duration::from_secs(60))?;
        let t = Instant::now();
        token.cancel();
        while busy(&mut probe)? {
            if t.elapsed() > Duration::from_secs(10) {
                return Err("a cancelled slot kept decoding for 10 s".into());
            }
        }
        lags.push(t.elapsed());
        if !matches!(worker.join(), Ok(Err(correx::InferenceError::Cancelled))) {
            return Err("a cancelled stream did not end as cancelled".into());
        }
    }
    lags.sort();
    println!("cancel_to_idle_ms_p50: {:.1}", ms(lags[lags.len() / 2]));
    println!("cancel_to_idle_ms_max: {:.1}", ms(lags[lags.len() - 1]));
    Ok(())
}
