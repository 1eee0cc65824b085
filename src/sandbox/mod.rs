//! [`SandboxedToolExecutor`]: every tool run gated by its tier, backed up, and recorded.
//!
//! For each request: the tool is resolved (unknown: a failure, nothing recorded); the request
//! is validated and its paths resolved (bad: `ToolExecutionRejected`); T2 and T3 tools are put
//! to the approval policy (denied: `ToolExecutionRejected`, the tool never runs); every path the
//! tool may touch is backed up through its directory, held open beneath its allowed root, and
//! listed in the run's journal; `ToolExecutionStarted` is appended; the tool runs; on success
//! the journal is marked committed, the backups dropped and `ToolExecutionCompleted` appended;
//! on failure or panic every path is restored byte for byte and `ToolExecutionFailed` appended.
//! A cancel ([`SandboxedToolExecutor::execute_cancellable_in`]) before the start is a
//! rejection; during the run it stops the tool, restores like a failure and appends
//! `ToolExecutionCancelled`.
//!
//! The journal is complete before `ToolExecutionStarted` is recorded and removed only after the
//! outcome is, so a host killed at any point leaves it behind; the next executor constructed on
//! the same root closes the run exactly once: restored (`ToolExecutionFailed`, reason
//! `interrupted`), committed (`ToolExecutionInterrupted`, state `completed`) or never changed
//! (state `unchanged`).

mod backup;
mod journal;
mod legacy;

use crate::approvals::{
    expired_reason, now_ms, ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalError,
    ApprovalPolicy, ApprovalRecord, ApprovalRequest, Approvals, Decided, Settled,
};
use crate::cancel::CancelToken;
use crate::confine::AppliedPolicy;
pub use crate::domain::session_stream;
use crate::domain::{DomainEvent, EventType};
use crate::events::{AppendResult, EventStore, EventStoreError, ExpectedVersion};
use crate::ids::ToolInvocationId;
use crate::tools::Recoverable;
use crate::tools::{
    Tool, ToolErrorKind, ToolExecutor, ToolRegistry, ToolRequest, ToolResult, ValidationResult,
};
use backup::BackupSet;
use journal::{Journals, Manifest};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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

/// What recovering one run came to.
enum Closed {
    /// Closed (or nothing to close), with what was restored when it was recorded here.
    Yes(Option<Recovered>),
    /// Its files could not be put back yet: its journal stays for the next recovery.
    Later,
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
    journals: Journals,
    root_fds: backup::RootFds,
    /// The durable approval requests of the log, read when the engine may defer.
    approvals: Approvals,
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
    let uid = crate::sys::uid();
    std::env::temp_dir().join(format!("correx-sandbox-{uid}"))
}

/// Test hook (feature `test-hooks`): `CORREX_TEST_ABORT_AT=<step>` aborts the process at that
/// step of a sandboxed run (`journal`, `backup`, `started`, `tool`, `committed`, `discarded`,
/// `outcome`), for the crash tests. A library built without the feature has no such variable.
#[cfg(not(feature = "test-hooks"))]
fn seam(_step: &str) {}

