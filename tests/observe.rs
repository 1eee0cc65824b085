//! Metrics, checked by the official Prometheus text-format parser (`prometheus_client`, from
//! PyPI, installed by `scripts/install-checkers.sh`) against what the test wrote to the log.

use crate::util::TempDir;
use correx::{append_domain, DomainEvent, SqliteEventStore, TokenUsage, UnloadReason};
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The checkers' Python (`$CACHE/checkers/env`); in CI a missing install fails, elsewhere the
/// test is skipped loudly.
pub fn checker_python() -> Option<PathBuf> {
    let cache = std::env::var_os("CORREX_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("correx")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/correx")))?;
    let found = std::fs::read_to_string(cache.join("checkers/env"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("python=").map(PathBuf::from))
        });
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("the checkers are not installed; CI must run scripts/install-checkers.sh");
        }
        eprintln!("\n!!! SKIPPING: checkers not installed; run scripts/install-checkers.sh !!!\n");
    }
    found
}

const PARSE: &str = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append({"family": fam.name, "type": fam.type, "name": s.name,
                    "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;

/// One sample as the parser read it.
#[derive(Debug)]
struct Sample {
    family_type: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// Parses `text` with the official parser; samples by name.
fn parse(
    python: &Path,
    text: &str,
) -> Result<HashMap<String, Vec<Sample>>, Box<dyn std::error::Error>> {
    let mut child = Command::new(python)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    assert!(
        out.status.success(),
        "the Prometheus parser refused the text:\n{}\n---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<Value> = serde_json::from_slice(&out.stdout)?;
    let mut by_name: HashMap<String, Vec<Sample>> = HashMap::new();
    for s in samples {
        let labels = s["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        by_name
            .entry(s["name"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(Sample {
                family_type: s["type"].as_str().unwrap_or_default().to_owned(),
                labels,
                value: s["value"].as_f64().unwrap_or(f64::NAN),
            });
    }
    Ok(by_name)
}

/// The value of `name` with exactly `labels`.
fn value(
    samples: &HashMap<String, Vec<Sample>>,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    samples.get(name)?.iter().find_map(|s| {
        let want: HashMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        (s.labels == want).then_some(s.value)
    })
}

/// A model id that needs every escape the format has.
const ODD_MODEL: &str = "gem\"ma\\2\nq4";

fn write_log(store: &dyn correx::EventStore) -> TestResult {
    let ev = |e: DomainEvent, stream: &str| append_domain(store, stream, &e).map(|_| ());
    for (i, (outcome, wait_ms)) in [("completed", 40), ("completed", 2_000), ("failed", 0)]
        .into_iter()
        .enumerate()
    {
        let inv = format!("inv-{i}");
        ev(
            DomainEvent::ToolApprovalDecided {
                session_id: "s1".into(),
                invocation_id: inv.clone(),
                tool_name: "shell".into(),
                tier: 2,
                decision: "approved".into(),
                decided_by: "host".into(),
                wait_ms,
                reason: None,
                answers_request: false,
                identity: None,
            },
            "session-s1",
        )?;
        ev(
            match outcome {
                "completed" => DomainEvent::ToolExecutionCompleted {
                    session_id: "s1".into(),
                    invocation_id: inv,
                    tool_name: "shell".into(),
                    duration_ms: 120,
                    network: None,
                },
                _ => DomainEvent::ToolExecutionFailed {
                    session_id: "s1".into(),
                    invocation_id: inv,
                    tool_name: "shell".into(),
                    reason: "exit 1".into(),
                    recoverable: true,
                    kind: None,
                    network: None,
                },
            },
            "session-s1",
        )?;
    }
    ev(
        DomainEvent::ToolExecutionRejected {
            session_id: "s1".into(),
            invocation_id: "inv-9".into(),
            tool_name: "file_write".into(),
            tier: 3,
            reason: "denied".into(),
            kind: None,
        },
        "session-s1",
    )?;
    for model in ["gemma", ODD_MODEL] {
        ev(
            DomainEvent::ModelLoaded {
                model_id: model.into(),
                model_path: "/m.gguf".into(),
                port: Some(1),
                pid: Some(2),
                load_ms: 900,
                endpoints: vec![],
                endpoint_features: Vec::new(),
                isolation: None,
            },
            "model-manager",
        )?;
    }
    for (prompt, completion, reason) in [(10, 3, "stop"), (7, 50, "length")] {
        ev(
            DomainEvent::InferenceCompleted {
                model_id: "gemma".into(),
                usage: TokenUsage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    total_tokens: prompt + completion,
                },
                latency_ms: 250,
                finish_reason: reason.into(),
                endpoint: None,
            },
            "model-manager",
        )?;
    }
    ev(
        DomainEvent::ModelUnloaded {
            model_id: ODD_MODEL.into(),
            reason: UnloadReason::Evicted,
            pid: Some(2),
            port: Some(1),
        },
        "model-manager",
    )?;
    Ok(())
}

#[test]
fn metrics_of_a_log_parse_with_the_official_parser_and_count_what_it_records() -> TestResult {
    let Some(python) = checker_python() else {
        return Ok(());
    };
    let tmp = TempDir::new("metrics");
    let db = tmp.join("events.db");
    let store = SqliteEventStore::open(&db)?;
    write_log(&store)?;
    let last = correx::EventStore::last_position(&store)?;
    drop(store);
    let out = Command::new(env!("CARGO_BIN_EXE_correx"))
        .args(["metrics", &db.to_string_lossy()])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let m = parse(&python, &text)?;
    let shell = |outcome| {
        value(
            &m,
            "correx_tool_runs_total",
            &[("tool", "shell"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (shell("completed"), shell("failed")),
        (Some(2.0), Some(1.0))
    );
    assert_eq!(
        value(
            &m,
            "correx_tool_runs_total",
            &[("tool", "file_write"), ("outcome", "rejected")]
        ),
        Some(1.0)
    );
    assert_eq!(m["correx_tool_runs_total"][0].family_type, "counter");
    // The approval waits, 40 ms and 2 s and 0: two at or below 0.05 s, all three below 5 s.
    let bucket = |le| {
        value(
            &m,
            "correx_tool_approval_wait_seconds_bucket",
            &[("tool", "shell"), ("le", le)],
        )
    };
    assert_eq!(
        (bucket("0.05"), bucket("5"), bucket("+Inf")),
        (Some(2.0), Some(3.0), Some(3.0))
    );
    assert_eq!(
        value(
            &m,
            "correx_tool_approval_wait_seconds_sum",
            &[("tool", "shell")]
        ),
        Some(2.04)
    );
    assert_eq!(
        m["correx_tool_approval_wait_seconds_count"][0].family_type,
        "histogram"
    );
    assert_eq!(
        value(
            &m,
            "correx_inference_input_tokens_total",
            &[("model", "gemma")]
        ),
        Some(17.0)
    );
    assert_eq!(
        value(
            &m,
            "correx_inference_output_tokens_total",
            &[("model", "gemma")]
        ),
        Some(53.0)
    );
    assert_eq!(
        value(
            &m,
            "correx_inferences_total",
            &[("model", "gemma"), ("finish_reason", "length")]
        ),
        Some(1.0)
    );
    // The escaped model id reads back as written.
    assert_eq!(
        value(
            &m,
            "correx_model_unloads_total",
            &[("model", ODD_MODEL), ("reason", "evicted")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&m, "correx_model_loads_total", &[("model", ODD_MODEL)]),
        Some(1.0)
    );
    assert_eq!(value(&m, "correx_models_resident", &[]), Some(1.0));
    assert_eq!(value(&m, "correx_log_position", &[]), Some(last as f64));
    assert_eq!(value(&m, "correx_log_events_total", &[]), Some(last as f64));
    Ok(())
}

#[test]
fn a_runtimes_metrics_add_live_append_latency_and_follow_the_log() -> TestResult {
    let Some(python) = checker_python() else {
        return Ok(());
    };
    let tmp = TempDir::new("metrics-live");
    let config = correx::RuntimeConfig::from_json(&format!(
        r#"{{"v": 1, "event_log": {:?}, "sandbox_root": {:?}}}"#,
        tmp.join("events.db"),
        tmp.join("work")
    ))?;
    let rt = correx::Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let before = parse(&python, &rt.metrics()?)?;
    let appends = |m: &HashMap<String, Vec<Sample>>| {
        value(m, "correx_log_append_duration_seconds_count", &[]).unwrap_or(-1.0)
    };
    write_log(rt.events().as_ref())?;
    let after = parse(&python, &rt.metrics()?)?;
    // 3 approvals, 3 runs, a rejection, 2 loads, 2 inferences, an unload.
    assert_eq!(appends(&after) - appends(&before), 12.0);
    assert_eq!(
        value(
            &after,
            "correx_tool_runs_total",
            &[("tool", "shell"), ("outcome", "completed")]
        ),
        Some(2.0)
    );
    // Live: the manager loaded nothing, whatever the log says.
    assert_eq!(value(&after, "correx_models_resident", &[]), Some(0.0));
    // Read again with nothing new: the same counts, not twice them.
    let again = parse(&python, &rt.metrics()?)?;
    assert_eq!(
        value(
            &again,
            "correx_tool_runs_total",
            &[("tool", "shell"), ("outcome", "completed")]
        ),
        Some(2.0)
    );
    Ok(())
}

/// The official-definitions receiver (`tests/otlp_receiver.py`), on a loopback port; killed
/// when dropped.
struct Receiver {
    child: std::process::Child,
    port: u16,
    spans: PathBuf,
}

impl Receiver {
    fn start(python: &Path, dir: &Path) -> Result<Receiver, Box<dyn std::error::Error>> {
        Self::start_mode(python, dir, "serve")
    }

    /// `mode` `unavailable`: every request is answered 503.
    fn start_mode(
        python: &Path,
        dir: &Path,
        mode: &str,
    ) -> Result<Receiver, Box<dyn std::error::Error>> {
        let spans = dir.join(format!("spans-{mode}.jsonl"));
        // Its stdin stays open while this process lives: the receiver ends with the test,
        // however the test ends.
        let child = Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/otlp_receiver.py"
            ))
            .arg(&spans)
            .arg(mode)
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()?;
        let mut receiver = Receiver {
            child,
            port: 0,
            spans,
        };
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(receiver.child.stdout.take().ok_or("stdout")?),
            &mut line,
        )?;
        receiver.port = line.trim().parse()?;
        Ok(receiver)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far; a refused request fails the test.
    fn spans(&self) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        // Only whole lines: the receiver may be writing the next one (a buffer's worth at a
        // time) as this reads.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        let spans: Vec<Value> = whole
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        if let Some(refused) = spans.iter().find(|s| s.get("refused").is_some()) {
            return Err(format!("the receiver refused a request: {refused}").into());
        }
        // What the official decoder lets through but OTLP requires.
        for s in &spans {
            let hex_len = |k: &str| s[k].as_str().map_or(0, str::len);
            assert_eq!(hex_len("trace_id"), 32, "a 16-byte trace id: {s}");
            assert_eq!(hex_len("span_id"), 16, "an 8-byte span id: {s}");
            assert!(matches!(hex_len("parent"), 0 | 16), "{s}");
            assert!(
                s["end"].as_u64() >= s["start"].as_u64(),
                "ends after it starts: {s}"
            );
        }
        Ok(spans)
    }

    /// Waits (bounded) until `n` spans arrived.
    fn wait_for(&self, n: usize) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let spans = self.spans()?;
            if spans.len() >= n || std::time::Instant::now() > deadline {
                return Ok(spans);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Tool runs in session `s2` beyond `write_log`'s: one with a network denial and a model call
/// id, one still open; and a model that crashed.
fn write_more(store: &SqliteEventStore) -> TestResult {
    let ev = |e: DomainEvent, stream: &str| append_domain(store, stream, &e).map(|_| ());
    ev(
        DomainEvent::SessionStepStarted {
            session_id: "s2".into(),
            step: "turn-1".into(),
            kind: "tool".into(),
            digest: "d".into(),
            attempt: 1,
            owner: serde_json::json!({}),
            invocation_id: Some("inv-net".into()),
            call_id: Some("call_abc".into()),
        },
        "session-s2",
    )?;
    ev(
        DomainEvent::ToolExecutionStarted {
            session_id: "s2".into(),
            invocation_id: "inv-net".into(),
            tool_name: "shell".into(),
            tier: 2,
            isolation: None,
        },
        "session-s2",
    )?;
    ev(
        DomainEvent::ToolNetworkDenied {
            session_id: "s2".into(),
            invocation_id: "inv-net".into(),
            tool_name: "shell".into(),
            host: "evil.example".into(),
            port: 443,
            reason: "not_allowed".into(),
        },
        "session-s2",
    )?;
    ev(
        DomainEvent::ToolExecutionCompleted {
            session_id: "s2".into(),
            invocation_id: "inv-net".into(),
            tool_name: "shell".into(),
            duration_ms: 30,
            network: None,
        },
        "session-s2",
    )?;
    ev(
        DomainEvent::ToolExecutionStarted {
            session_id: "s2".into(),
            invocation_id: "inv-open".into(),
            tool_name: "file_read".into(),
            tier: 0,
            isolation: None,
        },
        "session-s2",
    )?;
    ev(
        DomainEvent::ModelLoaded {
            model_id: "crashy".into(),
            model_path: "/c.gguf".into(),
            port: Some(3),
            pid: Some(4),
            load_ms: 100,
            endpoints: vec![],
            endpoint_features: Vec::new(),
            isolation: None,
        },
        "model-manager",
    )?;
    ev(
        DomainEvent::ModelUnloaded {
            model_id: "crashy".into(),
            reason: UnloadReason::Crashed,
            pid: Some(4),
            port: Some(3),
        },
        "model-manager",
    )?;
    Ok(())
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

#[test]
fn the_log_exported_as_otlp_decodes_with_the_official_definitions_as_a_span_tree() -> TestResult {
    let Some(python) = checker_python() else {
        return Ok(());
    };
    let tmp = TempDir::new("otlp");
    let db = tmp.join("events.db");
    let store = SqliteEventStore::open(&db)?;
    write_log(&store)?;
    write_more(&store)?;
    drop(store);
    let receiver = Receiver::start(&python, tmp.path())?;
    let out = Command::new(env!("CARGO_BIN_EXE_correx"))
        .args([
            "log",
            "export",
            &db.to_string_lossy(),
            "--otlp",
            &receiver.url(),
        ])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans()?;
    let named = |prefix: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .collect()
    };
    assert!(spans.iter().all(
        |s| s["schema_url"] == "https://opentelemetry.io/schemas/1.41.0"
            && s["scope"] == "correx"
            && s["service"] == "correx"
    ));
    // Six tool runs: two completed, one failed, one rejected in s1; one completed and one
    // still open in s2.
    let tools = named("execute_tool ");
    assert_eq!(tools.len(), 6, "{spans:#?}");
    for t in &tools {
        assert_eq!(attr(t, "gen_ai.operation.name"), "execute_tool");
        assert_eq!(t["kind"], 1, "INTERNAL");
        assert_eq!(t["parent"], "");
        let session = attr(t, "gen_ai.conversation.id");
        // A session is a trace.
        assert!(tools
            .iter()
            .filter(|o| attr(o, "gen_ai.conversation.id") == session)
            .all(|o| o["trace_id"] == t["trace_id"]));
    }
    let by_inv = |inv: &str| {
        tools
            .iter()
            .find(|t| attr(t, "correx.invocation.id") == inv)
            .copied()
            .ok_or(format!("no span for {inv}"))
    };
    let failed = by_inv("inv-2")?;
    assert_eq!(failed["status"]["code"], 2, "ERROR: {failed}");
    assert_eq!(attr(failed, "error.type"), "failed");
    let net = by_inv("inv-net")?;
    assert_eq!(
        attr(net, "gen_ai.tool.call.id"),
        "call_abc",
        "the model's call id"
    );
    assert_eq!(net["events"][0]["name"], "network_denied");
    assert_eq!(
        net["events"][0]["attributes"]["server.address"],
        "evil.example"
    );
    let open = by_inv("inv-open")?;
    assert_eq!(attr(open, "correx.open"), true);
    assert_eq!(attr(by_inv("inv-9")?, "error.type"), "rejected");
    // Each approval wait is a child of its run, inside it.
    let approvals = named("approval ");
    assert_eq!(approvals.len(), 3);
    for a in &approvals {
        let parent = tools
            .iter()
            .find(|t| t["span_id"] == a["parent"])
            .ok_or("an approval without its run")?;
        assert_eq!(parent["trace_id"], a["trace_id"]);
        let time = |s: &Value, k: &str| s[k].as_u64().ok_or(format!("no {k}"));
        assert!(time(a, "start")? >= time(parent, "start")?);
        assert!(time(a, "end")? <= time(parent, "end")?);
    }
    // Inferences under the residency that served them.
    let chats = named("chat ");
    assert_eq!(chats.len(), 2);
    let gemma = named("residency gemma");
    assert_eq!(gemma.len(), 1);
    for c in &chats {
        assert_eq!(c["parent"], gemma[0]["span_id"]);
        assert_eq!(c["kind"], 3, "CLIENT");
        assert_eq!(attr(c, "gen_ai.request.model"), "gemma");
    }
    let tokens: i64 = chats
        .iter()
        .map(|c| attr(c, "gen_ai.usage.input_tokens").as_i64().unwrap_or(0))
        .sum();
    assert_eq!(tokens, 17);
    assert!(chats
        .iter()
        .any(|c| attr(c, "gen_ai.response.finish_reasons") == &serde_json::json!(["length"])));
    let crashy = named("residency crashy");
    assert_eq!(crashy[0]["status"]["code"], 2);
    assert_eq!(crashy[0]["events"][0]["name"], "crashed");
    let odd = named(&format!("residency {ODD_MODEL}"));
    assert_eq!(attr(odd[0], "correx.unload.reason"), "evicted");
    // Bad endpoints are usage-level errors, named.
    let out = Command::new(env!("CARGO_BIN_EXE_correx"))
        .args(["log", "export", &db.to_string_lossy(), "--otlp", "ftp://x"])
        .output()?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an http://"));
    Ok(())
}

#[test]
fn a_runtime_exports_live_and_counts_what_it_cannot_deliver() -> TestResult {
    let Some(python) = checker_python() else {
        return Ok(());
    };
    let tmp = TempDir::new("otlp-live");
    let receiver = Receiver::start(&python, tmp.path())?;
    let config = |endpoint: &str, db: &str, queue: usize| {
        correx::RuntimeConfig::from_json(&format!(
            r#"{{"v": 1, "event_log": {:?}, "sandbox_root": {:?},
                "otlp": {{"endpoint": {endpoint:?}, "queue_spans": {queue}, "service_name": "agent-x"}}}}"#,
            tmp.join(db),
            tmp.join("work")
        ))
    };
    {
        let rt = correx::Runtime::new(
            &config(&receiver.url(), "live.db", 2048)?,
            Arc::new(correx::DenyAll),
        )?;
        write_log(rt.events().as_ref())?;
        // 4 runs (one rejected) + 3 approvals + 2 chats + the evicted residency.
        let spans = receiver.wait_for(10)?;
        assert_eq!(spans.len(), 10, "{spans:#?}");
        assert!(spans.iter().all(|s| s["service"] == "agent-x"));
        // The receiver writes before it answers: the count follows within a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while rt.otlp_stats().is_some_and(|s| s.exported < 10)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let stats = rt.otlp_stats().ok_or("an exporter")?;
        assert_eq!((stats.exported, stats.dropped), (10, 0));
        let m = parse(&python, &rt.metrics()?)?;
        assert_eq!(
            value(&m, "correx_otlp_spans_exported_total", &[]),
            Some(10.0)
        );
    }
    // A receiver that answers 503: appends go on, spans are dropped and counted.
    let unavailable = Receiver::start_mode(&python, tmp.path(), "unavailable")?;
    let rt = correx::Runtime::new(
        &config(&unavailable.url(), "dead.db", 4)?,
        Arc::new(correx::DenyAll),
    )?;
    for _ in 0..5 {
        write_log(rt.events().as_ref())?;
    }
    // What the log holds, as spans: the same log exported at once to the live receiver.
    let before = receiver.spans()?.len();
    let out = Command::new(env!("CARGO_BIN_EXE_correx"))
        .args([
            "log",
            "export",
            &tmp.join("dead.db").to_string_lossy(),
            "--otlp",
            &receiver.url(),
        ])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ended = receiver.spans()?[before..]
        .iter()
        .filter(|s| s["attributes"].get("correx.open").is_none())
        .count() as u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rt.otlp_stats().is_some_and(|s| s.dropped < ended) && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stats = rt.otlp_stats().ok_or("an exporter")?;
    assert_eq!(stats.exported, 0);
    assert_eq!(stats.dropped, ended, "every span that ended: {stats:?}");
    assert!(stats.failed_requests > 0);
    assert_eq!(stats.follow_errors, 0);
    for (json, field) in [
        (r#"{"endpoint": "localhost:4318"}"#, "otlp.endpoint"),
        (
            r#"{"endpoint": "http://x", "queue_spans": 0}"#,
            "otlp.queue_spans",
        ),
        (
            r#"{"endpoint": "http://x", "service_name": " "}"#,
            "otlp.service_name",
        ),
        (r#"{"endpoint": ["http://x"]}"#, "otlp.endpoint"),
    ] {
        let e = correx::RuntimeConfig::from_json(&format!(
            r#"{{"v": 1, "event_log": "/e.db", "otlp": {json}}}"#
        ))
        .expect_err(field)
        .to_string();
        assert!(e.contains(field), "{e}");
    }
    Ok(())
}

#[test]
fn closing_a_runtime_does_not_wait_long_on_a_receiver_that_never_answers() -> TestResult {
    // A stub receiver (named so: a real one cannot be made to hang): accepts and never
    // answers, holding every connection.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let tmp = TempDir::new("otlp-hung");
    let config = correx::RuntimeConfig::from_json(&format!(
        r#"{{"v": 1, "event_log": {:?}, "sandbox_root": {:?},
            "otlp": {{"endpoint": "http://127.0.0.1:{port}", "timeout_ms": 300}}}}"#,
        tmp.join("events.db"),
        tmp.join("work")
    ))?;
    let rt = correx::Runtime::new(&config, Arc::new(correx::DenyAll))?;
    for _ in 0..3 {
        write_log(rt.events().as_ref())?;
    }
    let stats = rt.otlp_stats().ok_or("an exporter")?;
    assert_eq!(stats.exported, 0);
    // Returns: the sender gives up at one timeout past the stop, counting what it drops. (A
    // hang here is the failure.)
    drop(rt);
    Ok(())
}
