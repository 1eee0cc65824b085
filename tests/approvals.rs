//! Durable approvals: a request the policy cannot decide is a record in the session's stream
//! that outlives the process that asked; any process decides it (the CLI, the API), the first
//! decision wins, a deadline expires it even with no process alive, and the step that asked
//! runs once, after an approving decision, whoever calls it next.

use crate::util::{child_test, is_child, TempDir};
use correx::{
    ApprovalDecision, ApprovalError, CancelToken, EventStore, Runtime, RuntimeConfig, SessionError,
    ToolErrorKind, ToolRequest, ToolResult,
};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A runtime whose approvals are durable (`deadline_secs` when given), with `file_edit` on
/// `DIR/work`.
pub fn runtime(
    dir: &Path,
    deadline_secs: Option<u64>,
) -> Result<Runtime, Box<dyn std::error::Error>> {
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    if !work.join("marker.txt").exists() {
        std::fs::write(work.join("marker.txt"), "")?;
    }
    let mut approvals = json!({"engine": "durable"});
    if let Some(d) = deadline_secs {
        approvals["deadline_secs"] = json!(d);
    }
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {"file_edit": {"enabled": true, "allowed_paths": [&work]}},
            "approvals": approvals
        })
        .to_string(),
    )?;
    Ok(Runtime::new(&config, Arc::new(correx::DenyAll))?)
}

/// The step's request: append `text` to the marker.
pub fn append(session: &str, dir: &Path, text: &str) -> ToolRequest {
    ToolRequest::json(
        session,
        "file_edit",
        json!({"operation": "append", "path": dir.join("work/marker.txt"), "content": text}),
    )
    .expect("an object")
}

fn cli(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_correx"));
    c.args(args);
    c
}

/// The event types of `session`'s stream, in order, without the steps' own records.
fn run_events(rt: &Runtime, session: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let events = rt
        .events()
        .read_stream(&format!("session-{session}"), 1, 1000)?;
    Ok(events
        .into_iter()
        .map(|e| e.type_id)
        .filter(|t| t.starts_with("tool."))
        .collect())
}

/// The asking process: calls step `edit` once and prints how it answered.
#[test]
#[ignore = "a child of the approvals tests; run by them"]
fn approval_step_child() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let deadline = std::env::var("CORREX_CHILD_DEADLINE")
        .ok()
        .and_then(|d| d.parse().ok());
    let rt = runtime(&dir, deadline)?;
    let s = rt.session("s1")?;
    match s.execute(
        "edit",
        rt.executor(),
        &append("s1", &dir, "x\n"),
        None,
        &CancelToken::new(),
    ) {
        Err(SessionError::Pending { request_id, .. }) => println!("\nANSWER PENDING {request_id}"),
        Ok(step) => println!(
            "\nANSWER DONE {} replayed={}",
            serde_json::to_string(&step.value)?,
            step.replayed
        ),
        Err(e) => println!("\nANSWER ERROR {e}"),
    }
    Ok(())
}

fn step_in_child(dir: &Path, deadline: Option<u64>) -> Result<String, Box<dyn std::error::Error>> {
    let mut c = child_test("approvals::approval_step_child");
    c.env("CORREX_CHILD_DIR", dir);
    if let Some(d) = deadline {
        c.env("CORREX_CHILD_DEADLINE", d.to_string());
    }
    let out = c.output()?;
    let text = crate::util::both_streams(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("ANSWER ").map(str::to_owned))
        .ok_or_else(|| format!("the child said nothing:\n{text}").into())
}