/// See the other `seam`.
#[cfg(feature = "test-hooks")]
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
            // Every type is named: a new one is a compile error here until recovery decides
            // whether it closes a run. The type decides, not a payload this build may not read
            // whole (a newer host's).
            match EventType::of(&e.type_id) {
                Some(EventType::ToolExecutionStarted) => {
                    tool = e.payload["tool_name"].as_str().map(str::to_owned);
                }
                Some(
                    EventType::ToolExecutionCompleted
                    | EventType::ToolExecutionFailed
                    | EventType::ToolExecutionCancelled
                    | EventType::ToolExecutionInterrupted,
                ) => closed = true,
                Some(
                    EventType::ToolApprovalDecided
                    // A request waits for a decision: the run has not started.
                    | EventType::ToolApprovalRequested
                    | EventType::ToolNetworkDenied
                    // A change set, appended before the run's outcome (which closes it).
                    | EventType::WorkspaceStaged
                    | EventType::WorkspaceSettled
                    | EventType::ToolProgress
                    | EventType::ToolExecutionRejected
                    | EventType::ModelLoaded
                    | EventType::ModelUnloaded
                    | EventType::ModelEndpointFailover
                    | EventType::InferenceCompleted
                    | EventType::EmbeddingCompleted
                    | EventType::ModelCacheRestored
                    | EventType::ModelCacheMissed
                    | EventType::ModelCacheSaved
                    | EventType::SessionWaiting
                    | EventType::SessionSignaled
                    | EventType::JobStarted
                    | EventType::JobExited
                    | EventType::McpServerStarted
                    | EventType::McpServerExited
                    | EventType::McpRequestRefused
                    | EventType::McpToolsPinned
                    | EventType::McpToolHeld
                    // A session step names the invocation it runs; its claim and its result
                    // neither start nor close the run.
                    | EventType::SessionStepStarted
                    | EventType::SessionStepCompleted
                    | EventType::SessionStepFailed,
                )
                | None => {}
            }
        }
        from = last + 1;
    }
    Ok((tool, version, closed))
}

/// The result of a run that waits for a durable decision on `record`: nothing ran.
fn pending_result(id: &ToolInvocationId, record: &ApprovalRecord) -> ToolResult {
    ToolResult::failure_of(
        id,
        ToolErrorKind::Pending,
        format!(
            "waiting for approval: request {} of session {} needs a decision (`correx approvals \
             decide`); ask for the run again after it",
            record.request_id, record.session_id
        ),
        Recoverable::Yes,
    )
    .with_data(serde_json::json!({"approval": {
        "request_id": record.request_id,
        "state": "pending",
        "deadline_ms": record.deadline_ms,
    }}))
}

/// Drops a recovered run's backups without restoring them.
fn discard_backups(entries: &[&backup::Entry]) {
    for e in entries {
        if let Err(err) = backup::discard(e) {
            log::warn!("dropping the backup of {}: {err}", e.path().display());
        }
    }
}

/// Puts a recovered run's paths back from their backups: the paths restored, those whose
/// backup could never be restored, and whether any is left for the next recovery to retry.
fn restore_backups(entries: &[&backup::Entry], blobs: &[u8]) -> (Vec<PathBuf>, Vec<PathBuf>, bool) {
    let mut restored = Vec::new();
    let mut failed = Vec::new();
    let mut retry = false;
    for e in entries {
        let done = e
            .open_dir()
            .and_then(|d| backup::restore(e, std::os::fd::AsRawFd::as_raw_fd(&d), blobs));
        match done {
            Ok(backup::Restored::Yes) => restored.push(e.path()),
            Ok(backup::Restored::Unchanged | backup::Restored::NoBackup) => {}
            // A backup a power loss left short can never be restored: dropped.
            Err(err) if err.kind() == std::io::ErrorKind::InvalidData => {
                log::error!("restoring {}: {err}", e.path().display());
                failed.push(e.path());
                let _ = backup::discard(e);
            }
            // Anything else (no space, no permission) may pass: the backup and the
            // journal stay, and the next executor on this root tries again.
            Err(err) => {
                log::error!(
                    "restoring {}: {err}; the backup is kept for the next recovery",
                    e.path().display()
                );
                retry = true;
            }
        }
    }
    (restored, failed, retry)
}

