use crate::util::{child_test, is_child, BeforeAppend, HookedStore, TempDir};
use correx::Recoverable;
use correx::{
    session_stream, ApprovalContext, ApprovalEngine, ApprovalRequest, AutoApprove,
    CallbackApprover, DenyAll, DispatchingToolExecutor, EventStore, FileAffectingTool,
    FileReadTool, FileWriteTool, RecordedEvent, RuntimeConfig, SandboxedToolExecutor, SessionId,
    SqliteEventStore, Tier, Tool, ToolCapability, ToolConfig, ToolExecutor, ToolRegistry,
    ToolRequest, ToolResult, ValidationResult,
};
use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

type Behaviour = dyn Fn(&ToolRequest, &Path) -> ToolResult + Send + Sync;

/// A file-affecting tool whose behaviour the test scripts; it counts its calls.
struct Scripted {
    name: &'static str,
    tier: Tier,
    target: PathBuf,
    calls: AtomicUsize,
    behaviour: Box<Behaviour>,
}

impl Tool for Scripted {
    fn name(&self) -> &str {
        self.name
    }
    fn tier(&self) -> Tier {
        self.tier
    }
    fn required_capabilities(&self) -> &[ToolCapability] {
        &[ToolCapability::FileWrite]
    }
    fn validate_request(&self, _: &ToolRequest) -> ValidationResult {
        ValidationResult::Valid
    }
    fn execute(&self, request: &ToolRequest) -> ToolResult {
        self.calls.fetch_add(1, Ordering::SeqCst);
        (self.behaviour)(request, &self.target)
    }
    fn as_file_affecting(&self) -> Option<&dyn FileAffectingTool> {
        Some(self)
    }
}

impl FileAffectingTool for Scripted {
    fn affected_paths(&self, request: &ToolRequest) -> Result<Vec<PathBuf>, String> {
        match request.str_param("path") {
            Some(p) => Ok(vec![PathBuf::from(p)]),
            None => Ok(vec![self.target.clone()]),
        }
    }
}

fn scripted(
    name: &'static str,
    tier: Tier,
    target: PathBuf,
    behaviour: impl Fn(&ToolRequest, &Path) -> ToolResult + Send + Sync + 'static,
) -> Arc<Scripted> {
    Arc::new(Scripted {
        name,
        tier,
        target,
        calls: AtomicUsize::new(0),
        behaviour: Box::new(behaviour),
    })
}

/// An approver that answers `answer` and counts how often it was asked.
fn counting_approver(answer: bool) -> (Arc<AtomicUsize>, CallbackApprover) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let approvals = CallbackApprover::new(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(answer)
    });
    (asked, approvals)
}

struct Rig {
    tmp: TempDir,
    store: Arc<SqliteEventStore>,
    work_root: PathBuf,
}

impl Rig {
    /// Waits (up to 500 ms) until no journal directory's lock is held. A dropped executor's
    /// lock can outlive it for a moment: a process another test forks at that instant holds a
    /// copy of the lock's descriptor until it execs, and a recovery meanwhile would take the
    /// dead executor for a live one.
    fn settle(&self) {
        let deadline = std::time::Instant::now() + Duration::from_millis(500);
        let held = || {
            std::fs::read_dir(&self.work_root)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|d| d.file_name().to_string_lossy().starts_with("run-"))
                .any(|d| {
                    let Ok(f) = std::fs::File::open(d.path().join("lock")) else {
                        return false;
                    };
                    // SAFETY: flock on a descriptor this closure owns; released when f closes.
                    let r = unsafe {
                        libc::flock(
                            std::os::fd::AsRawFd::as_raw_fd(&f),
                            libc::LOCK_EX | libc::LOCK_NB,
                        )
                    };
                    r != 0
                })
        };
        while held() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn new() -> Result<Rig, Box<dyn std::error::Error>> {
        let tmp = TempDir::new("sandbox");
        let store = Arc::new(SqliteEventStore::open(tmp.join("events.db"))?);
        let work_root = tmp.join("work");
        Ok(Rig {
            tmp,
            store,
            work_root,
        })
    }

    fn executor(
        &self,
        tools: Vec<Arc<dyn Tool>>,
        approvals: Arc<dyn ApprovalEngine>,
    ) -> Result<SandboxedToolExecutor, Box<dyn std::error::Error>> {
        self.settle();
        let registry = ToolRegistry::build(tools)?;
        Ok(SandboxedToolExecutor::new(
            Arc::new(DispatchingToolExecutor::new(registry.clone())),
            registry,
            approvals,
            self.store.clone(),
            self.work_root.clone(),
        )?)
    }

    /// The session's events but approval decisions (the approval tests read those).
    fn events(&self) -> Result<Vec<RecordedEvent>, correx::EventStoreError> {
        let all = self.all_events()?;
        Ok(all
            .into_iter()
            .filter(|e| e.type_id != "tool.approval_decided")
            .collect())
    }

    fn all_events(&self) -> Result<Vec<RecordedEvent>, correx::EventStoreError> {
        self.store.read_stream(&session_stream("s"), 1, 1000)
    }

    /// No open run journal is left under the working root (live executors keep their
    /// directories, with idle journals for reuse), and no backup files beside the targets.
    fn assert_clean(&self, dir: &Path) -> TestResult {
        let left: Vec<_> = std::fs::read_dir(&self.work_root)?
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n != "lock"))
            .filter(|p| std::fs::read(p).map_or(true, |b| b.first() != Some(&b'I')))
            .collect();
        assert!(left.is_empty(), "left in the working root: {left:?}");
        let baks: Vec<_> = std::fs::read_dir(dir)?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("correx-bak"))
            .collect();
        assert!(baks.is_empty(), "backup files left: {baks:?}");
        Ok(())
    }
}

fn req(tool: &str, params: serde_json::Value) -> ToolRequest {
    ToolRequest::new(
        SessionId::from("s"),
        tool,
        params.as_object().cloned().unwrap_or_default(),
    )
}

/// The run's types without its approval decision (the approval tests look at those).
fn types(events: &[RecordedEvent]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e.type_id.as_str())
        .filter(|t| *t != "tool.approval_decided")
        .collect()
}

#[test]
fn a_denied_tool_is_recorded_as_rejected_and_never_runs() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("f.txt");
    let tool = scripted("risky", Tier::T3, target.clone(), |r, _| {
        ToolResult::success(&r.invocation_id, "ran")
    });
    let ex = rig.executor(vec![tool.clone()], Arc::new(DenyAll))?;
    let r = ex.execute(&req("risky", json!({})));
    assert!(matches!(
        r,
        ToolResult::Failure {
            recoverable: false,
            ..
        }
    ));
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    let events = rig.all_events()?;
    assert_eq!(types(&events), ["tool.execution_rejected"]);
    // The decision is recorded first, in the same transaction, naming who decided.
    assert_eq!(events[0].type_id, "tool.approval_decided");
    assert_eq!(events[0].payload["decision"], "denied");
    assert_eq!(events.len(), 2);
    Ok(())
}

