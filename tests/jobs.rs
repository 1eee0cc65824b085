//! Background jobs: a shell request with `"background": true` returns once its program runs;
//! the `jobs` tool reads its output by cursor, waits for, signals and stops it; each start and
//! end is recorded; jobs end at their timeout, with their session, with the runtime, and with
//! a host killed by SIGKILL (the next runtime records them `interrupted`). Nothing a job
//! started outlives it, however it detached. Each scenario runs as root and again as nobody.

use crate::tools_util::{count_processes, marker};
use crate::util::{child_test, is_child, TempDir};
use correx::{EventStore, Runtime, RuntimeConfig, ToolExecutor, ToolRequest, ToolResult};
use serde_json::{json, Value};
use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Live processes whose command line holds `m`, once the kernel has had a moment.
fn survivors(m: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let n = count_processes(|c| c.contains(m));
        if n == 0 || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runtime(
    dir: &std::path::Path,
    max_per_session: usize,
) -> Result<Runtime, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir.join("work"))?;
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {
                "shell": {"enabled": true, "allowed_executables": ["sh", "sleep", "setsid"],
                          "working_dirs": [dir.join("work")],
                          "jobs": {"max_per_session": max_per_session, "buffer_bytes": 4096}},
                "jobs": {"enabled": true}
            },
            "approvals": {"engine": "auto"}
        })
        .to_string(),
    )?;
    Ok(Runtime::new(&config, Arc::new(correx::DenyAll))?)
}

fn call(rt: &Runtime, session: &str, tool: &str, params: Value) -> ToolResult {
    let req = ToolRequest::json(session, tool, params).expect("an object");
    rt.executor().execute(&req)
}

/// A successful call's data.
fn data(r: &ToolResult) -> Value {
    match r {
        ToolResult::Success { data, .. } => data.clone().unwrap_or(Value::Null),
        ToolResult::Failure { reason, .. } => panic!("failed: {reason}"),
    }
}

fn failure(r: &ToolResult) -> (String, String) {
    match r {
        ToolResult::Failure { kind, reason, .. } => (kind.as_str().to_owned(), reason.clone()),
        ToolResult::Success { output, .. } => panic!("succeeded: {output}"),
    }
}

fn start(rt: &Runtime, session: &str, argv: &[&str], extra: Value) -> String {
    let mut p = json!({"argv": argv, "background": true});
    if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
        p.extend(extra.clone());
    }
    let d = data(&call(rt, session, "shell", p));
    d["job_id"].as_str().expect("a job id").to_owned()
}

fn jobs(rt: &Runtime, session: &str, params: Value) -> Value {
    data(&call(rt, session, "jobs", params))
}

