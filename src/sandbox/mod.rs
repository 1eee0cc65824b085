//! [`SandboxedToolExecutor`]: every tool run gated by its tier, backed up, and recorded.
//!
//! For each request: the tool is resolved (unknown: a failure, nothing recorded); T2 and T3
//! tools are put to the approval engine (denied: `ToolExecutionRejected`, the tool never
//! runs); `ToolExecutionStarted` is appended; every path the tool may touch is backed up beside
//! itself and listed in a manifest in a fresh private working directory; the tool runs; on
//! success the backups are dropped and `ToolExecutionCompleted` appended; on failure or panic
//! every path is restored byte for byte and `ToolExecutionFailed` appended. The working
//! directory is always removed. A cancel ([`SandboxedToolExecutor::execute_cancellable_in`])
//! before the start is a rejection; during the run it stops the tool, restores like a failure
//! and appends `ToolExecutionCancelled`.
//!
//! The working directory exists (locked) from before `ToolExecutionStarted` until after the
//! outcome is recorded, so a host killed at any point leaves it behind; the next executor
//! constructed on the same root closes the run exactly once: restored from its manifest
//! (`ToolExecutionFailed`, reason `interrupted`), committed (`ToolExecutionInterrupted`, state
//! `completed`) or untouched (state `unchanged`).

mod backup;

use crate::approvals::{ApprovalContext, ApprovalEngine, ApprovalPolicy, ApprovalRequest};
use crate::cancel::CancelToken;
use crate::events::{append_domain, DomainEvent, EventStore, EventStoreError, ExpectedVersion};
use crate::private_dir::PrivateDir;
use crate::tools::{
    ToolErrorKind, ToolExecutor, ToolRegistry, ToolRequest, ToolResult, ValidationResult,
};
use backup::Manifest;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The event stream of a session's tool events.
pub fn session_stream(session_id: &str) -> String {
    format!("session-{session_id}")
}

/// Why an executor could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum SandboxError {
    /// The working root could not be created or read.
    WorkRoot {
        /// The root.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// Recovering an interrupted invocation could not be recorded.
    Events(EventStoreError),
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::WorkRoot { path, source } => write!(
                f,
                "sandbox working root {}: {source}; check that it is writable",
                path.display()
            ),
            SandboxError::Events(e) => write!(f, "recording a recovered invocation: {e}"),
        }
    }
}

impl std::error::Error for SandboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SandboxError::WorkRoot { source, .. } => Some(source),
            SandboxError::Events(e) => Some(e),
        }
    }
}

/// What an interrupted invocation found at construction came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// The session.
    pub session_id: String,
    /// The invocation.
    pub invocation_id: String,
    /// Paths put back as they were.
    pub restored: Vec<PathBuf>,
}

/// Gates, backs up and records every tool run. See the module docs.
pub struct SandboxedToolExecutor {
    delegate: Arc<dyn ToolExecutor>,
    registry: ToolRegistry,
    policy: ApprovalPolicy,
    events: Arc<dyn EventStore>,
    work_root: PathBuf,
    locks: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
    recovered: Vec<Recovered>,
}

impl fmt::Debug for SandboxedToolExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxedToolExecutor")
            .field("registry", &self.registry)
            .field("work_root", &self.work_root)
            .finish_non_exhaustive()
    }
}

/// The default working root: `correx-sandbox-{uid}` under the system temp directory, one per
/// user (a root shared between users would let one plant manifests for another to "recover").
pub fn default_work_root() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("correx-sandbox-{uid}"))
}

/// An exclusive advisory lock on `dir/lock`, held while an invocation runs; the kernel drops it
/// when the process dies, which is how recovery tells a crashed invocation from a live one.
fn lock_invocation(dir: &std::path::Path, wait: bool) -> std::io::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on an fd we own; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(f))
}

/// A run's working directory and its lock; removed (with its session directory when that is
/// left empty) when dropped.
struct WorkDir {
    dir: Option<PrivateDir>,
    _lock: Option<std::fs::File>,
    session_dir: PathBuf,
}