#[test]
fn a_request_outlives_its_process_is_decided_from_the_cli_and_runs_once_after() -> TestResult {
    let dir = TempDir::new("approval-procs");
    let db = dir.join("events.db");
    // The first process asks and exits: the request is in the log, nothing ran.
    let first = step_in_child(dir.path(), None)?;
    let id = first
        .strip_prefix("PENDING ")
        .ok_or_else(|| format!("the first call waits for a decision: {first}"))?
        .to_owned();
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "");
    // Asked again before a decision: still pending, under the same request.
    assert_eq!(step_in_child(dir.path(), None)?, format!("PENDING {id}"));

    let listed = cli(&["approvals", "list", db.to_str().unwrap_or_default()]).output()?;
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success() && text.contains(&id), "{text}");
    assert!(
        text.contains("file_edit") && text.contains("pending"),
        "{text}"
    );

    // Another process decides.
    let decided = cli(&[
        "approvals",
        "decide",
        db.to_str().unwrap_or_default(),
        "s1",
        &id,
        "approve",
        "--by",
        "alice",
    ])
    .output()?;
    assert!(
        decided.status.success(),
        "{}",
        crate::util::both_streams(&decided)
    );

    // A third runs it: once, after the decision.
    let done = step_in_child(dir.path(), None)?;
    assert!(
        done.starts_with("DONE ") && done.contains("\"success\""),
        "{done}"
    );
    assert!(done.ends_with("replayed=false"), "{done}");
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "x\n");
    // And again: replayed, not run.
    let again = step_in_child(dir.path(), None)?;
    assert!(again.ends_with("replayed=true"), "{again}");
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "x\n");

    let rt = runtime(dir.path(), None)?;
    assert_eq!(
        run_events(&rt, "s1")?,
        [
            "tool.approval_requested",
            "tool.approval_decided",
            "tool.execution_started",
            "tool.execution_completed"
        ],
        "the log shows request, decision, run"
    );
    let record = rt.approvals().get("s1", &id)?.ok_or("the request")?;
    let decision = record.decision.ok_or("its decision")?;
    assert_eq!(decision.decision, "approved");
    assert_eq!(decision.identity.as_deref(), Some("alice"));
    assert!(decision.at_ms >= record.requested_at_ms);
    // Nothing waits any more.
    assert!(rt.approvals().list(false)?.is_empty());
    Ok(())
}

#[test]
fn of_two_deciders_at_once_one_wins_and_the_other_is_told_the_first_decision() -> TestResult {
    let dir = TempDir::new("approval-race");
    let db = dir.join("events.db");
    let first = step_in_child(dir.path(), None)?;
    let id = first
        .strip_prefix("PENDING ")
        .ok_or(first.clone())?
        .to_owned();
    let db = db.to_str().unwrap_or_default().to_owned();
    // Two processes decide at once, one to approve and one to deny.
    let spawn = |answer: &str, by: &str| {
        cli(&["approvals", "decide", &db, "s1", &id, answer, "--by", by])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
    };
    for _ in 0..1 {
        let (a, b) = (spawn("approve", "alice")?, spawn("deny", "bob")?);
        let (a, b) = (a.wait_with_output()?, b.wait_with_output()?);
        let won: Vec<bool> = [&a, &b].iter().map(|o| o.status.success()).collect();
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "exactly one decision wins: {} / {}",
            crate::util::both_streams(&a),
            crate::util::both_streams(&b)
        );
        let loser = if won[0] { &b } else { &a };
        let (winner, decision) = if won[0] {
            ("alice", "approved")
        } else {
            ("bob", "denied")
        };
        let said = String::from_utf8_lossy(&loser.stderr);
        assert!(
            said.contains("decided already") && said.contains(winner) && said.contains(decision),
            "the loser is told the first decision: {said}"
        );
    }
    // The API says the same.
    let rt = runtime(dir.path(), None)?;
    match rt
        .approvals()
        .decide("s1", &id, &ApprovalDecision::Approved, "carol")
    {
        Err(ApprovalError::AlreadyDecided { first, .. }) => {
            assert!(matches!(first.identity.as_deref(), Some("alice" | "bob")))
        }
        other => return Err(format!("a third decision is refused: {other:?}").into()),
    }
    let decided = rt
        .events()
        .read_stream("session-s1", 1, 1000)?
        .into_iter()
        .filter(|e| e.type_id == "tool.approval_decided")
        .count();
    assert_eq!(decided, 1, "one decision recorded");
    Ok(())
}

