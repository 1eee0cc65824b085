//! Approvals: who says yes before a risky tool runs.
//!
//! The sandbox asks an [`ApprovalEngine`] for every T2 and T3 tool; T0 and T1 proceed without
//! asking. Engines fail closed: only an explicit [`ApprovalDecision::Approved`] lets a tool run.
//!
//! ```
//! use correx::{ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalRequest, AutoApprove,
//!              SessionId, Tier, ToolRequest};
//! let engine = AutoApprove::up_to(Tier::T2);
//! let request = ToolRequest::new(SessionId::from("s1"), "file_write", Default::default());
//! let ask = ApprovalRequest::new(&request, Tier::T2, Vec::new());
//! let ctx = ApprovalContext::new(SessionId::from("s1"));
//! assert_eq!(engine.evaluate(&ask, &ctx), ApprovalDecision::Approved);
//! ```

mod config;
mod durable;
mod engines;
mod ledger;
mod policy;

pub use config::{ApprovalsConfig, EngineChoice};
pub(crate) use durable::{decision_event, expired_reason};
pub use durable::{ApprovalError, Approvals, MAX_IDENTITY};
pub use engines::{AutoApprove, CallbackApprover, DeferAll, DenyAll};
pub(crate) use ledger::{now_ms, Ledger};
pub use ledger::{ApprovalRecord, RecordedDecision};
pub use policy::{ApprovalPolicy, ApprovalRule, Decided, RuleAction, Settled};

use crate::ids::{SessionId, StageId};
use crate::tools::{Tier, ToolRequest};
use serde::{Deserialize, Serialize};

/// How a session wants approvals handled; informational for engines that ask a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Ask for every tool that needs approval.
    #[default]
    Interactive,
    /// Approve what the engine's policy allows without asking.
    Auto,
    /// Deny everything that needs approval.
    Deny,
}

/// One question to an approval engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The tool's registered name.
    pub tool_name: String,
    /// The tool's tier.
    pub tier: Tier,
    /// The full request, parameters included.
    pub request: ToolRequest,
    /// Every path the tool may change (empty for tools that change no file).
    #[serde(default)]
    pub paths: Vec<std::path::PathBuf>,
    /// The command line, for a tool that takes one (the shell's `argv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Why a person must decide whatever the tier, rules and earlier answers say (an MCP
    /// tool whose definition changed since it was pinned): no `allow` rule, session answer or
    /// automatic engine approves such a request, and a `forbid` rule still denies it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

impl ApprovalRequest {
    /// The question for `request` of a tool of `tier` that may change `paths`; the argv is the
    /// request's `argv` parameter when it is an array of strings.
    pub fn new(request: &ToolRequest, tier: Tier, paths: Vec<std::path::PathBuf>) -> Self {
        let argv = request
            .parameters
            .get("argv")
            .and_then(|v| v.as_array())
            .and_then(|a| a.iter().map(|w| w.as_str().map(str::to_owned)).collect());
        ApprovalRequest {
            tool_name: request.tool_name.clone(),
            tier,
            request: request.clone(),
            paths,
            argv,
            notice: None,
        }
    }

    /// As this request, with `notice` (see [`ApprovalRequest::notice`]).
    pub fn with_notice(mut self, notice: Option<String>) -> Self {
        self.notice = notice;
        self
    }
}

/// What the engine knows about where the request comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalContext {
    /// The session asking.
    pub session_id: SessionId,
    /// The stage asking, when known.
    pub stage_id: Option<StageId>,
    /// The session's approval mode.
    pub mode: ApprovalMode,
}

impl ApprovalContext {
    /// A context for `session_id` with no stage and [`ApprovalMode::Interactive`].
    pub fn new(session_id: SessionId) -> Self {
        ApprovalContext {
            session_id,
            stage_id: None,
            mode: ApprovalMode::Interactive,
        }
    }
}

/// An engine's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// The tool may run.
    Approved,
    /// The tool may run, and so may the same tool for the rest of the session when its argv
    /// starts with this request's (any request of the tool, for one without an argv).
    ApprovedForSession,
    /// The tool must not run.
    Denied {
        /// Why, for the event log and the model.
        reason: String,
    },
    /// No answer now: the request is recorded (`tool.approval_requested`) and waits for a
    /// decision from any process ([`Approvals::decide`]); the run starts when asked for again
    /// after an approval. Only an engine answers this; the tool does not run.
    Deferred,
}

impl ApprovalDecision {
    /// A denial with a reason.
    pub fn denied(reason: impl Into<String>) -> Self {
        ApprovalDecision::Denied {
            reason: reason.into(),
        }
    }

    /// Whether this approves.
    pub fn is_approved(&self) -> bool {
        matches!(
            self,
            ApprovalDecision::Approved | ApprovalDecision::ApprovedForSession
        )
    }

    /// How the log names it: `approved`, `approved_for_session`, `denied` or `deferred`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ApprovalDecision::Approved => "approved",
            ApprovalDecision::ApprovedForSession => "approved_for_session",
            ApprovalDecision::Denied { .. } => "denied",
            ApprovalDecision::Deferred => "deferred",
        }
    }
}

/// Decides whether a tool request may run. Blocking (it may ask a person), shared across threads.
pub trait ApprovalEngine: Send + Sync {
    /// Approves or denies `request`. Implementations must fail closed.
    fn evaluate(&self, request: &ApprovalRequest, context: &ApprovalContext) -> ApprovalDecision;

    /// How the log names this engine in `tool.approval_decided`'s `decided_by`.
    fn name(&self) -> String {
        "engine".into()
    }

    /// Whether it may answer [`ApprovalDecision::Deferred`]: then a request recorded earlier
    /// is looked up (and its decision used) before the engine is asked again. An engine that
    /// never defers is asked at once.
    fn defers(&self) -> bool {
        false
    }
}
