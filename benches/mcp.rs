//! `cargo bench --bench mcp`: long-lived confined processes.
//!
//! - `job_start_ms_p50`: a background shell request (`"background": true`) for `/bin/true`,
//!   through the runtime's sandboxed executor, to the returned job id: the program has exec'd
//!   confined and contained, and `job.started` is durable. Reported beside it, in the same run,
//!   `foreground_true_ms_p50`: the same request run to its end, its usual floor.

use correx::{EventStore, Runtime, RuntimeConfig, ToolExecutor, ToolRequest, ToolResult};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 200;

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("correx-bench-mcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {"shell": {"enabled": true, "allowed_executables": ["true"],
                                "jobs": {"max_per_session": 1}}},
            "approvals": {"engine": "auto"}
        })
        .to_string(),
    )?;
    let rt = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    let run = |background: bool| -> Result<(Duration, ToolResult), String> {
        let req = ToolRequest::json(
            "b",
            "shell",
            json!({"argv": ["true"], "background": background}),
        )?;
        let t = Instant::now();
        let r = rt.executor().execute(&req);
        Ok((t.elapsed(), r))
    };
    // Warm-up: the first runs make the temp dirs and cgroups later runs reuse.
    for _ in 0..10 {
        run(false)?;
    }
    let (mut started, mut foreground) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (d, r) = run(true)?;
        let job = match &r {
            ToolResult::Success { data: Some(d), .. } => {
                d["job_id"].as_str().unwrap_or_default().to_owned()
            }
            other => return Err(format!("a background start failed: {other:?}").into()),
        };
        started.push(d);
        // The session's one job slot is free again once the job has ended and been recorded.
        rt.jobs().wait("b", &job, Duration::from_secs(10))?;
        let (d, r) = run(false)?;
        if !r.is_success() {
            return Err(format!("a foreground run failed: {r:?}").into());
        }
        foreground.push(d);
    }
    let mut ended = 0;
    let mut from = 1;
    loop {
        let page = rt
            .events()
            .read_stream(&correx::session_stream("b"), from, 1000)?;
        let Some(last) = page.last() else { break };
        from = last.stream_version + 1;
        ended += page.iter().filter(|e| e.type_id == "job.exited").count();
    }
    assert_eq!(ended, ROUNDS, "every job's end is recorded");
    println!(
        "job_start_ms_p50: {:.3}",
        p50(started).as_secs_f64() * 1000.0
    );
    println!(
        "foreground_true_ms_p50: {:.3}",
        p50(foreground).as_secs_f64() * 1000.0
    );
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
