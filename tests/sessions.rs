//! Durable sessions: a step (an inference or a tool run under the host's key) is performed
//! once and answered from the log after, also by another thread or a new process; the key of
//! one request is never answered with another's result; a failed inference is tried again;
//! and an agent loop over the real model, killed with SIGKILL at random points again and
//! again, completes every session with no model call repeated outside a cut-off try, no file
//! change applied twice, and the transcript of an uninterrupted run.

use crate::util::{child_test, is_child, llama_install, Rng, TempDir, TestServer};
use correx::{
    CancelToken, CapabilityScore, ContextEntry, ContextPack, EventStore, GenerationConfig,
    InferenceError, InferenceProvider, InferenceRequest, InferenceResponse, ModelDescriptor,
    ProviderHealth, ProviderId, Runtime, RuntimeConfig, SessionError, SourceType, TokenUsage,
    Tokenizer, ToolRequest, ToolResult,
};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn runtime(dir: &std::path::Path) -> Result<Runtime, Box<dyn std::error::Error>> {
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    // The markers the agents append to (file_edit appends to a file that exists).
    for name in ["marker.txt"] {
        if !work.join(name).exists() {
            std::fs::write(work.join(name), "")?;
        }
    }
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {
                "file_edit": {"enabled": true, "allowed_paths": [&work]},
                "shell": {"enabled": true, "allowed_executables": ["cat"],
                          "working_dirs": [&work]}
            },
            "approvals": {"engine": "auto", "max_tier": 3}
        })
        .to_string(),
    )?;
    Ok(Runtime::new(&config, Arc::new(correx::DenyAll))?)
}

/// A test double of a model (named so: it stands in for the model where a real one cannot
/// be made to block, fail on cue or count its calls exactly): answers `echo: <last entry>`.
#[derive(Default)]
struct DoubleModel {
    calls: AtomicUsize,
    /// While set, a call waits.
    hold: AtomicBool,
    /// The next call fails once.
    fail_next: AtomicBool,
    /// Where each call is noted (a line per call, from any process), and for how long it
    /// then takes: the two-process test counts calls there.
    notes: Option<(std::path::PathBuf, Duration)>,
    id: Option<ProviderId>,
}

struct NoTokens;

impl Tokenizer for NoTokens {
    fn tokenize(&self, _: &str) -> Result<Vec<i64>, InferenceError> {
        Ok(Vec::new())
    }
    fn count(&self, _: &str) -> usize {
        0
    }
}