#[test]
fn t0_and_t1_tools_run_without_asking() -> TestResult {
    let rig = Rig::new()?;
    std::fs::write(rig.tmp.join("a.txt"), "hello")?;
    let read = Arc::new(FileReadTool::new(&[rig.tmp.path().to_path_buf()])?);
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let approvals = CallbackApprover::new(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(false)
    });
    let ex = rig.executor(vec![read], Arc::new(approvals))?;
    let r = ex.execute(&req(
        "file_read",
        json!({"operation": "read", "path": "a.txt"}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 0);
    assert_eq!(
        types(&rig.events()?),
        ["tool.execution_started", "tool.execution_completed"]
    );
    Ok(())
}

#[test]
fn a_request_cancelled_before_it_starts_never_reaches_the_approver() -> TestResult {
    let rig = Rig::new()?;
    let write = Arc::new(FileWriteTool::new(&[rig.tmp.path().to_path_buf()])?);
    let (asked, approvals) = counting_approver(true);
    let ex = rig.executor(vec![write], Arc::new(approvals))?;
    let cancel = correx::CancelToken::new();
    cancel.cancel();
    let r = ex.execute_cancellable(
        &req(
            "file_write",
            json!({"operation": "write", "path": "a.txt", "content": "x"}),
        ),
        &cancel,
    );
    match &r {
        ToolResult::Failure { kind, .. } => assert_eq!(kind.as_str(), "cancelled"),
        other => return Err(format!("{other:?}").into()),
    }
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the approver was asked");
    assert!(!rig.tmp.join("a.txt").exists());
    let events = rig.events()?;
    assert_eq!(types(&events), ["tool.execution_rejected"]);
    assert_eq!(events[0].payload["kind"], "cancelled");
    Ok(())
}

/// A host killed while it removed its journal directory leaves it without its lock file: the
/// next executor on the root removes it (recovery used to skip it forever).
#[test]
fn a_run_directory_left_without_its_lock_is_removed() -> TestResult {
    let rig = Rig::new()?;
    // The root as an executor makes it (private), with the directory a dead one left.
    drop(rig.executor(vec![], Arc::new(DenyAll))?);
    let left = rig
        .work_root
        .join("run-01a23500-0000-7000-8000-000000000000");
    std::fs::create_dir(&left)?;
    let ex = rig.executor(vec![], Arc::new(DenyAll))?;
    assert!(!left.exists(), "a lockless run directory survived recovery");
    drop(ex);
    Ok(())
}

#[test]
fn an_invalid_request_fails_at_once_and_never_reaches_the_approver() -> TestResult {
    let rig = Rig::new()?;
    let write = Arc::new(FileWriteTool::new(&[rig.tmp.path().to_path_buf()])?);
    let (asked, approvals) = counting_approver(true);
    let ex = rig.executor(vec![write], Arc::new(approvals))?;
    // No "content": the tool's own validation says so, and no person is asked about it.
    let r = ex.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "a.txt"}),
    ));
    match &r {
        ToolResult::Failure {
            reason,
            recoverable,
            ..
        } => {
            assert!(
                reason.starts_with("invalid request:") && reason.contains("content"),
                "{reason}"
            );
            assert!(!recoverable);
        }
        other => panic!("an invalid request ran: {other:?}"),
    }
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the approver was asked");
    assert!(!rig.tmp.join("a.txt").exists());
    let events = rig.events()?;
    assert_eq!(types(&events), vec!["tool.execution_rejected"]);
    assert!(events[0].payload["reason"]
        .as_str()
        .is_some_and(|r| r.starts_with("invalid request:")));
    // A valid request is asked about and runs.
    let r = ex.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "a.txt", "content": "x"}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn an_unknown_tool_fails_unrecoverably() -> TestResult {
    let rig = Rig::new()?;
    let ex = rig.executor(vec![], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    let r = ex.execute(&req("nope", json!({})));
    assert!(matches!(
        r,
        ToolResult::Failure {
            recoverable: false,
            ..
        }
    ));
    Ok(())
}

#[test]
fn a_failing_tool_has_its_file_restored_byte_for_byte() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("f.bin");
    let original: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(&target, &original)?;
    let tool = scripted("mangle", Tier::T2, target.clone(), |r, t| {
        let _ = std::fs::write(t, b"garbage");
        ToolResult::failure(&r.invocation_id, "it went wrong", Recoverable::Yes)
    });
    let ex = rig.executor(vec![tool], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    let r = ex.execute(&req("mangle", json!({})));
    assert!(!r.is_success());
    assert_eq!(std::fs::read(&target)?, original);
    assert_eq!(
        types(&rig.events()?),
        ["tool.execution_started", "tool.execution_failed"]
    );
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn a_file_created_by_a_failing_tool_is_removed() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("new.txt");
    let tool = scripted("create", Tier::T2, target.clone(), |r, t| {
        let _ = std::fs::write(t, b"half");
        ToolResult::failure(&r.invocation_id, "failed after creating", Recoverable::Yes)
    });
    let ex = rig.executor(vec![tool], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    assert!(!ex.execute(&req("create", json!({}))).is_success());
    assert!(!target.exists());
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn a_panicking_tool_leaves_files_restored_and_a_failed_event() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("f.txt");
    std::fs::write(&target, "before")?;
    let tool = scripted("boom", Tier::T2, target.clone(), |_, t| {
        let _ = std::fs::write(t, "after");
        panic!("tool bug");
    });
    let ex = rig.executor(vec![tool], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    let r = ex.execute(&req("boom", json!({})));
    match &r {
        ToolResult::Failure { reason, .. } => {
            assert!(reason.contains("panicked: tool bug"), "{reason}")
        }
        ToolResult::Success { .. } => return Err("a panic counted as success".into()),
    }
    assert_eq!(std::fs::read_to_string(&target)?, "before");
    let events = rig.events()?;
    assert_eq!(
        types(&events),
        ["tool.execution_started", "tool.execution_failed"]
    );
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn a_failed_backup_stops_the_tool_before_it_runs() -> TestResult {
    let rig = Rig::new()?;
    let dir_target = rig.tmp.join("a-directory");
    std::fs::create_dir(&dir_target)?;
    let tool = scripted("dirs", Tier::T2, dir_target, |r, _| {
        ToolResult::success(&r.invocation_id, "ran")
    });
    let ex = rig.executor(vec![tool.clone()], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    let r = ex.execute(&req("dirs", json!({})));
    assert!(
        matches!(&r, ToolResult::Failure { reason, .. } if reason.contains("backup")),
        "{r:?}"
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    // Backups come before the start: a run that never started is a rejection.
    let events = rig.events()?;
    assert_eq!(types(&events), ["tool.execution_rejected"]);
    assert_eq!(events[0].payload["kind"], "io");
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn success_drops_backups_and_removes_the_working_dir() -> TestResult {
    let rig = Rig::new()?;
    std::fs::write(rig.tmp.join("f.txt"), "old")?;
    let write = Arc::new(FileWriteTool::new(&[rig.tmp.path().to_path_buf()])?);
    let ex = rig.executor(vec![write], Arc::new(AutoApprove::up_to(Tier::T2)))?;
    let r = ex.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "f.txt", "content": "new"}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(std::fs::read_to_string(rig.tmp.join("f.txt"))?, "new");
    assert_eq!(
        types(&rig.events()?),
        ["tool.execution_started", "tool.execution_completed"]
    );
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn a_running_invocation_has_its_own_private_journal() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let rig = Rig::new()?;
    let root = rig.work_root.clone();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let tool = scripted("peek", Tier::T0, rig.tmp.join("x"), move |r, _| {
        let mode = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0)
        };
        for d in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            for j in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                if j.file_name().to_string_lossy().ends_with(".run") {
                    let bytes = std::fs::read(j.path()).unwrap_or_default();
                    let mine = String::from_utf8_lossy(&bytes).contains(r.invocation_id.as_str());
                    seen2
                        .lock()
                        .push((j.path(), mode(&d.path()), mode(&j.path()), mine));
                }
            }
        }
        ToolResult::success(&r.invocation_id, "ok")
    });
    let ex = rig.executor(vec![tool], Arc::new(DenyAll))?;
    ex.execute(&req("peek", json!({})));
    ex.execute(&req("peek", json!({})));
    let seen = seen.lock();
    // One journal names each running invocation (the file is reused once a run ended).
    assert_eq!(
        seen.len(),
        2,
        "one journal per running invocation: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|(_, d, f, mine)| *d == 0o700 && *f == 0o600 && *mine),
        "{seen:?}"
    );
    for (p, ..) in seen.iter() {
        let state = std::fs::read(p)?.first().copied();
        assert_eq!(state, Some(b'I'), "{p:?} still open after its run");
    }
    drop(ex);
    let left: Vec<_> = std::fs::read_dir(&rig.work_root)?.flatten().collect();
    assert!(left.is_empty(), "an executor left {left:?}");
    Ok(())
}

#[test]
fn invocations_on_one_file_are_serialized() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("counter.txt");
    std::fs::write(&target, "0")?;
    // A read-modify-write with a pause in the middle: without the per-path lock, increments
    // are lost.
    let tool = scripted("incr", Tier::T1, target.clone(), |r, t| {
        let n: u64 = std::fs::read_to_string(t)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        std::thread::sleep(Duration::from_millis(5));
        let _ = std::fs::write(t, (n + 1).to_string());
        ToolResult::success(&r.invocation_id, "ok")
    });
    let ex = Arc::new(rig.executor(vec![tool], Arc::new(DenyAll))?);
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let ex = ex.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    assert!(ex.execute(&req("incr", json!({}))).is_success());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "thread panicked")?;
    }
    assert_eq!(std::fs::read_to_string(&target)?, "40");
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn invocations_on_different_files_run_in_parallel() -> TestResult {
    let rig = Rig::new()?;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (i2, m2) = (inside.clone(), most.clone());
    let tool = scripted("slow", Tier::T1, rig.tmp.join("unused"), move |r, _| {
        let now = i2.fetch_add(1, Ordering::SeqCst) + 1;
        m2.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        i2.fetch_sub(1, Ordering::SeqCst);
        ToolResult::success(&r.invocation_id, "ok")
    });
    let ex = Arc::new(rig.executor(vec![tool], Arc::new(DenyAll))?);
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let (ex, path) = (ex.clone(), rig.tmp.join(format!("f{i}")));
            std::thread::spawn(move || ex.execute(&req("slow", json!({"path": path}))).is_success())
        })
        .collect();
    for h in handles {
        assert!(h.join().map_err(|_| "thread panicked")?);
    }
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "different files did not overlap"
    );
    Ok(())
}