#[test]
fn a_deadline_passing_with_no_process_alive_is_recorded_expired_once_and_nothing_runs() -> TestResult
{
    let dir = TempDir::new("approval-deadline");
    let db = dir.join("events.db");
    let first = step_in_child(dir.path(), Some(1))?;
    let id = first
        .strip_prefix("PENDING ")
        .ok_or(first.clone())?
        .to_owned();
    // No process is alive while the deadline passes.
    std::thread::sleep(Duration::from_millis(1100));
    for _ in 0..2 {
        let listed = cli(&[
            "approvals",
            "list",
            db.to_str().unwrap_or_default(),
            "--all",
        ])
        .output()?;
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(
            text.contains(&id) && text.contains("expired by deadline"),
            "{text}"
        );
    }
    // A late decision is refused as expired already; the step answers with the denial.
    let late = cli(&[
        "approvals",
        "decide",
        db.to_str().unwrap_or_default(),
        "s1",
        &id,
        "approve",
    ])
    .output()?;
    assert!(!late.status.success());
    assert!(String::from_utf8_lossy(&late.stderr).contains("expired"));
    let done = step_in_child(dir.path(), Some(1))?;
    assert!(
        done.contains("not_allowed") && done.contains("expired"),
        "{done}"
    );
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "");

    let rt = runtime(dir.path(), Some(1))?;
    let events = rt.events().read_stream("session-s1", 1, 1000)?;
    let expired: Vec<_> = events
        .iter()
        .filter(|e| e.type_id == "tool.approval_decided")
        .collect();
    assert_eq!(expired.len(), 1, "recorded once");
    assert_eq!(expired[0].payload["decision"], "expired");
    assert!(
        !events.iter().any(|e| e.type_id == "tool.execution_started"),
        "the run never started"
    );
    Ok(())
}

/// The step's result, from a waiting call while another thread decides.
fn wait_while(
    rt: &Runtime,
    session: &str,
    dir: &Path,
    decide: impl FnOnce(&str) + Send,
) -> Result<ToolResult, Box<dyn std::error::Error>> {
    let s = rt.session(session)?;
    let request = append(session, dir, "w\n");
    let id = match s.execute("edit", rt.executor(), &request, None, &CancelToken::new()) {
        Err(SessionError::Pending { request_id, .. }) => request_id,
        other => return Err(format!("pending first: {other:?}").into()),
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            decide(&id);
        });
        // A new request value (a fresh invocation id) for the same step: the step keeps the
        // id its request was recorded under.
        let again = append(session, dir, "w\n");
        let step = s.execute_waiting(
            "edit",
            rt.executor(),
            &again,
            None,
            Duration::from_secs(20),
            &CancelToken::new(),
        )?;
        assert!(!step.replayed);
        Ok(step.value)
    })
}

#[test]
fn a_waiting_step_runs_on_an_approval_and_a_denial_is_its_recorded_result() -> TestResult {
    let dir = TempDir::new("approval-wait");
    let rt = runtime(dir.path(), None)?;
    let approved = wait_while(&rt, "w1", dir.path(), |id| {
        rt.approvals()
            .decide("w1", id, &ApprovalDecision::Approved, "alice")
            .expect("decided");
    })?;
    assert!(approved.is_success(), "{approved:?}");
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "w\n");

    let denied = wait_while(&rt, "w2", dir.path(), |id| {
        rt.approvals()
            .decide("w2", id, &ApprovalDecision::denied("not today"), "bob")
            .expect("decided");
    })?;
    assert_eq!(denied.error_kind(), Some(ToolErrorKind::NotAllowed));
    assert!(format!("{denied:?}").contains("not today"), "{denied:?}");
    // The denial is the step's result: asked again, it is replayed, and nothing ran.
    let s = rt.session("w2")?;
    let again = s.execute(
        "edit",
        rt.executor(),
        &append("w2", dir.path(), "w\n"),
        None,
        &CancelToken::new(),
    )?;
    assert!(again.replayed);
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "w\n");

    // A wait that runs out is Pending; a cancelled one is Cancelled.
    let s = rt.session("w3")?;
    let req = append("w3", dir.path(), "z\n");
    let short = s.execute_waiting(
        "edit",
        rt.executor(),
        &req,
        None,
        Duration::from_millis(50),
        &CancelToken::new(),
    );
    assert!(
        matches!(short, Err(SessionError::Pending { .. })),
        "{short:?}"
    );
    // Waiting reads the log; it claims the step once, not once per look.
    let claims = rt
        .events()
        .read_stream("session-w3", 1, 1000)?
        .iter()
        .filter(|e| e.type_id == "session.step_started")
        .count();
    assert_eq!(claims, 1, "one try asked; the wait appended nothing");
    let cancel = CancelToken::new();
    cancel.cancel();
    let cancelled = s.execute_waiting(
        "edit",
        rt.executor(),
        &req,
        None,
        Duration::from_secs(5),
        &cancel,
    );
    assert!(
        matches!(cancelled, Err(SessionError::Cancelled)),
        "{cancelled:?}"
    );
    Ok(())
}