impl InferenceProvider for DoubleModel {
    fn id(&self) -> &ProviderId {
        self.id.as_ref().expect("an id")
    }
    fn infer(&self, request: &InferenceRequest) -> Result<InferenceResponse, InferenceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some((path, takes)) = &self.notes {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(path)
                .map_err(|e| InferenceError::ModelUnavailable {
                    detail: e.to_string(),
                })?;
            let _ = writeln!(f, "call from {}", std::process::id());
            std::thread::sleep(*takes);
        }
        while self.hold.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(InferenceError::ModelUnavailable {
                detail: "the double failed on cue".into(),
            });
        }
        let last = request
            .context
            .entries
            .last()
            .map(|e| e.content.clone())
            .unwrap_or_default();
        Ok(InferenceResponse {
            text: format!("echo: {last}"),
            usage: TokenUsage {
                prompt_tokens: 3,
                completion_tokens: 2,
                total_tokens: 5,
            },
            finish_reason: correx::FinishReason::Stop,
            latency_ms: 1,
            model: "double".into(),
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

fn double() -> DoubleModel {
    DoubleModel {
        id: Some(ProviderId::from_string("double")),
        ..DoubleModel::default()
    }
}

fn ask(text: &str) -> InferenceRequest {
    InferenceRequest {
        context: ContextPack {
            system: Some("be terse".into()),
            task: None,
            entries: vec![ContextEntry::new(SourceType::User, text)],
        },
        ..InferenceRequest::default()
    }
}

fn append(session: &str, path: &std::path::Path, text: &str) -> ToolRequest {
    ToolRequest::json(
        session,
        "file_edit",
        json!({"operation": "append", "path": path, "content": text}),
    )
    .expect("an object")
}

#[test]
fn a_step_runs_once_and_later_calls_and_processes_get_its_recorded_result() -> TestResult {
    let dir = TempDir::new("session-once");
    let marker = dir.join("work/marker.txt");
    let model = double();
    let none = CancelToken::new();
    let first_answer;
    {
        let rt = runtime(dir.path())?;
        let s = rt.session("s1")?;
        let a = s.infer("t1.infer", &model, &ask("hello"), &none)?;
        assert!(!a.replayed && a.attempt == 1);
        let b = s.infer("t1.infer", &model, &ask("hello"), &none)?;
        assert!(b.replayed, "the second call is answered from the log");
        assert_eq!(a.value, b.value);
        assert_eq!(model.calls.load(Ordering::SeqCst), 1);
        first_answer = a.value;

        // The key of one request never answers another.
        match s.infer("t1.infer", &model, &ask("something else"), &none) {
            Err(SessionError::Conflict { step, .. }) => assert_eq!(step, "t1.infer"),
            other => panic!("a conflict, not {other:?}"),
        }
        assert_eq!(model.calls.load(Ordering::SeqCst), 1);

        let edit = s.execute(
            "t1.edit",
            rt.executor(),
            &append("s1", &marker, "one\n"),
            Some("call-1"),
            &none,
        )?;
        assert!(
            edit.value.is_success() && !edit.replayed,
            "{:?}",
            edit.value
        );
        // A fresh request (a new invocation id) under the same key: answered, not run.
        let again = s.execute(
            "t1.edit",
            rt.executor(),
            &append("s1", &marker, "one\n"),
            Some("call-1"),
            &none,
        )?;
        assert!(again.replayed);
        assert_eq!(again.value.invocation_id(), edit.value.invocation_id());
        assert_eq!(std::fs::read_to_string(&marker)?, "one\n");
        // Another argument under the key is a conflict, and nothing is written.
        let other = s.execute(
            "t1.edit",
            rt.executor(),
            &append("s1", &marker, "two\n"),
            Some("call-1"),
            &none,
        );
        assert!(
            matches!(other, Err(SessionError::Conflict { .. })),
            "{other:?}"
        );
        assert_eq!(std::fs::read_to_string(&marker)?, "one\n");
        // A request of another session is refused before anything runs.
        let wrong = s.execute(
            "t1.x",
            rt.executor(),
            &append("s2", &marker, "x\n"),
            None,
            &none,
        );
        assert!(
            matches!(wrong, Err(SessionError::InvalidRequest(_))),
            "{wrong:?}"
        );
        for bad in ["", "a\nb", &"k".repeat(257)] {
            let r = s.infer(bad, &model, &ask("hello"), &none);
            assert!(
                matches!(r, Err(SessionError::InvalidRequest(_))),
                "{bad:?}: {r:?}"
            );
        }
    }

    // A new runtime (a new process would do the same): the steps answer from the log, and
    // the transcript is the conversation so far.
    let rt = runtime(dir.path())?;
    let s = rt.session("s1")?;
    let a = s.infer("t1.infer", &model, &ask("hello"), &none)?;
    assert!(a.replayed);
    assert_eq!(a.value, first_answer);
    assert_eq!(model.calls.load(Ordering::SeqCst), 1);
    let t = s.transcript()?;
    assert_eq!(t.system.as_deref(), Some("be terse"));
    let shape: Vec<_> = t
        .entries
        .iter()
        .map(|e| (e.source, e.content.as_str(), e.tool_call_id.as_deref()))
        .collect();
    assert_eq!(
        shape,
        [
            (SourceType::User, "hello", None),
            (SourceType::Model, "echo: hello", None),
            (
                SourceType::Tool,
                edit_output(&edit_result(&rt, "s1")?),
                Some("call-1")
            ),
        ]
    );
    assert_eq!(std::fs::read_to_string(&marker)?, "one\n");

    // The command line: the conversation, and the steps in the audit.
    let db = dir.join("events.db");
    let cli = |args: &[&str]| -> Result<(bool, String), Box<dyn std::error::Error>> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_correx"))
            .args(args)
            .env("NO_COLOR", "1")
            .output()?;
        Ok((out.status.success(), crate::util::both_streams(&out)))
    };
    let db = db.to_string_lossy();
    let (ok, shown) = cli(&["session", "show", &db, "s1"])?;
    assert!(ok, "{shown}");
    assert!(
        shown.contains("system: be terse")
            && shown.contains("user: hello")
            && shown.contains("model: echo: hello")
            && shown.contains("tool (call-1): "),
        "{shown}"
    );
    let (ok, json_out) = cli(&["session", "show", &db, "s1", "--json"])?;
    let parsed: ContextPack = serde_json::from_str(&json_out)?;
    assert!(ok && parsed == t, "{json_out}");
    let (ok, audit) = cli(&["log", "audit", &db, "--session", "s1"])?;
    assert!(
        ok && audit.contains("session steps:")
            && audit.contains("step \"t1.infer\" (infer): recorded; 1 try")
            && audit.contains("step \"t1.edit\" (tool): recorded; 1 try, invocation"),
        "{audit}"
    );
    let (ok, none) = cli(&["session", "show", &db, "nobody"])?;
    assert!(ok && none.contains("no steps recorded"), "{none}");
    Ok(())
}

fn edit_result(rt: &Runtime, session: &str) -> Result<ToolResult, Box<dyn std::error::Error>> {
    let page = rt
        .events()
        .read_stream(&correx::session_stream(session), 1, 1000)?;
    let done = page
        .iter()
        .find(|e| e.type_id == "session.step_completed" && e.payload["step"] == "t1.edit")
        .ok_or("no record of t1.edit")?;
    Ok(serde_json::from_value(done.payload["result"].clone())?)
}

fn edit_output(r: &ToolResult) -> &'static str {
    match r {
        ToolResult::Success { output, .. } => Box::leak(output.clone().into_boxed_str()),
        ToolResult::Failure { reason, .. } => panic!("failed: {reason}"),
    }
}