#[test]
fn every_invocation_logs_started_then_one_end_or_rejected_alone() -> TestResult {
    let rig = Rig::new()?;
    std::fs::write(rig.tmp.join("f.txt"), "x")?;
    let root = vec![rig.tmp.path().to_path_buf()];
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(FileReadTool::new(&root)?),
        Arc::new(FileWriteTool::new(&root)?),
        scripted("t3", Tier::T3, rig.tmp.join("f.txt"), |r, _| {
            ToolResult::success(&r.invocation_id, "")
        }),
    ];
    let ex = Arc::new(rig.executor(tools, Arc::new(AutoApprove::up_to(Tier::T2)))?);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let ex = ex.clone();
            std::thread::spawn(move || {
                for i in 0..15 {
                    let r = match (t + i) % 4 {
                        0 => req("file_read", json!({"operation": "read", "path": "f.txt"})),
                        1 => req("file_write", json!({"operation": "write", "path": format!("w{t}.txt"), "content": "y"})),
                        2 => req("file_write", json!({"operation": "write", "path": "../escape.txt", "content": "y"})),
                        _ => req("t3", json!({})),
                    };
                    ex.execute(&r);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "thread panicked")?;
    }
    let mut by_invocation: HashMap<String, Vec<String>> = HashMap::new();
    for e in rig.events()? {
        let inv = e.payload["invocation_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if e.type_id != "tool.approval_decided" {
            by_invocation.entry(inv).or_default().push(e.type_id);
        }
    }
    assert_eq!(by_invocation.len(), 60);
    for (inv, seq) in by_invocation {
        let ok = matches!(
            seq.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ["tool.execution_started", "tool.execution_completed"]
                | ["tool.execution_started", "tool.execution_failed"]
                | ["tool.execution_rejected"]
        );
        assert!(ok, "{inv}: {seq:?}");
    }
    Ok(())
}

/// Helper: a host that runs a sandboxed write which stops half-way, then waits to be killed.
#[test]
#[ignore = "helper: run by a_host_killed_mid_tool_is_recovered_by_the_next_executor"]
fn child_host_mid_write() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    let target = dir.join("precious.txt");
    let tool = scripted("halfway", Tier::T2, target, |_, t| {
        // Write half of the new content in place, then stall: a crash here would leave a
        // half-written file if nothing restored it.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(t)
        {
            let _ = f.write_all(b"NEW CONTENT, ONLY HALF");
            let _ = f.sync_all();
        }
        println!("PAUSED");
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs(120));
        ToolResult::success(&correx::ToolInvocationId::from("never"), "")
    });
    let registry = ToolRegistry::build(vec![tool as Arc<dyn Tool>])?;
    let ex = SandboxedToolExecutor::new(
        Arc::new(DispatchingToolExecutor::new(registry.clone())),
        registry,
        Arc::new(AutoApprove::up_to(Tier::T3)),
        store,
        dir.join("work"),
    )?;
    ex.execute(&req("halfway", json!({})));
    Ok(())
}

