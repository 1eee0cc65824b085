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
//! A host killed mid-tool leaves its manifest behind; the next executor constructed on the same
//! root restores those files and records `ToolExecutionFailed` with the reason `interrupted`.

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
                let manifest = std::fs::read(dir.join(backup::MANIFEST))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok());
                if let Some(m) = manifest {
                    let mut restored = Vec::new();
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
                    append_domain(
                        self.events.as_ref(),
                        &session_stream(&m.session_id),
                        &DomainEvent::ToolExecutionFailed {
                            session_id: m.session_id.clone(),
                            invocation_id: m.invocation_id.clone(),
                            tool_name: m.tool_name.clone(),
                            reason: "interrupted".into(),
                            recoverable: true,
                            kind: None,
                        },
                    )
                    .map_err(SandboxError::Events)?;
                    out.push(Recovered {
                        session_id: m.session_id,
                        invocation_id: m.invocation_id,
                        restored,
                    });
                }
                let _ = std::fs::remove_dir_all(&dir);
            }
            let _ = std::fs::remove_dir(&session);
        }
        Ok(out)
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
            return ToolResult::failure(
                id,
                format!("the tool did not run: its start could not be recorded: {e}"),
                true,
            );
        }
        let started = Instant::now();
        let result = self.run_guarded(request, paths, cancel);
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
        result
    }

    /// Working dir, locks, backups, the tool itself, then commit or restore.
    fn run_guarded(
        &self,
        request: &ToolRequest,
        paths: Vec<PathBuf>,
        cancel: &CancelToken,
    ) -> ToolResult {
        let id = &request.invocation_id;
        let session_dir = self
            .work_root
            .join(safe_component(request.session_id.as_str()));
        let name = safe_component(id.as_str());
        // Another invocation of this session may remove the session directory just as this one
        // creates it: one retry covers that.
        let work = PrivateDir::new_exact(&session_dir, &name)
            .or_else(|_| PrivateDir::new_exact(&session_dir, &name))
            .and_then(|w| lock_invocation(w.path(), true).map(|lock| (w, lock)));
        let (work, _lock) = match work {
            Ok(w) => w,
            Err(e) => {
                return ToolResult::failure(
                    id,
                    format!("could not create the sandbox working directory: {e}"),
                    true,
                )
            }
        };
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
        let prepared = backup::write_manifest(work.path(), &manifest)
            .map_err(|e| format!("writing the sandbox manifest: {e}"))
            .and_then(|()| {
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
                // The manifest goes first: once it is gone, a crash cannot turn this success
                // into a "recovery" that rolls the tool's work back.
                if let Err(err) = std::fs::remove_file(work.path().join(backup::MANIFEST)) {
                    log::error!("removing the sandbox manifest of {id}: {err}");
                }
                for e in &manifest.entries {
                    if let Err(err) = backup::discard(e) {
                        log::warn!("dropping the backup of {}: {err}", e.path.display());
                    }
                }
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
        drop(work);
        let _ = std::fs::remove_dir(&session_dir);
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