#[test]
fn two_callers_of_one_step_share_one_model_call_and_a_failed_try_runs_again() -> TestResult {
    let dir = TempDir::new("session-race");
    let rt = runtime(dir.path())?;
    let model = Arc::new(double());
    let none = CancelToken::new();
    let s = rt.session("s1")?;

    model.hold.store(true, Ordering::SeqCst);
    let answers = std::thread::scope(|scope| {
        let first = scope.spawn(|| s.infer("t1", model.as_ref(), &ask("a"), &CancelToken::new()));
        // The second caller comes once the first has claimed the step and is in its call.
        while model.calls.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let second = scope.spawn(|| s.infer("t1", model.as_ref(), &ask("a"), &CancelToken::new()));
        // A third caller gives up waiting when its token is cancelled.
        let cancel = CancelToken::new();
        cancel.cancel();
        let third = s.infer("t1", model.as_ref(), &ask("a"), &cancel);
        assert!(matches!(third, Err(SessionError::Cancelled)), "{third:?}");
        std::thread::sleep(Duration::from_millis(50));
        model.hold.store(false, Ordering::SeqCst);
        (first.join(), second.join())
    });
    let (Ok(Ok(first)), Ok(Ok(second))) = answers else {
        panic!("a caller failed: {answers:?}");
    };
    assert_eq!(
        model.calls.load(Ordering::SeqCst),
        1,
        "one model call for two callers"
    );
    assert!(!first.replayed && second.replayed);
    assert_eq!(first.value, second.value);

    // A failed inference had no side effect: the next call with the key runs it again.
    model.fail_next.store(true, Ordering::SeqCst);
    let failed = s.infer("t2", model.as_ref(), &ask("b"), &none);
    assert!(
        matches!(failed, Err(SessionError::Inference(_))),
        "{failed:?}"
    );
    let retried = s.infer("t2", model.as_ref(), &ask("b"), &none)?;
    assert!(!retried.replayed && retried.attempt == 2, "{retried:?}");
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);

    // A try that panics (here, the stream callback) ends: the next caller does not wait on
    // it, and runs the step again.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.infer_stream("t3", model.as_ref(), &ask("c"), &none, &mut |_| {
            panic!("the host's callback panicked")
        })
    }));
    assert!(panicked.is_err());
    let after = s.infer("t3", model.as_ref(), &ask("c"), &none)?;
    assert!(!after.replayed && after.attempt == 2, "{after:?}");
    let failed_tries = rt
        .events()
        .read_stream(&correx::session_stream("s1"), 1, 1000)?
        .iter()
        .filter(|e| e.type_id == "session.step_failed")
        .count();
    assert_eq!(
        failed_tries, 2,
        "the error and the panic each ended a try on the record"
    );

    // An invocation id that already ran cannot be another step's run.
    let marker = dir.join("work/marker.txt");
    let first = append("s1", &marker, "x\n");
    s.execute("e1", rt.executor(), &first, None, &none)?;
    let mut reused = append("s1", &marker, "y\n");
    reused.invocation_id = first.invocation_id.clone();
    let r = s.execute("e2", rt.executor(), &reused, None, &none);
    assert!(matches!(r, Err(SessionError::InvalidRequest(_))), "{r:?}");
    assert_eq!(std::fs::read_to_string(&marker)?, "x\n");
    Ok(())
}

/// One of two processes calling the same step at once: its model (a test double that takes
/// 300 ms and notes each call in a shared file) answers at most once between them.
#[test]
#[ignore = "a child of the two-process test; run by it"]
fn session_race_child() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let rt = runtime(&dir)?;
    let s = rt.session("shared")?;
    let model = DoubleModel {
        notes: Some((dir.join("calls.txt"), Duration::from_millis(300))),
        ..double()
    };
    // Both processes start the step together.
    let go = dir.join("go");
    while !go.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let a = s.infer("t1", &model, &ask("race"), &CancelToken::new())?;
    println!("ANSWER {} replayed={}", a.value.text, a.replayed);
    Ok(())
}

