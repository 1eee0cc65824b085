//! [`Approvals`]: durable approval requests in the log, decided by any process.
//!
//! A request is a `tool.approval_requested` in its session's stream; a decision is a
//! `tool.approval_decided` (`answers_request`) appended at the stream version the decider
//! read, so of two deciders the first wins and the second is told which decision it lost to.
//! A request past its deadline is `expired` (a denial), recorded once by whoever reads it
//! next: a decider, a listing, or the step that asked.

use super::ledger::{now_ms, ApprovalRecord, Ledger, RecordedDecision};
use super::ApprovalDecision;
use crate::domain::{session_stream, DomainEvent, EventType};
use crate::events::{EventStore, EventStoreError, ExpectedVersion, RecordedEvent};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

/// The longest identity a decision may carry, in bytes.
pub const MAX_IDENTITY: usize = 256;

/// Why a durable approval call did not do what it was asked.
#[derive(Debug)]
#[non_exhaustive]
pub enum ApprovalError {
    /// A malformed session id, request id, identity or decision.
    InvalidRequest(String),
    /// The session recorded no request with this id.
    NotFound {
        /// The session.
        session_id: String,
        /// The request id asked about.
        request_id: String,
    },
    /// The request was decided already: the first decision stands.
    AlreadyDecided {
        /// The request.
        request_id: String,
        /// The decision that stands.
        first: Box<RecordedDecision>,
    },
    /// The request's deadline passed before this decision: it is now recorded `expired`.
    Expired {
        /// The request.
        request_id: String,
        /// Its deadline, in milliseconds since the Unix epoch.
        deadline_ms: i64,
    },
    /// The event log failed.
    Events(EventStoreError),
}

impl fmt::Display for ApprovalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApprovalError::InvalidRequest(m) => f.write_str(m),
            ApprovalError::NotFound {
                session_id,
                request_id,
            } => write!(
                f,
                "session {session_id:?} has no approval request {request_id:?}; `correx \
                 approvals list` shows those that wait"
            ),
            ApprovalError::AlreadyDecided { request_id, first } => {
                write!(
                    f,
                    "request {request_id:?} was decided already: {} by {}",
                    first.decision, first.decided_by
                )?;
                if let Some(who) = &first.identity {
                    write!(f, " ({who})")?;
                }
                write!(
                    f,
                    " at log position {}; the first decision stands",
                    first.position
                )
            }
            ApprovalError::Expired {
                request_id,
                deadline_ms,
            } => write!(
                f,
                "request {request_id:?} expired at {deadline_ms} ms since the epoch before this \
                 decision; it is denied (expired), and the run will not start"
            ),
            ApprovalError::Events(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ApprovalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ApprovalError::Events(e) => Some(e),
            _ => None,
        }
    }
}

/// Durable approval requests of one log: list them, decide them. Cheap to share; every
/// method may be called from many threads and processes at once.
pub struct Approvals {
    events: Arc<dyn EventStore>,
    /// Each session's requests, read incrementally.
    ledgers: Mutex<HashMap<String, Ledger>>,
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Approvals")
    }
}

/// Whether `e` is one of the two event types a ledger folds.
fn is_approval(e: &RecordedEvent) -> bool {
    matches!(
        EventType::of(&e.type_id),
        Some(EventType::ToolApprovalRequested | EventType::ToolApprovalDecided)
    )
}

/// Folds `e` into `ledger` (reading its payload only when it is an approval event).
fn read_into(ledger: &mut Ledger, e: &RecordedEvent) -> Result<(), EventStoreError> {
    if is_approval(e) {
        if let Some(event) = e.domain()? {
            ledger.apply(e, &event);
            return Ok(());
        }
    }
    ledger.version = e.stream_version;
    Ok(())
}

/// The event deciding `record`: `decision` (`approved`, `approved_for_session`, `denied`,
/// `expired`) by `decided_by`, at `now_ms`.
pub(crate) fn decision_event(
    record: &ApprovalRecord,
    decision: &str,
    decided_by: &str,
    reason: Option<String>,
    identity: Option<String>,
    now_ms: i64,
) -> DomainEvent {
    DomainEvent::ToolApprovalDecided {
        session_id: record.session_id.clone(),
        invocation_id: record.request_id.clone(),
        tool_name: record.tool_name.clone(),
        tier: record.tier,
        decision: decision.to_owned(),
        decided_by: decided_by.to_owned(),
        wait_ms: u64::try_from(now_ms.saturating_sub(record.requested_at_ms)).unwrap_or(0),
        reason,
        answers_request: true,
        identity,
    }
}

