//! `cargo bench --bench sandbox`: a sandboxed `file_write` (approval, backup, two events)
//! against its floor (the bare tool between the same two durable appends) and the bare tool,
//! with a split of where the time goes; and the backup of a 256 MiB file
//! against `cp --reflink=auto` on the same filesystem; and staged workspaces (a staged spawn's
//! extra, a promotion against `mv`, the change set of 10,000 files; `-- staged` runs only
//! these).

use correx::{
    session_stream, ApprovalContext, ApprovalEngine, ApprovalRequest, AutoApprove,
    DispatchingToolExecutor, DomainEvent, EventStore, ExpectedVersion, FileAffectingTool,
    FileWriteTool, PromotePolicy, SandboxedToolExecutor, SessionId, ShellOptions, ShellTool,
    SqliteEventStore, Tier, Tool, ToolCapability, ToolExecutor, ToolRegistry, ToolRequest,
    ToolResult, ValidationResult, WorkspaceMode,
};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn req(tool: &str, params: serde_json::Value) -> ToolRequest {
    ToolRequest::new(
        SessionId::from("bench"),
        tool,
        params.as_object().cloned().unwrap_or_default(),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(n: usize, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed() / n as u32
}

/// A T1 tool that touches nothing but declares one file as affected: running it through the
/// sandbox costs exactly the sandbox's own work on that file.
struct Touch(PathBuf);

impl Tool for Touch {
    fn name(&self) -> &str {
        "touch"
    }
    fn tier(&self) -> Tier {
        Tier::T1
    }
    fn required_capabilities(&self) -> &[ToolCapability] {
        &[]
    }
    fn validate_request(&self, _: &ToolRequest) -> ValidationResult {
        ValidationResult::Valid
    }
    fn execute(&self, r: &ToolRequest) -> ToolResult {
        ToolResult::success(&r.invocation_id, "")
    }
    fn as_file_affecting(&self) -> Option<&dyn FileAffectingTool> {
        Some(self)
    }
}

impl FileAffectingTool for Touch {
    fn affected_paths(&self, _: &ToolRequest) -> Result<Vec<PathBuf>, String> {
        Ok(vec![self.0.clone()])
    }
}

/// `cp --reflink=auto from to`, then (when `flush`) an fsync of the copy; removes the copy.
fn cp_reflink(from: &std::path::Path, to: &std::path::Path, flush: bool) {
    let ok = std::process::Command::new("cp")
        .arg("--reflink=auto")
        .arg(from)
        .arg(to)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "cp failed");
    if flush {
        std::fs::File::open(to)
            .and_then(|f| f.sync_all())
            .expect("sync copy");
    }
    std::fs::remove_file(to).expect("rm copy");
}

/// The two appends a sandboxed run makes (decision and start in one transaction, then the
/// outcome), with `between` run between them.
fn two_appends(store: &SqliteEventStore, stream: &str, between: impl FnOnce()) {
    let (session_id, invocation_id, tool_name) = (
        String::from("bench"),
        String::from("x"),
        String::from("file_write"),
    );
    let first = [
        DomainEvent::ToolApprovalDecided {
            session_id: session_id.clone(),
            invocation_id: invocation_id.clone(),
            tool_name: tool_name.clone(),
            tier: 2,
            decision: "approved".into(),
            decided_by: "auto up to T2".into(),
            wait_ms: 0,
            reason: None,
            answers_request: false,
            identity: None,
        },
        DomainEvent::ToolExecutionStarted {
            session_id: session_id.clone(),
            invocation_id: invocation_id.clone(),
            tool_name: tool_name.clone(),
            tier: 2,
            isolation: None,
        },
    ]
    .map(|e| e.to_new_event());
    store
        .append(stream, ExpectedVersion::Any, &first)
        .expect("append");
    between();
    let done = DomainEvent::ToolExecutionCompleted {
        session_id,
        invocation_id,
        tool_name,
        duration_ms: 1,
        network: None,
    };
    correx::append_domain(store, stream, &done).expect("append");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("correx-bench-sandbox-{}", std::process::id()));
    let files = dir.join("files");
    std::fs::create_dir_all(&files)?;
    if std::env::args().any(|a| a == "staged") {
        staged(&dir)?;
        return Ok(std::fs::remove_dir_all(&dir)?);
    }
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    let write: Arc<FileWriteTool> = Arc::new(FileWriteTool::new(std::slice::from_ref(&files))?);
    let registry = ToolRegistry::build(vec![write.clone() as Arc<dyn Tool>])?;
    let approvals = Arc::new(AutoApprove::up_to(Tier::T2));
    let sandbox = SandboxedToolExecutor::new(
        Arc::new(DispatchingToolExecutor::new(registry.clone())),
        registry,
        approvals.clone(),
        store.clone(),
        dir.join("work"),
    )?;
    let content = "y".repeat(4096);
    let r = req(
        "file_write",
        json!({"operation": "write", "path": "f.txt", "content": content}),
    );
    std::fs::write(files.join("f.txt"), &content)?;

    let (mut sandboxed, mut bare, mut events, mut approval, mut floor) =
        (vec![], vec![], vec![], vec![], vec![]);
    let ask = ApprovalRequest::new(&r, Tier::T2, vec![files.join("f.txt")]);
    let ctx = ApprovalContext::new(SessionId::from("bench"));
    let stream = session_stream("bench");
    // Rounds in which the sandboxed call and its floor run back to back, in alternating order:
    // the disk's flush latency drifts within minutes here, so each round's ratio is taken under
    // one drift, and the figure is the median of those ratios.
    let mut pairs = Vec::new();
    for round in 0..15 {
        bare.push(time(30, || assert!(write.execute(&r).is_success())));
        // The floor: the bare tool between the same two durable appends the sandbox makes
        // (the approval decision rides in the start's transaction), in the sandbox's order.
        let floor_round = || {
            time(40, || {
                two_appends(store.as_ref(), &stream, || {
                    assert!(write.execute(&r).is_success())
                })
            })
        };
        let sandboxed_round = || time(40, || assert!(sandbox.execute(&r).is_success()));
        let (sb, fl) = if round % 2 == 0 {
            let sb = sandboxed_round();
            (sb, floor_round())
        } else {
            let fl = floor_round();
            (sandboxed_round(), fl)
        };
        pairs.push(sb.as_secs_f64() / fl.as_secs_f64());
        sandboxed.push(sb);
        floor.push(fl);
        events.push(time(30, || two_appends(store.as_ref(), &stream, || {})));
        approval.push(time(1000, || {
            assert!(approvals.evaluate(&ask, &ctx).is_approved())
        }));
    }
    pairs.sort_by(|x, y| x.total_cmp(y));
    let (s, b, e, a, f) = (
        median(sandboxed),
        median(bare),
        median(events),
        median(approval),
        median(floor),
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("sandboxed_write_4k_us: {:.1}", us(s));
    println!("bare_write_4k_us: {:.1}", us(b));
    println!("split_tool_us: {:.1}", us(b));
    println!("split_events_us: {:.1}", us(e));
    println!("split_approval_us: {:.2}", us(a));
    println!(
        "split_backup_and_journal_us: {:.1}",
        us(s.saturating_sub(b + e + a))
    );
    println!("floor_us: {:.1}", us(f));
    println!("sandbox_own_us: {:.1}", us(s.saturating_sub(f)));
    println!("sandbox_overhead_vs_floor: {:.3}", pairs[pairs.len() / 2]);
    println!("sandbox_overhead_vs_floor_min: {:.3}", pairs[0]);
    println!(
        "sandbox_overhead_vs_floor_max: {:.3}",
        pairs[pairs.len() - 1]
    );
    println!(
        "sandbox_overhead_ratio: {:.3}",
        s.as_secs_f64() / b.as_secs_f64()
    );

    // 256 MiB: the sandbox's backup (copy in the kernel, flushed, renamed into place, dropped
    // after success) against cp --reflink=auto of the same file on the same filesystem.
    let big = files.join("big.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&big)?;
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
        for _ in 0..256 {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
    }
    let touch = Arc::new(Touch(big.clone()));
    let registry = ToolRegistry::build(vec![touch as Arc<dyn Tool>])?;
    let quiet = SandboxedToolExecutor::new(
        Arc::new(DispatchingToolExecutor::new(registry.clone())),
        registry,
        approvals,
        store,
        dir.join("work2"),
    )?;
    let touch_req = req("touch", json!({}));
    let copy = files.join("big.cp");
    let (mut ours, mut cp, mut cp_sync) = (vec![], vec![], vec![]);
    for _ in 0..7 {
        ours.push(time(1, || assert!(quiet.execute(&touch_req).is_success())));
        cp.push(time(1, || cp_reflink(&big, &copy, false)));
        cp_sync.push(time(1, || cp_reflink(&big, &copy, true)));
    }
    let (o, c, cs) = (median(ours), median(cp), median(cp_sync));
    println!("backup_256mib_ms: {:.1}", o.as_secs_f64() * 1e3);
    println!("cp_reflink_auto_256mib_ms: {:.1}", c.as_secs_f64() * 1e3);
    println!(
        "cp_reflink_auto_then_fsync_256mib_ms: {:.1}",
        cs.as_secs_f64() * 1e3
    );
    println!(
        "backup_ratio_vs_cp_fsync: {:.3}",
        o.as_secs_f64() / cs.as_secs_f64()
    );
    println!(
        "backup_ratio_vs_cp: {:.3}",
        o.as_secs_f64() / c.as_secs_f64()
    );
    staged(&dir)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// A confined shell on `work`, staged (`manual`) or direct.
fn shell_on(work: &std::path::Path, staged: bool) -> Result<ShellTool, Box<dyn std::error::Error>> {
    let mut o: ShellOptions = serde_json::from_value(json!({
        "allowed_executables": ["true", "sh", "python3"],
        "working_dirs": [work],
        "timeout_ms": 120000,
    }))?;
    if staged {
        o.workspace = WorkspaceMode::Staged;
        o.staging.promote = PromotePolicy::Manual;
    }
    let t = ShellTool::new(o)?;
    if let Some(why) = t.refusal() {
        return Err(format!("the shell cannot be confined here: {why}").into());
    }
    Ok(t)
}

/// The held change set of one run of `script` (run in `work`), by invocation.
fn held_run(tool: &ShellTool, work: &std::path::Path, script: &str) -> String {
    let script = format!("cd {} && {script}", work.display());
    let r = tool.execute(&req("shell", json!({"argv": ["sh", "-c", script]})));
    assert!(r.is_success(), "{r:?}");
    r.invocation_id().to_string()
}

/// Staged workspaces: a staged `/bin/true` against a direct one (both confined, alternating);
/// promoting 1,000 new files (10 MiB) against `mv` of the same files by hand; and reading the
/// change set and diff of a run that rewrote 10,000 files.
fn staged(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let work = dir.join("staged-work");
    std::fs::create_dir_all(work.join("d"))?;
    let (staged, direct) = (shell_on(&work, true)?, shell_on(&work, false)?);
    // The default policy (promoted on success): a run that changed nothing settles at once.
    let on_success = ShellTool::new(serde_json::from_value(json!({
        "allowed_executables": ["true"],
        "working_dirs": [&work],
        "workspace": "staged",
    }))?)?;
    let true_req = || req("shell", json!({"argv": ["/bin/true"]}));
    let (mut s, mut d) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        d.push(time(20, || {
            assert!(direct.execute(&true_req()).is_success())
        }));
        s.push(time(20, || {
            let r = on_success.execute(&true_req());
            assert!(r.is_success(), "{r:?}");
        }));
    }
    let (s, d) = (median(s), median(d));
    println!("staged_spawn_ms: {:.2}", s.as_secs_f64() * 1e3);
    println!("direct_spawn_ms: {:.2}", d.as_secs_f64() * 1e3);
    println!(
        "staged_spawn_extra_ms: {:.2}",
        (s.as_secs_f64() - d.as_secs_f64()) * 1e3
    );
    let ws = staged.workspace().ok_or("no workspace")?;

    // 1,000 files of 10 KiB each, new in d/: promoted, against mv from a directory beside it.
    let make = "python3 -c \"import os\nfor i in range(1000): open('d/%d' % i, 'wb').write(os.urandom(10240))\"";
    let by_hand = dir.join("by-hand");
    let (mut p, mut m, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        let inv = held_run(&staged, &work, make);
        let t = Instant::now();
        ws.promote(&inv)?;
        p.push(t.elapsed());
        std::fs::remove_dir_all(work.join("d"))?;
        std::fs::create_dir_all(work.join("d"))?;

        std::fs::create_dir_all(&by_hand)?;
        let mut files = Vec::new();
        for i in 0..1000 {
            let f = by_hand.join(i.to_string());
            std::fs::write(&f, [i as u8; 10240])?;
            files.push(f);
        }
        let t = Instant::now();
        let out = std::process::Command::new("mv")
            .args(&files)
            .arg(work.join("d"))
            .output()?;
        m.push(t.elapsed());
        assert!(out.status.success(), "{out:?}");
        // What a root host's promote must add: the run wrote the files as its own uid, and
        // they are given to the tree's owner (here: by hand, to nobody and back is the same).
        let t = Instant::now();
        for i in 0..1000 {
            std::os::unix::fs::lchown(work.join(format!("d/{i}")), Some(65534), Some(65534))?;
        }
        c.push(t.elapsed());
        std::fs::remove_dir_all(work.join("d"))?;
        std::fs::create_dir_all(work.join("d"))?;
    }
    let (p, m, c) = (median(p), median(m), median(c));
    println!("promote_1000_ms: {:.2}", p.as_secs_f64() * 1e3);
    println!("mv_1000_ms: {:.2}", m.as_secs_f64() * 1e3);
    println!(
        "promote_ratio_vs_mv: {:.3}",
        p.as_secs_f64() / m.as_secs_f64()
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        println!("chown_1000_ms: {:.2}", c.as_secs_f64() * 1e3);
        println!(
            "promote_ratio_vs_mv_and_chown: {:.3}",
            p.as_secs_f64() / (m + c).as_secs_f64()
        );
    }

    // 10,000 files rewritten by one run: its change set and diff, read again.
    let many = work.join("many");
    std::fs::create_dir_all(&many)?;
    for i in 0..10_000 {
        std::fs::write(many.join(format!("{i}.txt")), format!("line {i}\n"))?;
    }
    let rewrite =
        "python3 -c \"\nfor i in range(10000): open('many/%d.txt' % i, 'a').write('more\\n')\"";
    let inv = held_run(&staged, &work, rewrite);
    // Read from the layer, as at a run's end: a new tool on the same dirs takes it over
    // (the tool that ran it has the change set at hand).
    drop(staged);
    let fresh = shell_on(&work, true)?;
    let ws = fresh.workspace().ok_or("no workspace")?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let set = ws.changes(&inv)?;
        let diff = ws.diff(&inv)?;
        times.push(t.elapsed());
        assert_eq!(set.changes.len(), 10_000);
        assert!(!diff.is_empty());
    }
    println!("diff_ms_10k: {:.1}", median(times).as_secs_f64() * 1e3);
    ws.discard(&inv)?;
    Ok(())
}
