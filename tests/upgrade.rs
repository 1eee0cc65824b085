//! Upgrading: what an older correx left when its host died in the middle of two tool runs
//! (`tests/fixtures/v0`, made by its `make.sh` with correx 3bf6389, the last commit whose log
//! had no schema version) opens with this build. The log is migrated in place and keeps every
//! event as it was; the two runs are closed from their journals (the one that died before its
//! commit mark is rolled back, the committed one kept); the session resumes without performing
//! a step again; `verify` is clean, and a second open changes nothing.

use correx::{
    verify_log, CancelToken, DenyAll, EventStore, RecordedEvent, Runtime, RuntimeConfig,
    ToolErrorKind, ToolInvocationId, ToolRequest, ToolResult,
};
use rusqlite::{Connection, OpenFlags};
use serde_json::json;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Where the fixture was made and must be unpacked: a journal names its root absolutely.
const ROOT: &str = "/tmp/correx-v0-fixture";

/// The fixture unpacked at [`ROOT`], held under a lock on a file beside it (another clone's
/// test run on this machine waits rather than unpacking over it), removed when dropped.
struct Unpacked {
    _lock: std::fs::File,
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(ROOT);
    }
}

fn unpack() -> Result<Unpacked, Box<dyn std::error::Error>> {
    let lock = std::fs::File::create(format!("{ROOT}.lock"))?;
    // SAFETY: flock on a descriptor we own; released when the file closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if Path::new(ROOT).exists() {
        std::fs::remove_dir_all(ROOT)?;
    }
    let archive = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0/log.tar.gz");
    let status = std::process::Command::new("tar")
        .args(["-xzf"])
        .arg(&archive)
        .args(["-C", "/tmp", "--no-same-owner"])
        .status()?;
    if !status.success() {
        return Err(format!("tar -xzf {} failed: {status}", archive.display()).into());
    }
    Ok(Unpacked { _lock: lock })
}

/// The runtime the old host ran, as this build reads its config.
fn runtime() -> Result<Runtime, Box<dyn std::error::Error>> {
    let root = Path::new(ROOT);
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": root.join("events.db"),
            "sandbox_root": root.join("sandbox"),
            "tools": {"file_write": {"enabled": true, "allowed_paths": [root.join("files")]}},
            "approvals": {"engine": "auto"}
        })
        .to_string(),
    )?;
    Ok(Runtime::new(&config, Arc::new(DenyAll))?)
}

/// The request generate.rs made for `step`.
fn request(step: &str, file: &str, content: String) -> Result<ToolRequest, String> {
    let mut r = ToolRequest::json(
        "agent-1",
        "file_write",
        json!({"operation": "write", "path": format!("{ROOT}/files/{file}"), "content": content}),
    )?;
    r.invocation_id = ToolInvocationId::from(format!("inv-{step}").as_str());
    Ok(r)
}

fn schema(db: &Path) -> Result<(i64, bool), rusqlite::Error> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let version = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let hash = conn
        .prepare("SELECT 1 FROM pragma_table_info('events') WHERE name = 'hash'")?
        .exists([])?;
    Ok((version, hash))
}

/// An event's position, id, stream, version, type and payload.
type Row = (u64, String, String, u64, String, serde_json::Value);

/// The events as the old build wrote them, read with SQLite alone.
fn old_rows(db: &Path) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut st = conn.prepare(
        "SELECT position, event_id, stream_id, stream_version, type_id, payload \
         FROM events ORDER BY position",
    )?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get::<_, i64>(3)?,
            r.get(4)?,
            r.get::<_, String>(5)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (position, id, stream, version, type_id, payload) = row?;
        out.push((
            u64::try_from(position)?,
            id,
            stream,
            u64::try_from(version)?,
            type_id,
            serde_json::from_str(&payload)?,
        ));
    }
    Ok(out)
}

/// The same of events read through this build's store.
fn rows(events: &[RecordedEvent]) -> Vec<Row> {
    events
        .iter()
        .map(|e| {
            (
                e.position,
                e.event_id.to_string(),
                e.stream_id.clone(),
                e.stream_version,
                e.type_id.clone(),
                e.payload.clone(),
            )
        })
        .collect()
}

/// The types of invocation `inv`'s tool events, in order.
fn run_types(events: &[RecordedEvent], inv: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.type_id.starts_with("tool.") && e.payload["invocation_id"] == inv)
        .filter(|e| e.type_id != "tool.approval_decided")
        .map(|e| e.type_id.clone())
        .collect()
}