/// Reads a job's stdout from `cursor` until it holds `want`, or 10 s pass.
fn read_until(rt: &Runtime, session: &str, job: &str, want: &str) -> (String, Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = String::new();
    let mut cursor = 0;
    loop {
        let d = jobs(
            rt,
            session,
            json!({"operation": "read", "job_id": job, "stdout_cursor": cursor}),
        );
        got.push_str(d["stdout"].as_str().unwrap_or_default());
        cursor = d["stdout_cursor"].as_u64().unwrap_or(0);
        if got.contains(want) || Instant::now() > deadline {
            return (got, d);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn job_events(rt: &Runtime, session: &str) -> Vec<(String, Value)> {
    rt.events()
        .read_stream(&correx::session_stream(session), 1, 10_000)
        .expect("the session's stream")
        .into_iter()
        .filter(|e| e.type_id.starts_with("job."))
        .map(|e| (e.type_id, e.payload))
        .collect()
}

fn exited(rt: &Runtime, session: &str, job: &str) -> Value {
    job_events(rt, session)
        .into_iter()
        .find(|(t, p)| t == "job.exited" && p["job_id"] == job)
        .map(|(_, p)| p)
        .unwrap_or(Value::Null)
}

// ------------------------------------------------------------------------------ scenarios

fn lifecycle() -> TestResult {
    let dir = TempDir::new("jobs");
    let rt = runtime(dir.path(), 2)?;
    let m = marker();

    // Output by cursor, both streams; a detached grandchild; stopped: nothing survives.
    let script = format!("echo one; echo err >&2; setsid sleep 3{m} & echo two; exec sleep 2{m}");
    let job = start(&rt, "s", &["sh", "-c", &script], json!({}));
    let (out, last) = read_until(&rt, "s", &job, "two\n");
    assert_eq!(out, "one\ntwo\n");
    assert_eq!(last["status"]["state"], "running", "{last}");
    let again = jobs(
        &rt,
        "s",
        json!({"operation": "read", "job_id": job, "stdout_cursor": last["stdout_cursor"],
               "stderr_cursor": 0}),
    );
    assert_eq!(again["stdout"], "", "nothing new since the cursor: {again}");
    assert_eq!(again["stderr"], "err\n");
    assert_eq!(
        count_processes(|c| c.contains(&m)),
        2,
        "the job and its grandchild run"
    );
    let listed = jobs(&rt, "s", json!({"operation": "list"}));
    assert_eq!(listed["jobs"][0]["job_id"], job.as_str());
    assert_eq!(listed["jobs"][0]["state"], "running");
    let stopped = jobs(&rt, "s", json!({"operation": "stop", "job_id": job}));
    assert_eq!(stopped["status"]["reason"], "stopped", "{stopped}");
    assert_eq!(
        survivors(&m),
        0,
        "a stopped job leaves nothing, however it detached"
    );
    let ev = job_events(&rt, "s");
    assert_eq!(ev[0].0, "job.started");
    assert_eq!(ev[0].1["command"], json!(["sh", "-c", script]));
    let end = exited(&rt, "s", &job);
    assert_eq!(end["reason"], "stopped", "{end}");
    assert_eq!(
        (end["stdout_bytes"].as_u64(), end["stderr_bytes"].as_u64()),
        (Some(8), Some(4))
    );

    // Its own exit, with its code, after a wait; confined like any run: nothing written
    // outside the working dirs.
    let outside = std::env::temp_dir().join(format!("correx-job-outside-{m}"));
    let probe = format!("echo x > {}; exit 3", outside.display());
    let job = start(&rt, "s", &["sh", "-c", &probe], json!({}));
    let waited = jobs(
        &rt,
        "s",
        json!({"operation": "wait", "job_id": job, "timeout_ms": 10_000}),
    );
    assert_eq!(waited["status"]["reason"], "exited", "{waited}");
    assert_eq!(waited["status"]["exit_code"], 3);
    assert!(!outside.exists(), "a job wrote outside its working dirs");
    let (kind, _) = failure(&call(
        &rt,
        "s",
        "jobs",
        json!({"operation": "read", "job_id": "job-x"}),
    ));
    assert_eq!(kind, "invalid_request");

    // Its timeout.
    let job = start(
        &rt,
        "s",
        &["sleep", &format!("4{m}")],
        json!({"timeout_ms": 300}),
    );
    let waited = jobs(
        &rt,
        "s",
        json!({"operation": "wait", "job_id": job, "timeout_ms": 10_000}),
    );
    assert_eq!(waited["status"]["reason"], "timed_out", "{waited}");
    assert_eq!(survivors(&m), 0);

    // A signal it handles.
    let trap = format!("trap 'echo got-usr1; exit 0' USR1; echo ready; sleep 5{m} & wait");
    let job = start(&rt, "s", &["sh", "-c", &trap], json!({}));
    read_until(&rt, "s", &job, "ready");
    jobs(
        &rt,
        "s",
        json!({"operation": "signal", "job_id": job, "signal": "usr1"}),
    );
    let waited = jobs(
        &rt,
        "s",
        json!({"operation": "wait", "job_id": job, "timeout_ms": 10_000}),
    );
    assert_eq!(waited["status"]["exit_code"], 0, "{waited}");
    let (out, _) = read_until(&rt, "s", &job, "got-usr1");
    assert!(out.contains("got-usr1"), "{out}");
    let (kind, reason) = failure(&call(
        &rt,
        "s",
        "jobs",
        json!({"operation": "signal", "job_id": job, "signal": "SEGV"}),
    ));
    assert_eq!(kind, "invalid_request", "{reason}");

    // The session's bound; another session has its own; a session cannot reach another's
    // jobs; ending a session ends its jobs.
    let a = start(&rt, "s", &["sleep", &format!("6{m}")], json!({}));
    let _b = start(&rt, "s", &["sleep", &format!("6{m}")], json!({}));
    let (kind, reason) = failure(&call(
        &rt,
        "s",
        "shell",
        json!({"argv": ["sleep", "1"], "background": true}),
    ));
    assert_eq!(kind, "not_allowed");
    assert!(reason.contains("max_per_session"), "{reason}");
    let other = start(&rt, "t", &["sleep", &format!("7{m}")], json!({}));
    let (kind, _) = failure(&call(
        &rt,
        "t",
        "jobs",
        json!({"operation": "stop", "job_id": a}),
    ));
    assert_eq!(kind, "invalid_request", "session t stopped session s's job");
    rt.jobs().end_session("s");
    assert_eq!(exited(&rt, "s", &a)["reason"], "session_ended");
    assert!(rt.jobs().list("s").is_empty());
    assert_eq!(count_processes(|c| c.contains(&format!("6{m}"))), 0);

    // Bad shapes are refused before anything runs.
    for bad in [
        json!({"argv": ["sleep", "1"], "background": "yes"}),
        json!({"argv": ["sleep", "1"], "background": true, "timeout_ms": -1}),
    ] {
        let (kind, _) = failure(&call(&rt, "s", "shell", bad));
        assert_eq!(kind, "invalid_request");
    }
    for bad in [
        json!({"operation": 3}),
        json!({"operation": "read"}),
        json!({"operation": "read", "job_id": other, "max_bytes": "all"}),
        json!({"operation": "wait", "job_id": other, "timeout_ms": 3_600_000}),
        json!({"operation": "list", "extra": 1}),
    ] {
        let (kind, reason) = failure(&call(&rt, "t", "jobs", bad.clone()));
        assert_eq!(kind, "invalid_request", "{bad}: {reason}");
    }

    // The runtime closing ends the rest, and records it, even while someone still holds its
    // job table.
    let held = rt.jobs().clone();
    drop(rt);
    assert_eq!(survivors(&m), 0, "a job outlived its runtime");
    let left = held.list("t");
    assert!(
        matches!(
            left[0].status,
            correx::JobStatus::Ended {
                reason: correx::JobEndReason::RuntimeClosed,
                ..
            }
        ),
        "{left:?}"
    );
    drop(held);
    let rt = runtime(dir.path(), 2)?;
    assert_eq!(exited(&rt, "t", &other)["reason"], "runtime_closed");
    assert!(rt.interrupted_jobs().is_empty());
    Ok(())
}

/// A host killed with SIGKILL while its job runs: the job and what it started die with it,
/// and the next runtime on the same sandbox root records the job `interrupted`.
fn host_killed() -> TestResult {
    let dir = TempDir::new("jobs-killed");
    let m = marker();
    let mut child = child_test("jobs::job_host_child")
        .env("CORREX_CHILD_DIR", dir.path())
        .env("CORREX_CHILD_MARKER", &m)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let job = loop {
        match lines.next() {
            Some(line) => {
                // The harness prints the test's name on the same line first.
                if let Some((_, id)) = line?.split_once("job: ") {
                    break id.trim().to_owned();
                }
            }
            None => panic!("the host child ended before starting its job"),
        }
    };
    assert_eq!(
        count_processes(|c| c.contains(&m)),
        2,
        "the job and its grandchild run"
    );
    child.kill()?;
    child.wait()?;
    assert_eq!(survivors(&m), 0, "a job outlived its host's SIGKILL");
    let rt = runtime(dir.path(), 2)?;
    let closed: Vec<&str> = rt
        .interrupted_jobs()
        .iter()
        .map(|j| j.job_id.as_str())
        .collect();
    assert_eq!(closed, [job.as_str()]);
    assert_eq!(exited(&rt, "k", &job)["reason"], "interrupted");
    drop(rt);
    // Recorded once: a later runtime finds nothing more to close.
    let rt = runtime(dir.path(), 2)?;
    assert!(rt.interrupted_jobs().is_empty());
    let ends = job_events(&rt, "k")
        .into_iter()
        .filter(|(t, _)| t == "job.exited")
        .count();
    assert_eq!(ends, 1);
    Ok(())
}

/// The host side of [`host_killed`]: starts a job, says its id, and waits to be killed.
#[test]
#[ignore = "helper: run by host_killed"]
fn job_host_child() {
    if !is_child() {
        return;
    }
    let dir = std::path::PathBuf::from(std::env::var_os("CORREX_CHILD_DIR").expect("dir"));
    let m = std::env::var("CORREX_CHILD_MARKER").expect("marker");
    let rt = runtime(&dir, 2).expect("a runtime");
    let script = format!("setsid sleep 9{m} & exec sleep 8{m}");
    let job = start(&rt, "k", &["sh", "-c", &script], json!({}));
    // Both processes run before the host says so.
    while count_processes(|c| c.contains(&m)) < 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("job: {job}");
    std::thread::sleep(Duration::from_secs(600));
}

type Scenario = fn() -> TestResult;

const SCENARIOS: &[(&str, Scenario)] = &[("lifecycle", lifecycle), ("host_killed", host_killed)];

/// Runs `name` here and, when we are root, again as nobody in a child test process.
fn both(name: &str) -> TestResult {
    let (_, scenario) = SCENARIOS.iter().find(|(n, _)| *n == name).expect("known");
    scenario()?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    crate::util::assert_child_passes(
        child_test("jobs::unprivileged_child").env("CORREX_CHILD_SCENARIO", name),
        "scenario passed",
        &format!("{name} as nobody"),
    )?;
    Ok(())
}

#[test]
#[ignore = "helper: run by the unprivileged variants"]
fn unprivileged_child() {
    if !is_child() {
        return;
    }
    let name = std::env::var("CORREX_CHILD_SCENARIO").expect("scenario name");
    crate::util::become_nobody();
    let (_, scenario) = SCENARIOS.iter().find(|(n, _)| *n == name).expect("known");
    scenario().expect("the scenario");
    println!("scenario passed");
}

#[test]
fn a_background_job_is_read_waited_for_signalled_stopped_and_recorded() -> TestResult {
    both("lifecycle")
}

#[test]
fn a_host_killed_mid_job_leaves_no_process_and_the_next_runtime_records_it() -> TestResult {
    both("host_killed")
}