/// The event closing a recovered run: interrupted (`completed` when it committed, `unchanged`
/// when nothing needed restoring), else failed (`interrupted`).
fn recovery_event(
    committed: bool,
    unchanged: bool,
    session_id: String,
    invocation_id: String,
    tool_name: String,
) -> DomainEvent {
    if committed || unchanged {
        DomainEvent::ToolExecutionInterrupted {
            session_id,
            invocation_id,
            tool_name,
            state: if committed { "completed" } else { "unchanged" }.into(),
        }
    } else {
        DomainEvent::ToolExecutionFailed {
            session_id,
            invocation_id,
            tool_name,
            reason: "interrupted".into(),
            recoverable: true,
            kind: None,
            network: None,
        }
    }
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
        let events_for_approvals = events.clone();
        let journals = Journals::create(&work_root).map_err(|source| SandboxError::WorkRoot {
            path: work_root.clone(),
            source,
        })?;
        let mut ex = SandboxedToolExecutor {
            delegate,
            registry,
            policy,
            events,
            work_root,
            journals,
            root_fds: backup::RootFds::default(),
            approvals: Approvals::new(events_for_approvals),
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

    /// Finds the runs a dead host left (the journals of executors whose lock is free) and
    /// closes each exactly once: a pending run has its files restored and is recorded failed
    /// (`interrupted`), or `tool.execution_interrupted` with state `unchanged` when nothing
    /// needed restoring; a committed one changed its files and is recorded
    /// `tool.execution_interrupted` with state `completed`; one whose start was never recorded
    /// gets nothing. A run whose outcome is already in the log (the host died after recording
    /// it, or an earlier recovery was killed) gets nothing more. Stray temp files and partial
    /// backups beside the run's paths are removed.
    fn recover(&self) -> Result<Vec<Recovered>, SandboxError> {
        let dead = journal::dead(&self.work_root).map_err(|source| SandboxError::WorkRoot {
            path: self.work_root.clone(),
            source,
        })?;
        let mut out = Vec::new();
        for d in dead {
            let mut keep = false;
            for f in d.journals.into_iter().flatten() {
                match self.recover_one(f)? {
                    Closed::Yes(Some(r)) => out.push(r),
                    Closed::Yes(None) => {}
                    Closed::Later => keep = true,
                }
            }
            // A run whose files could not be put back keeps its journal for the next try.
            if !keep {
                let _ = std::fs::remove_dir_all(&d.dir);
            }
        }
        for old in legacy::dead_runs(&self.work_root) {
            if let Closed::Yes(r) = self.recover_one(old.found)? {
                out.extend(r);
                let _ = std::fs::remove_dir_all(&old.dir);
                if let Some(session) = old.dir.parent() {
                    let _ = std::fs::remove_dir(session);
                }
            }
        }
        Ok(out)
    }

    fn recover_one(&self, found: journal::Found) -> Result<Closed, SandboxError> {
        let m = found.manifest;
        let entries: Vec<_> = m.entries.iter().filter(|e| e.plausible()).collect();
        backup::remove_strays(&m.entries);
        let stream = session_stream(&m.session_id);
        let (started, version, closed) = run_state(self.events.as_ref(), &stream, &m.invocation_id)
            .map_err(SandboxError::Events)?;
        // Never started (killed before the start was recorded): nothing ran. Closed: the
        // files were settled before the outcome was recorded. Committed: the change stays.
        if started.is_none() || closed || found.committed {
            discard_backups(&entries);
            if started.is_none() || closed {
                return Ok(Closed::Yes(None));
            }
        }
        let (restored, failed, retry) = if found.committed {
            (Vec::new(), Vec::new(), false)
        } else {
            restore_backups(&entries, &found.blobs)
        };
        if retry {
            return Ok(Closed::Later);
        }
        // A run of the old layout that stopped before its manifest names its tool only in the log.
        let tool_name = if m.tool_name.is_empty() {
            started.unwrap_or_default()
        } else {
            m.tool_name
        };
        let (session_id, invocation_id) = (m.session_id, m.invocation_id);
        let event = recovery_event(
            found.committed,
            restored.is_empty() && failed.is_empty(),
            session_id.clone(),
            invocation_id.clone(),
            tool_name,
        );
        self.append_recovery(&stream, version, &event, &invocation_id)?;
        Ok(Closed::Yes(Some(Recovered {
            session_id,
            invocation_id,
            restored,
        })))
    }

    /// Records a recovery's `event` on `stream`, once, unless the run was closed meanwhile.
    fn append_recovery(
        &self,
        stream: &str,
        version: u64,
        event: &DomainEvent,
        invocation_id: &str,
    ) -> Result<(), SandboxError> {
        // At the version read: a recovery racing this one on the same log records it once.
        // Another event of the session meanwhile moves the version: read again, and append
        // unless the run was closed by then.
        let mut version = version;
        for _ in 0..100 {
            match self.events.append(
                stream,
                ExpectedVersion::Exact(version),
                &[event.to_new_event()],
            ) {
                Ok(_) => break,
                Err(EventStoreError::WrongExpectedVersion { .. }) => {
                    let (_, now, closed) = run_state(self.events.as_ref(), stream, invocation_id)
                        .map_err(SandboxError::Events)?;
                    if closed {
                        break;
                    }
                    version = now;
                }
                Err(e) => return Err(SandboxError::Events(e)),
            }
        }
        Ok(())
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
        let Some(tool) = self.registry.resolve(&request.tool_name) else {
            return ToolResult::failure_of(
                id,
                ToolErrorKind::InvalidRequest,
                format!(
                    "unknown tool {:?}; available: {}",
                    request.tool_name,
                    self.registry.names().join(", ")
                ),
                Recoverable::No,
            );
        };
        let log = RunLog::new(self.events.as_ref(), request, tool.tier().as_i32());
        let paths = match check_request(request, tool.as_ref(), &log) {
            Ok(p) => p,
            Err(failure) => return failure,
        };
        let decided_event =
            match self.approve(request, context, cancel, tool.as_ref(), &paths, &log) {
                Ok(d) => d,
                Err(failure) => return failure,
            };
        // The backups and the journal naming them exist before the start is recorded, and go
        // only after the outcome is: a started run without an outcome always leaves its
        // journal for recovery to find.
        let _locks = self.lock_paths(&paths);
        let mut backups = match self.take_backups(tool.as_ref(), &paths, &log) {
            Ok(b) => b,
            Err(reason) => {
                return log.reject(decided_event, ToolErrorKind::Io, reason.clone(), reason)
            }
        };
        seam("backup");
        if let Err(failure) = log.record_start(decided_event, tool.isolation(), &mut backups) {
            return failure;
        }
        seam("started");
        let started = Instant::now();
        let result = self.run_guarded(request, &mut backups, cancel);
        log.record_outcome(&result, cancel, started, backups);
        result
    }

    /// The approval phase: a run cancelled already is rejected, else the policy decides; a
    /// denial, or a cancel while it decided, is rejected. The decision's event, to record
    /// with the start.
    fn approve(
        &self,
        request: &ToolRequest,
        context: &ApprovalContext,
        cancel: &CancelToken,
        tool: &dyn Tool,
        paths: &[PathBuf],
        log: &RunLog<'_>,
    ) -> Result<Option<DomainEvent>, ToolResult> {
        // A run cancelled already never reaches the approver (a person would be asked about a
        // run that cannot start).
        if cancel.is_cancelled() {
            let reason = "cancelled by the host before it ran".to_owned();
            return Err(log.reject(
                None,
                ToolErrorKind::Cancelled,
                reason.clone(),
                format!("{reason}; nothing was changed"),
            ));
        }
        let ask = ApprovalRequest::new(request, tool.tier(), paths.to_vec())
            .with_notice(tool.approval_notice());
        // `recorded`: the decision is in the log already (a durable one), not to record again.
        let (decided, recorded) = match self.policy.settle(&ask, context) {
            Settled::NotNeeded => (None, false),
            Settled::Decided(d) => (Some(d), false),
            Settled::Ask { asked_by } => match self.durable_decision(&ask, context, log)? {
                Some(d) => (Some(d), true),
                None => {
                    let d = self.policy.ask(&ask, context);
                    if d.decision == ApprovalDecision::Deferred {
                        return Err(self.defer(&ask, asked_by, &d.decided_by, log));
                    }
                    (Some(d), false)
                }
            },
        };
        let decided_event =
            decided
                .as_ref()
                .filter(|_| !recorded)
                .map(|d| DomainEvent::ToolApprovalDecided {
                    session_id: log.session_id.clone(),
                    invocation_id: log.invocation_id.clone(),
                    tool_name: log.tool_name.clone(),
                    tier: log.tier,
                    decision: d.decision.as_str().to_owned(),
                    decided_by: d.decided_by.clone(),
                    wait_ms: d.wait_ms,
                    reason: match &d.decision {
                        ApprovalDecision::Denied { reason } => Some(reason.clone()),
                        _ => None,
                    },
                    answers_request: false,
                    identity: None,
                });
        if let Some(ApprovalDecision::Denied { reason }) = decided.as_ref().map(|d| &d.decision) {
            let shown = format!("not approved: {reason}");
            return Err(log.reject(
                decided_event,
                ToolErrorKind::NotAllowed,
                reason.clone(),
                shown,
            ));
        }
        // The approver may have taken long; a cancel meanwhile means the host no longer wants it.
        if cancel.is_cancelled() {
            let reason = "cancelled by the host before it ran".to_owned();
            return Err(log.reject(
                decided_event,
                ToolErrorKind::Cancelled,
                reason.clone(),
                format!("{reason}; nothing was changed"),
            ));
        }
        Ok(decided_event)
    }

    /// The decision a durable request of this run holds, when the engine may defer and the
    /// run was asked about before: `None` when there is no request (ask the engine); a
    /// request that still waits is `Pending` (an overdue one is recorded `expired` first).
    fn durable_decision(
        &self,
        ask: &ApprovalRequest,
        context: &ApprovalContext,
        log: &RunLog<'_>,
    ) -> Result<Option<Decided>, ToolResult> {
        if !self.policy.engine_defers() {
            return Ok(None);
        }
        let unreadable = |e: ApprovalError| {
            ToolResult::failure_of(
                log.id,
                ToolErrorKind::Io,
                format!("the run's approval request cannot be read from the log: {e}"),
                Recoverable::Yes,
            )
        };
        let Some(mut record) = self
            .approvals
            .get(&log.session_id, &log.invocation_id)
            .map_err(unreadable)?
        else {
            return Ok(None);
        };
        if record.overdue(now_ms()) {
            match self.approvals.expire(&log.session_id, &log.invocation_id) {
                Ok(_)
                | Err(ApprovalError::Expired { .. } | ApprovalError::AlreadyDecided { .. }) => {}
                Err(e) => return Err(unreadable(e)),
            }
            record = self
                .approvals
                .get(&log.session_id, &log.invocation_id)
                .map_err(unreadable)?
                .unwrap_or(record);
        }
        let Some(d) = record.decision.clone() else {
            return Err(pending_result(log.id, &record));
        };
        let decision = match d.decision.as_str() {
            "approved" => ApprovalDecision::Approved,
            "approved_for_session" => {
                self.policy.remember(ask, context);
                ApprovalDecision::ApprovedForSession
            }
            "expired" => ApprovalDecision::denied(expired_reason(&record)),
            _ => ApprovalDecision::denied(d.reason.clone().unwrap_or_else(|| {
                let who = d.identity.as_deref().unwrap_or(&d.decided_by);
                format!("{} denied by {who}", record.tool_name)
            })),
        };
        Ok(Some(Decided {
            decision,
            decided_by: d.decided_by,
            wait_ms: 0,
        }))
    }

    /// Records the run's request for a durable decision (the engine deferred); the `Pending`
    /// result naming it.
    fn defer(
        &self,
        ask: &ApprovalRequest,
        asked_by: String,
        engine: &str,
        log: &RunLog<'_>,
    ) -> ToolResult {
        let deadline_ms = self
            .policy
            .deadline()
            .map(|d| now_ms().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
        let event = DomainEvent::ToolApprovalRequested {
            session_id: log.session_id.clone(),
            invocation_id: log.invocation_id.clone(),
            tool_name: log.tool_name.clone(),
            tier: log.tier,
            parameters: serde_json::Value::Object(ask.request.parameters.clone()),
            argv: ask.argv.clone(),
            paths: ask.paths.iter().map(|p| p.display().to_string()).collect(),
            asked_by,
            engine: engine.to_owned(),
            deadline_ms,
        };
        match self.approvals.request(&event) {
            Ok(record) => pending_result(log.id, &record),
            // Not recorded, nothing waits: the run is refused, as a denial would be.
            Err(e) => ToolResult::failure_of(
                log.id,
                ToolErrorKind::NotAllowed,
                format!("not approved: the request for a decision could not be recorded: {e}"),
                Recoverable::Yes,
            ),
        }
    }

    /// The durable approvals of this executor's log.
    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// The backup phase: the run's journal and the backups of `paths` it names.
    fn take_backups(
        &self,
        tool: &dyn Tool,
        paths: &[PathBuf],
        log: &RunLog<'_>,
    ) -> Result<BackupSet<'_>, String> {
        let roots = tool
            .as_file_affecting()
            .map(|f| f.confining_roots())
            .unwrap_or_default();
        let run = self.journals.run(Manifest {
            session_id: log.session_id.clone(),
            invocation_id: log.invocation_id.clone(),
            tool_name: log.tool_name.clone(),
            entries: Vec::new(),
        });
        let id_part = crate::text::safe_component(log.id.as_str());
        let tag = crate::text::prefix(&id_part, 40);
        BackupSet::take(run, paths, &roots, &self.root_fds, tag)
    }

    /// The tool itself, then commit or restore.
    fn run_guarded(
        &self,
        request: &ToolRequest,
        backups: &mut BackupSet<'_>,
        cancel: &CancelToken,
    ) -> ToolResult {
        let id = &request.invocation_id;
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
                ToolResult::failure(id, format!("the tool panicked: {what}"), Recoverable::No)
            }
        };
        match result {
            ToolResult::Success { .. } => {
                seam("tool");
                match backups.commit() {
                    Ok(()) => result,
                    // Without its commit mark a crash would roll the change back: roll it back
                    // now, and say so.
                    Err(e) => {
                        let mut reason = format!(
                            "the tool succeeded, but its commit could not be recorded in the \
                             sandbox journal ({e}); its change was rolled back"
                        );
                        for err in backups.restore() {
                            reason.push_str("; ");
                            reason.push_str(&err);
                        }
                        ToolResult::failure_of(id, ToolErrorKind::Io, reason, Recoverable::Yes)
                    }
                }
            }
            ToolResult::Failure {
                invocation_id,
                reason,
                recoverable,
                kind,
                data,
            } => {
                let mut reason = reason;
                for err in backups.restore() {
                    reason.push_str("; ");
                    reason.push_str(&err);
                }
                ToolResult::Failure {
                    invocation_id,
                    reason: crate::text::bounded(reason),
                    recoverable,
                    kind,
                    data,
                }
            }
        }
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

/// Checks a request before anyone is asked about it: valid, and its paths resolved (the
/// paths a file tool may touch; none for another tool). Bad: rejected.
fn check_request(
    request: &ToolRequest,
    tool: &dyn Tool,
    log: &RunLog<'_>,
) -> Result<Vec<PathBuf>, ToolResult> {
    // A malformed request fails at once, before any approver (a person) is asked about it.
    if let ValidationResult::Invalid { reason } = tool.validate_request(request) {
        let reason = format!("invalid request: {reason}");
        return Err(log.reject(None, ToolErrorKind::InvalidRequest, reason.clone(), reason));
    }
    match tool
        .as_file_affecting()
        .map(|f| f.affected_paths_or_kind(request))
    {
        Some(Ok(p)) => Ok(p),
        Some(Err((kind, reason))) => {
            let reason = match kind {
                ToolErrorKind::InvalidRequest => format!("invalid request: {reason}"),
                _ => format!("refused: {reason}"),
            };
            Err(log.reject(None, kind, reason.clone(), reason))
        }
        None => Ok(Vec::new()),
    }
}

/// One run's place in the log: its session's stream and what each of its events names.
struct RunLog<'a> {
    events: &'a dyn EventStore,
    stream: String,
    id: &'a ToolInvocationId,
    session_id: String,
    invocation_id: String,
    tool_name: String,
    tier: i32,
}