#[test]
fn two_processes_calling_one_step_at_once_share_one_model_call() -> TestResult {
    let dir = TempDir::new("session-procs");
    drop(runtime(dir.path())?);
    let spawn = || {
        child_test("sessions::session_race_child")
            .env("CORREX_CHILD_DIR", dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
    };
    let (one, two) = (spawn()?, spawn()?);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(dir.join("go"), "")?;
    let outs = [one.wait_with_output()?, two.wait_with_output()?];
    let mut answers = Vec::new();
    for out in &outs {
        let text = crate::util::both_streams(out);
        assert!(out.status.success(), "{text}");
        let line = text
            .lines()
            .find_map(|l| l.split_once("ANSWER ").map(|(_, a)| a.to_owned()))
            .ok_or_else(|| format!("no answer:\n{text}"))?;
        answers.push(line);
    }
    answers.sort();
    assert_eq!(
        answers,
        ["echo: race replayed=false", "echo: race replayed=true"],
        "one process asked, the other was answered from the log"
    );
    let calls = std::fs::read_to_string(dir.join("calls.txt"))?;
    assert_eq!(
        calls.lines().count(),
        1,
        "one model call between them: {calls}"
    );
    Ok(())
}

// ---- The kill battery: an agent loop over the real model, killed at random points. ----

const TURNS: usize = 10;

/// Makes a tool step's request afresh (a new invocation id each try).
type MakeRequest<'a> = Box<dyn Fn() -> ToolRequest + 'a>;

/// The scripted agent: `TURNS` turns of an inference, a `file_edit` append of `turn N` to
/// the marker (call `call-N-edit`) and a `shell` `cat` of it (call `call-N-cat`), each a
/// session step, replayed from the log after a restart. A tool step a crash interrupted
/// (files restored) is tried again under a new key; one that completed before the crash is
/// not. Prints the transcript.
#[test]
#[ignore = "a child of the kill battery; run by it"]
fn session_agent_child() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let session = std::env::var("CORREX_CHILD_SESSION")?;
    let url = std::env::var("CORREX_CHILD_URL")?;
    let rt = runtime(&dir)?;
    let model = rt
        .models()
        .managed(&ModelDescriptor::remote("gemma", vec![url]));
    let s = rt.session(&session)?;
    let none = CancelToken::new();
    let marker = dir.join("work").join(format!("{session}.txt"));
    if !marker.exists() {
        std::fs::write(&marker, "")?;
    }
    let mut entries: Vec<ContextEntry> = Vec::new();
    let mut completed_before_crash = 0;
    for n in 1..=TURNS {
        entries.push(ContextEntry::new(
            SourceType::User,
            format!("Turn {n}: name one colour."),
        ));
        let request = InferenceRequest {
            context: ContextPack {
                system: Some("Answer in three words at most.".into()),
                task: None,
                entries: entries.clone(),
            },
            config: GenerationConfig {
                temperature: 0.0,
                seed: Some(42),
                max_tokens: 6,
                ..GenerationConfig::default()
            },
            session: Some(session.clone()),
        };
        let answer = s.infer(&format!("t{n}.infer"), &model, &request, &none)?;
        let mut said = ContextEntry::new(SourceType::Model, answer.value.text.clone());
        said.tool_calls = answer.value.tool_calls.clone();
        entries.push(said);
        let calls: [(&str, MakeRequest); 2] = [
            (
                "edit",
                Box::new(|| append(&session, &marker, &format!("turn {n}\n"))),
            ),
            (
                "cat",
                Box::new(|| {
                    ToolRequest::json(
                        session.as_str(),
                        "shell",
                        json!({"argv": ["cat", &marker], "cwd": marker.parent()}),
                    )
                    .expect("an object")
                }),
            ),
        ];
        for (what, request) in calls {
            let call_id = format!("call-{n}-{what}");
            let mut key = format!("t{n}.{what}");
            let result = loop {
                let r = s.execute(&key, rt.executor(), &request(), Some(&call_id), &none)?;
                let data = r.value.data().cloned().unwrap_or(Value::Null);
                let recovered = data["recovered_from"].as_str().is_some();
                if recovered && data["state"] == "completed" {
                    completed_before_crash += 1;
                    break r.value;
                }
                if recovered || r.value.error_kind() == Some(correx::ToolErrorKind::Interrupted) {
                    key.push_str(".again");
                    continue;
                }
                break r.value;
            };
            let text = match &result {
                ToolResult::Success { output, .. } => output.clone(),
                ToolResult::Failure { reason, .. } => reason.clone(),
            };
            let mut e = ContextEntry::new(SourceType::Tool, text);
            e.tool_call_id = Some(call_id);
            entries.push(e);
        }
    }
    println!("COMPLETED_BEFORE_CRASH {completed_before_crash}");
    println!("TRANSCRIPT {}", serde_json::to_string(&s.transcript()?)?);
    Ok(())
}

/// A loopback forwarder that counts the chat requests passing to the server: the model
/// calls, counted where they arrive.
struct CallCounter {
    port: u16,
    calls: Arc<AtomicUsize>,
}

impl CallCounter {
    fn start(upstream: u16) -> std::io::Result<CallCounter> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let counted = counted.clone();
                std::thread::spawn(move || {
                    let (mut client, mut server) = (client, server);
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut window: Vec<u8> = Vec::new();
                    let needle = b"POST /v1/chat/completions";
                    while let Ok(n) = client.read(&mut buf) {
                        if n == 0 || server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        window.extend_from_slice(&buf[..n]);
                        let hits = window.windows(needle.len()).filter(|w| w == needle).count();
                        counted.fetch_add(hits, Ordering::SeqCst);
                        let keep = window.len().min(needle.len() - 1);
                        window.drain(..window.len() - keep);
                    }
                    let _ = server.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s2, &mut c2);
                    let _ = c2.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Ok(CallCounter { port, calls })
    }
}