impl WorkDir {
    fn path(&self) -> &std::path::Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(std::path::Path::new(""))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        drop(self.dir.take());
        let _ = std::fs::remove_dir(&self.session_dir);
    }
}

/// Test seam: `CORREX_TEST_ABORT_AT=<step>` aborts the process at that step of a sandboxed
/// run (`workdir`, `started`, `manifest`, `backup`, `tool`, `committed`, `discarded`,
/// `outcome`), for the crash tests; unset, it costs one cached lookup.
fn seam(step: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("CORREX_TEST_ABORT_AT").ok());
    if at.as_deref() == Some(step) {
        std::process::abort();
    }
}

/// What the log says of one run: its tool (when it started), the session stream's version,
/// and whether it has an outcome.
fn run_state(
    events: &dyn EventStore,
    stream: &str,
    invocation_id: &str,
) -> Result<(Option<String>, u64, bool), EventStoreError> {
    let (mut tool, mut version, mut closed) = (None, 0, false);
    let mut from = 1;
    loop {
        let page = events.read_stream(stream, from, 1000)?;
        let Some(last) = page.last().map(|e| e.stream_version) else {
            break;
        };
        for e in &page {
            version = e.stream_version;
            if e.payload["invocation_id"].as_str() != Some(invocation_id) {
                continue;
            }
            match e.type_id.as_str() {
                "tool.execution_started" => {
                    tool = e.payload["tool_name"].as_str().map(str::to_owned);
                }
                "tool.execution_completed"
                | "tool.execution_failed"
                | "tool.execution_cancelled"
                | "tool.execution_interrupted" => closed = true,
                _ => {}
            }
        }
        from = last + 1;
    }
    Ok((tool, version, closed))
}

/// The id a directory name made by [`safe_component`] stands for.
fn from_component(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out == [0] {
        out.clear();
    }
    String::from_utf8(out).ok()
}

/// A path component safe to use as a directory name, whatever the id holds.
fn safe_component(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    out
}

impl SandboxedToolExecutor {
    /// An executor over `registry` that runs tools through `delegate`, with working
    /// directories under `work_root` ([`default_work_root`] is a good default). Recovers any
    /// invocation a crashed host left under `work_root` first.
    ///
    /// # Errors
    /// [`SandboxError::WorkRoot`] when the root cannot be created or read;
    /// [`SandboxError::Events`] when a recovery cannot be recorded.
    pub fn new(
        delegate: Arc<dyn ToolExecutor>,
        registry: ToolRegistry,
        approvals: Arc<dyn ApprovalEngine>,
        events: Arc<dyn EventStore>,
        work_root: PathBuf,
    ) -> Result<Self, SandboxError> {
        Self::with_policy(
            delegate,
            registry,
            ApprovalPolicy::new(Vec::new(), approvals),
            events,
            work_root,
        )
    }