impl<'a> RunLog<'a> {
    fn new(events: &'a dyn EventStore, request: &'a ToolRequest, tier: i32) -> Self {
        RunLog {
            events,
            stream: session_stream(request.session_id.as_str()),
            id: &request.invocation_id,
            session_id: request.session_id.to_string(),
            invocation_id: request.invocation_id.to_string(),
            tool_name: request.tool_name.clone(),
            tier,
        }
    }

    /// Appends `e`, after the approval decision that led to it when there is one.
    fn record_with(
        &self,
        decided: Option<DomainEvent>,
        e: DomainEvent,
    ) -> Result<AppendResult, EventStoreError> {
        // The decision goes into the same transaction as the start or rejection it led to.
        let events: Vec<_> = decided
            .iter()
            .chain(std::iter::once(&e))
            .map(DomainEvent::to_new_event)
            .collect();
        self.events
            .append(&self.stream, ExpectedVersion::Any, &events)
    }

    /// Records the rejection and returns the failure the caller gets.
    fn reject(
        &self,
        decided: Option<DomainEvent>,
        kind: ToolErrorKind,
        reason: String,
        shown: String,
    ) -> ToolResult {
        let recorded = self.record_with(
            decided,
            DomainEvent::ToolExecutionRejected {
                session_id: self.session_id.clone(),
                invocation_id: self.invocation_id.clone(),
                tool_name: self.tool_name.clone(),
                tier: self.tier,
                reason,
                kind: Some(kind.as_str().to_owned()),
            },
        );
        let note = match recorded {
            Ok(_) => String::new(),
            Err(e) => format!(" (and the rejection could not be recorded: {e})"),
        };
        ToolResult::failure_of(self.id, kind, format!("{shown}{note}"), Recoverable::No)
    }