fn run_child(dir: &std::path::Path, session: &str, url: &str) -> std::process::Child {
    child_test("sessions::session_agent_child")
        .env("CORREX_CHILD_DIR", dir)
        .env("CORREX_CHILD_SESSION", session)
        .env("CORREX_CHILD_URL", url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the agent")
}

/// The child's output, when it completed.
fn finish(child: std::process::Child) -> Result<(String, usize), String> {
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = crate::util::both_streams(&out);
    let transcript = text
        .lines()
        .find_map(|l| l.split_once("TRANSCRIPT ").map(|(_, t)| t.to_owned()));
    let completed = text
        .lines()
        .find_map(|l| {
            l.split_once("COMPLETED_BEFORE_CRASH ")
                .map(|(_, t)| t.trim().to_owned())
        })
        .and_then(|n| n.parse().ok());
    match (out.status.success(), transcript, completed) {
        (true, Some(t), Some(c)) => Ok((t, c)),
        _ => Err(text),
    }
}

#[test]
fn an_agent_killed_at_random_points_resumes_without_repeating_a_call_or_a_change() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    // One slot with room for ten turns.
    let server = TestServer::start_with(
        &install,
        &[
            "--no-jinja",
            "--chat-template",
            "gemma",
            "--ctx-size",
            "8192",
            "--parallel",
            "1",
        ],
    );
    let counter = CallCounter::start(server.port)?;
    let url = format!("http://127.0.0.1:{}", counter.port);

    // An uninterrupted run: the transcript every resumed session must end with.
    let dir = TempDir::new("session-kill");
    let reference = finish(run_child(dir.path(), "reference", &url))
        .map_err(|e| format!("the uninterrupted run failed:\n{e}"))?;
    assert_eq!(
        counter.calls.load(Ordering::SeqCst),
        TURNS,
        "one call per turn"
    );

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    println!("kill battery seed {seed}");
    let mut rng = Rng(seed);
    let (mut kills, mut sessions) = (0, Vec::new());
    // A bound on a hang, not a timing: a loaded 2-core machine takes minutes.
    let deadline = Instant::now() + Duration::from_secs(900);
    while kills < 50 {
        assert!(
            Instant::now() < deadline,
            "the battery ran out of time at {kills} kills"
        );
        let session = format!("s{}", sessions.len() + 1);
        let calls_before = counter.calls.load(Ordering::SeqCst);
        let mut lives = 0;
        let result = loop {
            assert!(
                Instant::now() < deadline,
                "the battery ran out of time at {kills} kills"
            );
            let mut child = run_child(dir.path(), &session, &url);
            lives += 1;
            // Anywhere from opening the runtime to the last turn; the 12th life of a
            // session runs to its end.
            std::thread::sleep(Duration::from_millis(5 + rng.below(1500)));
            if lives < 12 && child.try_wait()?.is_none() {
                child.kill()?;
                let _ = child.wait();
                kills += 1;
                continue;
            }
            break finish(child).map_err(|e| format!("session {session} failed:\n{e}"))?;
        };
        sessions.push((
            session,
            result,
            counter.calls.load(Ordering::SeqCst) - calls_before,
        ));
    }
    println!("{kills} kills over {} sessions", sessions.len());

    let rt = runtime(dir.path())?;
    let (mut cut_short, mut recovered_outputs) = (0, 0);
    let (mut closed_from_outcome, mut tool_retries) = (0, 0);
    for (session, (transcript, completed_before_crash), calls) in &sessions {
        // Every change once: the marker holds each turn's line once, in order.
        let marker = std::fs::read_to_string(dir.join(format!("work/{session}.txt")))?;
        let want: String = (1..=TURNS).map(|n| format!("turn {n}\n")).collect();
        assert_eq!(marker, want, "session {session}'s marker");

        // Model calls: one per inference step, plus at most one per try a kill cut short (its
        // claim is in the log without a result, and the next life ran it again).
        let events = rt
            .events()
            .read_stream(&correx::session_stream(session), 1, 100_000)?;
        let infer_claims = events
            .iter()
            .filter(|e| e.type_id == "session.step_started" && e.payload["kind"] == "infer")
            .count();
        let infer_results = events
            .iter()
            .filter(|e| e.type_id == "session.step_completed" && e.payload["kind"] == "infer")
            .count();
        assert_eq!(
            infer_results, TURNS,
            "session {session}: one result per inference step"
        );
        // (A kill between a claim and its request leaves a claim without a call.)
        assert!(
            (TURNS..=infer_claims).contains(calls),
            "session {session}: {calls} model calls for {TURNS} steps and {infer_claims} tries: \
             every call is a claimed try, no try calls twice"
        );
        cut_short += infer_claims - TURNS;
        closed_from_outcome += events
            .iter()
            .filter(|e| e.type_id == "session.step_completed" && e.payload["recovered"].is_string())
            .count();
        tool_retries += events
            .iter()
            .filter(|e| {
                e.type_id == "session.step_completed"
                    && e.payload["step"]
                        .as_str()
                        .is_some_and(|k| k.ends_with(".again"))
            })
            .count();

        // The same conversation as the uninterrupted run (unless a tool's output died with
        // the host after its change was made: then its entry says so).
        // (Each session has its own marker file, which the edit's output names.)
        if *completed_before_crash == 0 {
            assert_eq!(
                transcript.replace(&format!("/{session}.txt"), "/MARKER"),
                reference.0.replace("/reference.txt", "/MARKER"),
                "session {session}'s transcript"
            );
        } else {
            recovered_outputs += completed_before_crash;
        }
    }
    let total_calls: usize = sessions.iter().map(|(_, _, c)| c).sum();
    println!(
        "model calls: {total_calls} for {} inference steps; tries cut short by a kill: {cut_short}",
        TURNS * sessions.len()
    );
    println!(
        "tool steps closed from their run's outcome after a kill: {closed_from_outcome}, \
         tried again under a new key: {tool_retries}"
    );
    println!(
        "tool steps whose change was made but whose output died with the host: {recovered_outputs}"
    );
    Ok(())
}