    /// As [`SandboxedToolExecutor::new`], deciding approvals with `policy` (rules and session
    /// answers in front of its engine).
    ///
    /// # Errors
    /// As [`SandboxedToolExecutor::new`].
    pub fn with_policy(
        delegate: Arc<dyn ToolExecutor>,
        registry: ToolRegistry,
        policy: ApprovalPolicy,
        events: Arc<dyn EventStore>,
        work_root: PathBuf,
    ) -> Result<Self, SandboxError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&work_root)
            .and_then(|()| crate::private_dir::check_private(&work_root))
            .map_err(|source| SandboxError::WorkRoot {
                path: work_root.clone(),
                source,
            })?;
        let mut ex = SandboxedToolExecutor {
            delegate,
            registry,
            policy,
            events,
            work_root,
            locks: Mutex::new(HashMap::new()),
            recovered: Vec::new(),
        };
        ex.recovered = ex.recover()?;
        Ok(ex)
    }

    /// The interrupted invocations this executor restored when it was built.
    pub fn recovered(&self) -> &[Recovered] {
        &self.recovered
    }

    /// The registry this executor resolves tools in.
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// Finds the runs a dead host left (their working directories, unlocked) and closes each
    /// exactly once: a run with a manifest has its files restored and is recorded failed
    /// (`interrupted`); one with a commit mark changed its files and is recorded
    /// `tool.execution_interrupted` with state `completed`; one with neither never changed
    /// anything (`unchanged`). A run whose outcome is already in the log (the host died after
    /// recording it, or an earlier recovery was killed) gets nothing more. Stray temp files and
    /// partial backups beside the run's paths are removed.
    fn recover(&self) -> Result<Vec<Recovered>, SandboxError> {
        let root_err = |source| SandboxError::WorkRoot {
            path: self.work_root.clone(),
            source,
        };
        let mut out = Vec::new();
        for session in std::fs::read_dir(&self.work_root).map_err(root_err)? {
            let session = session.map_err(root_err)?.path();
            let Ok(invocations) = std::fs::read_dir(&session) else {
                continue;
            };
            for inv in invocations.flatten() {
                let dir = inv.path();
                // A live invocation (this process or another) holds its lock: not ours to touch.
                let Ok(Some(_held)) = lock_invocation(&dir, false) else {
                    continue;
                };
                if let Some(r) = self.recover_one(&session, &dir)? {
                    out.push(r);
                }
                let _ = std::fs::remove_dir_all(&dir);
            }
            let _ = std::fs::remove_dir(&session);
        }
        Ok(out)
    }

    fn recover_one(
        &self,
        session: &std::path::Path,
        dir: &std::path::Path,
    ) -> Result<Option<Recovered>, SandboxError> {
        let name = |p: &std::path::Path| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(from_component)
        };
        let (Some(session_id), Some(invocation_id)) = (name(session), name(dir)) else {
            return Ok(None);
        };
        let read_manifest = |file: &str| {
            std::fs::read(dir.join(file))
                .ok()
                .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
        };
        let manifest = read_manifest(backup::MANIFEST);
        let committed = read_manifest(backup::COMMITTED);
        for m in manifest.iter().chain(committed.iter()) {
            backup::remove_strays(&m.entries);
        }
        let stream = session_stream(&session_id);
        let (tool_name, version, closed) = run_state(self.events.as_ref(), &stream, &invocation_id)
            .map_err(SandboxError::Events)?;
        // Never started (killed before the start was recorded): nothing ran.
        let Some(tool_name) = tool_name else {
            return Ok(None);
        };
        let mut restored = Vec::new();
        if let Some(m) = &manifest {
            for e in m.entries.iter().filter(|e| backup::plausible(e)) {
                match backup::restore(e) {
                    Ok(backup::Restored::Yes) => restored.push(e.path.clone()),
                    Ok(backup::Restored::Unchanged | backup::Restored::NoBackup) => {}
                    Err(err) => {
                        log::error!("restoring {}: {err}", e.path.display());
                        let _ = backup::discard(e);
                    }
                }
            }
        }
        if let Some(m) = &committed {
            for e in &m.entries {
                let _ = backup::discard(e);
            }
        }
        if closed {
            return Ok(None);
        }
        let event = match (&manifest, &committed) {
            (Some(_), _) => DomainEvent::ToolExecutionFailed {
                session_id: session_id.clone(),
                invocation_id: invocation_id.clone(),
                tool_name,
                reason: "interrupted".into(),
                recoverable: true,
                kind: None,
            },
            (None, Some(_)) => DomainEvent::ToolExecutionInterrupted {
                session_id: session_id.clone(),
                invocation_id: invocation_id.clone(),
                tool_name,
                state: "completed".into(),
            },
            (None, None) => DomainEvent::ToolExecutionInterrupted {
                session_id: session_id.clone(),
                invocation_id: invocation_id.clone(),
                tool_name,
                state: "unchanged".into(),
            },
        };
        // At the version read: a recovery racing this one on the same log records it once.
        match self.events.append(
            &stream,
            ExpectedVersion::Exact(version),
            &[event.to_new_event()],
        ) {
            Ok(_) | Err(EventStoreError::WrongExpectedVersion { .. }) => {}
            Err(e) => return Err(SandboxError::Events(e)),
        }
        Ok(Some(Recovered {
            session_id,
            invocation_id,
            restored,
        }))
    }

    /// Runs `request` as [`ToolExecutor::execute`] does, asking approval with `context`.
    pub fn execute_in(&self, request: &ToolRequest, context: &ApprovalContext) -> ToolResult {
        self.execute_cancellable_in(request, context, &CancelToken::new())
    }

    /// As [`SandboxedToolExecutor::execute_in`], stopping when `cancel` is set: before the
    /// tool starts the run is rejected (nothing ran); while it runs the tool stops (a shell
    /// run's processes are killed; a file tool completes its one atomic change or never
    /// starts it), its files are restored and `tool.execution_cancelled` recorded.
    pub fn execute_cancellable_in(
        &self,
        request: &ToolRequest,
        context: &ApprovalContext,
        cancel: &CancelToken,
    ) -> ToolResult {
        let id = &request.invocation_id;
        let Some(tool) = self.registry.resolve(&request.tool_name).cloned() else {
            return ToolResult::failure_of(
                id,
                ToolErrorKind::InvalidRequest,
                format!(
                    "unknown tool {:?}; available: {}",
                    request.tool_name,
                    self.registry.names().join(", ")
                ),
                false,
            );
        };
        let stream = session_stream(request.session_id.as_str());
        let record = |e: DomainEvent| append_domain(self.events.as_ref(), &stream, &e);
        // The decision goes into the same transaction as the start or rejection it led to.
        let record_with = |decided: Option<DomainEvent>, e: DomainEvent| {
            let events: Vec<_> = decided
                .iter()
                .chain(std::iter::once(&e))
                .map(DomainEvent::to_new_event)
                .collect();
            self.events.append(&stream, ExpectedVersion::Any, &events)
        };
        let base = (
            request.session_id.to_string(),
            request.invocation_id.to_string(),
            request.tool_name.clone(),
        );
        let tier = tool.tier().as_i32();
        // Records the rejection and returns the failure the caller gets.
        let reject =
            |decided: Option<DomainEvent>, kind: ToolErrorKind, reason: String, shown: String| {
                let recorded = record_with(
                    decided,
                    DomainEvent::ToolExecutionRejected {
                        session_id: base.0.clone(),
                        invocation_id: base.1.clone(),
                        tool_name: base.2.clone(),
                        tier,
                        reason,
                        kind: Some(kind.as_str().to_owned()),
                    },
                );
                let note = match recorded {
                    Ok(_) => String::new(),
                    Err(e) => format!(" (and the rejection could not be recorded: {e})"),
                };
                ToolResult::failure_of(id, kind, format!("{shown}{note}"), false)
            };
        // A malformed request fails at once, before any approver (a person) is asked about it.
        if let ValidationResult::Invalid { reason } = tool.validate_request(request) {
            let reason = format!("invalid request: {reason}");
            return reject(None, ToolErrorKind::InvalidRequest, reason.clone(), reason);
        }
        let paths = match tool
            .as_file_affecting()
            .map(|f| f.affected_paths_or_kind(request))
        {
            Some(Ok(p)) => p,
            Some(Err((kind, reason))) => {
                let reason = match kind {
                    ToolErrorKind::InvalidRequest => format!("invalid request: {reason}"),
                    _ => format!("refused: {reason}"),
                };
                return reject(None, kind, reason.clone(), reason);
            }
            None => Vec::new(),
        };
        let ask = ApprovalRequest::new(request, tool.tier(), paths.clone());
        let decided = self.policy.decide(&ask, context);
        let decided_event = decided.as_ref().map(|d| DomainEvent::ToolApprovalDecided {
            session_id: base.0.clone(),
            invocation_id: base.1.clone(),
            tool_name: base.2.clone(),
            tier,
            decision: d.decision.as_str().to_owned(),
            decided_by: d.decided_by.clone(),
            wait_ms: d.wait_ms,
            reason: match &d.decision {
                crate::approvals::ApprovalDecision::Denied { reason } => Some(reason.clone()),
                _ => None,
            },
        });
        if let Some(crate::approvals::ApprovalDecision::Denied { reason }) =
            decided.as_ref().map(|d| &d.decision)
        {
            let shown = format!("not approved: {reason}");
            return reject(
                decided_event,
                ToolErrorKind::NotAllowed,
                reason.clone(),
                shown,
            );
        }
        // The approver may have taken long; a cancel meanwhile means the host no longer wants it.
        if cancel.is_cancelled() {
            let reason = "cancelled by the host before it ran".to_owned();
            return reject(
                decided_event,
                ToolErrorKind::Cancelled,
                reason.clone(),
                format!("{reason}; nothing was changed"),
            );
        }
        // The working directory (locked while the run lives) exists before the start is
        // recorded and goes only after the outcome is: a started run without an outcome always
        // leaves it for recovery to find.
        let workdir = match self.work_dir(request) {
            Ok(w) => w,
            Err(e) => {
                let reason = format!("could not create the sandbox working directory: {e}");
                return reject(decided_event, ToolErrorKind::Io, reason.clone(), reason);
            }
        };
        seam("workdir");
        if let Err(e) = record_with(
            decided_event,
            DomainEvent::ToolExecutionStarted {
                session_id: base.0.clone(),
                invocation_id: base.1.clone(),
                tool_name: base.2.clone(),
                tier,
                isolation: tool.isolation(),
            },
        ) {
            drop(workdir);
            return ToolResult::failure_of(
                id,
                ToolErrorKind::Io,
                format!("the tool did not run: its start could not be recorded: {e}"),
                true,
            );
        }
        seam("started");
        let started = Instant::now();
        let result = self.run_guarded(request, paths, &workdir, cancel);
        let event = match &result {
            ToolResult::Failure { .. } if cancel.is_cancelled() => {
                DomainEvent::ToolExecutionCancelled {
                    session_id: base.0,
                    invocation_id: base.1,
                    tool_name: base.2,
                    duration_ms: started.elapsed().as_millis() as u64,
                }
            }
            ToolResult::Success { .. } => DomainEvent::ToolExecutionCompleted {
                session_id: base.0,
                invocation_id: base.1,
                tool_name: base.2,
                duration_ms: started.elapsed().as_millis() as u64,
            },
            ToolResult::Failure {
                reason,
                recoverable,
                kind,
                ..
            } => DomainEvent::ToolExecutionFailed {
                session_id: base.0,
                invocation_id: base.1,
                tool_name: base.2,
                reason: reason.clone(),
                recoverable: *recoverable,
                kind: Some(kind.as_str().to_owned()),
            },
        };
        if let Err(e) = record(event) {
            log::error!("recording the end of invocation {id}: {e}");
        }
        seam("outcome");
        drop(workdir);
        result
    }

    /// The run's private working directory under the root, locked while the run lives.
    fn work_dir(&self, request: &ToolRequest) -> std::io::Result<WorkDir> {
        let session_dir = self
            .work_root
            .join(safe_component(request.session_id.as_str()));
        let name = safe_component(request.invocation_id.as_str());
        // Another invocation of this session may remove the session directory just as this one
        // creates it: one retry covers that.
        let dir = PrivateDir::new_exact(&session_dir, &name)
            .or_else(|_| PrivateDir::new_exact(&session_dir, &name))?;
        let lock = lock_invocation(dir.path(), true)?;
        Ok(WorkDir {
            dir: Some(dir),
            _lock: lock,
            session_dir,
        })
    }

    /// Locks, backups, the tool itself, then commit or restore.
    fn run_guarded(
        &self,
        request: &ToolRequest,
        paths: Vec<PathBuf>,
        workdir: &WorkDir,
        cancel: &CancelToken,
    ) -> ToolResult {
        let id = &request.invocation_id;
        let work = workdir.path();
        let _locks = self.lock_paths(&paths);
        let tag = &safe_component(id.as_str())[..safe_component(id.as_str()).len().min(40)];
        let mut entries = Vec::with_capacity(paths.len());
        for p in &paths {
            match backup::plan(p, tag) {
                Ok(e) => entries.push(e),
                Err(e) => {
                    return ToolResult::failure(
                        id,
                        format!(
                            "backup of {} failed, the tool did not run: {e}",
                            p.display()
                        ),
                        true,
                    )
                }
            }
        }
        let manifest = Manifest {
            session_id: request.session_id.to_string(),
            invocation_id: id.to_string(),
            tool_name: request.tool_name.clone(),
            entries,
        };
        // The manifest goes first: a crash while copying leaves it, and a recovery only renames
        // back backups that are complete (each lands under its final name only when whole).
        let prepared = backup::write_manifest(work, &manifest)
            .map_err(|e| format!("writing the sandbox manifest: {e}"))
            .and_then(|()| {
                seam("manifest");
                for e in &manifest.entries {
                    backup::take(e).map_err(|err| {
                        format!(
                            "backup of {} failed, the tool did not run: {err}",
                            e.path.display()
                        )
                    })?;
                }
                Ok(())
            });
        if let Err(reason) = prepared {
            for e in &manifest.entries {
                let _ = backup::discard(e);
            }
            return ToolResult::failure(id, reason, true);
        }
        seam("backup");
        let result = match catch_unwind(AssertUnwindSafe(|| {
            self.delegate.execute_cancellable(request, cancel)
        })) {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                ToolResult::failure(id, format!("the tool panicked: {what}"), false)
            }
        };
        let result = match result {
            ToolResult::Success { .. } => {
                seam("tool");
                // The manifest becomes the commit mark first: from here a crash cannot turn
                // this success into a "recovery" that rolls the tool's work back, and recovery
                // knows the change is in place.
                if let Err(err) =
                    std::fs::rename(work.join(backup::MANIFEST), work.join(backup::COMMITTED))
                {
                    log::error!("marking invocation {id} committed: {err}");
                }
                seam("committed");
                for e in &manifest.entries {
                    if let Err(err) = backup::discard(e) {
                        log::warn!("dropping the backup of {}: {err}", e.path.display());
                    }
                }
                seam("discarded");
                result
            }
            ToolResult::Failure {
                invocation_id,
                reason,
                recoverable,
                kind,
                data,
            } => {
                let mut reason = reason;
                for e in manifest.entries.iter().rev() {
                    if let Err(err) = backup::restore(e) {
                        reason.push_str(&format!("; restoring {} failed: {err}", e.path.display()));
                    }
                }
                ToolResult::Failure {
                    invocation_id,
                    reason: crate::text::bounded(reason),
                    recoverable,
                    kind,
                    data,
                }
            }
        };
        result
    }

    /// One lock per path, taken in sorted order so two invocations cannot deadlock.
    fn lock_paths(&self, paths: &[PathBuf]) -> Vec<PathGuard<'_>> {
        let mut sorted: Vec<&PathBuf> = paths.iter().collect();
        sorted.sort();
        sorted.dedup();
        let locks: Vec<(PathBuf, Arc<Mutex<()>>)> = {
            let mut map = self.locks.lock();
            sorted
                .into_iter()
                .map(|p| (p.clone(), Arc::clone(map.entry(p.clone()).or_default())))
                .collect()
        };
        locks
            .into_iter()
            .map(|(path, lock)| PathGuard {
                owner: self,
                path,
                guard: Some(lock.lock_arc()),
            })
            .collect()
    }
}

/// Holds one path's lock; releases it and forgets the lock when nobody else wants it.
struct PathGuard<'a> {
    owner: &'a SandboxedToolExecutor,
    path: PathBuf,
    guard: Option<parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>>,
}

impl Drop for PathGuard<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let lock = Arc::clone(parking_lot::ArcMutexGuard::mutex(&guard));
        drop(guard);
        let mut map = self.owner.locks.lock();
        // Two references left, the map's and ours: nobody waits, so the entry can go.
        if Arc::strong_count(&lock) == 2 {
            map.remove(&self.path);
        }
    }
}

impl ToolExecutor for SandboxedToolExecutor {
    fn execute(&self, request: &ToolRequest) -> ToolResult {
        self.execute_in(request, &ApprovalContext::new(request.session_id.clone()))
    }

    fn execute_cancellable(&self, request: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        self.execute_cancellable_in(
            request,
            &ApprovalContext::new(request.session_id.clone()),
            cancel,
        )
    }
}