    /// Records the start (with the decision that led to it). Not recorded: the backups are
    /// dropped and the tool does not run.
    fn record_start(
        &self,
        decided: Option<DomainEvent>,
        isolation: Option<&AppliedPolicy>,
        backups: &mut BackupSet<'_>,
    ) -> Result<(), ToolResult> {
        if let Err(e) = self.record_with(
            decided,
            DomainEvent::ToolExecutionStarted {
                session_id: self.session_id.clone(),
                invocation_id: self.invocation_id.clone(),
                tool_name: self.tool_name.clone(),
                tier: self.tier,
                isolation: isolation.map(AppliedPolicy::to_json),
            },
        ) {
            backups.abandon();
            return Err(ToolResult::failure_of(
                self.id,
                ToolErrorKind::Io,
                format!("the tool did not run: its start could not be recorded: {e}"),
                Recoverable::Yes,
            ));
        }
        Ok(())
    }

    /// Records the outcome with the run's network refusals; the journal goes once it is
    /// recorded, and the backups after.
    fn record_outcome(
        &self,
        result: &ToolResult,
        cancel: &CancelToken,
        started: Instant,
        mut backups: BackupSet<'_>,
    ) {
        let (denials, summary) = self.network_report(result);
        let staged = self.workspace_report(result);
        let event = self.outcome_event(result, cancel, started, summary);
        // The refusals, the change set and the outcome in one transaction: a crash leaves
        // all or none.
        let all: Vec<_> = denials
            .iter()
            .chain(staged.iter())
            .chain(std::iter::once(&event))
            .map(DomainEvent::to_new_event)
            .collect();
        let id = self.id;
        match self.events.append(&self.stream, ExpectedVersion::Any, &all) {
            // Recorded: the journal is done with.
            Ok(_) => backups.finish(),
            // Not recorded: the journal stays open, so the next executor on this root closes
            // the run from what it says.
            Err(e) => log::error!("recording the end of invocation {id}: {e}"),
        }
        seam("outcome");
        drop(backups);
    }