/// The reason an expired request is denied with.
pub(crate) fn expired_reason(record: &ApprovalRecord) -> String {
    format!(
        "the approval request for {} expired (deadline {} ms since the epoch) before anyone \
         decided it",
        record.tool_name,
        record.deadline_ms.unwrap_or_default()
    )
}

fn check_text(what: &str, s: &str, max: usize) -> Result<(), ApprovalError> {
    if s.is_empty() || s.len() > max || s.chars().any(char::is_control) {
        return Err(ApprovalError::InvalidRequest(format!(
            "a {what} is 1 to {max} bytes without control characters, not {:?}",
            s.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

impl Approvals {
    /// The durable approvals of `events`.
    pub fn new(events: Arc<dyn EventStore>) -> Self {
        Approvals {
            events,
            ledgers: Mutex::new(HashMap::new()),
        }
    }

    /// Reads what session `session` appended since the last read, then calls `f` on its
    /// ledger.
    fn with_ledger<T>(
        &self,
        session: &str,
        f: impl FnOnce(&Ledger) -> T,
    ) -> Result<T, ApprovalError> {
        let stream = session_stream(session);
        let mut ledgers = self.ledgers.lock();
        let ledger = ledgers.entry(session.to_owned()).or_default();
        loop {
            let page = self
                .events
                .read_stream_verified(&stream, ledger.version + 1, 1000)
                .map_err(ApprovalError::Events)?;
            for e in &page {
                read_into(ledger, e).map_err(ApprovalError::Events)?;
            }
            if page.len() < 1000 {
                return Ok(f(ledger));
            }
        }
    }

    /// Request `request_id` of session `session` as the log has it now.
    ///
    /// # Errors
    /// [`ApprovalError::InvalidRequest`] for a malformed id; [`ApprovalError::Events`].
    pub fn get(
        &self,
        session: &str,
        request_id: &str,
    ) -> Result<Option<ApprovalRecord>, ApprovalError> {
        check_text("session id", session, crate::sessions::MAX_STEP_KEY)?;
        check_text("request id", request_id, crate::sessions::MAX_STEP_KEY)?;
        self.with_ledger(session, |l| l.get(request_id).cloned())
    }

    /// Every request of session `session`, oldest first, decided or not.
    ///
    /// # Errors
    /// As [`Approvals::get`].
    pub fn of_session(&self, session: &str) -> Result<Vec<ApprovalRecord>, ApprovalError> {
        check_text("session id", session, crate::sessions::MAX_STEP_KEY)?;
        self.with_ledger(session, |l| l.all().into_iter().cloned().collect())
    }

    /// Every request in the log, oldest first (reads the whole log once): with `all`, decided
    /// ones too; else those that wait. A request found past its deadline is recorded
    /// `expired` first (and listed so only with `all`).
    ///
    /// # Errors
    /// [`ApprovalError::Events`].
    pub fn list(&self, all: bool) -> Result<Vec<ApprovalRecord>, ApprovalError> {
        let mut ledgers: BTreeMap<String, Ledger> = BTreeMap::new();
        let mut from = 1;
        loop {
            let page = self
                .events
                .read_all(from, 1000)
                .map_err(ApprovalError::Events)?;
            for e in &page {
                from = e.position + 1;
                if let Some(session) = e.stream_id.strip_prefix("session-") {
                    if is_approval(e) {
                        let ledger = ledgers.entry(session.to_owned()).or_default();
                        read_into(ledger, e).map_err(ApprovalError::Events)?;
                    }
                }
            }
            if page.len() < 1000 {
                break;
            }
        }
        let now = now_ms();
        let mut out = Vec::new();
        for (session, ledger) in &ledgers {
            for record in ledger.all() {
                if record.overdue(now) {
                    let _ = self.expire(session, &record.request_id);
                    if all {
                        out.extend(self.get(session, &record.request_id)?);
                    }
                } else if all || record.decision.is_none() {
                    out.push(record.clone());
                }
            }
        }
        out.sort_by_key(|r| r.position);
        Ok(out)
    }

    /// Decides request `request_id` of session `session`: `decision` (approved, approved for
    /// the session, or denied with its reason), made by `identity` (a person's or a service's
    /// name, as the host knows it). The first decision wins.
    ///
    /// # Errors
    /// [`ApprovalError::NotFound`] when the session has no such request;
    /// [`ApprovalError::AlreadyDecided`] naming the first decision;
    /// [`ApprovalError::Expired`] when its deadline passed (recorded so now);
    /// [`ApprovalError::InvalidRequest`] for malformed ids, an identity over
    /// [`MAX_IDENTITY`] bytes, or [`ApprovalDecision::Deferred`].
    pub fn decide(
        &self,
        session: &str,
        request_id: &str,
        decision: &ApprovalDecision,
        identity: &str,
    ) -> Result<RecordedDecision, ApprovalError> {
        check_text("identity", identity, MAX_IDENTITY)?;
        let (name, reason) = match decision {
            ApprovalDecision::Approved => ("approved", None),
            ApprovalDecision::ApprovedForSession => ("approved_for_session", None),
            ApprovalDecision::Denied { reason } => ("denied", Some(reason.clone())),
            ApprovalDecision::Deferred => {
                return Err(ApprovalError::InvalidRequest(
                    "a decision approves or denies; deferring is an engine's answer".into(),
                ))
            }
        };
        self.append_decision(session, request_id, |record, now| {
            decision_event(
                record,
                name,
                "api",
                reason.clone(),
                Some(identity.to_owned()),
                now,
            )
        })
    }

    /// Records request `request_id` `expired` when it waits past its deadline.
    ///
    /// # Errors
    /// As [`Approvals::decide`]: [`ApprovalError::Expired`] when this call recorded it.
    pub(crate) fn expire(
        &self,
        session: &str,
        request_id: &str,
    ) -> Result<RecordedDecision, ApprovalError> {
        self.append_decision(session, request_id, |record, now| {
            decision_event(
                record,
                "expired",
                "deadline",
                Some(expired_reason(record)),
                None,
                now,
            )
        })
    }

    /// Appends the decision `build` makes for the request at the version read: an overdue
    /// request gets `expired` instead (and the call fails with [`ApprovalError::Expired`]).
    fn append_decision(
        &self,
        session: &str,
        request_id: &str,
        build: impl Fn(&ApprovalRecord, i64) -> DomainEvent,
    ) -> Result<RecordedDecision, ApprovalError> {
        check_text("session id", session, crate::sessions::MAX_STEP_KEY)?;
        check_text("request id", request_id, crate::sessions::MAX_STEP_KEY)?;
        let stream = session_stream(session);
        loop {
            let (version, record) =
                self.with_ledger(session, |l| (l.version, l.get(request_id).cloned()))?;
            let record = record.ok_or_else(|| ApprovalError::NotFound {
                session_id: session.to_owned(),
                request_id: request_id.to_owned(),
            })?;
            if let Some(first) = record.decision.clone() {
                return Err(ApprovalError::AlreadyDecided {
                    request_id: request_id.to_owned(),
                    first: Box::new(first),
                });
            }
            let now = now_ms();
            let overdue = record.overdue(now);
            let event = if overdue {
                decision_event(
                    &record,
                    "expired",
                    "deadline",
                    Some(expired_reason(&record)),
                    None,
                    now,
                )
            } else {
                build(&record, now)
            };
            match self.events.append(
                &stream,
                ExpectedVersion::Exact(version),
                &[event.to_new_event()],
            ) {
                Ok(_) => {}
                Err(EventStoreError::WrongExpectedVersion { .. }) => continue,
                Err(e) => return Err(ApprovalError::Events(e)),
            }
            let decided = self
                .with_ledger(session, |l| {
                    l.get(request_id).and_then(|r| r.decision.clone())
                })?
                .ok_or_else(|| ApprovalError::NotFound {
                    session_id: session.to_owned(),
                    request_id: request_id.to_owned(),
                })?;
            if decided.decision == "expired" {
                return Err(ApprovalError::Expired {
                    request_id: request_id.to_owned(),
                    deadline_ms: record.deadline_ms.unwrap_or_default(),
                });
            }
            return Ok(decided);
        }
    }

    /// Records `request` (a `tool.approval_requested`) unless its invocation has a request
    /// already; the request as the log has it.
    ///
    /// # Errors
    /// [`ApprovalError::Events`].
    pub(crate) fn request(&self, request: &DomainEvent) -> Result<ApprovalRecord, ApprovalError> {
        let DomainEvent::ToolApprovalRequested {
            session_id,
            invocation_id,
            ..
        } = request
        else {
            return Err(ApprovalError::InvalidRequest(
                "only a tool.approval_requested is a request".into(),
            ));
        };
        let stream = session_stream(session_id);
        loop {
            let (version, found) =
                self.with_ledger(session_id, |l| (l.version, l.get(invocation_id).cloned()))?;
            if let Some(found) = found {
                return Ok(found);
            }
            let expected = if version == 0 {
                ExpectedVersion::NoStream
            } else {
                ExpectedVersion::Exact(version)
            };
            match self
                .events
                .append(&stream, expected, &[request.to_new_event()])
            {
                Ok(_) | Err(EventStoreError::WrongExpectedVersion { .. }) => continue,
                Err(e) => return Err(ApprovalError::Events(e)),
            }
        }
    }

    /// Forgets session `session`'s cached requests (its memory only).
    pub fn forget(&self, session: &str) {
        self.ledgers.lock().remove(session);
    }
}