/// Edits the log's one `session.step_completed` with `json_set(payload, <set>)`: its position.
fn damage_step(db: &std::path::Path, set: &str) -> Result<i64, Box<dyn std::error::Error>> {
    let conn = rusqlite::Connection::open(db)?;
    let position = conn.query_row(
        "SELECT position FROM events WHERE type_id = 'session.step_completed'",
        [],
        |r| r.get(0),
    )?;
    conn.execute(
        &format!("UPDATE events SET payload = json_set(payload, {set}) WHERE position = ?1"),
        [position],
    )?;
    Ok(position)
}

#[test]
fn a_damaged_step_record_is_found_by_verify_and_refused_by_the_session() -> TestResult {
    let dir = TempDir::new("session-damaged");
    let model = double();
    let none = CancelToken::new();
    {
        let rt = runtime(dir.path())?;
        let s = rt.session("s1")?;
        s.infer("t1", &model, &ask("hello"), &none)?;
    }
    let db = dir.join("events.db");
    assert!(correx::verify_log(&db)?.problems.is_empty());
    // The answer swapped for something that is not one.
    let position = damage_step(&db, "'$.answer', 'edited'")?;
    let report = correx::verify_log(&db)?;
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.position == Some(position as u64)),
        "{report:?}"
    );
    // The session does not read past it (which would run the step again): a typed error,
    // every time.
    let rt = runtime(dir.path())?;
    for _ in 0..2 {
        match rt
            .session("s1")
            .and_then(|s| s.infer("t1", &model, &ask("hello"), &none))
        {
            Err(SessionError::Corrupt { position: p, .. }) => assert_eq!(p, position as u64),
            other => panic!("a corrupt step, not {other:?}"),
        }
    }
    assert_eq!(
        model.calls.load(Ordering::SeqCst),
        1,
        "the damaged step was not run again"
    );
    Ok(())
}

/// A step record whose answer has the right shape outside but not inside (a field of the
/// wrong type) is `Corrupt` at its own position, not at position 0.
#[test]
fn a_damaged_answer_is_named_by_its_records_position() -> TestResult {
    let dir = TempDir::new("session-damaged-answer");
    let model = double();
    let none = CancelToken::new();
    {
        let rt = runtime(dir.path())?;
        let s = rt.session("s1")?;
        s.infer("t1", &model, &ask("hello"), &none)?;
    }
    let position = damage_step(&dir.join("events.db"), "'$.answer.text', 5")?;
    assert!(position > 0);
    let rt = runtime(dir.path())?;
    match rt
        .session("s1")
        .and_then(|s| s.infer("t1", &model, &ask("hello"), &none))
    {
        Err(SessionError::Corrupt {
            position: p,
            detail,
        }) => {
            assert_eq!(p, position as u64, "{detail}")
        }
        other => panic!("a corrupt step, not {other:?}"),
    }
    assert_eq!(
        model.calls.load(Ordering::SeqCst),
        1,
        "the damaged step ran again"
    );
    Ok(())
}

/// The same step key and request asked of another model is a conflict: the first model's
/// answer is not replayed as the second's.
#[test]
fn the_same_step_asked_of_another_model_is_a_conflict() -> TestResult {
    let dir = TempDir::new("session-other-model");
    let rt = runtime(dir.path())?;
    let s = rt.session("s1")?;
    let none = CancelToken::new();
    let (a, b) = (
        double(),
        DoubleModel {
            id: Some(ProviderId::from_string("another")),
            ..DoubleModel::default()
        },
    );
    s.infer("t1", &a, &ask("hello"), &none)?;
    assert!(s.infer("t1", &a, &ask("hello"), &none)?.replayed);
    match s.infer("t1", &b, &ask("hello"), &none) {
        Err(SessionError::Conflict { step, .. }) => assert_eq!(step, "t1"),
        other => panic!("another model's step answered: {other:?}"),
    }
    assert_eq!(b.calls.load(Ordering::SeqCst), 0);
    Ok(())
}

/// A runtime on the log at `db`, with the tools of [`runtime`] on `work`.
fn runtime_on(
    db: &std::path::Path,
    sandbox: &std::path::Path,
    work: &std::path::Path,
) -> Result<Runtime, Box<dyn std::error::Error>> {
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1, "event_log": db, "sandbox_root": sandbox,
            "tools": {"file_edit": {"enabled": true, "allowed_paths": [work]}},
            "approvals": {"engine": "auto", "max_tier": 3}
        })
        .to_string(),
    )?;
    Ok(Runtime::new(&config, Arc::new(correx::DenyAll))?)
}