fn run_dirs(sandbox: &Path) -> Result<Vec<String>, std::io::Error> {
    let mut names = Vec::new();
    for d in std::fs::read_dir(sandbox)? {
        names.push(d?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

#[test]
fn a_log_and_journals_of_an_older_correx_are_migrated_recovered_and_resumed() -> TestResult {
    let _unpacked = unpack()?;
    let root = Path::new(ROOT);
    let db = root.join("events.db");
    let (b_old, b_new) = ("b, before\n".repeat(104_858), "b, after\n".repeat(209_716));
    let c_new = "c, after\n".repeat(228);

    // What the old build left: a log without version or chain, both files rewritten, and the
    // journal and job directories of its two dead hosts.
    assert_eq!(schema(&db)?, (0, false), "the fixture is not an old log");
    assert_eq!(std::fs::read_to_string(root.join("files/b.txt"))?, b_new);
    assert_eq!(std::fs::read_to_string(root.join("files/c.txt"))?, c_new);
    let dirs = run_dirs(&root.join("sandbox"))?;
    assert_eq!(
        dirs.iter().filter(|d| d.starts_with("run-")).count(),
        2,
        "{dirs:?}"
    );
    let before = old_rows(&db)?;
    let old_count = before.len() as u64;
    assert!(
        before
            .iter()
            .filter(|r| r.4 == "tool.execution_started")
            .count()
            == 3
            && before
                .iter()
                .filter(|r| r.4 == "tool.execution_completed")
                .count()
                == 1,
        "the fixture's runs are not in flight"
    );

    let rt = runtime()?;
    assert_eq!(schema(&db)?, (3, true), "the log was not migrated");
    let mut recovered: Vec<(String, Vec<std::path::PathBuf>)> = rt
        .executor()
        .recovered()
        .iter()
        .map(|r| (r.invocation_id.clone(), r.restored.clone()))
        .collect();
    recovered.sort();
    assert_eq!(
        recovered,
        [
            ("inv-write-b".to_owned(), vec![root.join("files/b.txt")]),
            ("inv-write-c".to_owned(), vec![]),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(root.join("files/b.txt"))?,
        b_old,
        "the run that died before its commit mark was not rolled back byte for byte"
    );
    assert_eq!(std::fs::read_to_string(root.join("files/c.txt"))?, c_new);

    let after = rt.events().read_all(0, 10_000)?;
    assert_eq!(
        rows(&after[..before.len()]),
        before,
        "an event of the old log changed"
    );
    assert_eq!(
        run_types(&after, "inv-write-b"),
        ["tool.execution_started", "tool.execution_failed"]
    );
    assert_eq!(
        run_types(&after, "inv-write-c"),
        ["tool.execution_started", "tool.execution_interrupted"]
    );
    let closed = after
        .iter()
        .rev()
        .find(|e| e.payload["invocation_id"] == "inv-write-c");
    assert_eq!(
        closed.map(|e| e.payload["state"].clone()),
        Some(json!("completed"))
    );

    // The host resumes its turn with the same steps: none is performed again.
    let session = rt.session("agent-1")?;
    let cancel = CancelToken::new();
    let a = request("write-a", "a.txt", "a, after\n".into())?;
    let step = session.execute("write-a", rt.executor(), &a, Some("call-a"), &cancel)?;
    assert!(step.replayed && matches!(step.value, ToolResult::Success { .. }));
    std::fs::write(root.join("files/a.txt"), "changed since")?;
    // Each interrupted step answers with what recovery found, never running again: b's
    // files restored, c's change in place.
    for (step, req, state) in [
        (
            "write-b",
            request("write-b", "b.txt", b_new.clone())?,
            "restored",
        ),
        (
            "write-c",
            request("write-c", "c.txt", c_new.clone())?,
            "completed",
        ),
    ] {
        let call = format!("call-{}", &step[6..]);
        let answer = session.execute(step, rt.executor(), &req, Some(&call), &cancel)?;
        match &answer.value {
            ToolResult::Failure { kind, data, .. } => {
                assert_eq!(*kind, ToolErrorKind::Interrupted, "{step}");
                assert_eq!(
                    data.as_ref().map(|d| d["state"].clone()),
                    Some(json!(state)),
                    "{step}"
                );
            }
            other => panic!("{step} answered {other:?}, not interrupted"),
        }
    }
    assert_eq!(
        std::fs::read_to_string(root.join("files/a.txt"))?,
        "changed since"
    );
    assert_eq!(std::fs::read_to_string(root.join("files/b.txt"))?, b_old);
    let count = rt.events().last_position()?;
    drop(session);
    drop(rt);
    assert_eq!(
        run_dirs(&root.join("sandbox"))?,
        Vec::<String>::new(),
        "a journal or job directory was left behind"
    );

    let report = verify_log(&db)?;
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.unchained, old_count);
    assert_eq!(report.chained_from, Some(old_count + 1));

    // Opening again finds nothing to do.
    let rt = runtime()?;
    assert!(rt.executor().recovered().is_empty());
    assert_eq!(rt.events().last_position()?, count);
    assert_eq!(schema(&db)?, (3, true));
    Ok(())
}
