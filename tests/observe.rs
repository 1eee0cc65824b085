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

fn write_log(store: &SqliteEventStore) -> TestResult {
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
    write_log(rt.events())?;
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