#[test]
fn a_host_killed_mid_tool_is_recovered_by_the_next_executor() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("precious.txt");
    let original: Vec<u8> = b"the original bytes\n".repeat(5000);
    std::fs::write(&target, &original)?;
    drop(rig.store.clone());
    let mut child = child_test("sandbox::child_host_mid_write")
        .env("CORREX_CHILD_DIR", rig.tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut paused = false;
    for line in std::io::BufReader::new(stdout).lines() {
        if line?.contains("PAUSED") {
            paused = true;
            break;
        }
    }
    assert!(paused, "the child never reached the middle of the write");
    // SAFETY: SIGKILL to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait()?;
    assert_ne!(
        std::fs::read(&target)?,
        original,
        "the child did not damage the file"
    );
    let ex = rig.executor(vec![], Arc::new(DenyAll))?;
    assert_eq!(ex.recovered().len(), 1);
    assert_eq!(
        std::fs::read(&target)?,
        original,
        "not restored byte for byte"
    );
    let events = rig.events()?;
    assert_eq!(
        types(&events),
        ["tool.execution_started", "tool.execution_failed"]
    );
    assert_eq!(events[1].payload["reason"], "interrupted");
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn tool_config_defaults_deny_and_bad_fields_are_named() -> TestResult {
    let c = ToolConfig::from_value(&json!({}))?;
    for row in correx::BUILTIN_TOOLS {
        assert!(!c.is_enabled(row.name), "{} enabled by default", row.name);
    }
    let shell = c.get::<correx::ShellTool>().ok_or("no shell row")?;
    let read = c.get::<FileReadTool>().ok_or("no file_read row")?;
    assert!(shell.allowed_executables.is_empty() && read.allowed_paths.is_empty());
    let c = ToolConfig::from_value(
        &json!({"shell": {"enabled": true, "allowed_executables": ["ls"], "timeout_ms": 500}}),
    )?;
    assert!(c.is_enabled("shell") && !c.is_enabled("file_read"));
    assert_eq!(
        c.get::<correx::ShellTool>().ok_or("no shell row")?.timeout,
        Duration::from_millis(500)
    );
    // null is the same as leaving the field out.
    let c =
        ToolConfig::from_value(&json!({"file_read": {"enabled": null, "max_read_bytes": null}}))?;
    assert!(!c.is_enabled("file_read"));
    assert_eq!(
        c.get::<FileReadTool>()
            .ok_or("no file_read row")?
            .max_read_bytes,
        correx::DEFAULT_MAX_READ_BYTES
    );
    for (bad, field) in [
        (json!({"shell": {"enabled": "yes"}}), "tools.shell.enabled"),
        (
            json!({"shell": {"timeout_ms": 0}}),
            "tools.shell.timeout_ms",
        ),
        (
            json!({"shell": {"timeout_ms": -5}}),
            "tools.shell.timeout_ms",
        ),
        (
            json!({"shell": {"output_cap_bytes": 0}}),
            "tools.shell.output_cap_bytes",
        ),
        (
            json!({"shell": {"working_dirs": ["w"]}}),
            "tools.shell.working_dirs[0]",
        ),
        (
            json!({"shell": {"allowed_executables": ["ls", 7]}}),
            "tools.shell.allowed_executables[1]",
        ),
        (
            json!({"shell": {"allowed_executables": ["l\0s"]}}),
            "tools.shell.allowed_executables[0]",
        ),
        (
            json!({"shell": {"isolation": {"mode": "strict"}}}),
            "tools.shell.isolation.mode",
        ),
        (
            json!({"shell": {"isolation": {"read_paths": ["r"]}}}),
            "tools.shell.isolation.read_paths[0]",
        ),
        (
            json!({"shell": {"isolation": {"limits": {"cpu_seconds": 0}}}}),
            "tools.shell.isolation.limits.cpu_seconds",
        ),
        (
            json!({"shell": {"isolation": {"limits": {"cpu": 1}}}}),
            "tools.shell.isolation.limits.cpu",
        ),
        (
            json!({"shell": {"isolation": {"pretend_landlock_abi": 1}}}),
            "tools.shell.isolation.pretend_landlock_abi",
        ),
        (
            json!({"shell": {"isolation": ["required"]}}),
            "tools.shell.isolation",
        ),
        (json!({"shell": [true, ["ls"]]}), "tools.shell"),
        (
            json!({"file_read": {"allowed_paths": ["relative/dir"]}}),
            "tools.file_read.allowed_paths[0]",
        ),
        (
            json!({"file_read": {"max_read_bytes": 0}}),
            "tools.file_read.max_read_bytes",
        ),
        (
            json!({"file_write": {"allowed_paths": "/tmp"}}),
            "tools.file_write.allowed_paths",
        ),
        (
            json!({"file_edit": {"root": "/tmp"}}),
            "tools.file_edit.root",
        ),
        (json!({"file_raed": {}}), "tools.file_raed"),
        (json!({"shell": {"env": {"A": 1}}}), "tools.shell.env.A"),
        (json!([{"shell": {}}]), "tools"),
        // null stands for a field left out, not for a value: a map's or an unknown key's is
        // read as written, and an enum is a word.
        (json!({"shell": {"env": {"A": null}}}), "tools.shell.env.A"),
        (json!({"shel": null}), "tools.shel"),
        // Network by name.
        (
            json!({"shell": {"isolation": {"network": "yes"}}}),
            "tools.shell.isolation.network",
        ),
        (
            json!({"shell": {"isolation": {"network": {"allow": ["bad host"]}}}}),
            "tools.shell.isolation.network.allow[0]",
        ),
        (
            json!({"shell": {"isolation": {"network": {"allow": ["a.test"], "max_bytes": 0}}}}),
            "tools.shell.isolation.network.max_bytes",
        ),
        (
            json!({"shell": {"isolation": {"network": {"resolve": {"a.test": "nowhere"}}}}}),
            "tools.shell.isolation.network.resolve.a.test",
        ),
        (
            json!({"shell": {"isolation": {"mode": "none", "network": {"allow": ["a.test"]}}}}),
            "tools.shell.isolation.network",
        ),
        (
            json!({"shell": {"env": {"HTTPS_PROXY": "http://evil"},
                             "isolation": {"network": {"allow": ["a.test"]}}}}),
            "tools.shell.env.HTTPS_PROXY",
        ),
        (json!({"shell": {"timeout": null}}), "tools.shell.timeout"),
        (
            json!({"shell": {"isolation": {"mode": {"none": null}}}}),
            "tools.shell.isolation.mode",
        ),
    ] {
        let e = ToolConfig::from_value(&bad)
            .err()
            .ok_or(format!("accepted a bad config: {bad}"))?;
        assert_eq!(e.field, field, "{bad}: {e}");
    }
    let e = RuntimeConfig::from_json(r#"{"v": 2, "event_log": "/tmp/x.db"}"#)
        .err()
        .ok_or("accepted v2")?;
    assert_eq!(e.field, "v");
    let e = RuntimeConfig::from_json("{not json")
        .err()
        .ok_or("accepted garbage")?;
    assert_eq!(e.field, "json");
    // Every section of the runtime's config names its fields the same way.
    for (json, field) in [
        (r#"{"v": 1}"#, "event_log"),
        (r#"{"v": 1, "event_log": ""}"#, "event_log"),
        (r#"{"v": 1, "event_log": ["/e.db"]}"#, "event_log"),
        (
            r#"{"v": 1, "event_log": "/e.db", "durability": "fast"}"#,
            "durability",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "durability": {"normal": null}}"#,
            "durability",
        ),
        (r#"{"v": 1, "event_log": "/e.db", "bogus": null}"#, "bogus"),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": {"prot": null}}"#,
            "models.prot",
        ),
        (r#"{"v": 1, "event_log": null}"#, "event_log"),
        (
            r#"{"v": 1, "event_log": "/e.db", "sandbox_root": 1}"#,
            "sandbox_root",
        ),
        (r#"{"v": 1, "event_log": "/e.db", "extra": 1}"#, "extra"),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": {"port": 0}}"#,
            "models.port",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": {"host": "0.0.0.0"}}"#,
            "models.host",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": {"read_timeout_ms": 0}}"#,
            "models.read_timeout_ms",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": {"log_dir": ""}}"#,
            "models.log_dir",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": {"isolation": "default"}}"#,
            "models.isolation",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "models": [20000, 4]}"#,
            "models",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "approvals": {"max_tier": 4}}"#,
            "approvals.max_tier",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "approvals": {"rules": [{"action": "allow"}]}}"#,
            "approvals.rules[0].tool",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "approvals": {"rules": [{"tool": "shell", "argv_prefix": [], "action": "allow"}]}}"#,
            "approvals.rules[0].argv_prefix",
        ),
        (
            r#"{"v": 1, "event_log": "/e.db", "approvals": {"rules": [["shell", null, "allow"]]}}"#,
            "approvals.rules[0]",
        ),
    ] {
        let e = RuntimeConfig::from_json(json)
            .err()
            .ok_or(format!("accepted a bad config: {json}"))?;
        assert_eq!(e.field, field, "{json}: {e}");
    }
    Ok(())
}

/// A tool that is not built in, added through the table alone: its row and its type. The
/// config reads its section, the registry lists and runs it, and its bad fields are named.
#[test]
fn a_tool_is_added_through_the_table_alone() -> TestResult {
    #[derive(Clone, Debug, Default, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct EchoConfig {
        prefix: String,
    }
    impl correx::Section for EchoConfig {
        fn validate(&self) -> Result<(), correx::ConfigError> {
            if self.prefix.len() > 8 {
                return Err(correx::ConfigError::new("prefix", "at most 8 bytes"));
            }
            Ok(())
        }
    }
    struct Echo(String);
    // The tool's identity, said once: its row.
    impl Tool for Echo {
        fn name(&self) -> &str {
            <Echo as correx::BuiltinTool>::ROW.name
        }
        fn tier(&self) -> Tier {
            <Echo as correx::BuiltinTool>::ROW.tier
        }
        fn description(&self) -> &str {
            <Echo as correx::BuiltinTool>::ROW.description
        }
        fn parameters(&self) -> serde_json::Value {
            (<Echo as correx::BuiltinTool>::ROW.parameters)()
        }
        fn required_capabilities(&self) -> &[ToolCapability] {
            &[]
        }
        fn validate_request(&self, _: &ToolRequest) -> ValidationResult {
            ValidationResult::Valid
        }
        fn execute(&self, req: &ToolRequest) -> correx::ToolResult {
            let text = req
                .parameters
                .get("text")
                .and_then(|t| t.as_str())
                .unwrap_or("");
            ToolResult::success(&req.invocation_id, format!("{}{text}", self.0))
        }
    }
    impl correx::BuiltinTool for Echo {
        const ROW: correx::ToolRow =
            correx::ToolRow::new::<Echo>("echo", Tier::T0, "says its text back", echo_schema);
        type Config = EchoConfig;
        fn build(c: &EchoConfig, _: &correx::BuildContext) -> Result<Self, correx::ToolError> {
            Ok(Echo(c.prefix.clone()))
        }
        fn explain(c: &EchoConfig) -> Vec<(&'static str, String)> {
            vec![("", format!("echoes after {:?}", c.prefix))]
        }
    }
    fn echo_schema() -> serde_json::Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}})
    }
    let mut table = correx::BUILTIN_TOOLS.to_vec();
    table.push(<Echo as correx::BuiltinTool>::ROW);

    let config =
        ToolConfig::from_value_in(&table, &json!({"echo": {"enabled": true, "prefix": "> "}}))?;
    assert_eq!(
        config.explain().iter().find(|(f, _)| f == "tools.echo"),
        Some(&("tools.echo".to_owned(), "echoes after \"> \"".to_owned()))
    );
    let registry = correx::build_registry(&config)?;
    let listed = registry.describe();
    let names: Vec<(&str, bool)> = listed
        .iter()
        .map(|d| (d.name.as_str(), d.enabled))
        .collect();
    assert_eq!(
        names,
        [
            ("echo", true),
            ("file_edit", false),
            ("file_read", false),
            ("file_write", false),
            ("jobs", false),
            ("shell", false)
        ]
    );
    let exec = DispatchingToolExecutor::new(registry);
    let req = ToolRequest::json("s", "echo", json!({"text": "hi"}))?;
    match exec.execute(&req) {
        ToolResult::Success { output, .. } => assert_eq!(output, "> hi"),
        other => return Err(format!("echo failed: {other:?}").into()),
    }

    // Disabled, it is listed from its row and refused; its section is still checked.
    let off = correx::build_registry(&ToolConfig::from_value_in(&table, &json!({}))?)?;
    assert!(off
        .describe()
        .iter()
        .any(|d| d.name == "echo" && !d.enabled));
    assert!(!DispatchingToolExecutor::new(off).execute(&req).is_success());
    for (bad, field) in [
        (
            json!({"echo": {"prefix": "far too long"}}),
            "tools.echo.prefix",
        ),
        (json!({"echo": {"prefix": 1}}), "tools.echo.prefix"),
        (json!({"echo": {"suffix": ""}}), "tools.echo.suffix"),
    ] {
        let e = ToolConfig::from_value_in(&table, &bad)
            .err()
            .ok_or("accepted")?;
        assert_eq!(e.field, field, "{e}");
    }
    // The built-in table alone does not know it.
    let e = ToolConfig::from_value(&json!({"echo": {}}))
        .err()
        .ok_or("accepted")?;
    assert_eq!(e.field, "tools.echo");
    Ok(())
}