    /// A staged run's change set, as its data says.
    fn workspace_report(&self, result: &ToolResult) -> Option<DomainEvent> {
        let w = result
            .data()
            .map(|d| &d["workspace"])
            .filter(|w| w.is_object())?;
        let s = |k: &str| w[k].as_str().unwrap_or_default().to_owned();
        Some(DomainEvent::WorkspaceStaged {
            session_id: self.session_id.clone(),
            invocation_id: self.invocation_id.clone(),
            tool_name: self.tool_name.clone(),
            promote: s("promote"),
            state: s("state"),
            summary: w["summary"].clone(),
            changes: w["changes"].clone(),
            diff: s("diff"),
            diff_truncated: w["diff_truncated"].as_bool().unwrap_or(false),
            reason: w["reason"].as_str().map(str::to_owned),
        })
    }

    /// What a run did through its proxy: each refusal an event, the totals in the outcome.
    fn network_report(&self, result: &ToolResult) -> (Vec<DomainEvent>, Option<serde_json::Value>) {
        let network = result
            .data()
            .map(|d| d["network"].clone())
            .filter(|n| !n.is_null());
        let denials: Vec<DomainEvent> = network
            .as_ref()
            .and_then(|n| n["denied"].as_array())
            .into_iter()
            .flatten()
            .map(|d| DomainEvent::ToolNetworkDenied {
                session_id: self.session_id.clone(),
                invocation_id: self.invocation_id.clone(),
                tool_name: self.tool_name.clone(),
                host: d["host"].as_str().unwrap_or_default().to_owned(),
                port: d["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(0),
                reason: d["reason"].as_str().unwrap_or_default().to_owned(),
            })
            .collect();
        let summary = network.map(|mut n| {
            if let Some(o) = n.as_object_mut() {
                o.remove("denied");
                o.insert("denied_count".into(), denials.len().into());
            }
            n
        });
        (denials, summary)
    }

    /// The event closing the run: cancelled, completed or failed.
    fn outcome_event(
        &self,
        result: &ToolResult,
        cancel: &CancelToken,
        started: Instant,
        summary: Option<serde_json::Value>,
    ) -> DomainEvent {
        let (session_id, invocation_id, tool_name) = (
            self.session_id.clone(),
            self.invocation_id.clone(),
            self.tool_name.clone(),
        );
        match result {
            ToolResult::Failure { .. } if cancel.is_cancelled() => {
                DomainEvent::ToolExecutionCancelled {
                    session_id,
                    invocation_id,
                    tool_name,
                    duration_ms: started.elapsed().as_millis() as u64,
                    network: summary,
                }
            }
            ToolResult::Success { .. } => DomainEvent::ToolExecutionCompleted {
                session_id,
                invocation_id,
                tool_name,
                duration_ms: started.elapsed().as_millis() as u64,
                network: summary,
            },
            ToolResult::Failure {
                reason,
                recoverable,
                kind,
                ..
            } => DomainEvent::ToolExecutionFailed {
                session_id,
                invocation_id,
                tool_name,
                reason: reason.clone(),
                recoverable: *recoverable,
                kind: Some(kind.as_str().to_owned()),
                network: summary,
            },
        }
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

    fn recover_dead(&self) {
        if let Err(e) = self.recover() {
            log::warn!("recovering the runs of a dead host: {e}");
        }
    }
}
