//! `cargo bench --bench sessions`: what durable sessions cost.
//!
//! - `resume_ms_p50`: open a runtime and rebuild the transcript of a session of 1,000 events
//!   (inference and tool steps), as a restarted host does.
//! - `step_overhead_vs_floor`: `session.infer` on the real model against its floor, the same
//!   bare `infer()` plus one durable append, in paired rounds (alternating which goes first).
//! - `replayed_step_us_p50`: a step answered from the log.
//! - `pending_step_us_p50`: a tool step whose approver defers, from the call to its
//!   `Pending` (the claim, the request and the end of the try: three appends).
//! - `decision_to_start_ms_p50`: a decision appended by another process (this binary, run
//!   again as the decider) until the step waiting for it has run its tool (a `file_edit`
//!   append) and returned.
//!
//! `cargo bench --bench sessions -- approvals` runs the last two only.

use correx::{
    CancelToken, CapabilityScore, ContextEntry, ContextPack, EventStore, ExpectedVersion,
    FinishReason, GenerationConfig, HttpOptions, InferenceError, InferenceProvider,
    InferenceRequest, InferenceResponse, LlamaCppInferenceProvider, LlamaInstall, NewEvent,
    ProviderHealth, ProviderId, Runtime, RuntimeConfig, SourceType, TokenUsage, Tokenizer,
    ToolRequest,
};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAIRS: usize = 30;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A test double of a model for building a long session fast (named so: resuming reads the
/// log, and what answered does not matter to it).
struct Echo(ProviderId);

struct NoTokens;

impl Tokenizer for NoTokens {
    fn tokenize(&self, _: &str) -> Result<Vec<i64>, InferenceError> {
        Ok(Vec::new())
    }
    fn count(&self, _: &str) -> usize {
        0
    }
}

impl InferenceProvider for Echo {
    fn id(&self) -> &ProviderId {
        &self.0
    }
    fn infer(&self, request: &InferenceRequest) -> Result<InferenceResponse, InferenceError> {
        let last = request.context.entries.last().map(|e| e.content.clone());
        Ok(InferenceResponse {
            text: format!("I read: {}", last.unwrap_or_default()),
            usage: TokenUsage {
                prompt_tokens: 40,
                completion_tokens: 8,
                total_tokens: 48,
            },
            finish_reason: FinishReason::Stop,
            latency_ms: 90,
            model: "echo".into(),
            timings: None,
            tool_calls: Vec::new(),
            reasoning: None,
            endpoint: None,
        })
    }
    fn health_check(&self) -> ProviderHealth {
        ProviderHealth::Healthy
    }
    fn capabilities(&self) -> Vec<CapabilityScore> {
        Vec::new()
    }
    fn tokenizer(&self) -> &dyn Tokenizer {
        &NoTokens
    }
}

fn config(dir: &std::path::Path) -> Result<RuntimeConfig, Box<dyn std::error::Error>> {
    Ok(RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {"file_read": {"enabled": true, "allowed_paths": [dir.join("work")]}},
            "approvals": {"engine": "auto"}
        })
        .to_string(),
    )?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(db) = std::env::var("CORREX_BENCH_DECIDER") {
        return decider(&db);
    }
    let dir = std::env::temp_dir().join(format!("correx-bench-sessions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("work"))?;
    std::fs::write(dir.join("work/notes.txt"), "the plan: read, change, test\n")?;
    let only_approvals = std::env::args().any(|a| a == "approvals");
    let result = approvals(&dir).and_then(|()| if only_approvals { Ok(()) } else { run(&dir) });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The deciding process: for each `SESSION REQUEST` line on stdin, waits a few ms (the step
/// is waiting by then), notes the wall clock, approves, and prints the noted time in ns.
fn decider(db: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{BufRead, Write};
    let store: Arc<dyn EventStore> =
        Arc::new(correx::EventLog::open(db, correx::StoreOptions::default())?);
    let approvals = correx::Approvals::new(store);
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let Some((session, id)) = line.split_once(' ') else {
            continue;
        };
        std::thread::sleep(Duration::from_millis(5));
        let at = wall_ns();
        approvals.decide(session, id, &correx::ApprovalDecision::Approved, "bench")?;
        writeln!(out, "{at}")?;
        out.flush()?;
    }
    Ok(())
}

fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `pending_step_us_p50` and `decision_to_start_ms_p50`.
fn approvals(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{BufRead, BufReader, Write};
    let dir = dir.join("approvals");
    std::fs::create_dir_all(dir.join("work"))?;
    std::fs::write(dir.join("work/m.txt"), "")?;
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {"file_edit": {"enabled": true, "allowed_paths": [dir.join("work")]}},
            "approvals": {"engine": "durable"}
        })
        .to_string(),
    )?;
    let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let mut child = Command::new(std::env::current_exe()?)
        .env("CORREX_BENCH_DECIDER", dir.join("events.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to = child.stdin.take().ok_or("the decider's stdin")?;
    let mut from = BufReader::new(child.stdout.take().ok_or("the decider's stdout")?);
    let none = CancelToken::new();
    let (mut pending, mut latency) = (Vec::new(), Vec::new());
    let s = rt.session("bench-approvals")?;
    for i in 0..60 {
        let request = ToolRequest::json(
            "bench-approvals",
            "file_edit",
            json!({"operation": "append", "path": dir.join("work/m.txt"), "content": "x"}),
        )?;
        let step = format!("a{i}");
        let t = Instant::now();
        let id = match s.execute(&step, rt.executor(), &request, None, &none) {
            Err(correx::SessionError::Pending { request_id, .. }) => request_id,
            other => return Err(format!("a deferred step is pending, not {other:?}").into()),
        };
        pending.push(t.elapsed());
        writeln!(to, "bench-approvals {id}")?;
        to.flush()?;
        let done = s.execute_waiting(
            &step,
            rt.executor(),
            &request,
            None,
            Duration::from_secs(30),
            &none,
        )?;
        let end = wall_ns();
        assert!(done.value.is_success(), "{:?}", done.value);
        let mut line = String::new();
        from.read_line(&mut line)?;
        let decided: u128 = line.trim().parse()?;
        latency.push(Duration::from_nanos(u64::try_from(
            end.saturating_sub(decided),
        )?));
    }
    drop(to);
    let _ = child.wait();
    println!(
        "pending_step_us_p50: {:.1}",
        p50(pending).as_secs_f64() * 1e6
    );
    println!(
        "decision_to_start_ms_p50: {:.3}",
        p50(latency).as_secs_f64() * 1e3
    );
    Ok(())
}

fn run(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let none = CancelToken::new();
    let config = config(dir)?;

    // A session of 1,000 events: turns of an inference and a file_read, each a step.
    {
        let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
        let s = rt.session("long")?;
        let echo = Echo(ProviderId::from_string("echo"));
        let mut entries = Vec::new();
        let mut n = 0;
        while rt.events().read_stream("session-long", 1000, 1)?.is_empty() {
            n += 1;
            entries.push(ContextEntry::new(
                SourceType::User,
                format!("turn {n}: go on"),
            ));
            let request = InferenceRequest {
                context: ContextPack {
                    system: Some("You are a careful agent.".into()),
                    task: Some("Tidy the notes.".into()),
                    entries: entries.clone(),
                },
                ..InferenceRequest::default()
            };
            let a = s.infer(&format!("t{n}.infer"), &echo, &request, &none)?;
            entries.push(ContextEntry::new(SourceType::Model, a.value.text));
            let read = ToolRequest::json(
                "long",
                "file_read",
                json!({"operation": "read", "path": "notes.txt"}),
            )?;
            let call = format!("call-{n}");
            let r = s.execute(
                &format!("t{n}.read"),
                rt.executor(),
                &read,
                Some(&call),
                &none,
            )?;
            let mut e = ContextEntry::new(
                SourceType::Tool,
                r.value.data().map(|d| d.to_string()).unwrap_or_default(),
            );
            e.tool_call_id = Some(call);
            entries.push(e);
        }
    }
    let (mut resume, mut opens) = (Vec::new(), Vec::new());
    let mut entries = 0;
    for _ in 0..21 {
        let t = Instant::now();
        let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
        opens.push(t.elapsed());
        let transcript = rt.session("long")?.transcript()?;
        resume.push(t.elapsed());
        entries = transcript.entries.len();
    }
    println!("runtime_open_ms_p50: {:.3}", p50(opens).as_secs_f64() * 1e3);
    println!("resume_session_events: 1000");
    println!("resume_transcript_entries: {entries}");
    println!("resume_ms_p50: {:.3}", p50(resume).as_secs_f64() * 1e3);

    // The real model: a step against a bare infer() plus one durable append.
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
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--ctx-size",
                "2048",
                "--threads",
                "2",
                "--no-jinja",
                "--chat-template",
                "gemma",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let provider = LlamaCppInferenceProvider::new(
        "gemma",
        &format!("http://127.0.0.1:{port}"),
        &HttpOptions::default(),
    );
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
    let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let s = rt.session("steps")?;
    let store = rt.events().clone();
    let floor_event = || NewEvent::new("bench.inference", 1, json!({"text": "hello", "n": 8}));
    // Warm both paths.
    provider.infer(&request)?;
    s.infer("warm", &provider, &request, &none)?;
    let (mut step, mut floor) = (Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let one_step = || -> Result<Duration, Box<dyn std::error::Error>> {
            let t = Instant::now();
            let a = s.infer(&format!("s{i}"), &provider, &request, &none)?;
            assert!(!a.replayed);
            Ok(t.elapsed())
        };
        let one_floor = || -> Result<Duration, Box<dyn std::error::Error>> {
            let t = Instant::now();
            provider.infer(&request)?;
            store.append("bench-floor", ExpectedVersion::Any, &[floor_event()])?;
            Ok(t.elapsed())
        };
        if i % 2 == 0 {
            step.push(one_step()?);
            floor.push(one_floor()?);
        } else {
            floor.push(one_floor()?);
            step.push(one_step()?);
        }
    }
    let (step, floor) = (p50(step), p50(floor));
    println!("step_ms_p50: {:.3}", step.as_secs_f64() * 1e3);
    println!("floor_ms_p50: {:.3}", floor.as_secs_f64() * 1e3);
    println!(
        "step_overhead_vs_floor: {:.4}",
        step.as_secs_f64() / floor.as_secs_f64()
    );

    let mut replay = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        let a = s.infer(&format!("s{}", i % PAIRS), &provider, &request, &none)?;
        replay.push(t.elapsed());
        assert!(a.replayed);
    }
    println!(
        "replayed_step_us_p50: {:.1}",
        p50(replay).as_secs_f64() * 1e6
    );
    Ok(())
}