#[test]
fn approvers_see_the_request_and_fail_closed() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("f.txt");
    let tool = scripted("t2", Tier::T2, target, |r, _| {
        ToolResult::success(&r.invocation_id, "ran")
    });
    let approver = CallbackApprover::new(|req: &ApprovalRequest, ctx: &ApprovalContext| {
        assert_eq!(ctx.session_id.as_str(), "s");
        if req.request.str_param("mode") == Some("err") {
            return Err("approver offline".into());
        }
        Ok(req.tool_name == "t2" && req.tier == Tier::T2)
    });
    let ex = rig.executor(vec![tool], Arc::new(approver))?;
    assert!(ex.execute(&req("t2", json!({}))).is_success());
    let r = ex.execute(&req("t2", json!({"mode": "err"})));
    assert!(
        matches!(&r, ToolResult::Failure { reason, .. } if reason.contains("approver offline"))
    );
    Ok(())
}

#[test]
fn a_working_root_open_to_others_is_refused() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let rig = Rig::new()?;
    std::fs::create_dir_all(&rig.work_root)?;
    std::fs::set_permissions(&rig.work_root, std::fs::Permissions::from_mode(0o777))?;
    let err = rig
        .executor(vec![], Arc::new(DenyAll))
        .err()
        .ok_or("accepted a shared root")?;
    assert!(err.to_string().contains("0700"), "{err}");
    Ok(())
}

#[test]
fn a_second_executor_never_recovers_a_live_invocation() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("busy.txt");
    std::fs::write(&target, "before")?;
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = parking_lot::Mutex::new(release_rx);
    let started_tx = parking_lot::Mutex::new(started_tx);
    let tool = scripted("slow_write", Tier::T1, target.clone(), move |r, t| {
        let _ = std::fs::write(t, "after");
        let _ = started_tx.lock().send(());
        let _ = release_rx.lock().recv_timeout(Duration::from_secs(10));
        ToolResult::success(&r.invocation_id, "done")
    });
    let first = Arc::new(rig.executor(vec![tool], Arc::new(DenyAll))?);
    let runner = {
        let first = first.clone();
        std::thread::spawn(move || first.execute(&req("slow_write", json!({}))))
    };
    started_rx.recv_timeout(Duration::from_secs(10))?;
    // Another runtime on the same root starts while the tool is mid-run.
    let second = rig.executor(vec![], Arc::new(DenyAll))?;
    assert!(second.recovered().is_empty(), "recovered a live invocation");
    assert_eq!(std::fs::read_to_string(&target)?, "after");
    release_tx.send(())?;
    assert!(runner.join().map_err(|_| "runner panicked")?.is_success());
    assert_eq!(std::fs::read_to_string(&target)?, "after");
    assert_eq!(
        types(&rig.events()?),
        ["tool.execution_started", "tool.execution_completed"]
    );
    rig.assert_clean(rig.tmp.path())
}

#[test]
fn recovery_never_restores_a_short_backup() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("precious.txt");
    std::fs::write(&target, b"the original bytes\n".repeat(5000))?;
    let mut child = child_test("sandbox::child_host_mid_write")
        .env("CORREX_CHILD_DIR", rig.tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    for line in std::io::BufReader::new(stdout).lines() {
        if line?.contains("PAUSED") {
            break;
        }
    }
    // SAFETY: SIGKILL to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait()?;
    // A power loss could leave the unflushed backup short: simulate that.
    let backup = std::fs::read_dir(rig.tmp.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("correx-bak"))
        .ok_or("no backup beside the file")?;
    std::fs::write(&backup, b"short")?;
    let damaged = std::fs::read(&target)?;
    let ex = rig.executor(vec![], Arc::new(DenyAll))?;
    assert_eq!(ex.recovered().len(), 1);
    assert!(ex.recovered()[0].restored.is_empty());
    assert_eq!(
        std::fs::read(&target)?,
        damaged,
        "a short backup was restored"
    );
    rig.assert_clean(rig.tmp.path())
}

fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
}

#[test]
fn a_cancelled_shell_run_is_killed_and_recorded_as_cancelled() -> TestResult {
    let rig = Rig::new()?;
    let shell: Arc<dyn Tool> = Arc::new(correx::ShellTool::new(correx::ShellOptions {
        allowed_executables: vec!["sleep".into()],
        ..correx::ShellOptions::default()
    })?);
    let ex = rig.executor(vec![shell], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    let cancel = correx::CancelToken::new();
    let trigger = cancel.clone();
    let marker = format!("30.{}", std::process::id());
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        trigger.cancel();
    });
    let r = ex.execute_cancellable(&req("shell", json!({"argv": ["sleep", marker]})), &cancel);
    canceller.join().map_err(|_| "canceller panicked")?;
    match &r {
        ToolResult::Failure { reason, .. } => {
            assert!(reason.starts_with("cancelled by the host"), "{reason}")
        }
        other => return Err(format!("{other:?}").into()),
    }
    assert!(
        !running(&marker),
        "a process of the cancelled run is still alive"
    );
    let events = rig.events()?;
    assert_eq!(
        types(&events),
        ["tool.execution_started", "tool.execution_cancelled"]
    );
    assert!(events[1].payload["duration_ms"]
        .as_u64()
        .is_some_and(|ms| ms < 10_000));
    Ok(())
}

#[test]
fn a_cancel_before_the_start_rejects_and_one_during_the_run_restores() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("f.txt");
    std::fs::write(&target, "old")?;
    // Cancelled before: nothing runs, the rejection says why.
    let idle = scripted("edit", Tier::T2, target.clone(), |r, _| {
        ToolResult::success(&r.invocation_id, "ran")
    });
    let ex = rig.executor(vec![idle.clone()], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    let cancel = correx::CancelToken::new();
    cancel.cancel();
    let r = ex.execute_cancellable(&req("edit", json!({})), &cancel);
    assert!(!r.is_success());
    assert_eq!(idle.calls.load(Ordering::SeqCst), 0);
    let events = rig.events()?;
    assert_eq!(types(&events), ["tool.execution_rejected"]);
    assert_eq!(
        events[0].payload["reason"],
        "cancelled by the host before it ran"
    );

    // Cancelled while it runs, after it changed the file: the file is restored.
    let rig = Rig::new()?;
    let target = rig.tmp.join("f.txt");
    std::fs::write(&target, "old")?;
    let cancel = correx::CancelToken::new();
    let inside = cancel.clone();
    let tool = scripted("edit", Tier::T2, target.clone(), move |r, path| {
        let _ = std::fs::write(path, "half-written");
        inside.cancel();
        ToolResult::failure(&r.invocation_id, "stopped: cancelled", Recoverable::No)
    });
    let ex = rig.executor(vec![tool], Arc::new(AutoApprove::up_to(Tier::T3)))?;
    assert!(!ex
        .execute_cancellable(&req("edit", json!({})), &cancel)
        .is_success());
    assert_eq!(std::fs::read_to_string(&target)?, "old");
    assert_eq!(
        types(&rig.events()?),
        ["tool.execution_started", "tool.execution_cancelled"]
    );
    rig.assert_clean(&rig.tmp.join(""))?;
    Ok(())
}

