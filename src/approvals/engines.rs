use super::{ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalRequest};
use crate::tools::Tier;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Approves every request up to and including a tier; denies the rest.
#[derive(Clone, Copy, Debug)]
pub struct AutoApprove {
    max: Tier,
}

impl AutoApprove {
    /// Approves tiers `<= max`.
    pub fn up_to(max: Tier) -> Self {
        AutoApprove { max }
    }
}

impl ApprovalEngine for AutoApprove {
    fn evaluate(&self, request: &ApprovalRequest, _context: &ApprovalContext) -> ApprovalDecision {
        if let Some(notice) = &request.notice {
            return ApprovalDecision::denied(format!(
                "{notice}; automatic approval does not decide it"
            ));
        }
        if request.tier <= self.max {
            ApprovalDecision::Approved
        } else {
            ApprovalDecision::denied(format!(
                "{} is {} and automatic approval stops at {}",
                request.tool_name, request.tier, self.max
            ))
        }
    }

    fn name(&self) -> String {
        format!("auto up to {}", self.max)
    }
}

/// Denies everything it is asked.
#[derive(Clone, Copy, Debug, Default)]
pub struct DenyAll;

impl ApprovalEngine for DenyAll {
    fn evaluate(&self, request: &ApprovalRequest, _context: &ApprovalContext) -> ApprovalDecision {
        ApprovalDecision::denied(format!("{} denied: approvals are off", request.tool_name))
    }

    fn name(&self) -> String {
        "deny_all".into()
    }
}

/// Defers every request to a durable decision: each waits in the log
/// (`tool.approval_requested`) until a process decides it through [`super::Approvals`] (the
/// CLI's `correx approvals decide`, the C or Java call), or its deadline passes.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeferAll;

impl ApprovalEngine for DeferAll {
    fn evaluate(&self, _request: &ApprovalRequest, _context: &ApprovalContext) -> ApprovalDecision {
        ApprovalDecision::Deferred
    }

    fn name(&self) -> String {
        "durable".into()
    }

    fn defers(&self) -> bool {
        true
    }
}

/// The host's own answer, as a boxed closure.
type ApproverFn = dyn Fn(&ApprovalRequest, &ApprovalContext) -> Result<ApprovalDecision, String>
    + Send
    + Sync
    + 'static;

/// Asks the host through a callback. Fails closed: `Ok(true)` approves; `Ok(false)`, an error or
/// a panic inside the callback denies.
pub struct CallbackApprover {
    callback: Box<ApproverFn>,
    defers: bool,
}

impl CallbackApprover {
    /// Wraps `callback`, which answers `Ok(true)` to approve.
    pub fn new<F>(callback: F) -> Self
    where
        F: Fn(&ApprovalRequest, &ApprovalContext) -> Result<bool, String> + Send + Sync + 'static,
    {
        let mut engine = Self::with_answer(move |r, c| {
            callback(r, c).map(|yes| {
                if yes {
                    ApprovalDecision::Approved
                } else {
                    ApprovalDecision::denied(format!(
                        "{} ({}) denied by the host",
                        r.tool_name, r.tier
                    ))
                }
            })
        });
        // A yes-or-no callback never defers.
        engine.defers = false;
        engine
    }

    /// Wraps `callback`, which answers with a decision (so it can approve for the session,
    /// or defer: [`ApprovalDecision::Deferred`] records the request for a durable decision,
    /// and a request recorded earlier is answered from the log before the callback is asked).
    pub fn with_answer<F>(callback: F) -> Self
    where
        F: Fn(&ApprovalRequest, &ApprovalContext) -> Result<ApprovalDecision, String>
            + Send
            + Sync
            + 'static,
    {
        CallbackApprover {
            callback: Box::new(callback),
            defers: true,
        }
    }
}

impl std::fmt::Debug for CallbackApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackApprover")
    }
}

impl ApprovalEngine for CallbackApprover {
    fn evaluate(&self, request: &ApprovalRequest, context: &ApprovalContext) -> ApprovalDecision {
        match catch_unwind(AssertUnwindSafe(|| (self.callback)(request, context))) {
            Ok(Ok(decision)) => decision,
            Ok(Err(e)) => ApprovalDecision::denied(format!(
                "{} denied: the approver failed: {e}",
                request.tool_name
            )),
            Err(_) => ApprovalDecision::denied(format!(
                "{} denied: the approver panicked",
                request.tool_name
            )),
        }
    }

    fn name(&self) -> String {
        "host".into()
    }

    fn defers(&self) -> bool {
        self.defers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;
    use crate::tools::ToolRequest;

    fn ask(tier: Tier) -> (ApprovalRequest, ApprovalContext) {
        let request = ToolRequest::new(SessionId::from("s"), "t", Default::default());
        (
            ApprovalRequest::new(&request, tier, Vec::new()),
            ApprovalContext::new(SessionId::from("s")),
        )
    }

    #[test]
    fn auto_approve_stops_at_its_tier() {
        let e = AutoApprove::up_to(Tier::T2);
        let (r, c) = ask(Tier::T2);
        assert!(e.evaluate(&r, &c).is_approved());
        let (r, c) = ask(Tier::T3);
        assert!(!e.evaluate(&r, &c).is_approved());
    }

    #[test]
    fn deny_all_denies() {
        let (r, c) = ask(Tier::T0);
        assert!(!DenyAll.evaluate(&r, &c).is_approved());
    }

    #[test]
    fn callback_fails_closed_on_error_and_panic() {
        let (r, c) = ask(Tier::T3);
        let erring = CallbackApprover::new(|_, _| Err("host gone".into()));
        assert!(!erring.evaluate(&r, &c).is_approved());
        let panicking = CallbackApprover::new(|_, _| panic!("approver bug"));
        assert!(!panicking.evaluate(&r, &c).is_approved());
        let yes = CallbackApprover::new(|_, _| Ok(true));
        assert!(yes.evaluate(&r, &c).is_approved());
    }
}