#[test]
fn one_byte_changed_anywhere_in_a_step_record_is_corrupt_at_its_position_never_run_again(
) -> TestResult {
    let dir = TempDir::new("session-byte");
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let marker = work.join("marker.txt");
    std::fs::write(&marker, "")?;
    let model = double();
    let none = CancelToken::new();
    let edit = append("s1", &marker, "x\n");
    let (answer, result) = {
        let rt = runtime_on(&dir.join("events.db"), &dir.join("sandbox"), &work)?;
        let s = rt.session("s1")?;
        let a = s.infer("t1", &model, &ask("hello"), &none)?.value;
        let r = s
            .execute("e1", rt.executor(), &edit, Some("call-1"), &none)?
            .value;
        (a, r)
    };
    let conn = rusqlite::Connection::open(dir.join("events.db"))?;
    let records: Vec<(i64, String)> = conn
        .prepare("SELECT position, payload FROM events WHERE type_id = 'session.step_completed'")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    drop(conn);
    assert_eq!(records.len(), 2);
    let mut copies = 0;
    for (position, payload) in &records {
        // Every 5th byte of each record (both records, every field), one at a time.
        for i in (0..payload.len()).step_by(5) {
            if !payload.as_bytes()[i].is_ascii() {
                continue;
            }
            let copy = dir.join(format!("copy-{position}-{i}"));
            std::fs::create_dir_all(&copy)?;
            std::fs::copy(dir.join("events.db"), copy.join("events.db"))?;
            let mut bytes = payload.clone().into_bytes();
            bytes[i] ^= 0x01;
            let damaged = String::from_utf8(bytes)?;
            rusqlite::Connection::open(copy.join("events.db"))?.execute(
                "UPDATE events SET payload = ?1 WHERE position = ?2",
                rusqlite::params![damaged, position],
            )?;
            let rt = runtime_on(&copy.join("events.db"), &copy.join("sandbox"), &work)?;
            let resumed = rt.session("s1").and_then(|s| {
                let a = s.infer("t1", &model, &ask("hello"), &none)?;
                let r = s.execute("e1", rt.executor(), &edit, Some("call-1"), &none)?;
                Ok((a, r))
            });
            match resumed {
                Err(SessionError::Corrupt { position: p, .. }) => {
                    assert_eq!(p, *position as u64, "byte {i}")
                }
                Ok((a, r)) => {
                    assert!(a.replayed && r.replayed, "byte {i}: replayed");
                    assert_eq!(
                        (a.value, r.value),
                        (answer.clone(), result.clone()),
                        "byte {i}"
                    );
                }
                Err(other) => panic!("byte {i} of the record at {position}: {other:?}"),
            }
            drop(rt);
            let _ = std::fs::remove_dir_all(&copy);
            copies += 1;
        }
    }
    assert!(copies > 50, "{copies} copies tried");
    assert_eq!(model.calls.load(Ordering::SeqCst), 1, "no model call again");
    assert_eq!(
        std::fs::read_to_string(&marker)?,
        "x\n",
        "no tool run again"
    );
    Ok(())
}

/// A runtime on `dir` whose shell may run `sleep`.
fn sleepy_runtime(dir: &std::path::Path) -> Result<Runtime, Box<dyn std::error::Error>> {
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1, "event_log": dir.join("events.db"), "sandbox_root": dir.join("sandbox"),
            "tools": {"shell": {"enabled": true, "allowed_executables": ["sleep"],
                                "working_dirs": [&work]}},
            "approvals": {"engine": "auto", "max_tier": 3}
        })
        .to_string(),
    )?;
    Ok(Runtime::new(&config, Arc::new(correx::DenyAll))?)
}

fn sleep_step(dir: &std::path::Path) -> ToolRequest {
    ToolRequest::json(
        "s1",
        "shell",
        json!({"argv": ["sleep", "30"], "cwd": dir.join("work")}),
    )
    .expect("an object")
}

/// Runs the step `long` (a 30 s sleep) until it is killed.
#[test]
#[ignore = "a child of the dead-owner test; run by it"]
fn session_sleeper_child() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let rt = sleepy_runtime(&dir)?;
    let s = rt.session("s1")?;
    s.execute(
        "long",
        rt.executor(),
        &sleep_step(&dir),
        None,
        &CancelToken::new(),
    )?;
    Ok(())
}