#[test]
fn approve_for_the_session_covers_the_next_request_and_bad_decisions_are_typed() -> TestResult {
    let dir = TempDir::new("approval-remember");
    let rt = runtime(dir.path(), None)?;
    let s = rt.session("r1")?;
    let none = CancelToken::new();
    let first = append("r1", dir.path(), "a\n");
    let Err(SessionError::Pending { request_id, .. }) =
        s.execute("one", rt.executor(), &first, None, &none)
    else {
        return Err("pending first".into());
    };
    // Malformed decisions and unknown requests are typed errors; nothing is recorded.
    assert!(matches!(
        rt.approvals()
            .decide("r1", &request_id, &ApprovalDecision::Approved, ""),
        Err(ApprovalError::InvalidRequest(_))
    ));
    assert!(matches!(
        rt.approvals()
            .decide("r1", &request_id, &ApprovalDecision::Deferred, "alice"),
        Err(ApprovalError::InvalidRequest(_))
    ));
    assert!(matches!(
        rt.approvals().decide(
            "r1",
            "no-such-request",
            &ApprovalDecision::Approved,
            "alice"
        ),
        Err(ApprovalError::NotFound { .. })
    ));
    assert!(matches!(
        rt.approvals()
            .decide("other", &request_id, &ApprovalDecision::Approved, "alice"),
        Err(ApprovalError::NotFound { .. })
    ));
    rt.approvals().decide(
        "r1",
        &request_id,
        &ApprovalDecision::ApprovedForSession,
        "alice",
    )?;
    assert!(s
        .execute("one", rt.executor(), &first, None, &none)?
        .value
        .is_success());
    // The same tool again in the session: approved by the earlier answer, no new request.
    let second = s.execute(
        "two",
        rt.executor(),
        &append("r1", dir.path(), "b\n"),
        None,
        &none,
    )?;
    assert!(second.value.is_success(), "{:?}", second.value);
    assert_eq!(
        std::fs::read_to_string(dir.join("work/marker.txt"))?,
        "a\nb\n"
    );
    let requests = run_events(&rt, "r1")?
        .into_iter()
        .filter(|t| t == "tool.approval_requested")
        .count();
    assert_eq!(requests, 1);

    // The log: the request, its decision, and the second run approved by that answer.
    let types: Vec<Value> = rt
        .events()
        .read_all(1, 1000)?
        .into_iter()
        .filter(|e| e.type_id.starts_with("tool.approval"))
        .map(|e| json!(e.type_id))
        .collect();
    assert_eq!(
        types,
        [
            json!("tool.approval_requested"),
            json!("tool.approval_decided"),
            json!("tool.approval_decided")
        ]
    );
    Ok(())
}

// ---- The kill battery: SIGKILLs between asking and running, the asker and the decider. ----

const BATTERY_STEPS: usize = 30;

/// The agent: `BATTERY_STEPS` tool steps, each waiting for a decision; a step a crash
/// interrupted (its file restored) is tried again under a new key. Prints `ALLDONE`.
#[test]
#[ignore = "a child of the kill battery; run by it"]
fn approval_agent_child() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let rt = runtime(&dir, None)?;
    let s = rt.session("k")?;
    let none = CancelToken::new();
    for i in 0..BATTERY_STEPS {
        for t in 0.. {
            let request = append("k", &dir, &format!("line {i}\n"));
            let step = s.execute_waiting(
                &format!("step-{i}-{t}"),
                rt.executor(),
                &request,
                None,
                Duration::from_secs(120),
                &none,
            )?;
            let state = step
                .value
                .data()
                .and_then(|d| d["state"].as_str())
                .map(str::to_owned);
            match step.value.error_kind() {
                None => break,
                Some(ToolErrorKind::Interrupted) if state.as_deref() == Some("completed") => break,
                Some(ToolErrorKind::Interrupted) => continue,
                Some(other) => return Err(format!("step {i}: {other:?}: {:?}", step.value).into()),
            }
        }
    }
    println!("\nALLDONE");
    Ok(())
}

