//! Durable approval requests, folded from a session's stream: what waits for a decision, what
//! was decided, by whom and when. The sandbox reads it before asking an engine that may defer,
//! a session step reads it to wait, and [`super::Approvals`] reads it to decide.

use crate::domain::DomainEvent;
use crate::events::RecordedEvent;
use serde::Serialize;
use std::collections::HashMap;

/// One durable approval request and its decision, if it has one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApprovalRecord {
    /// The session that asked.
    pub session_id: String,
    /// The request's id: the tool run's invocation id.
    pub request_id: String,
    /// The tool.
    pub tool_name: String,
    /// The tool's tier, 0..=3.
    pub tier: i32,
    /// The request's parameters.
    pub parameters: serde_json::Value,
    /// The command line, for a tool that takes one.
    pub argv: Option<Vec<String>>,
    /// Every path the tool may change.
    pub paths: Vec<String>,
    /// Why it needs a decision (`tier T2`, or the rule that asks).
    pub asked_by: String,
    /// When it was recorded, in milliseconds since the Unix epoch.
    pub requested_at_ms: i64,
    /// When it expires, in milliseconds since the Unix epoch; none: never.
    pub deadline_ms: Option<i64>,
    /// The request's position in the log.
    pub position: u64,
    /// Its decision; none while it waits.
    pub decision: Option<RecordedDecision>,
}

impl ApprovalRecord {
    /// Whether it waits for a decision and its deadline has passed at `now_ms`.
    pub fn overdue(&self, now_ms: i64) -> bool {
        self.decision.is_none() && self.deadline_ms.is_some_and(|d| now_ms >= d)
    }

    /// `pending`, or its decision: `approved`, `approved_for_session`, `denied`, `expired`.
    pub fn state(&self) -> &str {
        self.decision
            .as_ref()
            .map_or("pending", |d| d.decision.as_str())
    }
}

/// A decision on a durable request, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecordedDecision {
    /// `approved`, `approved_for_session`, `denied` or `expired`.
    pub decision: String,
    /// What decided: `host` (the callback), `api`, `cli`, `deadline`, or an engine's name.
    pub decided_by: String,
    /// Who decided, as the host named them.
    pub identity: Option<String>,
    /// A denial's reason.
    pub reason: Option<String>,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Its position in the log.
    pub position: u64,
}

impl RecordedDecision {
    /// Whether it lets the run start.
    pub fn approves(&self) -> bool {
        matches!(self.decision.as_str(), "approved" | "approved_for_session")
    }
}

/// The durable requests of one session stream, by request id.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// The last stream version folded in (0: none).
    pub version: u64,
    requests: HashMap<String, ApprovalRecord>,
}

impl Ledger {
    /// Folds in `event`, read as `recorded` (events in stream order). The first decision of a
    /// request is its decision; a later one (which optimistic appends rule out) is ignored.
    pub fn apply(&mut self, recorded: &RecordedEvent, event: &DomainEvent) {
        self.version = recorded.stream_version;
        match event {
            DomainEvent::ToolApprovalRequested {
                session_id,
                invocation_id,
                tool_name,
                tier,
                parameters,
                argv,
                paths,
                asked_by,
                deadline_ms,
                ..
            } => {
                self.requests
                    .entry(invocation_id.clone())
                    .or_insert_with(|| ApprovalRecord {
                        session_id: session_id.clone(),
                        request_id: invocation_id.clone(),
                        tool_name: tool_name.clone(),
                        tier: *tier,
                        parameters: parameters.clone(),
                        argv: argv.clone(),
                        paths: paths.clone(),
                        asked_by: asked_by.clone(),
                        requested_at_ms: recorded.timestamp_ms,
                        deadline_ms: *deadline_ms,
                        position: recorded.position,
                        decision: None,
                    });
            }
            DomainEvent::ToolApprovalDecided {
                invocation_id,
                decision,
                decided_by,
                reason,
                answers_request: true,
                identity,
                ..
            } => {
                if let Some(r) = self.requests.get_mut(invocation_id) {
                    r.decision.get_or_insert_with(|| RecordedDecision {
                        decision: decision.clone(),
                        decided_by: decided_by.clone(),
                        identity: identity.clone(),
                        reason: reason.clone(),
                        at_ms: recorded.timestamp_ms,
                        position: recorded.position,
                    });
                }
            }
            _ => {}
        }
    }

    /// Request `id`, if this session recorded it.
    pub fn get(&self, id: &str) -> Option<&ApprovalRecord> {
        self.requests.get(id)
    }

    /// Every request, oldest first.
    pub fn all(&self) -> Vec<&ApprovalRecord> {
        let mut all: Vec<_> = self.requests.values().collect();
        all.sort_by_key(|r| r.position);
        all
    }
}

/// Milliseconds since the Unix epoch, now (0 before it: a clock that broken expires nothing
/// early).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