/// The config's engines and rules, through a whole runtime: `auto` up to a tier, `deny`, and
/// rules in front of either; each decision recorded with who decided, in the transaction of
/// the start or rejection it led to.
#[test]
fn config_engines_and_rules_decide_and_every_decision_is_recorded() -> TestResult {
    let tmp = TempDir::new("approvals-config");
    let work = tmp.join("work");
    std::fs::create_dir_all(&work)?;
    let runtime_with =
        |engine: &str, log: &str| -> Result<correx::Runtime, Box<dyn std::error::Error>> {
            let config = RuntimeConfig::from_json(
                &json!({"v": 1, "event_log": tmp.join(log), "sandbox_root": tmp.join("sb"),
                "tools": {"file_write": {"enabled": true, "allowed_paths": [work]},
                          "file_edit": {"enabled": true, "allowed_paths": [work]}},
                "approvals": {"engine": engine, "max_tier": 2, "rules": [
                    {"tool": "file_edit", "action": "forbid"}]}})
                .to_string(),
            )?;
            // The host's engine is never asked: the config chose another.
            let host = Arc::new(CallbackApprover::new(|_, _| {
                Err("the host was asked".into())
            }));
            Ok(correx::Runtime::new(&config, host)?)
        };
    let write = ToolRequest::new(
        SessionId::from("s"),
        "file_write",
        json!({"operation": "write", "path": work.join("a.txt"), "content": "a"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    let edit = ToolRequest::new(
        SessionId::from("s"),
        "file_edit",
        json!({"operation": "append", "path": work.join("a.txt"), "content": "b"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    let decisions =
        |rt: &correx::Runtime| -> Result<Vec<(String, String)>, correx::EventStoreError> {
            Ok(rt
                .events()
                .read_stream(&session_stream("s"), 1, 100)?
                .into_iter()
                .filter(|e| e.type_id == "tool.approval_decided")
                .map(|e| {
                    (
                        e.payload["decision"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        e.payload["decided_by"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
                .collect())
        };
    let auto = runtime_with("auto", "auto.db")?;
    assert!(auto.executor().execute(&write).is_success());
    assert!(!auto.executor().execute(&edit).is_success());
    assert_eq!(
        decisions(&auto)?,
        [
            ("approved".to_owned(), "auto up to T2".to_owned()),
            ("denied".to_owned(), "rule: file_edit forbid".to_owned())
        ]
    );
    // Each decision shares its transaction with what followed: they are adjacent versions.
    let all = auto.events().read_stream(&session_stream("s"), 1, 100)?;
    let kinds: Vec<&str> = all.iter().map(|e| e.type_id.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "tool.approval_decided",
            "tool.execution_started",
            "tool.execution_completed",
            "tool.approval_decided",
            "tool.execution_rejected"
        ]
    );
    drop(auto);
    let deny = runtime_with("deny", "deny.db")?;
    assert!(!deny.executor().execute(&write).is_success());
    assert_eq!(
        decisions(&deny)?,
        [("denied".to_owned(), "deny_all".to_owned())]
    );
    for (engine, field) in [
        ("sometimes", "approvals.engine"),
        ("auto", "approvals.rules[0].action"),
    ] {
        let text = json!({"v": 1, "event_log": "/e.db", "approvals": {"engine": engine,
            "rules": [{"tool": "shell", "action": "maybe"}]}})
        .to_string();
        let e = RuntimeConfig::from_json(&text)
            .err()
            .ok_or("accepted a bad config")?;
        assert_eq!(e.field, field, "{e}");
    }
    Ok(())
}

/// A run that floods stderr keeps the log small: the event holds a bounded slice that says how
/// much was cut, and its kind; the caller's result has the whole (capped) streams as data.
#[test]
fn an_output_flood_leaves_a_bounded_event_with_its_kind() -> TestResult {
    let rig = Rig::new()?;
    let shell = correx::ShellTool::new(correx::ShellOptions {
        allowed_executables: vec!["sh".into()],
        isolation: correx::IsolationOptions {
            mode: correx::IsolationMode::BestEffort,
            ..correx::IsolationOptions::default()
        },
        ..correx::ShellOptions::default()
    })?;
    let ex = rig.executor(
        vec![Arc::new(shell)],
        Arc::new(AutoApprove::up_to(Tier::T3)),
    )?;
    let r = ex.execute(&req(
        "shell",
        json!({"argv": ["sh", "-c", "head -c 1500000 /dev/zero | tr '\\0' e >&2; exit 4"]}),
    ));
    assert_eq!(r.error_kind(), Some(correx::ToolErrorKind::NonZeroExit));
    let stderr = r
        .data()
        .and_then(|d| d["stderr"].as_str())
        .unwrap_or_default();
    assert_eq!(stderr.len(), 1_048_576, "the capped stream is in the data");
    let events = rig.events()?;
    let failed = events.last().ok_or("no events")?;
    assert_eq!(failed.type_id, "tool.execution_failed");
    let reason = failed.payload["reason"].as_str().unwrap_or_default();
    assert!(reason.len() <= 4096, "{} bytes in the event", reason.len());
    assert!(reason.contains("more bytes cut"), "{reason}");
    assert_eq!(failed.payload["kind"], "non_zero_exit");
    Ok(())
}

/// Helper for the crash tests: one sandboxed 2 MiB `file_write` in `CORREX_CHILD_DIR`, which
/// the parent kills (or `CORREX_TEST_ABORT_AT` aborts) somewhere along the way.
#[test]
#[ignore = "helper: run by a_host_killed_at_any_step_leaves_the_file_whole_and_one_outcome"]
fn child_sandboxed_write() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let dir = PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    let files = dir.join("files");
    let write = FileWriteTool::new(std::slice::from_ref(&files))?;
    let registry = ToolRegistry::build(vec![Arc::new(write) as Arc<dyn Tool>])?;
    let ex = SandboxedToolExecutor::new(
        Arc::new(DispatchingToolExecutor::new(registry.clone())),
        registry,
        Arc::new(AutoApprove::up_to(Tier::T3)),
        store,
        dir.join("work"),
    )?;
    println!("READY");
    let _ = std::io::stdout().flush();
    let new = "n".repeat(new_size());
    ex.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "target.txt", "content": new}),
    ));
    Ok(())
}

/// The crash tests' sizes: `CORREX_CHILD_SMALL` set, a file small enough for its backup to
/// live in the journal (1 KiB, then 2 KiB); else a copied backup (1 MiB, then 2 MiB).
fn old_size() -> usize {
    if std::env::var_os("CORREX_CHILD_SMALL").is_some() {
        1 << 10
    } else {
        1 << 20
    }
}

fn new_size() -> usize {
    2 * old_size()
}

/// After a kill, recovery leaves the file old or new byte for byte, exactly one outcome that
/// agrees with it, no stray file, an empty working root; a second recovery adds nothing.
fn check_after_kill(dir: &Path, what: &str, small: bool) -> TestResult {
    let scale = if small { 1 << 10 } else { 1 << 20 };
    let old = "o".repeat(scale);
    let new = "n".repeat(2 * scale);
    let open =
        || -> Result<(Arc<SqliteEventStore>, SandboxedToolExecutor), Box<dyn std::error::Error>> {
            let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
            let registry = ToolRegistry::build(vec![])?;
            let ex = SandboxedToolExecutor::new(
                Arc::new(DispatchingToolExecutor::new(registry.clone())),
                registry,
                Arc::new(DenyAll),
                store.clone(),
                dir.join("work"),
            )?;
            Ok((store, ex))
        };
    let (store, ex) = open()?;
    drop(ex);
    let content = std::fs::read_to_string(dir.join("files/target.txt"))?;
    let is_new = content == new;
    assert!(
        is_new || content == old,
        "{what}: the file is torn ({} bytes)",
        content.len()
    );
    let events = store.read_stream(&session_stream("s"), 1, 100)?;
    let kinds: Vec<String> = events
        .iter()
        .filter(|e| e.type_id != "tool.approval_decided")
        .map(|e| match e.type_id.as_str() {
            "tool.execution_interrupted" => {
                format!("interrupted:{}", e.payload["state"].as_str().unwrap_or("?"))
            }
            t => t.to_owned(),
        })
        .collect();
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    let agrees = match kinds[..] {
        [] => !is_new,
        ["tool.execution_started", "tool.execution_completed" | "interrupted:completed"] => is_new,
        ["tool.execution_started", "tool.execution_failed" | "interrupted:unchanged"] => !is_new,
        _ => false,
    };
    let state = if is_new { "new" } else { "old" };
    assert!(agrees, "{what}: file {state} but the log says {kinds:?}");
    println!("{what}: file {state}, log {kinds:?}");
    let strays: Vec<String> = std::fs::read_dir(dir.join("files"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target.txt")
        .collect();
    assert!(strays.is_empty(), "{what}: strays left: {strays:?}");
    let left: Vec<_> = std::fs::read_dir(dir.join("work"))?.flatten().collect();
    assert!(left.is_empty(), "{what}: the working root holds {left:?}");
    // Exactly once: recovering again records nothing new.
    let before = store.read_stream(&session_stream("s"), 1, 100)?.len();
    drop(open()?);
    assert_eq!(
        store.read_stream(&session_stream("s"), 1, 100)?.len(),
        before,
        "{what}"
    );
    Ok(())
}

fn crash_rig(tag: &str, small: bool) -> Result<TempDir, Box<dyn std::error::Error>> {
    let tmp = TempDir::new(tag);
    std::fs::create_dir_all(tmp.join("files"))?;
    let old = if small { 1 << 10 } else { 1 << 20 };
    std::fs::write(tmp.join("files/target.txt"), "o".repeat(old))?;
    Ok(tmp)
}

#[test]
fn a_host_killed_at_any_step_leaves_the_file_whole_and_one_outcome() -> TestResult {
    // Test seam: each named step aborts the child there.
    for step in [
        "journal",
        "backup",
        "started",
        "tool",
        "committed",
        "discarded",
        "outcome",
    ] {
        for small in [false, true] {
            let tmp = crash_rig("crash-step", small)?;
            let mut child = child_test("sandbox::child_sandboxed_write");
            child
                .env("CORREX_CHILD_DIR", tmp.path())
                .env("CORREX_TEST_ABORT_AT", step)
                .stdout(std::process::Stdio::null());
            if small {
                child.env("CORREX_CHILD_SMALL", "1");
            }
            let status = child.status()?;
            let what = format!("{step} ({})", if small { "inline" } else { "copied" });
            assert!(!status.success(), "{what}: the child was not aborted");
            check_after_kill(tmp.path(), &what, small)?;
        }
    }
    // And SIGKILL at random moments of the run.
    let mut seed = std::process::id() as u64;
    for round in 0..12 {
        let tmp = crash_rig("crash-random", false)?;
        let mut child = child_test("sandbox::child_sandboxed_write")
            .env("CORREX_CHILD_DIR", tmp.path())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            if line?.contains("READY") {
                break;
            }
        }
        // Keep reading, so the child never writes into a closed pipe.
        let drain = std::thread::spawn(move || lines.for_each(drop));
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_micros((seed >> 33) % 25_000));
        // SAFETY: SIGKILL to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait()?;
        let _ = drain.join();
        check_after_kill(tmp.path(), &format!("random kill {round}"), false)?;
    }
    Ok(())
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_run_cannot_redirect_the_restore() -> TestResult {
    // None: the file did not exist, so the restore removes it (by path, that would delete
    // the file the symlink leads to).
    for size in [None, Some(100), Some(100_000)] {
        let rig = Rig::new()?;
        let sub = rig.tmp.join("sub");
        let moved = rig.tmp.join("sub-moved");
        let outside = rig.tmp.join("outside");
        std::fs::create_dir_all(&sub)?;
        std::fs::create_dir_all(&outside)?;
        let original: Vec<u8> = (0..size.unwrap_or(0)).map(|i| (i % 251) as u8).collect();
        if size.is_some() {
            std::fs::write(sub.join("f.txt"), &original)?;
        }
        std::fs::write(outside.join("f.txt"), "not yours")?;
        let (s, m, o) = (sub.clone(), moved.clone(), outside.clone());
        let tool = scripted("swap", Tier::T1, sub.join("f.txt"), move |r, _| {
            // Damage the file, then swap its directory for a symlink to somewhere else.
            let _ = std::fs::write(s.join("f.txt"), "damaged");
            let _ = std::fs::rename(&s, &m);
            let _ = std::os::unix::fs::symlink(&o, &s);
            ToolResult::failure(&r.invocation_id, "failed after the swap", Recoverable::Yes)
        });
        let ex = rig.executor(vec![tool], Arc::new(DenyAll))?;
        let r = ex.execute(&req("swap", json!({})));
        assert!(!r.is_success());
        assert_eq!(
            std::fs::read(outside.join("f.txt"))?,
            b"not yours",
            "{size:?}: the restore followed the swapped-in symlink"
        );
        match size {
            Some(_) => assert_eq!(
                std::fs::read(moved.join("f.txt"))?,
                original,
                "{size:?}: the file was not restored in its own directory"
            ),
            None => assert!(!moved.join("f.txt").exists(), "the created file stayed"),
        }
        let strays: Vec<_> = std::fs::read_dir(&outside)?.flatten().collect();
        assert_eq!(strays.len(), 1, "{size:?}: {strays:?}");
        rig.assert_clean(&moved)?;
    }
    Ok(())
}

/// Appends of a run's outcome fail while `failing` is set: the log refusing a run's outcome
/// (a full disk, say).
struct RefusingOutcomes {
    failing: std::sync::atomic::AtomicBool,
}

impl BeforeAppend for RefusingOutcomes {
    fn before_append(&self, events: &[correx::NewEvent]) -> Result<(), correx::EventStoreError> {
        let outcome = events
            .iter()
            .any(|e| e.type_id == "tool.execution_completed");
        if outcome && self.failing.load(Ordering::SeqCst) {
            return Err(correx::EventStoreError::CommitFailed {
                detail: "disk full (test)".into(),
            });
        }
        Ok(())
    }
}

#[test]
fn an_outcome_the_log_refused_is_recorded_by_the_next_executor() -> TestResult {
    let rig = Rig::new()?;
    std::fs::write(rig.tmp.join("f.txt"), "old")?;
    let refusing = Arc::new(HookedStore {
        inner: rig.store.clone(),
        hook: RefusingOutcomes {
            failing: std::sync::atomic::AtomicBool::new(true),
        },
    });
    let write = Arc::new(FileWriteTool::new(&[rig.tmp.path().to_path_buf()])?);
    let registry = ToolRegistry::build(vec![write as Arc<dyn Tool>])?;
    let ex = SandboxedToolExecutor::new(
        Arc::new(DispatchingToolExecutor::new(registry.clone())),
        registry,
        Arc::new(AutoApprove::up_to(Tier::T2)),
        refusing.clone(),
        rig.work_root.clone(),
    )?;
    let r = ex.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "f.txt", "content": "new"}),
    ));
    assert!(r.is_success(), "{r:?}");
    drop(ex);
    assert_eq!(types(&rig.events()?), ["tool.execution_started"]);
    // The executor kept the run's journal: the next one closes the run from it.
    let next = rig.executor(vec![], Arc::new(DenyAll))?;
    assert_eq!(next.recovered().len(), 1);
    let events = rig.events()?;
    assert_eq!(
        types(&events),
        ["tool.execution_started", "tool.execution_interrupted"]
    );
    assert_eq!(events[1].payload["state"], "completed");
    assert_eq!(std::fs::read_to_string(rig.tmp.join("f.txt"))?, "new");
    drop(next);
    assert!(
        std::fs::read_dir(&rig.work_root)?.next().is_none(),
        "the working root is left clean"
    );
    Ok(())
}

#[test]
fn a_run_the_previous_layout_left_is_recovered() -> TestResult {
    let rig = Rig::new()?;
    let target = rig.tmp.join("old-layout.txt");
    std::fs::write(&target, "original")?;
    let m = std::fs::metadata(&target)?;
    use std::os::unix::fs::MetadataExt;
    // What a host of the previous version left when killed mid-run: its directory with a
    // lock and a manifest, a backup beside the file, the file damaged, and the start in the log.
    let backup = rig.tmp.join(".old-layout.txt.correx-bak-inv-1");
    std::fs::copy(&target, &backup)?;
    let run = rig.work_root.join("s").join("inv-1");
    std::fs::create_dir_all(&run)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&rig.work_root, std::fs::Permissions::from_mode(0o700))?;
    std::fs::write(run.join("lock"), "")?;
    let manifest = json!({
        "session_id": "s", "invocation_id": "inv-1", "tool_name": "halfway",
        "entries": [{"path": target, "saved": {"kind": "file", "backup": backup, "identity": {
            "dev": m.dev(), "ino": m.ino(), "size": m.size(),
            "mtime_ns": m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            "ctime_ns": m.ctime() * 1_000_000_000 + m.ctime_nsec()}}}]
    });
    std::fs::write(run.join("manifest.json"), manifest.to_string())?;
    let started = correx::DomainEvent::ToolExecutionStarted {
        session_id: "s".into(),
        invocation_id: "inv-1".into(),
        tool_name: "halfway".into(),
        tier: 2,
        isolation: None,
    };
    correx::append_domain(rig.store.as_ref(), &session_stream("s"), &started)?;
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&target, "damag")?;
    let ex = rig.executor(vec![], Arc::new(DenyAll))?;
    assert_eq!(ex.recovered().len(), 1);
    assert_eq!(std::fs::read_to_string(&target)?, "original");
    let events = rig.events()?;
    assert_eq!(
        types(&events),
        ["tool.execution_started", "tool.execution_failed"]
    );
    assert_eq!(events[1].payload["reason"], "interrupted");
    assert!(!rig.work_root.join("s").exists(), "the old directory stays");
    assert!(!backup.exists(), "the old backup stays");
    Ok(())
}

#[test]
fn a_write_through_a_symlinked_directory_inside_the_root_is_backed_up_at_its_real_path(
) -> TestResult {
    let rig = Rig::new()?;
    let real = rig.tmp.join("real");
    std::fs::create_dir_all(&real)?;
    std::os::unix::fs::symlink("real", rig.tmp.join("link"))?;
    std::fs::write(real.join("f.txt"), "old")?;
    let write = Arc::new(FileWriteTool::new(&[rig.tmp.path().to_path_buf()])?);
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let approver = CallbackApprover::new(move |req: &ApprovalRequest, _: &ApprovalContext| {
        seen2.lock().extend(req.paths.iter().cloned());
        Ok(true)
    });
    let ex = rig.executor(vec![write], Arc::new(approver))?;
    let r = ex.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "link/f.txt", "content": "new"}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(std::fs::read_to_string(real.join("f.txt"))?, "new");
    // The approver and the backup see the real path, not the link.
    let canonical = std::fs::canonicalize(&real)?.join("f.txt");
    assert_eq!(*seen.lock(), vec![canonical]);
    rig.assert_clean(&real)
}
