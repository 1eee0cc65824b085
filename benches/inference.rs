//! `cargo bench --bench inference`: correx's `infer()` against a bare keep-alive HTTP client
//! posting the identical body to the same real llama-server, alternating the two.

use correx::{
    chat_body, ContextPack, GenerationConfig, HttpOptions, InferenceProvider, InferenceRequest,
    LlamaCppInferenceProvider, LlamaInstall,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PAIRS: usize = 25;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A minimal HTTP/1.1 client on one kept-alive connection.
struct BareClient {
    reader: BufReader<TcpStream>,
}

impl BareClient {
    fn connect(port: u16) -> std::io::Result<Self> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        Ok(BareClient {
            reader: BufReader::new(s),
        })
    }

    fn post(&mut self, path: &str, body: &str) -> std::io::Result<String> {
        write!(
            self.reader.get_mut(),
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut len = 0;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut buf = vec![0; len];
        self.reader.read_exact(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
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
    };
    let mut speeds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let r = provider.infer(&long)?;
            Ok(f64::from(r.usage.completion_tokens) / t.elapsed().as_secs_f64())
        })
        .collect::<Result<_, correx::InferenceError>>()?;
    speeds.sort_by(f64::total_cmp);
    println!("generation_tokens_per_s: {:.1}", speeds[speeds.len() / 2]);
    println!(
        "infer_overhead_ratio: {:.4}",
        ours.as_secs_f64() / raw.as_secs_f64()
    );
    Ok(())
}