/// The decider: approves every request that waits, again and again.
#[test]
#[ignore = "a child of the kill battery; run by it"]
fn approval_decider_child() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let store: Arc<dyn EventStore> = Arc::new(correx::EventLog::open(
        dir.join("events.db"),
        correx::StoreOptions::default(),
    )?);
    let approvals = correx::Approvals::new(store);
    loop {
        for r in approvals.of_session("k")? {
            if r.decision.is_none() {
                match approvals.decide("k", &r.request_id, &ApprovalDecision::Approved, "decider") {
                    Ok(_) | Err(ApprovalError::AlreadyDecided { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn killed_at_random_between_asking_and_running_no_request_is_lost_and_each_run_is_approved_once(
) -> TestResult {
    let dir = TempDir::new("approval-battery");
    drop(runtime(dir.path(), None)?);
    let spawn = |name: &str| {
        child_test(&format!("approvals::{name}"))
            .env("CORREX_CHILD_DIR", dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
    };
    let mut rng = crate::util::Rng::from_clock();
    println!("seed {}", rng.0);
    let (mut agent, mut decider) = (
        spawn("approval_agent_child")?,
        spawn("approval_decider_child")?,
    );
    let mut kills = 0;
    let mut round = 0u64;
    while kills < 200 {
        round += 1;
        std::thread::sleep(Duration::from_millis(1 + rng.below(60)));
        let victim = if rng.below(2) == 0 {
            &mut agent
        } else {
            &mut decider
        };
        if victim.try_wait()?.is_none() {
            victim.kill()?;
            kills += 1;
        }
        victim.wait()?;
        if agent.try_wait()?.is_some() {
            let out =
                std::mem::replace(&mut agent, spawn("approval_agent_child")?).wait_with_output()?;
            let text = crate::util::both_streams(&out);
            assert!(
                out.status.code().is_none() || out.status.success(),
                "the agent failed: {text}"
            );
        }
        if decider.try_wait()?.is_some() {
            decider = spawn("approval_decider_child")?;
        }
        assert!(round < 5000, "the battery makes no progress");
    }
    // Left alone, the agent finishes.
    let out = agent.wait_with_output()?;
    let _ = decider.kill();
    let _ = decider.wait();
    let text = crate::util::both_streams(&out);
    assert!(out.status.success() && text.contains("ALLDONE"), "{text}");

    let expected: String = (0..BATTERY_STEPS).map(|i| format!("line {i}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(dir.join("work/marker.txt"))?,
        expected,
        "each step's change once, none lost"
    );
    let rt = runtime(dir.path(), None)?;
    let events = rt.events().read_stream("session-k", 1, 100_000)?;
    let mut approved = std::collections::HashMap::new();
    let mut requested = std::collections::HashSet::new();
    let mut starts = 0;
    for e in &events {
        let id = e.payload["invocation_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match e.type_id.as_str() {
            "tool.approval_requested" => {
                assert!(requested.insert(id), "a run asked once");
            }
            "tool.approval_decided" => {
                assert_eq!(e.payload["answers_request"], true);
                assert_eq!(e.payload["decision"], "approved");
                assert!(approved.insert(id, e.position).is_none(), "decided once");
            }
            "tool.execution_started" => {
                starts += 1;
                assert!(
                    approved.get(&id).is_some_and(|at| *at < e.position),
                    "run {id} started without an approving decision before it"
                );
            }
            _ => {}
        }
    }
    assert!(requested.len() >= BATTERY_STEPS);
    assert!(
        requested.iter().all(|id| approved.contains_key(id)),
        "every request was decided: none lost"
    );
    assert!(rt.approvals().list(false)?.is_empty(), "nothing waits");
    println!(
        "kills: {kills}, requests: {}, runs started: {starts}",
        requested.len()
    );
    Ok(())
}

#[test]
fn a_plain_run_asked_again_before_its_decision_stays_pending_and_runs_after_it() -> TestResult {
    let dir = TempDir::new("approval-plain");
    let rt = runtime(dir.path(), None)?;
    use correx::ToolExecutor;
    let request = append("p1", dir.path(), "p\n");
    for _ in 0..2 {
        let r = rt.executor().execute(&request);
        assert_eq!(r.error_kind(), Some(ToolErrorKind::Pending), "{r:?}");
        let data = r.data().ok_or("data")?;
        assert_eq!(
            data["approval"]["request_id"],
            request.invocation_id.as_str()
        );
    }
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "");
    assert_eq!(rt.approvals().list(false)?.len(), 1, "asked once");
    rt.approvals().decide(
        "p1",
        request.invocation_id.as_str(),
        &ApprovalDecision::Approved,
        "alice",
    )?;
    assert!(rt.executor().execute(&request).is_success());
    assert_eq!(std::fs::read_to_string(dir.join("work/marker.txt"))?, "p\n");
    Ok(())
}