#[test]
fn a_step_whose_owner_died_mid_run_is_closed_by_a_runtime_opened_before_the_death() -> TestResult {
    let dir = TempDir::new("session-dead-owner");
    // This runtime is open before the owner dies: its own opening recovered nothing.
    let rt = sleepy_runtime(dir.path())?;
    let mut child = child_test("sessions::session_sleeper_child")
        .env("CORREX_CHILD_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let started = Instant::now();
    loop {
        let events = rt.events().read_stream("session-s1", 1, 100)?;
        if events.iter().any(|e| e.type_id == "tool.execution_started") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill()?;
    child.wait()?;
    let s = rt.session("s1")?;
    let step = s.execute(
        "long",
        rt.executor(),
        &sleep_step(dir.path()),
        None,
        &CancelToken::new(),
    )?;
    assert!(step.recovered && !step.replayed, "{step:?}");
    assert_eq!(
        step.value.error_kind(),
        Some(correx::ToolErrorKind::Interrupted)
    );
    let again = s.execute(
        "long",
        rt.executor(),
        &sleep_step(dir.path()),
        None,
        &CancelToken::new(),
    )?;
    assert!(again.recovered && again.replayed, "{again:?}");
    let starts = rt
        .events()
        .read_stream("session-s1", 1, 100)?
        .iter()
        .filter(|e| e.type_id == "tool.execution_started")
        .count();
    assert_eq!(starts, 1, "the run was not started again");
    Ok(())
}

/// A wait step records that it waits, is answered by a signal from any process (another
/// handle on the log, opened on its own), records the signal's payload once, and answers from
/// the log after; the first signal of a name wins; a key of another step, or another signal,
/// is a conflict; bad names and payloads are refused.
#[test]
fn a_wait_is_answered_once_by_the_first_signal_from_any_process() -> TestResult {
    let dir = TempDir::new("session-wait");
    let db = dir.join("events.db");
    let store = |_: ()| -> Result<Arc<correx::SqliteEventStore>, correx::EventStoreError> {
        Ok(Arc::new(correx::SqliteEventStore::open(&db)?))
    };
    let waiter = correx::Session::open(store(())?, "w1")?;
    let cancel = CancelToken::new();
    // Nothing sent: the step waits, recorded once however often it is asked.
    for _ in 0..3 {
        let e = waiter
            .wait("approve-deploy", "deploy-ok", Duration::ZERO, &cancel)
            .unwrap_err();
        assert!(
            matches!(&e, SessionError::Waiting { step, name } if step == "approve-deploy" && name == "deploy-ok"),
            "{e:?}"
        );
    }
    let events = || -> Result<Vec<correx::RecordedEvent>, Box<dyn std::error::Error>> {
        Ok(store(())?.read_stream("session-w1", 1, 1000)?)
    };
    let kinds = |evs: &[correx::RecordedEvent]| -> Vec<String> {
        evs.iter().map(|e| e.type_id.clone()).collect()
    };
    assert_eq!(kinds(&events()?), ["session.waiting"]);

    // Another handle (its own connection) sends it while the first waits.
    let sender = correx::Session::open(store(())?, "w1")?;
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        sender.signal(
            "deploy-ok",
            json!({"approved": true, "by": "ops"}),
            Some("ops-phone"),
        )
    });
    let got = waiter.wait(
        "approve-deploy",
        "deploy-ok",
        Duration::from_secs(30),
        &cancel,
    )?;
    let position = t.join().map_err(|_| "the sender panicked")??;
    assert_eq!(got.value, json!({"approved": true, "by": "ops"}));
    assert!(!got.replayed);
    // Answered from the log after, in a new handle too; the completion is recorded once.
    let again = correx::Session::open(store(())?, "w1")?.wait(
        "approve-deploy",
        "deploy-ok",
        Duration::ZERO,
        &cancel,
    )?;
    assert!(again.replayed);
    assert_eq!(again.value, got.value);
    let evs = events()?;
    assert_eq!(
        kinds(&evs),
        [
            "session.waiting",
            "session.signaled",
            "session.step_completed"
        ]
    );
    assert_eq!(evs[1].position, position);
    assert_eq!(evs[1].payload["by"], "ops-phone");
    assert_eq!(evs[2].payload["kind"], "wait");

    // The first signal wins.
    let e = waiter.signal("deploy-ok", json!(false), None).unwrap_err();
    assert!(
        matches!(e, SessionError::AlreadySignaled { position: p, .. } if p == position),
        "{e:?}"
    );
    // A signal sent before its wait answers it at once.
    waiter.signal("early", json!(7), None)?;
    assert_eq!(
        waiter
            .wait("late-step", "early", Duration::ZERO, &cancel)?
            .value,
        json!(7)
    );
    // A key is one step's: another signal, or an inference under it, is a conflict.
    let e = waiter
        .wait("approve-deploy", "other", Duration::ZERO, &cancel)
        .unwrap_err();
    assert!(matches!(e, SessionError::Conflict { .. }), "{e:?}");
    let _ = waiter.wait("pending-step", "never", Duration::ZERO, &cancel);
    let e = waiter
        .infer("pending-step", &double(), &ask("hi"), &cancel)
        .unwrap_err();
    assert!(matches!(e, SessionError::Conflict { .. }), "{e:?}");
    // A cancel ends a wait.
    let cancelled = CancelToken::new();
    cancelled.cancel();
    let e = waiter
        .wait("pending-step", "never", Duration::from_secs(30), &cancelled)
        .unwrap_err();
    assert!(matches!(e, SessionError::Cancelled), "{e:?}");
    // Bad input, nothing recorded for it.
    let before = events()?.len();
    for name in ["", "a\u{7}b", &"n".repeat(300)] {
        let e = waiter.signal(name, json!(1), None).unwrap_err();
        assert!(matches!(e, SessionError::InvalidRequest(_)), "{e:?}");
        let e = waiter.wait("s", name, Duration::ZERO, &cancel).unwrap_err();
        assert!(matches!(e, SessionError::InvalidRequest(_)), "{e:?}");
    }
    let big = json!("x".repeat(correx::MAX_SIGNAL_BYTES));
    let e = waiter.signal("big", big, None).unwrap_err();
    assert!(matches!(e, SessionError::InvalidRequest(_)), "{e:?}");
    assert_eq!(events()?.len(), before);
    Ok(())
}
